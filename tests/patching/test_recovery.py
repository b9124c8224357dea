"""A run killed between two file replacements is finished or undone by the next run."""

from __future__ import annotations

import base64
import hashlib
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path, PurePosixPath

import pytest

from ddtree_deploy.hosts.local import LocalHost
from ddtree_deploy.hosts.state import HostStateStore
from ddtree_deploy.patching import journal
from ddtree_deploy.patching.engine import (
    RecoveryAction,
    SetState,
    apply_patch_set,
    plan_patch,
    recover,
    revert_patch_set,
)
from ddtree_deploy.patching.errors import RecordMismatch, TransactionStuck
from ddtree_deploy.patching.manifest import PatchSet
from patching.trees import real_patch_set, rewrite, tree_bytes

MakeTree = Callable[[str], Path]


class SimulatedCrash(BaseException):
    """Stands for the process dying: a BaseException, so no `except Exception` swallows it."""


class CrashingHost(LocalHost):
    """A real local host that "dies" right after its first replacement of a package file."""

    def __init__(self, site: Path) -> None:
        super().__init__("crashing")
        self.site = PurePosixPath(site)
        self.replaced: list[PurePosixPath] = []

    def write_atomic(
        self, path: PurePosixPath, data: bytes | str, *, mode: int = 0o644, sudo: bool = False
    ) -> None:
        super().write_atomic(path, data, mode=mode, sudo=sudo)
        if path.is_relative_to(self.site):
            self.replaced.append(path)
            raise SimulatedCrash(str(path))


def _crash_mid_apply(site: Path, patch_set: PatchSet, state_root: Path) -> CrashingHost:
    crashing = CrashingHost(site)
    store = HostStateStore(crashing, PurePosixPath(state_root), sudo=False)
    with pytest.raises(SimulatedCrash):
        apply_patch_set(crashing, PurePosixPath(site), patch_set, store)
    assert len(crashing.replaced) == 1
    return crashing


def _targets(patch_set: PatchSet) -> set[PurePosixPath]:
    return {f.path for p in patch_set.patches for f in p.files}


def test_apply_after_crash_rolls_forward(
    make_tree: MakeTree, host: LocalHost, state: HostStateStore
) -> None:
    patch_set = real_patch_set("0.5.11")
    assert len(_targets(patch_set)) >= 2  # a crash between two replacements needs two files
    site = make_tree("0.5.11")
    patched = make_tree("0.5.11")
    apply_patch_set(host, PurePosixPath(patched), patch_set, HostStateStore(
        host, PurePosixPath(patched.parent / "other-state"), sudo=False))  # fmt: skip
    _crash_mid_apply(site, patch_set, Path(str(state.root)))
    plan = plan_patch(host, PurePosixPath(site), patch_set, state)
    assert plan.state is SetState.mixed and plan.unfinished is not None
    outcome = apply_patch_set(host, PurePosixPath(site), patch_set, state)
    assert outcome.recovery is not None
    assert outcome.recovery.action is RecoveryAction.rolled_forward
    assert len(outcome.recovery.files) == len(_targets(patch_set)) - 1
    assert outcome.changed == ()
    assert tree_bytes(site) == tree_bytes(patched)
    assert journal.find_unfinished(state, PurePosixPath(site)) is None


def test_revert_after_crash_rolls_back_when_post_images_are_lost(
    make_tree: MakeTree, host: LocalHost, state: HostStateStore
) -> None:
    patch_set = real_patch_set("0.5.11")
    site = make_tree("0.5.11")
    pristine = tree_bytes(site)
    crashing = _crash_mid_apply(site, patch_set, Path(str(state.root)))
    transaction = journal.find_unfinished(state, PurePosixPath(site))
    assert transaction is not None
    for change in transaction.changes:  # lose the new contents not yet written
        if change.real_path != crashing.replaced[0]:
            Path(str(state.blob_path(f"patching/sha256/{change.sha256_to}"))).unlink()
    outcome = revert_patch_set(host, PurePosixPath(site), patch_set, state)
    assert outcome.recovery is not None
    assert outcome.recovery.action is RecoveryAction.rolled_back
    assert outcome.recovery.files == (transaction.changes[0].path,)
    assert outcome.changed == ()
    assert tree_bytes(site) == pristine
    assert [r["event"] for r in state.read_journal()][-1] == journal.ABORT


