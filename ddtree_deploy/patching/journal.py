"""Patch transactions in the host journal, and content-addressed file copies in its blobs.

A transaction replaces a set of package files. Before the first replacement, every file's old
and new bytes are stored as blobs named by their sha256 and one `patching.begin` record lists
each file with both hashes; `patching.commit` (or `patching.abort` after a roll-back) closes
it. A `begin` without a close is unfinished: the next run finds it here and `engine.recover`
finishes or undoes it. This module only records; it never writes package files.
"""

from __future__ import annotations

import io
import tarfile
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import PurePosixPath
from typing import Any

from ddtree_deploy.hosts.state import HostStateStore
from ddtree_deploy.patching.targets import sha256_hex

BEGIN = "patching.begin"
COMMIT = "patching.commit"
ABORT = "patching.abort"


class Operation(StrEnum):
    """What a transaction does to the package."""

    apply = "apply"
    revert = "revert"


@dataclass(frozen=True)
class FileChange:
    """One file a transaction replaces: where it lives and its hashes before and after."""

    path: PurePosixPath  # relative to site-packages
    real_path: PurePosixPath  # absolute on the host
    mode: int
    sha256_from: str
    sha256_to: str


@dataclass(frozen=True)
class Transaction:
    """An all-or-nothing replacement of package files, as written to the journal."""

    id: str
    operation: Operation
    patch_set: str
    site_packages: PurePosixPath
    changes: tuple[FileChange, ...]

    @classmethod
    def new(
        cls,
        operation: Operation,
        patch_set: str,
        site_packages: PurePosixPath,
        changes: tuple[FileChange, ...],
    ) -> Transaction:
        return cls(uuid.uuid4().hex, operation, patch_set, site_packages, changes)

    def to_record(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "operation": self.operation.value,
            "patch_set": self.patch_set,
            "site_packages": str(self.site_packages),
            "files": [
                {
                    "path": str(c.path),
                    "real_path": str(c.real_path),
                    "mode": c.mode,
                    "sha256_from": c.sha256_from,
                    "sha256_to": c.sha256_to,
                }
                for c in self.changes
            ],
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Transaction:
        return cls(
            id=str(record["id"]),
            operation=Operation(record["operation"]),
            patch_set=str(record["patch_set"]),
            site_packages=PurePosixPath(record["site_packages"]),
            changes=tuple(
                FileChange(
                    path=PurePosixPath(f["path"]),
                    real_path=PurePosixPath(f["real_path"]),
                    mode=int(f["mode"]),
                    sha256_from=str(f["sha256_from"]),
                    sha256_to=str(f["sha256_to"]),
                )
                for f in record["files"]
            ),
        )


def begin(store: HostStateStore, transaction: Transaction) -> None:
    """Announce the transaction; call only once every blob it needs is stored."""
    store.journal(BEGIN, **transaction.to_record())


def close(store: HostStateStore, transaction: Transaction, *, committed: bool) -> None:
    store.journal(COMMIT if committed else ABORT, id=transaction.id)


def find_unfinished(store: HostStateStore, site_packages: PurePosixPath) -> Transaction | None:
    """The last transaction on `site_packages` that was begun but never closed."""
    open_ones: dict[str, dict[str, Any]] = {}
    for record in store.read_journal():
        event = record.get("event")
        if event == BEGIN and record.get("site_packages") == str(site_packages):
            open_ones[str(record["id"])] = record
        elif event in (COMMIT, ABORT):
            open_ones.pop(str(record.get("id")), None)
    if not open_ones:
        return None
    return Transaction.from_record(list(open_ones.values())[-1])


_COPIES = "patching/sha256"
_UNPACK_SCRIPT = (
    'set -e; mkdir -p -- "$1"; tar -xf "$2" -C "$1" --no-same-owner --no-same-permissions; '
    'rm -f -- "$2"'
)


def _blob_name(sha256: str) -> str:
    return f"{_COPIES}/{sha256}"


def put_copies(store: HostStateStore, contents: Iterable[bytes]) -> None:
    """Store each of `contents` under its own hash, in one upload and one command.

    The copies travel as one uncompressed tar unpacked beside the others, so a transaction of
    many files costs the same few SSH round trips as one. Unpacking is not atomic per file, but
    `get_copy` checks every hash, so a copy torn by a killed run reads as missing.
    """
    unique = {sha256_hex(data): data for data in contents}
    if not unique:
        return
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for digest, data in unique.items():
            info = tarfile.TarInfo(digest)
            info.size = len(data)
            info.mode = 0o600
            tar.addfile(info, io.BytesIO(data))
    bundle = store.put_blob(f"patching/incoming/{uuid.uuid4().hex}.tar", buffer.getvalue())
    store.host.run(
        ["sh", "-c", _UNPACK_SCRIPT, "sh", str(store.blob_path(_COPIES)), str(bundle)],
        sudo=store.sudo,
    )


def get_copy(store: HostStateStore, sha256: str) -> bytes | None:
    """The stored bytes with this hash, or None when absent or corrupted."""
    data = store.get_blob(_blob_name(sha256))
    return data if data is not None and sha256_hex(data) == sha256 else None
