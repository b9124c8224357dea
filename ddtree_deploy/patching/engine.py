"""Plan, apply and revert a patch set on a host's installed package, all or nothing.

Public API (the `rollout`/`cli` rooms call these; nothing here prints):

- `site_packages_for(package_path)`: site-packages from the facts probe's `sglang_path`.
- `plan_patch(host, site_packages, patch_set, state=None) -> PatchPlan`: read-only. Each target
  file is `pristine` (sha256 = the manifest's pre-image, itself checked against the wheel's
  RECORD), `applied` (= post-image) or `drifted` (neither, or missing); pristine files get a dry
  run whose per-hunk offsets are reported. With `state`, an unfinished transaction is shown.
- `apply_patch_set(host, site_packages, patch_set, state) -> PatchOutcome`: recovers an
  unfinished transaction first, then patches every pristine file in one transaction. A second
  call changes nothing (`outcome.changed == ()`).
- `revert_patch_set(host, site_packages, patch_set, state) -> PatchOutcome`: the inverse; the
  restored bytes come from the stored backups (or the diffs run backwards) and must hash to the
  RECORD's pristine value. Reverting a pristine tree changes nothing.
- `recover(host, site_packages, state) -> Recovery | None`: finish (roll forward) or undo (roll
  back) a transaction a killed run left open; apply and revert call it first.

Refusals happen before the first write: `DriftedFile` (a drifted file, or some files applied and
others not with no open transaction to explain it), `RecordMismatch`, `HunkFailed`,
`DiffRejected`, `PathEscape`, `PackageNotFound`. The write order is: backups and new contents
stored as blobs, `patching.begin` in the journal, files replaced in place (atomic, mode kept),
stale bytecode dropped, `patching.commit`. `sudo` applies to the package files; the state
store has its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import PurePosixPath

from ddtree_deploy.hosts.connection import ShellHost
from ddtree_deploy.hosts.state import HostStateStore
from ddtree_deploy.patching import journal
from ddtree_deploy.patching.errors import DriftedFile, RecordMismatch, TransactionStuck
from ddtree_deploy.patching.hunks import HunkOffset
from ddtree_deploy.patching.journal import FileChange, Operation, Transaction
from ddtree_deploy.patching.manifest import PatchSet
from ddtree_deploy.patching.targets import (
    FileTarget,
    load_targets,
    patch_file,
    sha256_hex,
    unpatch_file,
)
from ddtree_deploy.patching.tree import (
    HostFile,
    Snapshot,
    drop_bytecode,
    read_snapshot,
)


class FileState(StrEnum):
    """Where one target file stands against the patch set."""

    pristine = "pristine"
    applied = "applied"
    drifted = "drifted"


class SetState(StrEnum):
    """Where the whole set stands: all pristine, all applied, a mix, or any file drifted."""

    pristine = "pristine"
    applied = "applied"
    mixed = "mixed"
    drifted = "drifted"


@dataclass(frozen=True)
class FilePlan:
    """One target file's state, hashes, and (when pristine) where each hunk would apply."""

    path: PurePosixPath
    state: FileState
    sha256: str | None  # None: the file is missing
    sha256_pristine: str
    sha256_applied: str
    patches: tuple[str, ...]
    hunks: tuple[HunkOffset, ...]


@dataclass(frozen=True)
class PatchPlan:
    """What `plan_patch` found on the host."""

    host: str
    site_packages: PurePosixPath
    patch_set: str
    release: str  # the installed release, from its dist-info folder
    files: tuple[FilePlan, ...]
    unfinished: Transaction | None

    @property
    def state(self) -> SetState:
        states = {f.state for f in self.files}
        if FileState.drifted in states:
            return SetState.drifted
        if states == {FileState.applied}:
            return SetState.applied
        return SetState.pristine if states == {FileState.pristine} else SetState.mixed

    @property
    def would_change(self) -> bool:
        """True when `apply_patch_set` would write anything."""
        return self.state is not SetState.applied or self.unfinished is not None