def test_recover_refuses_file_changed_after_crash(
    make_tree: MakeTree, host: LocalHost, state: HostStateStore
) -> None:
    patch_set = real_patch_set("0.5.11")
    site = make_tree("0.5.11")
    crashing = _crash_mid_apply(site, patch_set, Path(str(state.root)))
    replaced = Path(str(crashing.replaced[0]))
    rewrite(replaced, replaced.read_bytes() + b"# edited by hand\n")
    before = tree_bytes(site)
    with pytest.raises(TransactionStuck, match="changed outside the unfinished"):
        recover(host, PurePosixPath(site), state)
    assert tree_bytes(site) == before


def test_recover_closes_transaction_superseded_by_a_reinstall(
    make_tree: MakeTree, host: LocalHost, state: HostStateStore
) -> None:
    patch_set = real_patch_set("0.5.11")
    site = make_tree("0.5.11")
    crashing = _crash_mid_apply(site, patch_set, Path(str(state.root)))
    # pip installs another build: every target gets new bytes, RECORD lists their hashes
    record_path = site / "sglang-0.5.11.dist-info" / "RECORD"
    record = record_path.read_text()
    transaction = journal.find_unfinished(state, PurePosixPath(site))
    assert transaction is not None and crashing.replaced
    for change in transaction.changes:
        path = site / change.path
        rewrite(path, path.read_bytes() + b"# another build\n")
        digest = base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest())
        record = re.sub(
            rf"^{re.escape(str(change.path))},sha256=[^,]*,",
            f"{change.path},sha256={digest.rstrip(b'=').decode()},",
            record,
            flags=re.MULTILINE,
        )
    rewrite(record_path, record.encode())
    before = tree_bytes(site)
    recovery = recover(host, PurePosixPath(site), state)
    assert recovery is not None and recovery.action is RecoveryAction.superseded
    assert tree_bytes(site) == before
    assert journal.find_unfinished(state, PurePosixPath(site)) is None
    with pytest.raises(RecordMismatch):
        apply_patch_set(host, PurePosixPath(site), patch_set, state)


def test_recover_refuses_when_no_backups_exist(
    make_tree: MakeTree, host: LocalHost, state: HostStateStore
) -> None:
    patch_set = real_patch_set("0.5.11")
    site = make_tree("0.5.11")
    _crash_mid_apply(site, patch_set, Path(str(state.root)))
    for blob in Path(str(state.root / "blobs")).rglob("*"):
        if blob.is_file():
            blob.unlink()
    before = tree_bytes(site)
    with pytest.raises(TransactionStuck, match="neither finished nor undone"):
        apply_patch_set(host, PurePosixPath(site), patch_set, state)
    assert tree_bytes(site) == before


_KILLED_RUN = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path, PurePosixPath
    from ddtree_deploy.hosts.local import LocalHost
    from ddtree_deploy.hosts.state import HostStateStore
    from ddtree_deploy.patching.engine import apply_patch_set
    from ddtree_deploy.patching.manifest import load_patch_set

    site, state_root, series = sys.argv[1:4]

    class DiesAfterFirstReplacement(LocalHost):
        def write_atomic(self, path, data, *, mode=0o644, sudo=False):
            super().write_atomic(path, data, mode=mode, sudo=sudo)
            if path.is_relative_to(site):
                os.kill(os.getpid(), signal.SIGKILL)

    host = DiesAfterFirstReplacement("killed")
    store = HostStateStore(host, PurePosixPath(state_root), sudo=False)
    apply_patch_set(host, PurePosixPath(site), load_patch_set(Path(series)), store)
    """
)


def test_apply_after_sigkill_between_replacements_finishes_the_transaction(
    make_tree: MakeTree, host: LocalHost, state: HostStateStore
) -> None:
    patch_set = real_patch_set("0.5.11")
    site = make_tree("0.5.11")
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_RUN, str(site), str(state.root), str(patch_set.directory)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert killed.returncode == -9, killed.stderr
    assert plan_patch(host, PurePosixPath(site), patch_set).state is SetState.mixed
    outcome = apply_patch_set(host, PurePosixPath(site), patch_set, state)
    assert outcome.recovery is not None
    assert outcome.recovery.action is RecoveryAction.rolled_forward
    assert plan_patch(host, PurePosixPath(site), patch_set).state is SetState.applied
    assert revert_patch_set(host, PurePosixPath(site), patch_set, state).changed
