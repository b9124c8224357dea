"""One changing run at a time per host: `lock.json` in `host.state_dir`.

Every action that changes a host (deploy, rollback, patch, unpatch, build-kernels, prepare) holds
the lock for its whole run. Taking and dropping it happen under `flock` on the state folder, so
two controllers can never both win. The file names its owner (controller machine, pid, user, action,
start time). A lock left by a run of *this* controller whose process is gone (a killed run) is
taken over, with an event; any other held lock refuses the run with `HostBusy`, naming the owner
and the file to remove once the operator knows that run is gone.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import PurePosixPath

from ddtree_deploy.errors import CommandFailed, DeployError, ExitCode, HostError
from ddtree_deploy.events import emit
from ddtree_deploy.hosts.connection import ShellHost

LOCK_NAME = "lock.json"
_BUSY_EXIT = 75  # EX_TEMPFAIL: the take script found a lock it may not replace

# Both scripts hold `flock` on the state folder itself, so no lock-of-the-lock file is left behind.
# $1 lock path, $2 our owner JSON, $3 the exact text of a stale lock we may replace ("" if none).
# Prints the holder's text and exits 75 when the lock is held by someone else.
_TAKE_SCRIPT = (
    'set -e; dir=$(dirname -- "$1"); mkdir -p -- "$dir"; exec 9<"$dir"; flock -x -w 30 9; '
    'if [ -e "$1" ] && [ "$(cat -- "$1")" != "$3" ]; then cat -- "$1"; exit '
    f"{_BUSY_EXIT}; fi; "
    'printf "%s" "$2" > "$1.tmp"; chmod 600 -- "$1.tmp"; mv -f -- "$1.tmp" "$1"'
)
# $1 lock path, $2 our owner JSON: removes the lock only while it is still ours.
_DROP_SCRIPT = (
    'exec 9<"$(dirname -- "$1")" && flock -x -w 30 9 && '
    'if [ "$(cat -- "$1" 2>/dev/null)" = "$2" ]; then rm -f -- "$1"; fi'
)


class HostBusy(DeployError):
    """Another run holds the host's lock."""

    exit_code = ExitCode.HOST_BUSY


@dataclass(frozen=True)
class LockOwner:
    """Who holds a host's lock: enough to find the run, or to know that it is gone."""

    controller: str
    pid: int
    user: str
    action: str
    started: str
    token: str

    @classmethod
    def this_process(cls, action: str) -> LockOwner:
        return cls(
            controller=socket.gethostname(),
            pid=os.getpid(),
            user=_user(),
            action=action,
            started=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            token=uuid.uuid4().hex,
        )

    @classmethod
    def parse(cls, text: str) -> LockOwner | None:
        try:
            data = json.loads(text)
            return cls(**{name: data[name] for name in cls.__dataclass_fields__})
        except (ValueError, TypeError, KeyError):
            return None

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    def gone(self) -> bool:
        """True only when the owner ran on this controller and its process no longer exists."""
        if self.controller != socket.gethostname():
            return False  # another machine's process: we cannot tell, so it may be running
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False  # alive, under another user
        return False

    def describe(self) -> str:
        return (
            f"action={self.action} by {self.user}@{self.controller} "
            f"(pid {self.pid}, since {self.started})"
        )


def lock_holder(host: ShellHost, state_dir: PurePosixPath) -> str | None:
    """Who holds the host's lock now (for `action=status`), or None when it is free."""
    text = host.read_text(state_dir / LOCK_NAME, sudo=True)
    if text is None:
        return None
    holder = LockOwner.parse(text)
    return holder.describe() if holder is not None else "an unreadable owner"


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name and no passwd entry (some containers)
        return str(os.getuid())


@contextmanager
def host_lock(host: ShellHost, state_dir: PurePosixPath, action: str) -> Iterator[LockOwner]:
    """Hold the host's lock for the block; `HostBusy` if another live run holds it."""
    path = state_dir / LOCK_NAME
    owner = LockOwner.this_process(action)
    _take(host, path, owner)
    emit("lock.taken", path=str(path), action=action)
    try:
        yield owner
    finally:
        # A lock that cannot be dropped (connection lost) is ours, from a process about to end:
        # the next run from this controller takes it over. The run's own error must win here.
        try:
            dropped = host.run(
                ["sh", "-c", _DROP_SCRIPT, "sh", str(path), owner.to_json()], sudo=True, check=False
            ).ok
        except HostError:
            dropped = False
        emit("lock.dropped" if dropped else "lock.left", path=str(path))


def _take(host: ShellHost, path: PurePosixPath, owner: LockOwner) -> None:
    """Write `owner` into the lock; a lock left by a gone process of this controller is taken
    over (once: the script replaces only the exact text seen, so a race refuses instead)."""
    stale = ""  # the text of a gone owner's lock, which the second try may replace
    while True:
        result = host.run(
            ["sh", "-c", _TAKE_SCRIPT, "sh", str(path), owner.to_json(), stale],
            sudo=True,
            check=False,
        )
        if result.ok:
            return
        if result.exit_code != _BUSY_EXIT:
            raise CommandFailed(
                f"Cannot take the lock {path} on {host.name} (exit code {result.exit_code}): "
                f"{result.tail(3) or 'no output'}; check that the state folder is writable and "
                "that flock (util-linux) is installed."
            )
        holder = LockOwner.parse(result.stdout)
        if holder is None or stale or not holder.gone():
            break
        emit("lock.stale", path=str(path), holder=holder.describe())
        stale = result.stdout
    who = holder.describe() if holder is not None else "an unreadable owner"
    raise HostBusy(
        f"{host.name} is busy: {path} is held by {who}; wait for that run to finish, or remove "
        f"{path} on {host.name} once you know it is gone."
    )
