"""action=port on real wheels: the 0.5.11 set (whole, and the part of it that still fits) to 0.5.12,
the CLI around it, and the 0.5.15 set to 0.5.15.post1, which writes a derived set.
test_port_lineage.py holds each reviewed set from 0.5.15 to 0.5.22 to the port of its neighbour's.

The 0.5.12 set began as such a port; since it shipped, these tests port from a sets root holding
the shipped source set alone, so they keep exercising a real port.

The whole 0.5.11 set does not port to 0.5.12: 0.5.12 dropped the server-args `choices=[...]`
list and the `speculative_dflash_draft_window_size` field, and rewrote the DFlash acceptance in
dflash_utils.py (GNU `patch --fuzz=2` fails the same three hunks). Patches 0001, 0003, 0005 and
0007 alone do port (with offsets and fuzz), so a set made of just those, copied from the shipped
one, is the success case.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from ddtree_deploy.cli import main
from ddtree_deploy.hosts.local import LocalHost
from ddtree_deploy.hosts.state import HostStateStore
from ddtree_deploy.patching.engine import apply_patch_set, revert_patch_set
from ddtree_deploy.patching.errors import HunkFailed
from ddtree_deploy.patching.manifest import (
    PatchSetError,
    load_patch_set,
    load_patch_sets,
    patch_sets_root,
)
from ddtree_deploy.patching.port import (
    HunkStatus,
    PortRefused,
    PortReport,
    nearest_patch_set,
    port_patch_set,
    write_candidate,
)
from ddtree_deploy.patching.record import parse_record
from patching.trees import own_copy, series_of, shipped_sets_root, tree_bytes, wheel_path

MakeTree = Callable[[str], Path]
RELEASE = "0.5.12"
FITTING = (  # the 0.5.11 patches whose hunks all land on 0.5.12
    "0001-spec-info-ddtree-enum.patch",
    "0003-dflash-worker-ddtree.patch",
    "0005-cuda-graph-ddtree-tree-mask.patch",
    "0007-hybrid-linear-attn-ddtree-tree.patch",
)


def _fitting_root(base: Path) -> Path:
    """A sets root holding the shipped 0.5.11 set cut down to `FITTING` (and its gates)."""
    source = patch_sets_root() / "0.5.11"
    target = base / "sets" / "0.5.11"
    target.mkdir(parents=True)
    raw: dict[str, Any] = yaml.safe_load((source / "series.yaml").read_text())
    raw["patches"] = [p for p in raw["patches"] if p["name"] in FITTING]
    raw["gates"] = [g for g in raw["gates"] if g.get("patch") in (None, *FITTING)]
    for name in FITTING:
        shutil.copy(source / name, target / name)
    (target / "series.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return target.parent


@pytest.fixture(scope="module")
def fitting_port(tmp_path_factory: pytest.TempPathFactory) -> PortReport:
    wheel = wheel_path(RELEASE)
    return port_patch_set(RELEASE, root=_fitting_root(tmp_path_factory.mktemp("fit")), wheel=wheel)


@pytest.fixture(scope="module")
def whole_port(tmp_path_factory: pytest.TempPathFactory) -> PortReport:
    root = shipped_sets_root(tmp_path_factory.mktemp("whole"), "0.5.11")
    return port_patch_set(RELEASE, root=root, wheel=wheel_path(RELEASE))


@pytest.fixture
def candidate_dir(fitting_port: PortReport, tmp_path: Path) -> Path:
    assert fitting_port.candidate is not None
    return write_candidate(fitting_port.candidate, tmp_path / f"candidate-{RELEASE}")


def _record(site: Path) -> dict[PurePosixPath, str]:
    return parse_record((site / f"sglang-{RELEASE}.dist-info" / "RECORD").read_text())


def _gnu_patch(site: Path, diff: Path, fuzz: int) -> subprocess.CompletedProcess[str]:
    if shutil.which("patch") is None:
        pytest.skip("GNU patch is not installed")
    argv = ["patch", "-p1", f"--fuzz={fuzz}", "--no-backup-if-mismatch", "-r", "-", "-i", str(diff)]
    return subprocess.run(argv, cwd=site, capture_output=True, text=True, check=False)


def test_port_reports_each_hunk_with_offset_and_fuzz(fitting_port: PortReport) -> None:
    found = [
        (h.fit.patch[:4], h.file.name, h.fit.index, h.status, h.fit.offset, h.fit.fuzz)
        for h in fitting_port.hunks
    ]
    assert found == [
        ("0001", "spec_info.py", 1, HunkStatus.fuzzed, 14, 1),
        ("0001", "spec_info.py", 2, HunkStatus.fuzzed, 56, 1),
        ("0001", "spec_info.py", 3, HunkStatus.offset, 77, 0),  # the loader, load_ddtree
        *(("0003", "dflash_worker.py", i, HunkStatus.applied, 0, 0) for i in range(1, 8)),
        ("0003", "dflash_worker.py", 8, HunkStatus.fuzzed, 0, 2),
        ("0003", "dflash_worker.py", 9, HunkStatus.applied, 0, 0),  # the log-prob invariant
        ("0003", "dflash_worker.py", 10, HunkStatus.applied, 0, 0),
        ("0005", "cuda_graph_runner.py", 1, HunkStatus.offset, 33, 0),
        ("0005", "cuda_graph_runner.py", 2, HunkStatus.offset, 33, 0),
        ("0007", "hybrid_linear_attn_backend.py", 1, HunkStatus.applied, 0, 0),
    ]
    assert fitting_port.exit_code == 0 and fitting_port.candidate is not None


def test_port_fuzzed_result_equals_gnu_patch_fuzz_2(
    fitting_port: PortReport, make_tree: MakeTree, tmp_path: Path
) -> None:
    """The candidate's post-images are what `patch --fuzz=2` makes of the source diffs."""
    assert fitting_port.candidate is not None
    site = make_tree(RELEASE)
    source = _fitting_root(tmp_path) / "0.5.11"
    for patch in fitting_port.candidate.patches:
        for file in patch.files:
            own_copy(site, str(file.path))
        assert _gnu_patch(site, source / patch.name, fuzz=2).returncode == 0
    for patch in fitting_port.candidate.patches:
        for file in patch.files:
            assert hashlib.sha256((site / file.path).read_bytes()).hexdigest() == file.sha256_after


