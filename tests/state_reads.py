"""Count how often a run reads the host's state folder (`state.json`, `journal.jsonl`).

Every read of a file on a host goes through `ShellHost.read_bytes`, whichever transport; the
counter wraps it for the block and counts reads of files directly in `state_dir` by name.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import PurePosixPath

import pytest

from ddtree_deploy.hosts.connection import ShellHost


@contextmanager
def counting_state_reads(state_dir: str | PurePosixPath) -> Iterator[Counter[str]]:
    """Within the block, the returned counter holds each state-folder file's reads."""
    reads: Counter[str] = Counter()
    read_bytes = ShellHost.read_bytes

    def counted(self: ShellHost, path: PurePosixPath, *, sudo: bool = False) -> bytes | None:
        if PurePosixPath(path).parent == PurePosixPath(state_dir):
            reads[PurePosixPath(path).name] += 1
        return read_bytes(self, path, sudo=sudo)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ShellHost, "read_bytes", counted)
        yield reads