class RecoveryAction(StrEnum):
    """How `recover` closed a transaction a killed run left open."""

    rolled_forward = "rolled-forward"  # finished: every file now has its new bytes
    rolled_back = "rolled-back"  # undone: every file has its old bytes again
    superseded = "superseded"  # the package was reinstalled since; nothing written


@dataclass(frozen=True)
class Recovery:
    """A transaction `recover` closed, how, and the files it wrote."""

    transaction: Transaction
    action: RecoveryAction
    files: tuple[PurePosixPath, ...]


@dataclass(frozen=True)
class PatchOutcome:
    """What apply or revert did: the plan it started from and the files it replaced."""

    operation: Operation
    plan: PatchPlan
    changed: tuple[FileChange, ...]
    recovery: Recovery | None
    transaction: str | None  # journal id, when files were replaced

    @property
    def unchanged(self) -> tuple[PurePosixPath, ...]:
        touched = {c.path for c in self.changed}
        return tuple(f.path for f in self.plan.files if f.path not in touched)


@dataclass(frozen=True)
class _Entry:
    target: FileTarget
    file: HostFile | None
    plan: FilePlan
    patched: bytes | None  # the staged post-image, for pristine files


def site_packages_for(package_path: str | PurePosixPath) -> PurePosixPath:
    """The site-packages folder holding a package folder (e.g. the probe's `sglang_path`)."""
    return PurePosixPath(package_path).parent


def plan_patch(
    host: ShellHost,
    site_packages: PurePosixPath,
    patch_set: PatchSet,
    state: HostStateStore | None = None,
    *,
    sudo: bool = False,
) -> PatchPlan:
    """Classify every target file; read-only (one command, plus the journal with `state`)."""
    return _classify(host, site_packages, patch_set, state, sudo=sudo)[0]


def apply_patch_set(
    host: ShellHost,
    site_packages: PurePosixPath,
    patch_set: PatchSet,
    state: HostStateStore,
    *,
    sudo: bool = False,
) -> PatchOutcome:
    """Patch every target file in one transaction; a no-op when the set is already applied."""
    recovery, plan, entries = _recover_and_classify(host, site_packages, patch_set, state, sudo)
    new_bytes = {e.target.path: e.patched for e in entries if e.patched is not None}
    changes = _changes(entries, FileState.pristine, to_applied=True)
    # The pristine bytes are the backups revert restores (and a killed apply rolls back to).
    backups = [e.file.data for e in entries if e.patched is not None and e.file is not None]
    return _commit(host, state, Operation.apply, plan, changes, new_bytes, backups, recovery, sudo)


def revert_patch_set(
    host: ShellHost,
    site_packages: PurePosixPath,
    patch_set: PatchSet,
    state: HostStateStore,
    *,
    sudo: bool = False,
) -> PatchOutcome:
    """Restore the RECORD's bytes of every applied file; a no-op on a pristine set."""
    recovery, plan, entries = _recover_and_classify(host, site_packages, patch_set, state, sudo)
    old_bytes: dict[PurePosixPath, bytes] = {}
    current: list[bytes] = []  # the patched bytes, so a killed revert can roll back
    for entry in entries:
        if entry.plan.state is FileState.applied and entry.file is not None:
            backup = journal.get_copy(state, entry.target.pristine)
            # No backup (state folder lost, or patched by hand): run the diffs backwards; the
            # result is checked against the pristine (= RECORD) hash either way.
            old_bytes[entry.target.path] = backup or unpatch_file(entry.target, entry.file.data)
            current.append(entry.file.data)
    changes = _changes(entries, FileState.applied, to_applied=False)
    return _commit(host, state, Operation.revert, plan, changes, old_bytes, current, recovery, sudo)


