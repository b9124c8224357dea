"""Apply, re-apply, revert and refusals of the patch engine on real SGLang wheel trees."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path, PurePosixPath

import pytest

from ddtree_deploy.hosts.local import LocalHost
from ddtree_deploy.hosts.state import HostStateStore
from ddtree_deploy.patching.engine import (
    FileState,
    SetState,
    apply_patch_set,
    plan_patch,
    revert_patch_set,
    site_packages_for,
)
from ddtree_deploy.patching.errors import DriftedFile, PackageNotFound, PathEscape
from ddtree_deploy.patching.manifest import UnsupportedRelease, select_patch_set
from ddtree_deploy.patching.record import parse_record
from patching.trees import REAL_RELEASES, real_patch_set, rewrite, tree_bytes

MakeTree = Callable[[str], Path]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _record(site: Path, release: str) -> dict[PurePosixPath, str]:
    return parse_record((site / f"sglang-{release}.dist-info" / "RECORD").read_text())


@pytest.mark.parametrize("release", REAL_RELEASES)
def test_apply_writes_recorded_post_images(
    release: str, make_tree: MakeTree, host: LocalHost, state: HostStateStore
) -> None:
    patch_set = real_patch_set(release)
    site = make_tree(release)
    outcome = apply_patch_set(host, PurePosixPath(site), patch_set, state)
    expected = {f.path: f.sha256_after for p in patch_set.patches for f in p.files}
    # the last patch touching a file gives its final hash
    assert {c.path for c in outcome.changed} == set(expected)
    for change in outcome.changed:
        assert _sha(site / change.path) == change.sha256_to == expected[change.path]
    assert plan_patch(host, PurePosixPath(site), patch_set).state is SetState.applied


@pytest.mark.parametrize("release", REAL_RELEASES)
def test_apply_second_run_changes_nothing(
    release: str, make_tree: MakeTree, host: LocalHost, state: HostStateStore
) -> None:
    patch_set = real_patch_set(release)
    site = make_tree(release)
    apply_patch_set(host, PurePosixPath(site), patch_set, state)
    before = tree_bytes(site)
    journal_before = state.read_journal()
    again = apply_patch_set(host, PurePosixPath(site), patch_set, state)
    assert again.changed == ()
    assert again.transaction is None
    assert set(again.unchanged) == {f.path for f in again.plan.files}
    assert tree_bytes(site) == before
    assert state.read_journal() == journal_before


@pytest.mark.parametrize("release", REAL_RELEASES)
def test_revert_restores_record_bytes(
    release: str, make_tree: MakeTree, host: LocalHost, state: HostStateStore
) -> None:
    patch_set = real_patch_set(release)
    site = make_tree(release)
    pristine = tree_bytes(site)
    apply_patch_set(host, PurePosixPath(site), patch_set, state)
    outcome = revert_patch_set(host, PurePosixPath(site), patch_set, state)
    record = _record(site, release)
    assert outcome.changed
    for change in outcome.changed:
        assert _sha(site / change.path) == record[change.path]
    assert tree_bytes(site) == pristine
    assert revert_patch_set(host, PurePosixPath(site), patch_set, state).changed == ()


def test_revert_without_backups_runs_diffs_backwards(
    make_tree: MakeTree, host: LocalHost, state: HostStateStore, tmp_path: Path
) -> None:
    patch_set = real_patch_set("0.5.11")
    site = make_tree("0.5.11")
    pristine = tree_bytes(site)
    apply_patch_set(host, PurePosixPath(site), patch_set, state)
    fresh_state = HostStateStore(host, PurePosixPath(tmp_path / "lost-state"), sudo=False)
    outcome = revert_patch_set(host, PurePosixPath(site), patch_set, fresh_state)
    assert outcome.changed
    assert tree_bytes(site) == pristine


def test_apply_refuses_drifted_file_writing_nothing(
    make_tree: MakeTree, host: LocalHost, state: HostStateStore
) -> None:
    patch_set = real_patch_set("0.5.11")
    site = make_tree("0.5.11")
    target = site / patch_set.patches[-1].files[0].path
    data = bytearray(target.read_bytes())
    data[100] ^= 0x01  # one byte
    rewrite(target, bytes(data))
    before = tree_bytes(site)
    with pytest.raises(DriftedFile) as refused:
        apply_patch_set(host, PurePosixPath(site), patch_set, state)
    message = str(refused.value)
    assert str(target) in message and host.name in message and "reinstall" in message
    assert refused.value.exit_code == 6
    assert tree_bytes(site) == before
    assert state.read_journal() == []
    plan = plan_patch(host, PurePosixPath(site), patch_set)
    assert plan.state is SetState.drifted
    assert FileState.drifted in {f.state for f in plan.files}


def test_revert_refuses_missing_file(
    make_tree: MakeTree, host: LocalHost, state: HostStateStore
) -> None:
    patch_set = real_patch_set("0.5.11")
    site = make_tree("0.5.11")
    apply_patch_set(host, PurePosixPath(site), patch_set, state)
    (site / patch_set.patches[0].files[0].path).unlink()
    before = tree_bytes(site)
    with pytest.raises(DriftedFile, match="is missing"):
        revert_patch_set(host, PurePosixPath(site), patch_set, state)
    assert tree_bytes(site) == before


def test_apply_refuses_mixed_set_when_no_transaction_explains_it(
    make_tree: MakeTree, host: LocalHost, state: HostStateStore, tmp_path: Path
) -> None:
    patch_set = real_patch_set("0.5.11")
    assert len({f.path for p in patch_set.patches for f in p.files}) >= 2
    patched = make_tree("0.5.11")
    apply_patch_set(host, PurePosixPath(patched), patch_set, state)
    site = make_tree("0.5.11")
    first = patch_set.patches[0].files[0].path
    rewrite(site / first, (patched / first).read_bytes())  # a foreign tool patched one file
    before = tree_bytes(site)
    other_state = HostStateStore(host, PurePosixPath(tmp_path / "other-state"), sudo=False)
    with pytest.raises(DriftedFile, match="only some files"):
        apply_patch_set(host, PurePosixPath(site), patch_set, other_state)
    assert tree_bytes(site) == before


def test_apply_keeps_mode_and_drops_stale_bytecode(
    make_tree: MakeTree, host: LocalHost, state: HostStateStore
) -> None:
    patch_set = real_patch_set("0.5.11")
    site = make_tree("0.5.11")
    target = site / patch_set.patches[0].files[0].path
    rewrite(target, target.read_bytes())  # its own inode, so chmod stays in this tree
    target.chmod(0o640)
    cache = target.parent / "__pycache__"
    cache.mkdir(exist_ok=True)
    stale = cache / f"{target.stem}.cpython-311.pyc"
    stale.write_bytes(b"stale")
    neighbour = cache / "other_module.cpython-311.pyc"
    neighbour.write_bytes(b"keep")
    apply_patch_set(host, PurePosixPath(site), patch_set, state)
    assert target.stat().st_mode & 0o777 == 0o640
    assert not stale.exists()
    assert neighbour.read_bytes() == b"keep"


def test_plan_rejects_symlink_escape(
    make_tree: MakeTree, host: LocalHost, state: HostStateStore, tmp_path: Path
) -> None:
    patch_set = real_patch_set("0.5.11")
    site = make_tree("0.5.11")
    target = site / patch_set.patches[0].files[0].path
    outside = tmp_path / "outside.py"
    outside.write_bytes(target.read_bytes())
    target.unlink()
    target.symlink_to(outside)
    with pytest.raises(PathEscape, match="resolves to"):
        apply_patch_set(host, PurePosixPath(site), patch_set, state)
    assert outside.read_bytes() == (tmp_path / "outside.py").read_bytes()
    assert target.is_symlink()


def test_plan_refuses_missing_package(
    host: LocalHost, state: HostStateStore, tmp_path: Path
) -> None:
    with pytest.raises(PackageNotFound, match="does not exist"):
        plan_patch(host, PurePosixPath(tmp_path / "nowhere"), real_patch_set("0.5.11"))


def test_plan_reports_pristine_with_hunk_offsets(make_tree: MakeTree, host: LocalHost) -> None:
    patch_set = real_patch_set("0.5.11")
    site = make_tree("0.5.11")
    plan = plan_patch(host, PurePosixPath(site), patch_set)
    assert plan.state is SetState.pristine
    assert plan.would_change
    assert plan.release == "0.5.11"
    assert all(f.hunks for f in plan.files)
    assert tree_bytes(site) == tree_bytes(make_tree("0.5.11"))


def test_site_packages_for_probe_path() -> None:
    assert site_packages_for("/opt/venv/lib/python3.11/site-packages/sglang") == PurePosixPath(
        "/opt/venv/lib/python3.11/site-packages"
    )


def test_select_refuses_unsupported_release_naming_supported() -> None:
    with pytest.raises(UnsupportedRelease) as refused:
        select_patch_set("0.4.0")
    message = str(refused.value)
    assert "0.4.0" in message and "==0.5.11" in message
    assert refused.value.exit_code == 5


def test_0512_set_serves_0512_and_its_post1_only() -> None:
    # 0.5.12.post1's patch targets are byte-identical to 0.5.12's (RECORD); a later post release
    # or any other release must not be served by a range nobody checked it against.
    assert select_patch_set("0.5.12").name == "0.5.12"
    assert select_patch_set("0.5.12.post1").name == "0.5.12"
    for other in ("0.5.12.post2", "0.5.12rc1", "0.5.11.post1", "0.5.24"):
        with pytest.raises(UnsupportedRelease):
            select_patch_set(other)


def test_0513_set_serves_0513_and_its_post1_only() -> None:
    # 0.5.13.post1 changes only the eagle/standalone v2 workers: every patch target and every
    # DFLASH gate site is byte-identical to 0.5.13's (RECORD), so the 0.5.13 set serves both.
    assert select_patch_set("0.5.13").name == "0.5.13"
    assert select_patch_set("0.5.13.post1").name == "0.5.13"
    assert select_patch_set("0.5.14").name == "0.5.14"
    for other in ("0.5.13.post2", "0.5.13rc1", "0.5.24"):
        with pytest.raises(UnsupportedRelease):
            select_patch_set(other)


def test_0514_set_serves_0514_only() -> None:
    # 0.5.14 has no post release; a later one, or a release candidate, must not be served by a
    # pin nobody checked it against.
    assert select_patch_set("0.5.14").name == "0.5.14"
    assert select_patch_set("0.5.15").name == "0.5.15"  # its own set, not 0.5.14's
    for other in ("0.5.14.post1", "0.5.14rc1"):
        with pytest.raises(UnsupportedRelease):
            select_patch_set(other)


def test_0515_sets_serve_0515_and_its_post1_each() -> None:
    # 0.5.15.post1 changes two of the set's targets (server_args.py, spec_info.py: DSA fields
    # and an attention-backend lookup), so its `==0.5.15` pin must not stretch to it: the derived
    # 0.5.15.post1 set serves it, with 0.5.15's diffs and its own hashes.
    assert select_patch_set("0.5.15").name == "0.5.15"
    derived = select_patch_set("0.5.15.post1")
    assert (derived.name, derived.base) == ("0.5.15.post1", "0.5.15")
    assert select_patch_set("0.5.16").name == "0.5.16"  # its own set, not 0.5.15's
    for other in ("0.5.15.post2", "0.5.15rc1"):
        with pytest.raises(UnsupportedRelease):
            select_patch_set(other)


def test_0516_set_serves_0516_only() -> None:
    # 0.5.16 has no post release; a later one or a release candidate must not be served by a pin
    # nobody checked it against, and 0.5.17 (which adds DFLASH gates of its own) has its own set.
    assert select_patch_set("0.5.16").name == "0.5.16"
    assert select_patch_set("0.5.17").name == "0.5.17"
    for other in ("0.5.16.post1", "0.5.16rc1", "0.5.24"):
        with pytest.raises(UnsupportedRelease):
            select_patch_set(other)


def test_0517_set_serves_0517_only() -> None:
    # 0.5.18 drops the extra_buffer_lazy assert 0002 widens and adds dflash_disaggregation.py
    # (it has its own set); a post release, a release candidate or a later release must not take
    # this pin.
    assert select_patch_set("0.5.17").name == "0.5.17"
    assert select_patch_set("0.5.18").name == "0.5.18"
    for other in ("0.5.17.post1", "0.5.17rc1", "0.5.24"):
        with pytest.raises(UnsupportedRelease):
            select_patch_set(other)


def test_0518_set_serves_0518_only() -> None:
    # 0.5.18 has no post release; a post release, a release candidate or a later release (0.5.19's
    # worker reads config through get_spec(), its _handle_dflash resolves through
    # declare_resolution: its own set) must not take this pin.
    assert select_patch_set("0.5.18").name == "0.5.18"
    assert select_patch_set("0.5.19").name == "0.5.19"
    for other in ("0.5.18.post1", "0.5.18rc1", "0.5.24"):
        with pytest.raises(UnsupportedRelease):
            select_patch_set(other)


def test_0522_set_serves_0522_only() -> None:
    # 0.5.22's set is 0.5.23's ported back, 0.5.21's is 0.5.22's, 0.5.20's is 0.5.21's and
    # 0.5.19's is 0.5.20's; no pin stretches to a neighbour's post release or release candidate,
    # or to a later release.
    for release in ("0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23"):
        assert select_patch_set(release).name == release
    for other in (
        "0.5.22.post1", "0.5.22rc1", "0.5.21.post1", "0.5.21rc1", "0.5.20.post1", "0.5.20rc1",
        "0.5.19.post1", "0.5.19rc1", "0.5.24",
    ):  # fmt: skip
        with pytest.raises(UnsupportedRelease):
            select_patch_set(other)