def test_port_candidate_applies_with_gnu_patch_fuzz_0(
    candidate_dir: Path, make_tree: MakeTree
) -> None:
    site = make_tree(RELEASE)
    record = _record(site)
    series = series_of(candidate_dir)
    assert series["release"] == f"=={RELEASE}"
    for entry in series["patches"]:
        for file in entry["files"]:
            assert file["sha256_before"] == record[PurePosixPath(file["path"])]
            own_copy(site, file["path"])
        done = _gnu_patch(site, candidate_dir / entry["name"], fuzz=0)
        assert done.returncode == 0, done.stdout
        assert "offset" not in done.stdout and "fuzz" not in done.stdout
        for file in entry["files"]:
            digest = hashlib.sha256((site / file["path"]).read_bytes()).hexdigest()
            assert digest == file["sha256_after"]


def test_port_candidate_keeps_purposes_and_headers(candidate_dir: Path) -> None:
    shipped = {p.name: p.purpose for p in load_patch_set(patch_sets_root() / "0.5.11").patches}
    series = series_of(candidate_dir)
    assert [p["name"] for p in series["patches"]] == list(FITTING)
    assert all(p["purpose"] == shipped[p["name"]] for p in series["patches"])
    first = (candidate_dir / FITTING[0]).read_text().splitlines()[:2]
    path = "sglang/srt/speculative/spec_info.py"
    assert first == [f"--- a/{path}", f"+++ b/{path}"]


