"""action=patch / audit / unpatch through the CLI on a real SGLang 0.5.11 install on this machine.

The venv under test (`sglang_venv`, tests/cli/conftest.py) holds its own `sglang==0.5.11` from
PyPI, so the shared staging venv is never patched.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from ddtree_deploy.cli import main
from ddtree_deploy.patching.manifest import load_patch_sets, select_patch_set

TARGETS = len({f.path for p in select_patch_set("0.5.11").patches for f in p.files})


def _run(
    capsys: pytest.CaptureFixture[str], venv: Path, tmp_path: Path, action: str
) -> tuple[int, str]:
    code = main(
        [
            f"action={action}",
            f"host.sglang_venv={venv}",
            f"host.state_dir={tmp_path / 'state'}",
            f"rollout.runs_dir={tmp_path / 'runs'}",
        ]
    )
    return code, capsys.readouterr().out


def _record_matches(venv: Path) -> bool:
    """Every file the 0.5.11 patch set touches hashes to its RECORD entry."""
    script = (
        "import base64, hashlib, importlib.metadata as m\n"
        "d = m.distribution('sglang'); bad = []\n"
        "for f in d.files:\n"
        "    if f.hash and str(f).endswith(('spec_info.py', 'server_args.py', 'dflash_worker.py')):\n"
        "        digest = base64.urlsafe_b64encode(hashlib.sha256(f.locate().read_bytes()).digest()).rstrip(b'=').decode()\n"
        "        bad += [str(f)] if digest != f.hash.value else []\n"
        "print(bad)\n"
    )
    out = subprocess.run(
        [venv / "bin" / "python", "-c", script], capture_output=True, text=True, check=True
    )
    return out.stdout.strip() == "[]"


def test_patch_audit_unpatch_round_trip(
    capsys: pytest.CaptureFixture[str], sglang_venv: Path, tmp_path: Path
) -> None:
    assert _record_matches(sglang_venv)
    code, out = _run(capsys, sglang_venv, tmp_path, "patch")
    assert code == 0 and f"patched {TARGETS} files of patch set 0.5.11" in out
    assert not _record_matches(sglang_venv)
    code, out = _run(capsys, sglang_venv, tmp_path, "patch")
    assert code == 0 and "nothing to do" in out

    code, out = _run(capsys, sglang_venv, tmp_path, "audit")
    assert code == 0 and "0 unreviewed; passed." in out
    (audit_dir,) = (p for p in (tmp_path / "runs").iterdir() if p.name.endswith("-audit"))
    report = json.loads((audit_dir / "patch-audit.json").read_text())
    assert (
        report
        and (audit_dir / "patch-audit.md").exists()
        and (audit_dir / "patch-audit.junit.xml").exists()
    )

    code, out = _run(capsys, sglang_venv, tmp_path, "unpatch")
    assert code == 0 and f"restored {TARGETS} files of patch set 0.5.11" in out
    assert _record_matches(sglang_venv)


def test_unsupported_release_is_refused_before_anything_is_written(
    capsys: pytest.CaptureFixture[str], sglang_venv: Path, tmp_path: Path
) -> None:
    code = main(
        [
            "action=patch",
            f"host.sglang_venv={sglang_venv}",
            "sglang.version=0.5.24",
            f"host.state_dir={tmp_path / 'state'}",
            f"rollout.runs_dir={tmp_path / 'runs'}",
        ]
    )
    err = capsys.readouterr().err
    assert code == 5
    supported = ", ".join(str(s.release) for s in load_patch_sets())  # one per shipped set
    assert err.strip() == (
        f"error: SGLang 0.5.24 has no patch set (supported: {supported}); pin a supported release "
        "in the host's sglang config, or run `ddtree-deploy action=port sglang.version=0.5.24` "
        "for a candidate set to review."
    )
    assert not (tmp_path / "state").exists()
    assert _record_matches(sglang_venv)


def test_audit_of_drifted_file_fails_with_exit_6(
    capsys: pytest.CaptureFixture[str], sglang_venv: Path, tmp_path: Path
) -> None:
    (target,) = sglang_venv.glob("lib/python*/site-packages/sglang/srt/speculative/spec_info.py")
    target.write_bytes(target.read_bytes() + b"# drift\n")
    code, out = _run(capsys, sglang_venv, tmp_path, "audit")
    assert code == 6 and "failed." in out
    code = main(
        [
            "action=patch",
            f"host.sglang_venv={sglang_venv}",
            f"host.state_dir={tmp_path / 'state'}",
            f"rollout.runs_dir={tmp_path / 'runs'}",
        ]
    )
    assert code == 6
    assert "spec_info.py" in capsys.readouterr().err
    assert target.read_bytes().endswith(b"# drift\n")


def _status_event(tmp_path: Path) -> dict[str, object]:
    """The `status` event of the latest action=status run."""
    runs = sorted((tmp_path / "runs").glob("*-status"), key=lambda p: p.stat().st_mtime)
    lines = (runs[-1] / "events.jsonl").read_text().splitlines()
    events: list[dict[str, object]] = [json.loads(line) for line in lines]
    (event,) = (e for e in events if e["event"] == "status")
    return event


def test_status_reports_the_applied_patch_set_then_a_drifted_file_as_drift(
    capsys: pytest.CaptureFixture[str], sglang_venv: Path, tmp_path: Path
) -> None:
    assert _run(capsys, sglang_venv, tmp_path, "patch")[0] == 0
    code, out = _run(capsys, sglang_venv, tmp_path, "status")
    assert code == 0 and out.count("│   applied ") == TARGETS
    assert _status_event(tmp_path)["patch_set"] == "0.5.11: applied"

    (target,) = sglang_venv.glob("lib/python*/site-packages/sglang/srt/speculative/spec_info.py")
    target.write_bytes(target.read_bytes() + b"# drift\n")
    code, out = _run(capsys, sglang_venv, tmp_path, "status")
    assert code == 1 and out.count("│   applied ") == TARGETS - 1
    event = _status_event(tmp_path)
    assert event["patch_set"] == "0.5.11: drifted"
    assert event["drift"] == [
        "sglang/srt/speculative/spec_info.py matches neither the pristine nor the patched file "
        "of its patch set"
    ]
