"""systemctl and journalctl on a host: read a unit's state, reload, enable, restart, wait.

Every command goes through the host connection with sudo. `wait_started` decides whether a
(re)started unit really runs: active with the same main PID for `settle_s`, no automatic restart
in between. A unit that fails is reported with the last journal lines, masked by the caller's
secret mask, since SGLang logs its own arguments.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

from ddtree_deploy.errors import DeployError, ExitCode
from ddtree_deploy.hosts.connection import ShellHost

_PROPERTIES = (
    "LoadState",
    "ActiveState",
    "SubState",
    "MainPID",
    "NRestarts",
    "NeedDaemonReload",
    "UnitFileState",
    "ExecMainStatus",
)
_POLL_S = 0.5


class UnitFailedToStart(DeployError):
    """The SGLang unit did not reach a stable running state after a (re)start."""

    exit_code = ExitCode.BUILD_OR_START


@dataclass(frozen=True)
class UnitState:
    """What `systemctl show` reports for a unit (strings as systemd prints them)."""

    load_state: str
    active_state: str
    sub_state: str
    main_pid: int
    n_restarts: int
    need_daemon_reload: bool
    unit_file_state: str
    exec_main_status: int

    @property
    def running(self) -> bool:
        return self.active_state == "active" and self.sub_state == "running"

    @property
    def failing(self) -> bool:
        """Crashed, given up, or waiting to be restarted after a crash."""
        return self.active_state in ("failed", "inactive") or self.sub_state == "auto-restart"

    def describe(self) -> str:
        return f"{self.active_state} ({self.sub_state})"


def unit_state(host: ShellHost, unit: str) -> UnitState:
    """The unit's state; a unit systemd does not know reads as `not-found`/`inactive`."""
    out = host.run(
        ["systemctl", "show", "--property=" + ",".join(_PROPERTIES), "--", unit], sudo=True
    ).stdout
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return UnitState(
        load_state=props.get("LoadState", ""),
        active_state=props.get("ActiveState", ""),
        sub_state=props.get("SubState", ""),
        main_pid=_int(props.get("MainPID")),
        n_restarts=_int(props.get("NRestarts")),
        need_daemon_reload=props.get("NeedDaemonReload") == "yes",
        unit_file_state=props.get("UnitFileState", ""),
        exec_main_status=_int(props.get("ExecMainStatus")),
    )


def daemon_reload(host: ShellHost) -> None:
    host.run(["systemctl", "daemon-reload"], sudo=True)


def enable(host: ShellHost, unit: str) -> None:
    host.run(["systemctl", "enable", "--", unit], sudo=True)


def reset_failed(host: ShellHost, unit: str) -> None:
    """Clear the start-limit counter so a restart after earlier failures is not refused."""
    host.run(["systemctl", "reset-failed", "--", unit], sudo=True, check=False)


def restart(host: ShellHost, unit: str, *, mask: Callable[[str], str]) -> None:
    """`systemctl restart`; a refused start (exec failed, start limit) raises with the journal."""
    result = host.run(["systemctl", "restart", "--", unit], sudo=True, check=False)
    if not result.ok:
        raise UnitFailedToStart(
            f"`systemctl restart {unit}` failed on {host.name}: {mask(result.tail(1))}",
            hint=journal_tail(host, unit, 30, mask=mask),
        )


def journal_tail(host: ShellHost, unit: str, lines: int, *, mask: Callable[[str], str]) -> str:
    """The unit's last journal lines (`journalctl -u UNIT -n N --no-pager`), masked."""
    result = host.run(
        ["journalctl", "-u", unit, "-n", str(lines), "--no-pager", "-o", "short-iso"],
        sudo=True,
        check=False,
    )
    return mask(result.stdout.strip() or result.stderr.strip())


def wait_started(
    host: ShellHost,
    unit: str,
    *,
    timeout_s: float,
    settle_s: float,
    journal_lines: int,
    mask: Callable[[str], str],
) -> UnitState:
    """Wait until `unit` runs steadily; raise `UnitFailedToStart` (with the journal) otherwise."""
    deadline = time.monotonic() + timeout_s
    first = unit_state(host, unit)
    steady_since: float | None = None
    state = first
    while time.monotonic() < deadline:
        state = unit_state(host, unit)
        if state.failing or state.n_restarts > first.n_restarts:
            _fail(host, unit, state, "stopped running", journal_lines, mask)
        if state.running and state.main_pid == first.main_pid:
            steady_since = steady_since or time.monotonic()
            if time.monotonic() - steady_since >= settle_s:
                return state
        elif state.running:  # a new main PID: started again under us, so start counting anew
            first, steady_since = state, None
        time.sleep(_POLL_S)
    _fail(host, unit, state, f"did not run steadily within {timeout_s:g} s", journal_lines, mask)


def _fail(
    host: ShellHost,
    unit: str,
    state: UnitState,
    what: str,
    journal_lines: int,
    mask: Callable[[str], str],
) -> NoReturn:
    raise UnitFailedToStart(
        f"{unit} on {host.name} {what}: it is {state.describe()}, main process exit status "
        f"{state.exec_main_status}, {state.n_restarts} automatic restart(s); the journal follows.",
        hint=journal_tail(host, unit, journal_lines, mask=mask),
    )


def _int(value: str | None) -> int:
    try:
        return int(value or 0)
    except ValueError:
        return 0
