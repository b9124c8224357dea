"""action=port on real wheels: the 0.5.11 set (whole, and the part of it that still fits) to 0.5.12,
the 0.5.14 set to 0.5.15, the 0.5.15 set to 0.5.16, the 0.5.16 set to 0.5.17, the 0.5.17 set to
0.5.18, and the 0.5.23 set back to 0.5.22, 0.5.22's to 0.5.21, 0.5.21's to 0.5.20 and 0.5.20's to
0.5.19.

This is how the reviewed 0.5.12 and 0.5.15 to 0.5.22 sets (patches/sglang/<release>/) began; since
they shipped, these tests port from a sets root holding the shipped source set alone, so they keep
exercising a real port. The 0.5.15 to 0.5.22 ones hold the
reviewed set to that port: it fails exactly at the hunks the reviewed set rewrote, and with those
patches taken from the reviewed set it regenerates it, hashes, diffs and gate reviews.

The whole 0.5.11 set does not port to 0.5.12: 0.5.12 dropped the server-args `choices=[...]`
list and the `speculative_dflash_draft_window_size` field, and rewrote the DFlash acceptance in
dflash_info.py / dflash_utils.py (GNU `patch --fuzz=2` fails the same five hunks). Patches 0001,
0003, 0005 and 0007 alone do port (with offsets and fuzz), so a set made of just those, copied
from the shipped one, is the success case.
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
from patching.trees import own_copy, tree_bytes, wheel_path

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


def _shipped_root(base: Path, name: str = "0.5.11") -> Path:
    """A sets root holding the shipped set `name` alone (the release ported to has its own)."""
    shutil.copytree(patch_sets_root() / name, base / "sets" / name)
    return base / "sets"


@pytest.fixture(scope="module")
def whole_port(tmp_path_factory: pytest.TempPathFactory) -> PortReport:
    root = _shipped_root(tmp_path_factory.mktemp("whole"))
    return port_patch_set(RELEASE, root=root, wheel=wheel_path(RELEASE))


@pytest.fixture
def candidate_dir(fitting_port: PortReport, tmp_path: Path) -> Path:
    assert fitting_port.candidate is not None
    return write_candidate(fitting_port.candidate, tmp_path / f"candidate-{RELEASE}")


def _series(directory: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((directory / "series.yaml").read_text())
    return loaded


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
        *(("0003", "dflash_worker.py", i, HunkStatus.applied, 0, 0) for i in range(1, 8)),
        ("0003", "dflash_worker.py", 8, HunkStatus.fuzzed, 0, 2),
        ("0003", "dflash_worker.py", 9, HunkStatus.applied, 0, 0),
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
    series = _series(candidate_dir)
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
    series = _series(candidate_dir)
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
    raw = _series(reviewed)
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
    gates = _series(candidate_dir)["gates"]
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
    first = next(g for g in _series(candidate_dir)["gates"] if g["disposition"] == "unreviewed")
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
        ("0004", "dflash_info.py", 1),
        ("0004", "dflash_info.py", 2),
        ("0004", "dflash_utils.py", 1),
    }
    assert failed[("0002", "server_args.py", 1)] == (
        "context line 'speculative_dflash_draft_window_size: Optional[int] = None' is not in "
        "the file"
    )
    assert 'removed line \'choices=["DFLASH"' in str(failed[("0002", "server_args.py", 5)])
    assert whole_port.candidate is None and whole_port.exit_code == 5


def test_port_cli_failure_writes_reports_and_no_candidate(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    sets = _shipped_root(tmp_path / "src")
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
    assert "5 of 27 hunks of patch set 0.5.11 do not apply to SGLang 0.5.12" in out
    assert "newest reviewed set whose release is not newer than 0.5.12" in out
    (run_dir,) = runs.iterdir()
    names = sorted(p.name for p in run_dir.iterdir())
    assert names == ["debug.log", "events.jsonl", "port-report.json", "port-report.md"]
    report = json.loads((run_dir / "port-report.json").read_text())
    assert report["summary"]["hunks_failed"] == 5 and report["candidate"] is None
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
    assert "All 14 hunks of patch set 0.5.11 apply to SGLang 0.5.12" in out
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


# ---------------------------------------------------------------- 0.5.14 -> 0.5.15

PORTED = "0.5.15"
WORKER = "0003-ddtree-worker.patch"
HELPERS = "0004-ddtree-verify-input.patch"  # dflash_utils: the worker's new helper lives here
# The 0.5.14 worker hunks whose context 0.5.15 changed, each with the line no longer there: the
# draft runner now shares the target's server args, an in-graph draft sampler replaced the
# eager greedy head, and the worker's batch argument is `batch` (0.5.14: model_worker_batch).
REWRITTEN = {
    2: "draft_server_args = deepcopy(server_args)",
    8: "def _validate_phase1_sampling_support(",
    9: "if draft_hidden is None:",
    11: "batch=model_worker_batch,",
}


def _gate_key(gate: Any) -> tuple[str, str, str]:
    return (str(gate.file), gate.function, gate.text)


def _assert_gates_are_the_reviewed_sets(
    port: PortReport,
    release: str,
    source: str,
    written: frozenset[tuple[str, str, str]] = frozenset(),
) -> tuple[set[tuple[str, str, str]], dict[tuple[str, str, str], Any]]:
    """The sites the port of `source` left unreviewed are the ones `release`'s set reviews new,
    every review carried over keeps its disposition, and the reviews left behind are the sites
    `release` no longer has (plus, since hunks failed and the port scanned no patched text, those
    of the lines the patches write, which `release`'s set reviews). `written`: the new sites only
    a rewritten hunk writes, which the failed port could not see. Returns the unreviewed keys
    and `release`'s reviews, for what each port adds."""
    reviewed = {_gate_key(g): g for g in load_patch_set(patch_sets_root() / release).gates}
    shipped = {_gate_key(g) for g in load_patch_set(patch_sets_root() / source).gates}
    unreviewed = {_gate_key(g.site) for g in port.unreviewed}
    assert unreviewed.isdisjoint(written)
    assert unreviewed | written == {k for k in reviewed if k not in shipped}
    for gate in port.gates:
        if gate.review is not None:
            assert reviewed[_gate_key(gate.site)].disposition is gate.review.disposition
    dropped = {_gate_key(r) for r in port.dropped_reviews}
    gone = shipped - set(reviewed)
    assert gone and gone <= dropped
    assert all(k in reviewed and "DDTREE" in k[2] for k in dropped - gone)
    return unreviewed, reviewed


def _assert_regenerates_the_reviewed_set(port: PortReport, release: str) -> None:
    """The port's candidate is `release`'s reviewed set: patch names, hashes, diffs, gates."""
    candidate = port.candidate
    assert candidate is not None and not port.failed
    reviewed = load_patch_set(patch_sets_root() / release)
    assert [p.name for p in candidate.patches] == [p.name for p in reviewed.patches]
    for made, shipped in zip(candidate.patches, reviewed.patches, strict=True):
        assert [(f.path, f.sha256_before, f.sha256_after) for f in made.files] == [
            (f.path, f.sha256_before, f.sha256_after) for f in shipped.files
        ], made.name
        assert made.text == shipped.diff_path.read_text(), made.name
    ported = {_gate_key(g.site): g.review for g in candidate.gates}
    assert set(ported) == {_gate_key(g) for g in reviewed.gates}


@pytest.fixture(scope="module")
def port_0514(tmp_path_factory: pytest.TempPathFactory) -> PortReport:
    root = _shipped_root(tmp_path_factory.mktemp("p0514"), "0.5.14")
    return port_patch_set(PORTED, root=root, wheel=wheel_path(PORTED))


@pytest.fixture(scope="module")
def port_0514_with_0515_worker(tmp_path_factory: pytest.TempPathFactory) -> PortReport:
    """The shipped 0.5.14 set with the reviewed 0.5.15 set's worker and helper diffs."""
    root = _shipped_root(tmp_path_factory.mktemp("p0514w"), "0.5.14")
    for name in (WORKER, HELPERS):
        shutil.copy(patch_sets_root() / PORTED / name, root / "0.5.14" / name)
    return port_patch_set(PORTED, root=root, wheel=wheel_path(PORTED))


def test_port_0514_to_0515_fails_only_at_the_rewritten_worker_hunks(port_0514: PortReport) -> None:
    failed = {(h.fit.patch, h.file.name, h.fit.index): h.fit.mismatch for h in port_0514.failed}
    assert failed == {
        (WORKER, "dflash_worker_v2.py", i): f"context line {line!r} is not in the file"
        for i, line in REWRITTEN.items()
    }
    assert port_0514.candidate is None and port_0514.exit_code == 5


def test_port_0514_to_0515_gates_are_the_reviewed_sets(port_0514: PortReport) -> None:
    """The sites the port left unreviewed are the ones the 0.5.15 set reviews new (and none stays
    unreviewed there), every review carried over keeps its disposition, and the reviews left
    behind are the sites 0.5.15 no longer has (plus, since hunks failed and the port scanned no
    patched text, those of the lines the patches write, which the 0.5.15 set reviews)."""
    unreviewed, reviewed = _assert_gates_are_the_reviewed_sets(port_0514, PORTED, "0.5.14")
    assert len(unreviewed) == 4
    assert {reviewed[k].disposition.value for k in unreviewed} == {"widened"}


def test_port_0514_with_0515_worker_regenerates_the_reviewed_set(
    port_0514_with_0515_worker: PortReport,
) -> None:
    """Every other 0.5.14 patch ports to exactly the reviewed 0.5.15 diff (so a change to the
    0.5.14 set that 0.5.15's code shares shows up here until 0.5.15 carries it)."""
    _assert_regenerates_the_reviewed_set(port_0514_with_0515_worker, PORTED)


# ---------------------------------------------------------------- 0.5.15 -> 0.5.16

PORTED_0516 = "0.5.16"
# The patches of the 0.5.15 set the 0.5.16 set rewrote (each then taken whole from the 0.5.16 set).
REWRITTEN_0516 = (
    "0001-spec-info-ddtree-enum.patch",
    "0002-server-args-ddtree.patch",
    WORKER,
    "0007-hybrid-linear-attn-ddtree-tree.patch",
)
_MIXIN = "sglang/srt/model_executor/model_runner_kv_cache_mixin.py"
# The 0.5.15 hunks 0.5.16's code no longer fits, each with the port's reason: the enum, the
# hidden-state relay and the algorithm help gained DSPARK, whose fields now follow the DFLASH block
# size; the worker builds its draft runner through build_draft_tp_worker, no longer refuses TP > 1
# for its draft sampler, and keeps the Mamba commit in a flag set at init; SpecInput's token
# scaling became a function; the Mamba pools moved to mem_cache/kv_cache_configurator.py.
FAILED_0516 = {
    (REWRITTEN_0516[0], "spec_info.py", 1): "context line 'EAGLE = auto()' does not match line 38 "
    "('DSPARK = auto()') at the closest match (3 of 6 lines)",
    (REWRITTEN_0516[0], "spec_utils.py", 1): "context line \"# multi_layer_eagle and DFLASH don't "
    'relay hidden_states through FutureMap." is not in the file',
    (REWRITTEN_0516[1], "server_args.py", 1): "removed line '\"Speculative algorithm. Builtins: "
    "EAGLE, EAGLE3, NEXTN, STANDALONE, NGRAM, DF...' is not in the file",
    (REWRITTEN_0516[1], "server_args.py", 2): "context line 'speculative_accept_threshold_single: "
    "A[' does not match line 1753 ('speculative_dspark_block_size: A[') at the closest match (3 "
    "of 6 lines)",
    (WORKER, "dflash_worker_v2.py", 2): "removed line '# Draft runner (separate KV cache + "
    "attention backend).' is not in the file",
    (WORKER, "dflash_worker_v2.py", 6): "context line 'if get_tp_group().world_size != 1:' is not "
    "in the file",
    (WORKER, "dflash_worker_v2.py", 13): "context line 'if need_mamba_verify_commit:' is not in "
    "the file",
    (REWRITTEN_0516[3], "spec_info.py", 1): "context line 'x * c2 for x in "
    "batch.global_num_tokens_for_logprob' is not in the file",
    **{
        (REWRITTEN_0516[3], "model_runner_kv_cache_mixin.py", i): f"{_MIXIN} is not in "
        "sglang==0.5.16"
        for i in (1, 2, 3)
    },
}


@pytest.fixture(scope="module")
def port_0515(tmp_path_factory: pytest.TempPathFactory) -> PortReport:
    root = _shipped_root(tmp_path_factory.mktemp("p0515"), "0.5.15")
    return port_patch_set(PORTED_0516, root=root, wheel=wheel_path(PORTED_0516))


def _port_with_rewrites(
    base: Path, source: str, release: str, rewritten: tuple[str, ...]
) -> PortReport:
    """The port to `release` of the shipped `source` set with `release`'s reviewed `rewritten`
    patches, its manifest naming `release`'s files and hashes (the rewritten patches start from
    `release`'s bytes, so the hash chain of every target runs through them; the port reads no
    hash)."""
    root = _shipped_root(base, source)
    for name in rewritten:
        shutil.copy(patch_sets_root() / release / name, root / source / name)
    raw = _series(root / source)
    files = {p["name"]: p["files"] for p in _series(patch_sets_root() / release)["patches"]}
    for entry in raw["patches"]:
        entry["files"] = files[entry["name"]]
    (root / source / "series.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return port_patch_set(release, root=root, wheel=wheel_path(release))


@pytest.fixture(scope="module")
def port_0515_with_0516_rewrites(tmp_path_factory: pytest.TempPathFactory) -> PortReport:
    """The shipped 0.5.15 set with the reviewed 0.5.16 set's rewritten patches."""
    base = tmp_path_factory.mktemp("p0515w")
    return _port_with_rewrites(base, "0.5.15", PORTED_0516, REWRITTEN_0516)


def test_port_0515_to_0516_fails_only_at_the_rewritten_hunks(port_0515: PortReport) -> None:
    failed = {(h.fit.patch, h.file.name, h.fit.index): h.fit.mismatch for h in port_0515.failed}
    assert failed == FAILED_0516
    assert len(port_0515.hunks) == 40
    assert port_0515.candidate is None and port_0515.exit_code == 5


def test_port_0515_to_0516_gates_are_the_reviewed_sets(port_0515: PortReport) -> None:
    """The sites the port left unreviewed are the ones the 0.5.16 set reviews new (0.5.16 asks
    is_dflash_family() at most runtime gates; the one new review the port cannot see is the line
    0001 writes, as hunks failed and the port scanned no patched text), and none stays unreviewed
    there; every review carried over keeps its disposition; the reviews left behind are the sites
    0.5.16 no longer has, plus those of the lines the 0.5.15 patches write."""
    reviewed = {_gate_key(g): g for g in load_patch_set(patch_sets_root() / PORTED_0516).gates}
    shipped = {_gate_key(g) for g in load_patch_set(patch_sets_root() / "0.5.15").gates}
    unreviewed = {_gate_key(g.site) for g in port_0515.unreviewed}
    new = {k for k in reviewed if k not in shipped}
    assert len(unreviewed) == 17
    assert unreviewed == {k for k in new if "DDTREE" not in k[2]}
    assert [reviewed[k].disposition.value for k in new - unreviewed] == ["covered"]
    dispositions = [reviewed[k].disposition.value for k in unreviewed]
    assert sorted(set(dispositions)) == ["covered", "dflash-only", "widened"]
    assert dispositions.count("widened") == 14
    for gate in port_0515.gates:
        if gate.review is not None:
            assert reviewed[_gate_key(gate.site)].disposition is gate.review.disposition
    dropped = {_gate_key(r) for r in port_0515.dropped_reviews}
    gone = shipped - set(reviewed)
    assert gone and gone <= dropped
    assert all(k in reviewed and "DDTREE" in k[2] for k in dropped - gone)


def test_port_0515_with_0516_rewrites_regenerates_the_reviewed_set(
    port_0515_with_0516_rewrites: PortReport,
) -> None:
    """Every other 0.5.15 patch ports to exactly the reviewed 0.5.16 diff (so a change to the
    0.5.15 set that 0.5.16's code shares shows up here until 0.5.16 carries it), and the port
    meets exactly the reviewed gate sites."""
    candidate = port_0515_with_0516_rewrites.candidate
    assert candidate is not None
    reviewed = load_patch_set(patch_sets_root() / PORTED_0516)
    assert [p.name for p in candidate.patches] == [p.name for p in reviewed.patches]
    for made, shipped in zip(candidate.patches, reviewed.patches, strict=True):
        assert [(f.path, f.sha256_before, f.sha256_after) for f in made.files] == [
            (f.path, f.sha256_before, f.sha256_after) for f in shipped.files
        ], made.name
        assert made.text == shipped.diff_path.read_text(), made.name
    ported = {_gate_key(g.site) for g in candidate.gates}
    assert ported == {_gate_key(g) for g in reviewed.gates}


# ---------------------------------------------------------------- 0.5.23 -> 0.5.22 (backwards)

BACKPORTED = "0.5.22"
# The patches the 0.5.22 set rewrote, each failing hunk (file, index) with why it failed:
# 0.5.22 has no spec-decode metrics tuple, no dflash_dp module and no draft_parallel import; its
# worker keeps the draft placement in `draft_owns_attention` (0.5.23: `draft_parallel_layout`),
# has no deferred target-verify gather (so no `target_predict` to pass on) and no
# `target_dp_enabled`; its dflash_utils ends past the line 0.5.23's helpers are appended after.
# The worker patch also rewrote two hunks that apply: 14 named 0.5.23's draft_parallel_layout
# (test_verify_path_worker_v2's name check holds that), and 12's tree accept took 0.5.23's
# `target_predict`, an argmax 0.5.22 never has (its verify logits are always gathered).
BACKPORT_FAILED = {
    ("0001-spec-info-ddtree-enum.patch", "metrics_reporter.py", 1): "context line "
    "'SpeculativeAlgorithm.EAGLE,' is not in the file",
    (WORKER, "dflash_worker_v2.py", 1): "context line "
    "'from sglang.srt.speculative.dflash_dp import gather_draft_embedding' is not in the file",
    (WORKER, "dflash_worker_v2.py", 3): "removed line "
    "'with draft_pp_context(), draft_tp_context(self.draft_parallel_layout):' is not in the file",
    (WORKER, "dflash_worker_v2.py", 6): "context line "
    "'self._target_logits_processor = self._defer_target_verify_gather()' is not in the file",
    (WORKER, "dflash_worker_v2.py", 7): "context line "
    "'draft_tp_context(self.draft_parallel_layout),' is not in the file",
    (WORKER, "dflash_worker_v2.py", 8): "context line "
    "'target_dp_enabled = get_parallel().attn_dp_enabled' is not in the file",
    (WORKER, "dflash_worker_v2.py", 18): "removed line 'target_predict=target_predict,' is not "
    "in the file",
    (HELPERS, "dflash_utils.py", 5): "its lines match only before the end of the previous hunk",
    ("0006-hybrid-mamba-pool-ddtree-tree.patch", "kv_cache_configurator.py", 1): "context line "
    "'from sglang.srt.speculative.draft_parallel import legacy_draft_attn_tp_size' is not in "
    "the file",
}
BACKPORT_REWRITTEN = sorted({patch for patch, _, _ in BACKPORT_FAILED})


@pytest.fixture(scope="module")
def port_0523(tmp_path_factory: pytest.TempPathFactory) -> PortReport:
    root = _shipped_root(tmp_path_factory.mktemp("p0523"), "0.5.23")
    return port_patch_set(BACKPORTED, root=root, wheel=wheel_path(BACKPORTED))


@pytest.fixture(scope="module")
def port_0523_with_0522_rewrites(tmp_path_factory: pytest.TempPathFactory) -> PortReport:
    """The shipped 0.5.23 set with the reviewed 0.5.22 set's rewritten patches (and their file
    lists: 0.5.22's 0001 has no metrics_reporter.py)."""
    root = _shipped_root(tmp_path_factory.mktemp("p0523r"), "0.5.23")
    source = root / "0.5.23"
    series = _series(source)
    ours = {p["name"]: p for p in _series(patch_sets_root() / BACKPORTED)["patches"]}
    for entry in series["patches"]:
        if entry["name"] in BACKPORT_REWRITTEN:
            entry["files"] = ours[entry["name"]]["files"]
            shutil.copy(patch_sets_root() / BACKPORTED / entry["name"], source / entry["name"])
    (source / "series.yaml").write_text(yaml.safe_dump(series, sort_keys=False))
    return port_patch_set(BACKPORTED, root=root, wheel=wheel_path(BACKPORTED))


def test_port_0523_to_0522_fails_only_at_the_rewritten_hunks(port_0523: PortReport) -> None:
    failed = {(h.fit.patch, h.file.name, h.fit.index): h.fit.mismatch for h in port_0523.failed}
    assert failed == BACKPORT_FAILED
    assert port_0523.candidate is None and port_0523.exit_code == 5


def test_port_0523_to_0522_gates_are_the_reviewed_sets(port_0523: PortReport) -> None:
    """The sites the port left unreviewed are the two the 0.5.22 set reviews new (an NPU site
    whose line 0.5.23 wraps, and DeepSeek-V4's prefill snapshot, gone by 0.5.23), every review
    carried over keeps its disposition, and the reviews left behind are the sites 0.5.22 does not
    have (plus the lines the failed hunks would have written)."""
    unreviewed, reviewed = _assert_gates_are_the_reviewed_sets(port_0523, BACKPORTED, "0.5.23")
    assert {key[0].rsplit("/", 1)[1] for key in unreviewed} == {
        "ascend_backend.py", "deepseek_v4_backend.py",
    }  # fmt: skip
    assert {reviewed[k].disposition.value for k in unreviewed} == {"widened"}


def test_port_0523_with_0522_rewrites_regenerates_the_reviewed_set(
    port_0523_with_0522_rewrites: PortReport,
) -> None:
    """0.5.23's 0002 and 0005 port to exactly the reviewed 0.5.22 diffs, and the rewritten ones
    come back unchanged (so a change to the 0.5.23 set that 0.5.22's code shares shows up here
    until 0.5.22 carries it)."""
    _assert_regenerates_the_reviewed_set(port_0523_with_0522_rewrites, BACKPORTED)


# ---------------------------------------------------------------- 0.5.22 -> 0.5.21 (backwards)

PORTED_BACK = "0.5.21"
# 0.5.22's worker hunks whose context 0.5.21 lacks, each with why it failed: 0.5.21 enters the
# draft's TP scope through its own `self.draft_tp_context(group, owns_attention=...)` (0.5.22:
# `draft_tp_context(self.draft_owns_attention)`, the flag read from `attn_dp_enabled`), plans no
# KV window (no `kv_loc_plan`) and captures no sampling mask (it refuses return_sampling_mask
# with speculative decoding). The worker patch also rewrote one hunk that applies: 14, the tree
# proposal, entered 0.5.22's `draft_tp_context(flag)`, which 0.5.21's context takes as its group
# (test_verify_path_worker_v2's name check and checks_0523's worker doubles hold that); and the
# accept hunk (18) keeps 0.5.21's `target_predict` and runs SGLANG_SIMULATE_ACC_LEN's forced
# chain acceptance for DFLASH only, as 0.5.22 does inside `_accept_block`.
PORTED_BACK_FAILED = {
    (WORKER, "dflash_worker_v2.py", 3): "context line "
    "'self.draft_owns_attention = get_parallel().attn_dp_enabled' is not in the file",
    (WORKER, "dflash_worker_v2.py", 7): "context line "
    "'draft_tp_context(self.draft_owns_attention),' is not in the file",
    (WORKER, "dflash_worker_v2.py", 8): "context line "
    "'draft_tp_context(self.draft_owns_attention),' is not in the file",
    (WORKER, "dflash_worker_v2.py", 15): "removed line 'kv_loc_plan=kv_loc_plan,' is not in "
    "the file",
    (WORKER, "dflash_worker_v2.py", 18): "context line "
    "'sampling_mask_capture = SpeculativeSamplingMaskCapture.from_logits(' is not in the file",
}


@pytest.fixture(scope="module")
def port_0522(tmp_path_factory: pytest.TempPathFactory) -> PortReport:
    root = _shipped_root(tmp_path_factory.mktemp("p0522"), BACKPORTED)
    return port_patch_set(PORTED_BACK, root=root, wheel=wheel_path(PORTED_BACK))


@pytest.fixture(scope="module")
def port_0522_with_0521_worker(tmp_path_factory: pytest.TempPathFactory) -> PortReport:
    """The shipped 0.5.22 set with the reviewed 0.5.21 set's worker diff (and its hashes)."""
    root = _shipped_root(tmp_path_factory.mktemp("p0522w"), BACKPORTED)
    source = root / BACKPORTED
    series = _series(source)
    ours = {p["name"]: p for p in _series(patch_sets_root() / PORTED_BACK)["patches"]}
    for entry in series["patches"]:
        if entry["name"] == WORKER:
            entry["files"] = ours[WORKER]["files"]
    shutil.copy(patch_sets_root() / PORTED_BACK / WORKER, source / WORKER)
    (source / "series.yaml").write_text(yaml.safe_dump(series, sort_keys=False))
    return port_patch_set(PORTED_BACK, root=root, wheel=wheel_path(PORTED_BACK))


def test_port_0522_to_0521_fails_only_at_the_rewritten_worker_hunks(port_0522: PortReport) -> None:
    failed = {(h.fit.patch, h.file.name, h.fit.index): h.fit.mismatch for h in port_0522.failed}
    assert failed == PORTED_BACK_FAILED
    assert port_0522.candidate is None and port_0522.exit_code == 5


def test_port_0522_to_0521_gates_are_the_reviewed_sets(port_0522: PortReport) -> None:
    """The one site the port left unreviewed is the one the 0.5.21 set reviews new: the DFlash
    request validation in the scheduler, whose method 0.5.22 renamed (`_handle_generate_request`)."""
    unreviewed, reviewed = _assert_gates_are_the_reviewed_sets(port_0522, PORTED_BACK, BACKPORTED)
    assert unreviewed == {
        (
            "sglang/srt/managers/scheduler.py",
            "Scheduler.handle_generate_request",
            "if self.spec_algorithm.is_dflash_family():",
        )
    }
    assert {reviewed[k].disposition.value for k in unreviewed} == {"widened"}


def test_port_0522_with_0521_worker_regenerates_the_reviewed_set(
    port_0522_with_0521_worker: PortReport,
) -> None:
    """Every 0.5.22 patch but the worker ports to exactly the reviewed 0.5.21 diff, and the
    rewritten worker comes back unchanged (so a change to the 0.5.22 set that 0.5.21's code shares
    shows up here until 0.5.21 carries it)."""
    _assert_regenerates_the_reviewed_set(port_0522_with_0521_worker, PORTED_BACK)


# ---------------------------------------------------------------- 0.5.21 -> 0.5.20 (backwards)

SIGNATURE_PS = "0.5.20"  # the last release whose DFlashWorkerV2.__init__ takes `ps`
SERVER_ARGS = "0002-server-args-ddtree.patch"
ENUM = "0001-spec-info-ddtree-enum.patch"
# 0.5.21's hunks whose context 0.5.20 lacks, each with why it failed: 0.5.20's replay-SSM refusal
# asks kimi_linear_config() (0.5.21: self.hybrid_kda_config); its draft-window warning lists
# ("EAGLE3", "DFLASH") (0.5.21 adds EAGLE) and its DFLASH device check names no `algorithm`
# (0.5.21's platform hook does); its worker, which still takes `ps`, enters no draft_pp_context
# and passes the draft runner's TP group alone to its own `self.draft_tp_context` (0.5.21 adds
# `owns_attention=`), and has no LiLiCorr head to branch past. The worker patch also rewrote two
# hunks that apply: 6 (`_init_ddtree`) refused LiLiCorr drafts through `self.lilicorr`, which
# 0.5.20's worker never sets (test_verify_path_worker_v2's name check holds that), and 8 (the
# hybrid tree links) only fuzzed.
PS_FAILED = {
    (ENUM, "kv_cache_configurator.py", 1): "context line "
    "'and self.hybrid_kda_config is None' is not in the file",
    (SERVER_ARGS, "speculative_hook.py", 1): "removed line "
    '\'if cfg.speculative_algorithm not in ("EAGLE", "EAGLE3", "DFLASH"):\' is not in the file',
    (SERVER_ARGS, "speculative_hook.py", 2): "removed line 'algorithm = \"DFLASH\"' is not in the "
    "file",
    (WORKER, "dflash_worker_v2.py", 3): "removed line "
    "'with draft_pp_context(), draft_init_ctx:' is not in the file",
    (WORKER, "dflash_worker_v2.py", 7): "context line "
    "'self.draft_model_runner.tp_group,' is not in the file",
    (WORKER, "dflash_worker_v2.py", 9): "context line "
    "'self.draft_model_runner.tp_group,' is not in the file",
    (WORKER, "dflash_worker_v2.py", 15): "context line "
    "'if lilicorr_q_rows is not None and not _is_all_greedy(batch.sampling_info):' is not in "
    "the file",
}
PS_REWRITTEN = sorted({patch for patch, _, _ in PS_FAILED})
# The draft-window warning's line as 0002 writes it for 0.5.20: a new site only the rewritten
# hunk writes, so the failed port never scanned it.
PS_WRITTEN = frozenset(
    {
        (
            "sglang/srt/arg_groups/speculative_hook.py",
            "handle_speculative_decoding",
            'if cfg.speculative_algorithm not in ("EAGLE3", "DFLASH", "DDTREE"):',
        )
    }
)


@pytest.fixture(scope="module")
def port_0521(tmp_path_factory: pytest.TempPathFactory) -> PortReport:
    root = _shipped_root(tmp_path_factory.mktemp("p0521"), PORTED_BACK)
    return port_patch_set(SIGNATURE_PS, root=root, wheel=wheel_path(SIGNATURE_PS))


@pytest.fixture(scope="module")
def port_0521_with_0520_rewrites(tmp_path_factory: pytest.TempPathFactory) -> PortReport:
    """The shipped 0.5.21 set with the reviewed 0.5.20 set's rewritten patches. Every patch takes
    0.5.20's file hashes: the rewritten 0001 and 0002 share a file with 0006 and 0005, whose
    pre-images must be what the rewritten patches leave."""
    root = _shipped_root(tmp_path_factory.mktemp("p0521r"), PORTED_BACK)
    source = root / PORTED_BACK
    series = _series(source)
    ours = {p["name"]: p for p in _series(patch_sets_root() / SIGNATURE_PS)["patches"]}
    for entry in series["patches"]:
        entry["files"] = ours[entry["name"]]["files"]
        if entry["name"] in PS_REWRITTEN:
            shutil.copy(patch_sets_root() / SIGNATURE_PS / entry["name"], source / entry["name"])
    (source / "series.yaml").write_text(yaml.safe_dump(series, sort_keys=False))
    return port_patch_set(SIGNATURE_PS, root=root, wheel=wheel_path(SIGNATURE_PS))


def test_port_0521_to_0520_fails_only_at_the_rewritten_hunks(port_0521: PortReport) -> None:
    failed = {(h.fit.patch, h.file.name, h.fit.index): h.fit.mismatch for h in port_0521.failed}
    assert failed == PS_FAILED
    assert port_0521.candidate is None and port_0521.exit_code == 5


def test_port_0521_to_0520_gates_are_the_reviewed_sets(port_0521: PortReport) -> None:
    """The sites the port left unreviewed are the four the 0.5.20 set reviews new, where 0.5.21
    writes the test otherwise: the draft-window warning (0002 adds DDTREE to it), an NPU replay
    copy 0.5.21 splits in two, the draft runner's input-embeds copy, and the prefill read-done
    fastpath 0.5.21 moves into SpeculativeAlgorithm."""
    unreviewed, reviewed = _assert_gates_are_the_reviewed_sets(
        port_0521, SIGNATURE_PS, PORTED_BACK, PS_WRITTEN
    )
    assert {key[0].rsplit("/", 1)[1] for key in unreviewed} == {
        "speculative_hook.py", "npu_graph_runner.py", "decode_cuda_graph_runner.py",
        "shared_read_event.py",
    }  # fmt: skip
    assert {reviewed[k].disposition.value for k in unreviewed} == {"covered", "widened"}
    assert {reviewed[k].disposition.value for k in PS_WRITTEN} == {"covered"}


def test_port_0521_with_0520_rewrites_regenerates_the_reviewed_set(
    port_0521_with_0520_rewrites: PortReport,
) -> None:
    """0.5.21's 0004 to 0006 port to exactly the reviewed 0.5.20 diffs, and the rewritten ones
    come back unchanged (so a change to the 0.5.21 set that 0.5.20's code shares shows up here
    until 0.5.20 carries it)."""
    _assert_regenerates_the_reviewed_set(port_0521_with_0520_rewrites, SIGNATURE_PS)


# ---------------------------------------------------------------- 0.5.15 -> 0.5.15.post1 (derived)


def test_port_to_a_post_release_writes_the_shipped_derived_set(tmp_path: Path) -> None:
    """Every 0.5.15 hunk lands on 0.5.15.post1 without fuzz (one at an offset) and every gate site
    has a review, so the candidate also holds the release as a derived set; beside the 0.5.15 set
    it loads as the shipped 0.5.15.post1 set does: its base, its hashes, no review of its own."""
    root = _shipped_root(tmp_path, "0.5.15")
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


# ---------------------------------------------------------------- 0.5.20 -> 0.5.19 (backwards)

# The last release whose server-argument fields are annotated in server_args.py.
ANNOTATED = "0.5.19"
HELPERS_0519 = "0004-ddtree-verify-input.patch"
# 0.5.20's hunks whose context 0.5.19 lacks: it has no UNO member to anchor DDTREE after, no
# arg_groups/fields/spec.py (0002 adds the fields to server_args.py's speculative section, as
# 0.5.16's set does), a DFLASH device check of CUDA or NPU on one line (no XPU); its worker enters
# no draft TP scope at all (its draft runner shares the target's TP group), has no Domino head,
# and its third Mamba request pool spells its layer ids inline.
ANNOTATED_FAILED = {
    (ENUM, "spec_info.py", 1): "context line 'UNO = auto()' is not in the file",
    (SERVER_ARGS, "spec.py", 1): "sglang/srt/arg_groups/fields/spec.py is not in sglang==0.5.19",
    (SERVER_ARGS, "spec.py", 2): "sglang/srt/arg_groups/fields/spec.py is not in sglang==0.5.19",
    (SERVER_ARGS, "speculative_hook.py", 2): "removed line 'if not (' is not in the file",
    (WORKER, "dflash_worker_v2.py", 3): "context line "
    "'draft_init_ctx = draft_tp_context(get_parallel().attn_tp_group)' is not in the file",
    (WORKER, "dflash_worker_v2.py", 5): "context line "
    "'if self._is_domino and self.block_size <= 1:' is not in the file",
    (WORKER, "dflash_worker_v2.py", 7): "removed line "
    "'with self.draft_tp_context(self.draft_model_runner.tp_group):' is not in the file",
    (WORKER, "dflash_worker_v2.py", 8): "removed line "
    "'with self.draft_tp_context(self.draft_model_runner.tp_group):' is not in the file",
    (WORKER, "dflash_worker_v2.py", 14): "context line "
    "'anchor_token_ids=block_ids[:, 0],' is not in the file",
    ("0006-hybrid-mamba-pool-ddtree-tree.patch", "kv_cache_configurator.py", 3): "context line "
    "'mamba_layer_ids=self._get_mamba_layer_ids_for_req_pool(),' is not in the file",
}
# A hunk that lands with fuzz 2 in the wrong place: the tree's retrieve arrays would replace the
# chain's after the sampling kernel ran, not before. 0004 was rewritten to put it back.
ANNOTATED_MISPLACED = (HELPERS_0519, "dflash_utils.py", 3)
ANNOTATED_REWRITTEN = sorted({p for p, _, _ in ANNOTATED_FAILED} | {ANNOTATED_MISPLACED[0]})


@pytest.fixture(scope="module")
def port_0520(tmp_path_factory: pytest.TempPathFactory) -> PortReport:
    root = _shipped_root(tmp_path_factory.mktemp("p0520"), SIGNATURE_PS)
    return port_patch_set(ANNOTATED, root=root, wheel=wheel_path(ANNOTATED))


@pytest.fixture(scope="module")
def port_0520_with_0519_rewrites(tmp_path_factory: pytest.TempPathFactory) -> PortReport:
    """The shipped 0.5.20 set with the reviewed 0.5.19 set's rewritten patches, every patch
    taking 0.5.19's file hashes (0002 names server_args.py where 0.5.20's names fields/spec.py)."""
    root = _shipped_root(tmp_path_factory.mktemp("p0520r"), SIGNATURE_PS)
    source = root / SIGNATURE_PS
    series = _series(source)
    ours = {p["name"]: p for p in _series(patch_sets_root() / ANNOTATED)["patches"]}
    for entry in series["patches"]:
        entry["files"] = ours[entry["name"]]["files"]
        if entry["name"] in ANNOTATED_REWRITTEN:
            shutil.copy(patch_sets_root() / ANNOTATED / entry["name"], source / entry["name"])
    (source / "series.yaml").write_text(yaml.safe_dump(series, sort_keys=False))
    return port_patch_set(ANNOTATED, root=root, wheel=wheel_path(ANNOTATED))


def test_port_0520_to_0519_fails_only_at_the_rewritten_hunks(port_0520: PortReport) -> None:
    failed = {(h.fit.patch, h.file.name, h.fit.index): h.fit.mismatch for h in port_0520.failed}
    assert failed == ANNOTATED_FAILED
    misplaced = next(
        h for h in port_0520.hunks if (h.fit.patch, h.file.name, h.fit.index) == ANNOTATED_MISPLACED
    )
    assert misplaced.status is HunkStatus.fuzzed
    assert port_0520.candidate is None and port_0520.exit_code == 5


def test_port_0520_to_0519_gates_are_the_reviewed_sets(port_0520: PortReport) -> None:
    """0.5.19 has no gate site 0.5.20's set does not review, so the port leaves none unreviewed
    and the 0.5.19 set reviews nothing new; the reviews left behind are the three sites 0.5.19
    lacks (two Ascend attention gates, the PD DFlash draft input) and the DDTREE lines the
    patches write, which the failed port never scanned."""
    unreviewed, _ = _assert_gates_are_the_reviewed_sets(port_0520, ANNOTATED, SIGNATURE_PS)
    assert unreviewed == set()
    shipped = {_gate_key(g) for g in load_patch_set(patch_sets_root() / SIGNATURE_PS).gates}
    reviewed = {_gate_key(g) for g in load_patch_set(patch_sets_root() / ANNOTATED).gates}
    assert {(k[0].rsplit("/", 1)[1], k[1]) for k in shipped - reviewed} == {
        ("ascend_backend.py", "AscendAttnBackend.init_forward_metadata"),
        ("spec_info.py", "SpeculativeAlgorithm.build_disagg_draft_input"),
    }


def test_port_0520_with_0519_rewrites_regenerates_the_reviewed_set(
    port_0520_with_0519_rewrites: PortReport,
) -> None:
    """0.5.20's 0005 ports to exactly the reviewed 0.5.19 diff, and the rewritten ones come back
    unchanged (so a change to the 0.5.20 set that 0.5.19's code shares shows up here until 0.5.19
    carries it)."""
    _assert_regenerates_the_reviewed_set(port_0520_with_0519_rewrites, ANNOTATED)


# ---------------------------------------------------------------- 0.5.16 -> 0.5.17

PORTED_0517 = "0.5.17"
_SERVER_ARGS_PY = "sglang/srt/server_args.py"
# The patches of the 0.5.16 set the 0.5.17 set rewrote (each then taken whole from the 0.5.17 set):
# the ones with failing hunks, and 0004, whose hunks fit but whose helpers 0.5.17 needs changed
# (a deep copy of the read-only server args, the draft runner's spec-bag scope, the grammar
# refusal), as 0002 and 0007 also gained hunks for 0.5.17's new gates.
REWRITTEN_0517 = (REWRITTEN_0516[1], WORKER, HELPERS, REWRITTEN_0516[3])
# The 0.5.16 hunks 0.5.17's code no longer fits, each with the port's reason: the server-args
# fields carry NS("spec") (0.5.17 publishes them into its config bags); the worker imports the
# exec bag and the grammar and simulated-acceptance helpers, and masks a grammar over its chain
# before the accept; the Mamba pools read the top-k from the spec bag.
FAILED_0517 = {
    (REWRITTEN_0517[0], "server_args.py", 1): "context line '] = None' does not match line 2027 "
    "('NS(\"spec\"),') at the closest match (4 of 7 lines)",
    (WORKER, "dflash_worker_v2.py", 1): "context line ')' does not match line 31 ('from "
    "sglang.srt.server_args import ServerArgs') at the closest match (8 of 14 lines)",
    (WORKER, "dflash_worker_v2.py", 11): "context line 'lm_head=lm_head,' does not match line 1649 "
    "('draft_tokens[:, 1:].copy_(draft_next)') at the closest match (18 of 24 lines)",
    (WORKER, "dflash_worker_v2.py", 12): "context line 'candidates = draft_tokens' does not match "
    "line 1718 ('# Constrain every chain position before accept picks from it.') at the closest "
    "match (6 of 12 lines)",
    **{
        (REWRITTEN_0517[3], "kv_cache_configurator.py", i): "removed line "
        "'speculative_eagle_topk=self.server_args.speculative_eagle_topk,' is not in the file"
        for i in (2, 3)
    },
}


@pytest.fixture(scope="module")
def port_0516(tmp_path_factory: pytest.TempPathFactory) -> PortReport:
    root = _shipped_root(tmp_path_factory.mktemp("p0516"), PORTED_0516)
    return port_patch_set(PORTED_0517, root=root, wheel=wheel_path(PORTED_0517))


@pytest.fixture(scope="module")
def port_0516_with_0517_rewrites(tmp_path_factory: pytest.TempPathFactory) -> PortReport:
    """The shipped 0.5.16 set with the reviewed 0.5.17 set's rewritten patches."""
    base = tmp_path_factory.mktemp("p0516w")
    return _port_with_rewrites(base, PORTED_0516, PORTED_0517, REWRITTEN_0517)


def test_port_0516_to_0517_fails_only_at_the_rewritten_hunks(port_0516: PortReport) -> None:
    failed = {(h.fit.patch, h.file.name, h.fit.index): h.fit.mismatch for h in port_0516.failed}
    assert failed == FAILED_0517
    assert len(port_0516.hunks) == 40
    assert port_0516.candidate is None and port_0516.exit_code == 5


def test_port_0516_to_0517_gates_are_the_reviewed_sets(port_0516: PortReport) -> None:
    """The 7 sites the port left unreviewed are the ones the 0.5.17 set reviews new: string gates
    around the ReplaySSM spec-verify and lazy Mamba caching (covered: DDTREE joins DFLASH there),
    grammar overlap, an NPU verify layout and two gates 0.5.17 rewrote (widened); the 3 lines
    0002 and 0007 write there are reviewed covered."""
    written = frozenset(
        (file, function, text)
        for file, function, text in (
            (_SERVER_ARGS_PY, "ServerArgs._validate_mamba_extra_buffer",
             'assert algo not in ("DFLASH", "DDTREE"), ('),
            (_SERVER_ARGS_PY, "ServerArgs._handle_linear_attn_backend",
             'if _algo not in ("DSPARK", "DFLASH", "DDTREE") or verify not in ('),
            ("sglang/srt/mem_cache/kv_cache_configurator.py",
             "KVCacheConfigurator._build_hybrid_req_pool", 'and _algo in ("DSPARK", "DFLASH", "DDTREE")'),
        )
    )  # fmt: skip
    unreviewed, reviewed = _assert_gates_are_the_reviewed_sets(
        port_0516, PORTED_0517, PORTED_0516, written
    )
    dispositions = [reviewed[k].disposition.value for k in unreviewed]
    assert sorted(dispositions) == ["covered"] * 3 + ["widened"] * 4
    assert {reviewed[k].disposition.value for k in written} == {"covered"}


def test_port_0516_with_0517_rewrites_regenerates_the_reviewed_set(
    port_0516_with_0517_rewrites: PortReport,
) -> None:
    """Every other 0.5.16 patch ports to exactly the reviewed 0.5.17 diff, and the rewritten ones
    come back unchanged (so a change to the 0.5.16 set that 0.5.17's code shares shows up here
    until 0.5.17 carries it)."""
    _assert_regenerates_the_reviewed_set(port_0516_with_0517_rewrites, PORTED_0517)


# ---------------------------------------------------------------- 0.5.17 -> 0.5.18

PORTED_0518 = "0.5.18"
_KV_CONFIGURATOR_PY = "sglang/srt/mem_cache/kv_cache_configurator.py"
# The patches of the 0.5.17 set the 0.5.18 set rewrote (each then taken whole from the 0.5.18 set):
# the ones with failing hunks (0004's also refuses log-prob requests and writes the draft runner's
# server-args copy past the read-only guard, 0.5.18 having no ServerArgs.override; 0003's also
# refuses a tree on a target head without a dense weight). 0005 and 0006 port unchanged.
REWRITTEN_0518 = (*REWRITTEN_0516[:2], WORKER, HELPERS, REWRITTEN_0516[3])
# The 0.5.17 hunks 0.5.18's code no longer fits, each with the port's reason: spec_utils and the
# KV-cache configurator read the spec bag and runtime_context's predicates, the worker imports
# the schedule bag, dflash_utils grew Triton kernels after validate_dflash_request, and the
# extra_buffer_lazy assert 0002 widened is gone.
FAILED_0518 = {
    (REWRITTEN_0518[0], "spec_utils.py", 1): "removed line 'if "
    'server_args.speculative_algorithm in ("STANDALONE", "DFLASH", "DSPARK"):\' is not in the file',
    (REWRITTEN_0518[1], "server_args.py", 3): "context line 'algo = "
    '(view.speculative_algorithm or "").upper()\' is not in the file',
    (WORKER, "dflash_worker_v2.py", 1): "removed line 'from sglang.srt.runtime_context import "
    "get_exec' is not in the file",
    (HELPERS, "dflash_utils.py", 5): "its lines match only before the end of the previous hunk",
    (REWRITTEN_0518[4], "kv_cache_configurator.py", 2): "context line "
    "'speculative_num_draft_tokens=self.server_args.max_speculative_num_draft_tokens,' is not in "
    "the file",
    (REWRITTEN_0518[4], "kv_cache_configurator.py", 3): "context line '_algo = "
    '(self.server_args.speculative_algorithm or "").upper()\' is not in the file',
    (REWRITTEN_0518[4], "kv_cache_configurator.py", 4): "context line "
    "'enable_mamba_extra_buffer=self.server_args.enable_mamba_extra_buffer(),' is not in the file",
}


@pytest.fixture(scope="module")
def port_0517(tmp_path_factory: pytest.TempPathFactory) -> PortReport:
    root = _shipped_root(tmp_path_factory.mktemp("p0517"), PORTED_0517)
    return port_patch_set(PORTED_0518, root=root, wheel=wheel_path(PORTED_0518))


@pytest.fixture(scope="module")
def port_0517_with_0518_rewrites(tmp_path_factory: pytest.TempPathFactory) -> PortReport:
    """The shipped 0.5.17 set with the reviewed 0.5.18 set's rewritten patches."""
    base = tmp_path_factory.mktemp("p0517w")
    return _port_with_rewrites(base, PORTED_0517, PORTED_0518, REWRITTEN_0518)


def test_port_0517_to_0518_fails_only_at_the_rewritten_hunks(port_0517: PortReport) -> None:
    failed = {(h.fit.patch, h.file.name, h.fit.index): h.fit.mismatch for h in port_0517.failed}
    assert failed == FAILED_0518
    assert len(port_0517.hunks) == 48
    assert port_0517.candidate is None and port_0517.exit_code == 5


def test_port_0517_to_0518_gates_are_the_reviewed_sets(port_0517: PortReport) -> None:
    """The 3 sites the port left unreviewed are the ones the 0.5.18 set reviews new: the DFlash
    draft pool's KV cell size and the spec worker's draft runners (widened), and the FutureMap
    relay gate spec_utils now asks of the spec bag (covered by 0001, whose line is written only
    by the rewritten hunk). 0.5.17's extra_buffer_lazy assert and two cuda-graph gates are gone."""
    written = frozenset(
        {
            (
                "sglang/srt/speculative/spec_utils.py",
                "spec_need_hidden_states",
                'if spec.speculative_algorithm in ("STANDALONE", "DFLASH", "DDTREE", "DSPARK"):',
            )
        }
    )
    unreviewed, reviewed = _assert_gates_are_the_reviewed_sets(
        port_0517, PORTED_0518, PORTED_0517, written
    )
    dispositions = [reviewed[k].disposition.value for k in unreviewed]
    assert sorted(dispositions) == ["covered"] + ["widened"] * 2
    dropped = {_gate_key(r) for r in port_0517.dropped_reviews}
    assert (
        _SERVER_ARGS_PY,
        "ServerArgs._validate_mamba_extra_buffer",
        'assert algo != "DFLASH", (',
    ) in dropped
    assert _KV_CONFIGURATOR_PY in {k[0] for k in reviewed}


def test_port_0517_with_0518_rewrites_regenerates_the_reviewed_set(
    port_0517_with_0518_rewrites: PortReport,
) -> None:
    """Every other 0.5.17 patch (0005, 0006) ports to exactly the reviewed 0.5.18 diff, and the
    rewritten ones come back unchanged."""
    _assert_regenerates_the_reviewed_set(port_0517_with_0518_rewrites, PORTED_0518)