def test_port_candidate_apply_then_revert_restores_record_bytes(
    candidate_dir: Path, make_tree: MakeTree, tmp_path: Path
) -> None:
    """The engine applies the candidate (once its gates are reviewed) and reverts it exactly."""
    reviewed = tmp_path / "reviewed"
    shutil.copytree(candidate_dir, reviewed)
    raw = series_of(reviewed)
    raw["gates"] = [g for g in raw["gates"] if g["disposition"] != "unreviewed"]
    (reviewed / "series.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    patch_set = load_patch_set(reviewed)
    site = make_tree(RELEASE)
    pristine = tree_bytes(site)
    host = LocalHost("port-test")
    state = HostStateStore(host, PurePosixPath(tmp_path / "state"), sudo=False)
    applied = apply_patch_set(host, PurePosixPath(site), patch_set, state)
    assert len(applied.changed) == 4 and tree_bytes(site) != pristine
    reverted = revert_patch_set(host, PurePosixPath(site), patch_set, state)
    assert len(reverted.changed) == 4
    assert tree_bytes(site) == pristine
    record = _record(site)
    for change in applied.changed:
        assert hashlib.sha256((site / change.path).read_bytes()).hexdigest() == record[change.path]


def test_port_lists_new_unreviewed_gates_and_carries_reviews(
    fitting_port: PortReport, candidate_dir: Path
) -> None:
    unreviewed = {(str(g.site.file), g.site.function) for g in fitting_port.unreviewed}
    assert ("sglang/srt/speculative/spec_registry.py", "<module>") in unreviewed
    gates = series_of(candidate_dir)["gates"]
    marked = {(g["file"], g["function"]) for g in gates if g["disposition"] == "unreviewed"}
    assert marked == unreviewed
    carried = [g for g in gates if g["disposition"] != "unreviewed"]
    assert carried and all(g["carried_from"] == "0.5.11" for g in carried)
    # The patched is_dflash() line is carried as covered by 0001, as in the shipped set.
    assert any(
        g["text"] == "return self in (SpeculativeAlgorithm.DFLASH, SpeculativeAlgorithm.DDTREE)"
        and g["patch"] == FITTING[0]
        for g in carried
    )


def test_port_candidate_cannot_be_loaded_while_gates_are_unreviewed(candidate_dir: Path) -> None:
    first = next(g for g in series_of(candidate_dir)["gates"] if g["disposition"] == "unreviewed")
    with pytest.raises(PatchSetError) as refused:
        load_patch_set(candidate_dir)
    assert f"gate {first['file']}:{first['function']} is unreviewed" in str(refused.value)


def test_port_whole_set_fails_naming_hunks_and_lines(whole_port: PortReport) -> None:
    failed = {
        (h.fit.patch[:4], h.file.name, h.fit.index): h.fit.mismatch for h in whole_port.failed
    }
    assert set(failed) == {
        ("0002", "server_args.py", 1),
        ("0002", "server_args.py", 5),
        ("0004", "dflash_utils.py", 2),
    }  # since 0.5.11 is on ddtree_kernels.sglang (docs/ddtree-module.md): its verify hook is a
    # small hunk that lands on 0.5.12 (the fat set moved DFlash's whole accept into a method, a
    # hunk 0.5.12's rewrite failed); dflash_info.py's first hunk is the loader's import, beside
    # context 0.5.12 kept (the proxy's import sat among the renamed accept helpers); the end
    # of dflash_utils.py (its hunk #2, the Verifier/Step hook block) still fails
    assert failed[("0002", "server_args.py", 1)] == (
        "context line 'speculative_dflash_draft_window_size: Optional[int] = None' is not in "
        "the file"
    )
    assert 'removed line \'choices=["DFLASH"' in str(failed[("0002", "server_args.py", 5)])
    assert whole_port.candidate is None and whole_port.exit_code == 5


def test_port_cli_failure_writes_reports_and_no_candidate(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    sets = shipped_sets_root(tmp_path / "src", "0.5.11")
    runs = tmp_path / "runs"
    code = main(
        [
            "action=port",
            f"sglang.version={RELEASE}",
            f"port.sets={sets}",
            f"rollout.runs_dir={runs}",
        ]
    )
    out = " ".join(capsys.readouterr().out.split())  # rich wraps at the terminal's width
    assert code == 5
    assert "3 of 30 hunks of patch set 0.5.11 do not apply to SGLang 0.5.12" in out
    assert "newest reviewed set whose release is not newer than 0.5.12" in out
    (run_dir,) = runs.iterdir()
    names = sorted(p.name for p in run_dir.iterdir())
    assert names == ["debug.log", "events.jsonl", "port-report.json", "port-report.md"]
    report = json.loads((run_dir / "port-report.json").read_text())
    assert report["summary"]["hunks_failed"] == 3 and report["candidate"] is None
    assert (
        "| 0002-server-args-ddtree.patch | sglang/srt/server_args.py | #5 |"
        in (run_dir / "port-report.md").read_text()
    )


def test_port_cli_refuses_release_with_reviewed_set(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = main(["action=port", "sglang.version=0.5.11", f"rollout.runs_dir={tmp_path}"])
    err = capsys.readouterr().err.strip()
    assert code == 5 and "\n" not in err
    assert "already has the reviewed patch set 0.5.11" in err and "action=audit" in err


def test_port_cli_refuses_release_pip_cannot_download(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = main(["action=port", "sglang.version=0.0.99", f"rollout.runs_dir={tmp_path}"])
    err = capsys.readouterr().err.strip()
    assert code == 3 and "\n" not in err and "Traceback" not in err
    assert err.startswith("error: pip download --no-deps sglang==0.0.99 got no wheel")


def test_patch_without_set_points_to_port(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = main(
        [
            "action=patch",
            "sglang.version=0.5.24",
            f"host.sglang_venv={tmp_path / 'venv'}",
            f"host.state_dir={tmp_path / 'state'}",
            f"rollout.runs_dir={tmp_path / 'runs'}",
        ]
    )
    err = capsys.readouterr().err
    assert code == 5
    assert "run `ddtree-deploy action=port sglang.version=0.5.24`" in err
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize(
    ("release", "chosen", "phrase"),
    [
        # 0.5.15.post1 has its own (derived) set now.
        ("0.5.15.post2", "0.5.15.post1", "newest reviewed set"),
        ("0.5.18.post1", "0.5.18", "newest reviewed set"),
        ("0.5.22.post1", "0.5.22", "newest reviewed set"),
        ("0.5.24", "0.5.23", "newest reviewed set"),
        ("0.5.10", "0.5.11", "oldest one above it"),
    ],
)
def test_port_picks_nearest_set_by_pep440_order(release: str, chosen: str, phrase: str) -> None:
    patch_set, why = nearest_patch_set(release, load_patch_sets())
    assert patch_set.name == chosen and phrase in why


def test_port_write_candidate_leaves_nothing_when_its_check_fails(
    fitting_port: PortReport, tmp_path: Path
) -> None:
    assert fitting_port.candidate is not None
    broken_patch = replace(
        fitting_port.candidate.patches[0],
        files=tuple(
            replace(f, sha256_after="0" * 64) for f in fitting_port.candidate.patches[0].files
        ),
    )
    broken = replace(
        fitting_port.candidate, patches=(broken_patch, *fitting_port.candidate.patches[1:])
    )
    with pytest.raises(HunkFailed):
        write_candidate(broken, tmp_path / "out" / "candidate")
    assert list((tmp_path / "out").iterdir()) == []


def test_port_write_candidate_refuses_existing_folder(
    fitting_port: PortReport, tmp_path: Path
) -> None:
    assert fitting_port.candidate is not None
    (tmp_path / "taken").mkdir()
    with pytest.raises(PortRefused):
        write_candidate(fitting_port.candidate, tmp_path / "taken")
    assert list((tmp_path / "taken").iterdir()) == []


def test_port_cli_success_writes_candidate_into_run_folder(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    sets = _fitting_root(tmp_path)
    runs = tmp_path / "runs"
    argv = [
        "action=port",
        f"sglang.version={RELEASE}",
        f"port.sets={sets}",
        f"rollout.runs_dir={runs}",
    ]
    code = main(argv)
    out = " ".join(capsys.readouterr().out.split())
    assert code == 0
    assert "All 16 hunks of patch set 0.5.11 apply to SGLang 0.5.12" in out
    assert "unreviewed: sglang/srt/speculative/spec_registry.py:82" in out
    (run_dir,) = runs.iterdir()
    candidate = run_dir / f"candidate-{RELEASE}"
    assert sorted(p.name for p in candidate.iterdir()) == sorted([*FITTING, "series.yaml"])
    report = json.loads((run_dir / "port-report.json").read_text())
    assert report["candidate"] == str(candidate) and report["exit_code"] == 0
    assert report["summary"]["hunks_failed"] == 0 and report["summary"]["hunks_fuzzed"] == 3


def test_port_cli_refuses_existing_port_out(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "taken").mkdir()
    code = main(
        [
            "action=port",
            f"sglang.version={RELEASE}",
            f"port.out={tmp_path / 'taken'}",
            f"rollout.runs_dir={tmp_path / 'runs'}",
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 5 and "already exists; nothing was written" in err and "\n" not in err


# ---------------------------------------------------------------- 0.5.15 -> 0.5.15.post1 (derived)


def test_port_to_a_post_release_writes_the_shipped_derived_set(tmp_path: Path) -> None:
    """Every 0.5.15 hunk lands on 0.5.15.post1 without fuzz (one at an offset) and every gate site
    has a review, so the candidate also holds the release as a derived set; beside the 0.5.15 set
    it loads as the shipped 0.5.15.post1 set does: its base, its hashes, no review of its own."""
    root = shipped_sets_root(tmp_path, "0.5.15")
    report = port_patch_set("0.5.15.post1", root=root, wheel=wheel_path("0.5.15.post1"))
    assert report.candidate is not None and report.candidate.derivable
    assert {h.status for h in report.hunks} == {HunkStatus.applied, HunkStatus.offset}
    written = write_candidate(report.candidate, tmp_path / "candidate")
    (root / "0.5.15.post1").mkdir()
    shutil.copy(written / "derived" / "series.yaml", root / "0.5.15.post1" / "series.yaml")
    ported = load_patch_set(root / "0.5.15.post1")
    shipped = load_patch_set(patch_sets_root() / "0.5.15.post1")
    assert (ported.base, ported.release) == (shipped.base, shipped.release)
    assert [(p.name, p.files, p.diff_path.name) for p in ported.patches] == [
        (p.name, p.files, p.diff_path.name) for p in shipped.patches
    ]
    assert ported.gates == shipped.gates
