"""The one way to reach a host: run a command, read a file, write a file atomically.

`ShellHost` implements everything on top of a single primitive, `_execute(argv, stdin, timeout)`,
which the local and SSH transports provide. Commands are argv lists; they are joined with
`shlex.join` wherever a shell sees them, so every value is quoted. File writes go to a temp file
beside the target and are renamed into place, so a reader never sees half a file.
"""

from __future__ import annotations

import base64
import shlex
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from ddtree_deploy.errors import CommandFailed

_MISSING_EXIT = 66  # exit code our read script uses for "no such file"

_READ_SCRIPT = f'if [ -e "$1" ]; then base64 -w0 -- "$1"; else exit {_MISSING_EXIT}; fi'
_WRITE_SCRIPT = (
    'set -e; mkdir -p -- "$(dirname -- "$1")"; '
    'tmp=$(mktemp -- "$1.tmp.XXXXXX"); trap \'rm -f -- "$tmp"\' EXIT; '
    'base64 -d > "$tmp"; chmod "$2" -- "$tmp"; mv -f -- "$tmp" "$1"; trap - EXIT'
)


@dataclass(frozen=True)
class CommandResult:
    """What a finished command left: its argv, exit code and captured output."""

    argv: tuple[str, ...]
    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def command(self) -> str:
        return shlex.join(self.argv)

    def tail(self, lines: int = 10) -> str:
        """The last lines of stderr (or stdout when stderr is empty), for error messages."""
        text = self.stderr.strip() or self.stdout.strip()
        return "\n".join(text.splitlines()[-lines:])


class ShellHost(ABC):
    """A host reached through argv commands; subclasses supply `_execute` and `close`."""

    def __init__(self, name: str, *, use_sudo: bool, default_timeout_s: float) -> None:
        self.name = name
        self.use_sudo = use_sudo
        self.default_timeout_s = default_timeout_s

    @abstractmethod
    def _execute(self, argv: Sequence[str], stdin: bytes | None, timeout_s: float) -> CommandResult:
        """Run argv as given (no shell unless argv starts one); `HostError` on transport failure."""

    @abstractmethod
    def close(self) -> None:
        """Release the transport; the host can be used again afterwards (it reconnects)."""

    def __enter__(self) -> ShellHost:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(
        self,
        argv: Sequence[str],
        *,
        sudo: bool = False,
        check: bool = True,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
    ) -> CommandResult:
        """Run a command; with `check`, a non-zero exit raises `CommandFailed` with its tail."""
        full = list(argv)
        if env:
            full = ["env", *(f"{key}={value}" for key, value in env.items()), *full]
        if sudo and self.use_sudo:
            full = ["sudo", "-n", "--", *full]
        result = self._execute(full, stdin, timeout_s or self.default_timeout_s)
        if check and not result.ok:
            raise CommandFailed(
                f"`{shlex.join(argv)}` failed on {self.name} with exit code {result.exit_code}: "
                f"{result.tail(3) or 'no output'}",
                hint=result.tail(10) if result.tail(10) != result.tail(3) else None,
            )
        return result

    def read_bytes(self, path: PurePosixPath, *, sudo: bool = False) -> bytes | None:
        """The file's bytes, or None when it does not exist."""
        result = self.run(["sh", "-c", _READ_SCRIPT, "sh", str(path)], sudo=sudo, check=False)
        if result.exit_code == _MISSING_EXIT:
            return None
        if not result.ok:
            raise CommandFailed(f"Cannot read {path} on {self.name}: {result.tail(3)}")
        return base64.b64decode(result.stdout)

    def read_text(self, path: PurePosixPath, *, sudo: bool = False) -> str | None:
        data = self.read_bytes(path, sudo=sudo)
        return None if data is None else data.decode()

    def write_atomic(
        self, path: PurePosixPath, data: bytes | str, *, mode: int = 0o644, sudo: bool = False
    ) -> None:
        """Write through a temp file beside `path` and rename it over; creates parent folders."""
        payload = data.encode() if isinstance(data, str) else data
        self.run(
            ["sh", "-c", _WRITE_SCRIPT, "sh", str(path), f"{mode:o}"],
            sudo=sudo,
            stdin=base64.b64encode(payload),
        )

    def exists(self, path: PurePosixPath) -> bool:
        return self.run(["test", "-e", str(path)], check=False).ok