def recover(
    host: ShellHost, site_packages: PurePosixPath, state: HostStateStore, *, sudo: bool = False
) -> Recovery | None:
    """Close the transaction a killed run left open on `site_packages`, if there is one.

    Rolls forward when every file not yet replaced has its new bytes stored, else back when
    every replaced file has its old bytes stored. When the files match neither hash of the
    transaction but all match the installed RECORD, the package was reinstalled since and the
    transaction is closed as superseded; otherwise `TransactionStuck` is raised before anything
    is written.
    """
    transaction = journal.find_unfinished(state, site_packages)
    if transaction is None:
        return None
    package = transaction.changes[0].path.parts[0]
    paths = [c.path for c in transaction.changes]
    snapshot = read_snapshot(host, site_packages, package, paths, sudo=sudo)
    current = {}
    for change in transaction.changes:
        file = snapshot.files[change.path]
        current[change.path] = sha256_hex(file.data) if file is not None else None
    foreign = [
        c for c in transaction.changes if current[c.path] not in (c.sha256_from, c.sha256_to)
    ]
    if foreign and all(snapshot.record.get(path) == digest for path, digest in current.items()):
        # pip reinstalled the package since (another release): nothing left to finish or undo.
        journal.close(state, transaction, committed=False)
        return Recovery(transaction, RecoveryAction.superseded, ())
    if foreign:
        raise TransactionStuck(
            f"{foreign[0].path} on {host.name} changed outside the unfinished "
            f"{transaction.operation} transaction {transaction.id} (journal "
            f"{state.journal_path}); nothing written: reinstall the package and run again."
        )
    for forward in (True, False):
        pending = [c for c in transaction.changes if current[c.path] != _end(c, forward=forward)]
        stored = _stored(state, pending, forward=forward)
        if stored is not None:
            for change in pending:
                host.write_atomic(
                    change.real_path, stored[change.path], mode=change.mode, sudo=sudo
                )
            drop_bytecode(host, (c.real_path for c in pending), sudo=sudo)
            journal.close(state, transaction, committed=forward)
            action = RecoveryAction.rolled_forward if forward else RecoveryAction.rolled_back
            return Recovery(transaction, action, tuple(c.path for c in pending))
    raise TransactionStuck(
        f"The unfinished {transaction.operation} transaction {transaction.id} on {host.name} "
        f"can be neither finished nor undone: backups are missing under {state.root}/blobs; "
        "reinstall the package and run again."
    )


def _recover_and_classify(
    host: ShellHost,
    site_packages: PurePosixPath,
    patch_set: PatchSet,
    state: HostStateStore,
    sudo: bool,
) -> tuple[Recovery | None, PatchPlan, list[_Entry]]:
    """What apply and revert both start with: close a killed run's transaction, then classify
    (refusing drift) without reading the journal again, since recovery left nothing open."""
    recovery = recover(host, site_packages, state, sudo=sudo)
    plan, entries = _classify(host, site_packages, patch_set, None, sudo=sudo)
    _refuse_drift(plan, patch_set)
    return recovery, plan, entries


def _end(change: FileChange, *, forward: bool) -> str:
    """The hash a file has once the transaction is finished (forward) or undone."""
    return change.sha256_to if forward else change.sha256_from


def _stored(
    state: HostStateStore, changes: list[FileChange], *, forward: bool
) -> dict[PurePosixPath, bytes] | None:
    """The stored end contents of every change, or None when any is missing."""
    found = {}
    for change in changes:
        data = journal.get_copy(state, _end(change, forward=forward))
        if data is None:
            return None
        found[change.path] = data
    return found


def _classify(
    host: ShellHost,
    site_packages: PurePosixPath,
    patch_set: PatchSet,
    state: HostStateStore | None,
    *,
    sudo: bool,
) -> tuple[PatchPlan, list[_Entry]]:
    targets = load_targets(patch_set)
    paths = [t.path for t in targets]
    snapshot = read_snapshot(host, site_packages, patch_set.package, paths, sudo=sudo)
    entries = [_entry(host, snapshot, target) for target in targets]
    plan = PatchPlan(
        host=host.name,
        site_packages=site_packages,
        patch_set=patch_set.name,
        release=_release(snapshot, patch_set.package),
        files=tuple(e.plan for e in entries),
        unfinished=journal.find_unfinished(state, site_packages) if state else None,
    )
    return plan, entries


