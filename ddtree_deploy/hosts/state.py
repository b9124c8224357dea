"""The toolkit's state folder on a host (`host.state_dir`): the only memory a run leaves behind.

Layout: `state.json` (current truth, replaced atomically), `journal.jsonl` (append-only; an intent
is written before each change so a killed run can be finished or undone by the next one), and
`blobs/` (backups and artifacts addressed by name). Rooms build their records on top of this;
what a generation is belongs to `rollout`.
"""

from __future__ import annotations

import copy
import json
from pathlib import PurePosixPath
from typing import Any

from ddtree_deploy.errors import HostError
from ddtree_deploy.hosts.connection import ShellHost

_APPEND_SCRIPT = 'mkdir -p -- "$(dirname -- "$1")" && printf "%s\\n" "$2" >> "$1" && sync -- "$1"'


class HostStateStore:
    """Read and write the state folder of one host, always through its connection."""

    def __init__(self, host: ShellHost, root: PurePosixPath, *, sudo: bool = True) -> None:
        self.host = host
        self.root = root
        self.sudo = sudo
        self._state: dict[str, Any] | None = None  # state.json as last read or written

    @property
    def state_path(self) -> PurePosixPath:
        return self.root / "state.json"

    @property
    def journal_path(self) -> PurePosixPath:
        return self.root / "journal.jsonl"

    def load(self) -> dict[str, Any]:
        """`state.json` as a dict; empty for a host the toolkit never touched.

        Read from the host once; after that, the copy this store keeps, which its own writes
        update. A run shares one store while it holds the host's lock, when nothing else writes
        the file; a new store reads it afresh."""
        if self._state is None:
            self._state = self._read()
        return copy.deepcopy(self._state)

    def save(self, state: dict[str, Any]) -> None:
        """Replace `state.json` atomically."""
        text = json.dumps(state, indent=2, sort_keys=True) + "\n"
        self.host.write_atomic(self.state_path, text, mode=0o600, sudo=self.sudo)
        self._state = copy.deepcopy(state)

    def update(self, sections: dict[str, Any]) -> None:
        """Replace the given top-level keys of `state.json`, keeping every other one."""
        self.save({**self.load(), **sections})

    def _read(self) -> dict[str, Any]:
        text = self.host.read_text(self.state_path, sudo=self.sudo)
        if text is None:
            return {}
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise HostError(
                f"{self.state_path} on {self.host.name} is not valid JSON; "
                "restore it from the journal or remove it to start over."
            ) from err
        if not isinstance(data, dict):
            raise HostError(f"{self.state_path} on {self.host.name} does not hold an object.")
        return data

    def journal(self, event: str, **fields: Any) -> None:
        """Append one record (written and synced before the change it announces)."""
        line = json.dumps({"event": event, **fields}, sort_keys=True)
        self.host.run(
            ["sh", "-c", _APPEND_SCRIPT, "sh", str(self.journal_path), line], sudo=self.sudo
        )

    def read_journal(self) -> list[dict[str, Any]]:
        """Every journal record in order; a torn last line (killed mid-append) is ignored."""
        text = self.host.read_text(self.journal_path, sudo=self.sudo) or ""
        records = []
        for line in text.splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return records

    def blob_path(self, name: str) -> PurePosixPath:
        return self.root / "blobs" / name

    def put_blob(self, name: str, data: bytes | str, *, mode: int = 0o600) -> PurePosixPath:
        path = self.blob_path(name)
        self.host.write_atomic(path, data, mode=mode, sudo=self.sudo)
        return path

    def get_blob(self, name: str) -> bytes | None:
        return self.host.read_bytes(self.blob_path(name), sudo=self.sudo)
