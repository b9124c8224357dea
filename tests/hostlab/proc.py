"""Subprocess helpers shared by the hostlab modules: run a command, fail with its stderr tail."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path


class HostlabError(RuntimeError):
    """A test host could not be built, started, reached or torn down."""


def run(
    argv: Sequence[str | os.PathLike[str]],
    *,
    timeout_s: float = 120.0,
    check: bool = True,
    input_text: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `argv`, capturing output; with `check`, raise HostlabError with stderr's tail."""
    try:
        done = subprocess.run(
            [os.fspath(a) for a in argv],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            input=input_text,
            check=False,
        )
    except subprocess.TimeoutExpired as err:
        raise HostlabError(f"{' '.join(map(str, argv))} ran past {timeout_s:.0f} s.") from err
    if check and done.returncode != 0:
        raise HostlabError(
            f"{' '.join(map(str, argv))} exited {done.returncode}: "
            f"{(done.stderr or done.stdout).strip()[-2000:]}"
        )
    return done


def is_alive(pid: int, marker: str) -> bool:
    """True if `pid` runs and its command line holds `marker` (guards against a reused pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] == "Z":
        return False  # a zombie has exited; only its parent's wait is missing
    return marker.encode() in cmdline


def stop_pid(pid: int, marker: str, *, grace_s: float = 10.0) -> None:
    """SIGTERM `pid` if it is still the process we started, SIGKILL after `grace_s`; reap it."""
    if not is_alive(pid, marker):
        _reap(pid)
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        _reap(pid)
        if not is_alive(pid, marker):
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    for _ in range(50):
        _reap(pid)
        if not is_alive(pid, marker):
            return
        time.sleep(0.1)


def _reap(pid: int) -> None:
    """Collect `pid`'s exit status if it is our child, so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
