"""The command as users run it: exit codes, one-sentence errors, run events, installed script."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from staging import require_staging_venv

from ddtree_deploy.cli import _run_dir, main
from ddtree_deploy.config import ACTIONS, compose_config, group_options
from ddtree_deploy.config.schema import FLEET_ACTIONS
from ddtree_deploy.patching.manifest import select_patch_set
from ddtree_deploy.report.usage import ACTION_SUMMARIES

SCRIPT = shutil.which("ddtree-deploy", path=str(Path(sys.executable).parent))


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The installed script, its tables wide enough that no cell wraps."""
    assert SCRIPT, "the ddtree-deploy console script is not installed next to this python"
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [SCRIPT, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_main_bad_option_prints_one_sentence_and_exits_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["algo=nope"]) == 2
    err = capsys.readouterr().err
    assert (
        err.strip() == "error: Unknown algo 'nope'; choose one of: ddtree, ddtree_shadow, dflash."
    )


def test_main_help_lists_groups_actions_and_docs_on_one_80x40_screen(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--help"]) == 0
    lines = capsys.readouterr().out.rstrip("\n").splitlines()
    assert len(lines) <= 40, f"--help prints {len(lines)} lines"
    assert [line for line in lines if len(line) > 80] == []
    words = " ".join(lines).split()
    for action in ACTIONS:  # each on a line of its own, with its summary
        assert any(line.split()[:1] == [action] and len(line.split()) > 1 for line in lines)
    for group in group_options():
        assert group.group in words
        assert all(o in words or f"{o}*" in words for o in group.options), group
    assert "local*" in words and "qwen3_8b*" in words  # the defaults are marked
    assert "docs/troubleshooting.md:" in words
    # How to act on a fleet, and which actions it takes.
    assert "fleet=NAME" in words and f"({' '.join(FLEET_ACTIONS)};" in " ".join(words)


def test_every_action_has_a_help_summary() -> None:
    assert list(ACTION_SUMMARIES) == list(ACTIONS)


def test_installed_script_unreachable_host_is_one_line_without_traceback(tmp_path: Path) -> None:
    done = run_cli(
        "host=ct200",
        "algo=ddtree_shadow",
        "host.address=127.0.0.1",
        "host.port=1",
        "host.connect_timeout_s=2",
        cwd=tmp_path,
    )
    assert done.returncode == 3
    assert "Traceback" not in done.stderr + done.stdout
    assert done.stderr.startswith("error: Cannot reach ct200 at root@127.0.0.1:1 over SSH")
    assert len(done.stderr.strip().splitlines()) == 1


def test_installed_script_facts_json_and_run_events(tmp_path: Path) -> None:
    done = run_cli(
        "action=facts",
        "output=json",
        f"host.sglang_venv={sys.prefix}",
        f"rollout.runs_dir={tmp_path / 'runs'}",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout)
    assert facts["python_version"].startswith(f"{sys.version_info.major}.{sys.version_info.minor}.")
    (run_dir,) = (tmp_path / "runs").iterdir()
    events = [
        json.loads(line)["event"] for line in (run_dir / "events.jsonl").read_text().splitlines()
    ]
    assert events == ["run.start", "facts.probe", "facts", "run.end"]


def test_installed_script_plan_refuses_cuda_mismatch(tmp_path: Path) -> None:
    """This venv's torch is a cu130 build: a config that says cu128 must be refused."""
    done = run_cli(
        f"host.sglang_venv={sys.prefix}",
        "abi.cuda=12.8",
        f"rollout.runs_dir={tmp_path}",
        cwd=tmp_path,
    )
    assert done.returncode == 4
    assert "ABI mismatch on local: the config says torch" in done.stdout


def test_installed_script_status_on_the_staging_host_reports_patches_and_kernels_not_systemd(
    tmp_path: Path,
) -> None:
    """host=local has no systemd (host.systemd=false): status says so instead of failing in systemctl."""
    venv = require_staging_venv("0.5.11")  # only read: status changes nothing
    done = run_cli(
        "action=status",
        f"host.sglang_venv={venv}",
        f"host.state_dir={tmp_path / 'state'}",
        f"rollout.runs_dir={tmp_path / 'runs'}",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    pairs = [
        cells
        for line in done.stdout.splitlines()
        if len(cells := [c.strip() for c in line.split("│")[1:-1]]) == 2
    ]
    rows = dict(pairs)
    assert rows["generation"] == "none"
    assert rows["unit"] == "sglang.service: not managed, host.systemd=false"
    assert rows["patch set"] == "0.5.11: pristine"
    targets = {str(f.path) for p in select_patch_set("0.5.11").patches for f in p.files}
    files = {path: state for state, path in pairs if state in ("pristine", "applied", "drifted")}
    assert files == dict.fromkeys(targets, "pristine")
    # Built on this host, or taken from the control machine's wheel cache, depending on its state.
    assert re.fullmatch(
        r"not current; action=build-kernels would (build|install cached wheel) cp311-torch\S+ .*",
        rows["kernels"],
    )
    assert rows["drift"] == "none"
    assert done.stdout.strip().splitlines()[-1] == (
        "No service is managed on local (host.systemd=false): deploys patch SGLang and install the kernels there, and only render and lint the unit."
    )


def test_runs_started_in_the_same_second_each_get_their_own_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs started at once from one control machine (two hosts deployed side by side) race
    between seeing a name free and creating it. Each must still get a folder of its own: here every
    name looks free, as it does to a run that looked just before another created it."""
    cfg = compose_config([f"rollout.runs_dir={tmp_path}", "action=prepare"])
    monkeypatch.setattr(time, "strftime", lambda _format: "20261203-091646")
    first = _run_dir(cfg)
    monkeypatch.setattr(Path, "exists", lambda self: False)
    later = [_run_dir(cfg) for _ in range(2)]
    assert [f.name for f in [first, *later]] == [
        "20261203-091646-local-prepare",
        "20261203-091646-local-prepare-1",
        "20261203-091646-local-prepare-2",
    ]
    assert all(f.is_dir() for f in [first, *later])