def _entry(host: ShellHost, snapshot: Snapshot, target: FileTarget) -> _Entry:
    recorded = snapshot.record.get(target.path)
    if recorded != target.pristine:
        raise RecordMismatch(
            f"The manifest's pre-image of {target.path} ({target.pristine[:12]}…) disagrees "
            f"with {snapshot.record_path} on {host.name} "
            f"({recorded[:12] + '…' if recorded else 'no entry'}); the patch set was made "
            "for another build of this release: pick or regenerate the right one."
        )
    file = snapshot.files[target.path]
    digest = sha256_hex(file.data) if file is not None else None
    state = {target.pristine: FileState.pristine, target.applied: FileState.applied}.get(
        digest or "", FileState.drifted
    )
    patched: bytes | None = None
    hunks: tuple[HunkOffset, ...] = ()
    if file is not None and state is FileState.pristine:
        patched, hunks = patch_file(target, file.data)  # the dry run, staged for apply
    plan = FilePlan(
        target.path, state, digest, target.pristine, target.applied, target.patches, hunks
    )
    return _Entry(target, file, plan, patched)


def _release(snapshot: Snapshot, package: str) -> str:
    """`0.5.11` from `.../sglang-0.5.11.dist-info/RECORD`."""
    return snapshot.record_path.parent.name.removeprefix(f"{package}-").removesuffix(".dist-info")


def _refuse_drift(plan: PatchPlan, patch_set: PatchSet) -> None:
    """Raise `DriftedFile` unless every file is pristine or every file is applied."""
    todo = (
        f"nothing written: reinstall it (pip install --force-reinstall --no-deps "
        f"{patch_set.package}=={plan.release}) on {plan.host}, then run again"
    )
    for file in plan.files:
        if file.state is FileState.drifted:
            found = (
                f"is missing (a target of patch set {patch_set.name})"
                if file.sha256 is None
                else f"matches neither the pristine nor the patched hash of patch set "
                f"{patch_set.name}"
            )
            raise DriftedFile(f"{plan.site_packages / file.path} on {plan.host} {found}; {todo}.")
    if plan.state is SetState.mixed:
        applied = [str(f.path) for f in plan.files if f.state is FileState.applied]
        raise DriftedFile(
            f"Patch set {patch_set.name} is applied to only some files on {plan.host} "
            f"({', '.join(applied)}) and no unfinished transaction explains it; {todo}."
        )


def _changes(entries: list[_Entry], source: FileState, *, to_applied: bool) -> list[FileChange]:
    """A `FileChange` for every entry in state `source`, towards applied or pristine."""
    changes = []
    for entry in entries:
        if entry.plan.state is source and entry.file is not None:
            old, new = entry.target.pristine, entry.target.applied
            before, after = (old, new) if to_applied else (new, old)
            changes.append(
                FileChange(entry.target.path, entry.file.real_path, entry.file.mode, before, after)
            )
    return changes


def _commit(
    host: ShellHost,
    state: HostStateStore,
    operation: Operation,
    plan: PatchPlan,
    changes: list[FileChange],
    contents: Mapping[PurePosixPath, bytes],
    old_contents: list[bytes],
    recovery: Recovery | None,
    sudo: bool,
) -> PatchOutcome:
    """Store old and new contents, journal the intent, replace the files, journal completion."""
    if not changes:
        return PatchOutcome(operation, plan, (), recovery, None)
    # Both ends of every file are stored before `begin`, so a killed run can go either way.
    journal.put_copies(state, [*old_contents, *(contents[c.path] for c in changes)])
    transaction = Transaction.new(operation, plan.patch_set, plan.site_packages, tuple(changes))
    journal.begin(state, transaction)
    for change in changes:
        host.write_atomic(change.real_path, contents[change.path], mode=change.mode, sudo=sudo)
    drop_bytecode(host, (c.real_path for c in changes), sudo=sudo)
    journal.close(state, transaction, committed=True)
    return PatchOutcome(operation, plan, tuple(changes), recovery, transaction.id)
