"""Data-driven patch cases (`cases/<name>/`): tree before, series, expected result.

Each case that applies is checked three ways: the files hash to the manifest's post-images
(and equal `expected/` where the case has one), the per-hunk offsets are the case's, and GNU
`patch -p1 --fuzz=0` on a second pristine copy gives the same bytes and offsets. A case that
must fail raises its error class with every byte of the tree and the journal untouched.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path, PurePosixPath

import pytest

from ddtree_deploy.hosts.local import LocalHost
from ddtree_deploy.hosts.state import HostStateStore
from ddtree_deploy.patching import errors as patching_errors
from ddtree_deploy.patching import manifest
from ddtree_deploy.patching.engine import apply_patch_set, plan_patch
from ddtree_deploy.patching.manifest import PatchSet, load_patch_set
from patching.trees import ALL_CASES, REAL_RELEASES, Case, own_copy, real_patch_set, tree_bytes

_OFFSET = re.compile(r"Hunk #(\d+) succeeded at \d+ \(offset (-?\d+) lines?\)")


def _error_class(name: str) -> type[Exception]:
    found = getattr(patching_errors, name, None) or getattr(manifest, name)
    assert isinstance(found, type) and issubclass(found, Exception)
    return found


def _targets(patch_set: PatchSet) -> set[str]:
    return {str(f.path) for p in patch_set.patches for f in p.files}


def gnu_patch(site: Path, patch_set: PatchSet) -> dict[str, list[int]]:
    """Apply the series with `patch -p1 --fuzz=0` in `site`; offsets per file, in hunk order."""
    if shutil.which("patch") is None:
        pytest.skip("GNU patch is not installed")
    offsets: dict[str, list[int]] = {}
    for patch in patch_set.patches:
        done = subprocess.run(
            ["patch", "-p1", "--fuzz=0", "--no-backup-if-mismatch", "-i", str(patch.diff_path)],
            cwd=site, capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        current = ""
        for line in done.stdout.splitlines():
            if line.startswith("patching file "):
                current = line.removeprefix("patching file ").strip("'")
                offsets.setdefault(current, [])
            elif match := _OFFSET.search(line):
                offsets[current].append(int(match.group(2)))
    return offsets


@pytest.mark.parametrize("case", ALL_CASES, ids=lambda c: c.name)
def test_case_applies_or_refuses_as_recorded(
    case: Case,
    case_tree: Callable[[Case], Path],
    host: LocalHost,
    state: HostStateStore,
) -> None:
    site = case_tree(case)
    before = tree_bytes(site)
    if case.expect == "error":
        assert case.error is not None
        with pytest.raises(
            _error_class(case.error), match=re.escape(case.message) if case.message else None
        ):
            patch_set = load_patch_set(case.series_dir)
            apply_patch_set(host, PurePosixPath(site), patch_set, state)
        assert tree_bytes(site) == before
        assert state.read_journal() == []
        return
    patch_set = load_patch_set(case.series_dir)
    plan = plan_patch(host, PurePosixPath(site), patch_set)
    offsets = {str(f.path): [h.offset for h in f.hunks] for f in plan.files}
    assert offsets == case.offsets
    outcome = apply_patch_set(host, PurePosixPath(site), patch_set, state)
    for change in outcome.changed:
        assert (site / change.path).read_bytes() != before[str(change.path)]
    if case.expected_dir is not None:
        for expected in case.expected_dir.rglob("*"):
            if expected.is_file():
                relative = str(expected.relative_to(case.expected_dir))
                assert (site / relative).read_bytes() == expected.read_bytes()


@pytest.mark.parametrize(
    "case", [c for c in ALL_CASES if c.expect == "applied"], ids=lambda c: c.name
)
def test_case_matches_gnu_patch(
    case: Case,
    case_tree: Callable[[Case], Path],
    host: LocalHost,
    state: HostStateStore,
    tmp_path: Path,
) -> None:
    ours = case_tree(case)
    theirs = tmp_path / "gnu"
    shutil.copytree(ours, theirs, copy_function=os.link)
    patch_set = load_patch_set(case.series_dir)
    for path in _targets(patch_set):
        own_copy(theirs, path)  # GNU patch may write in place: keep it off the shared inodes
    gnu_offsets = gnu_patch(theirs, patch_set)
    plan = plan_patch(host, PurePosixPath(ours), patch_set)
    apply_patch_set(host, PurePosixPath(ours), patch_set, state)
    assert tree_bytes(ours) == tree_bytes(theirs)
    ours_nonzero = {str(f.path): [h.offset for h in f.hunks if h.offset] for f in plan.files}
    assert ours_nonzero == gnu_offsets


@pytest.mark.parametrize("release", REAL_RELEASES)
def test_real_patch_set_applies_with_gnu_patch_like_ours(
    release: str,
    make_tree: Callable[[str], Path],
    host: LocalHost,
    state: HostStateStore,
    tmp_path: Path,
) -> None:
    patch_set = real_patch_set(release)
    theirs = make_tree(release)
    for path in _targets(patch_set):
        own_copy(theirs, path)
    gnu_patch(theirs, patch_set)
    ours = make_tree(release)
    apply_patch_set(host, PurePosixPath(ours), patch_set, state)
    for path in _targets(patch_set):
        assert (ours / path).read_bytes() == (theirs / path).read_bytes(), path
