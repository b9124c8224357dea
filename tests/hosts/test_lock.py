"""The host lock (hosts/lock.py): one changing run per host, killed runs taken over, never stolen."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from ddtree_deploy.cli import main
from ddtree_deploy.errors import UnreachableHost
from ddtree_deploy.events import sink_installed
from ddtree_deploy.hosts.connection import CommandResult
from ddtree_deploy.hosts.local import LocalHost
from ddtree_deploy.hosts.lock import LOCK_NAME, HostBusy, LockOwner, host_lock, lock_holder
from ddtree_deploy.hosts.ssh import SshHost
from ddtree_deploy.report import console, render
from ddtree_deploy.rollout.status import HostStatus


def lock_text(state: Path) -> str:
    return (state / LOCK_NAME).read_text()


def owner_file(state: Path, **fields: Any) -> str:
    """Write a lock as another run would have left it; returns its text."""
    owner = {
        "controller": socket.gethostname(),
        "pid": os.getpid(),
        "user": "ops",
        "action": "deploy",
        "started": "2026-11-30T09:00:00+0000",
        "token": "0" * 32,
        **fields,
    }
    state.mkdir(parents=True, exist_ok=True)
    text = json.dumps(owner, sort_keys=True)
    (state / LOCK_NAME).write_text(text)
    return text


def dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_a_second_run_is_refused_while_the_first_holds_the_lock(tmp_path: Path) -> None:
    host = LocalHost()
    state = PurePosixPath(tmp_path / "state")
    with host_lock(host, state, "deploy") as first:
        held = lock_text(tmp_path / "state")
        with pytest.raises(HostBusy) as refused, host_lock(host, state, "rollback"):
            pytest.fail("the second run got the lock")
        assert lock_text(tmp_path / "state") == held  # the first run's lock is untouched
        assert LockOwner.parse(held) == first
    assert str(refused.value) == (
        f"local is busy: {state / LOCK_NAME} is held by action=deploy by {first.user}@"
        f"{first.controller} (pid {os.getpid()}, since {first.started}); wait for that run to "
        f"finish, or remove {state / LOCK_NAME} on local once you know it is gone."
    )
    assert refused.value.exit_code == 9
    assert list((tmp_path / "state").iterdir()) == []  # dropped at the end, nothing left


RACER = """
import sys, time
from pathlib import Path, PurePosixPath
from ddtree_deploy.hosts.local import LocalHost
from ddtree_deploy.hosts.lock import HostBusy, host_lock
go = Path(sys.argv[2])
Path(sys.argv[3]).touch()  # imported and waiting
while not go.exists():
    time.sleep(0.005)
try:
    with host_lock(LocalHost(), PurePosixPath(sys.argv[1]), "deploy"):
        time.sleep(3)  # far longer than the racers need to reach the lock
except HostBusy:
    sys.exit(9)
"""


def test_runs_racing_for_the_lock_never_both_win(tmp_path: Path) -> None:
    go = tmp_path / "go"
    ready = [tmp_path / f"ready-{i}" for i in range(6)]
    racers = [
        subprocess.Popen([sys.executable, "-c", RACER, str(tmp_path / "state"), str(go), str(r)])
        for r in ready
    ]
    deadline = time.monotonic() + 60
    while not all(r.exists() for r in ready) and time.monotonic() < deadline:
        time.sleep(0.05)
    go.touch()  # every racer is polling for it now
    codes = sorted(racer.wait(timeout=60) for racer in racers)
    assert codes == [0, 9, 9, 9, 9, 9]
    assert not (tmp_path / "state" / LOCK_NAME).exists()


def test_lock_holder_names_the_run_holding_the_lock(tmp_path: Path) -> None:
    host, state = LocalHost(), PurePosixPath(tmp_path / "state")
    assert lock_holder(host, state) is None
    with host_lock(host, state, "build-kernels") as owner:
        assert lock_holder(host, state) == owner.describe()
        assert owner.describe().startswith("action=build-kernels by ")
    assert lock_holder(host, state) is None


def test_a_lock_left_by_a_killed_run_of_this_controller_is_taken_over(tmp_path: Path) -> None:
    owner_file(tmp_path / "state", pid=dead_pid())
    events: list[dict[str, Any]] = []
    with (
        sink_installed(events.append),
        host_lock(LocalHost(), PurePosixPath(tmp_path / "state"), "rollback") as owner,
    ):
        assert LockOwner.parse(lock_text(tmp_path / "state")) == owner
    assert [e["event"] for e in events] == ["lock.stale", "lock.taken", "lock.dropped"]
    assert events[0]["holder"].startswith("action=deploy by ops@")


def test_a_lock_from_another_controller_is_never_taken_over(tmp_path: Path) -> None:
    """Its pid means nothing here: only its operator knows whether that run is gone."""
    left = owner_file(tmp_path / "state", controller="ops-laptop-2", pid=dead_pid())
    with (
        pytest.raises(HostBusy, match="held by action=deploy by ops@ops-laptop-2"),
        host_lock(LocalHost(), PurePosixPath(tmp_path / "state"), "deploy"),
    ):
        pytest.fail("took another controller's lock")
    assert lock_text(tmp_path / "state") == left


def test_an_unreadable_lock_refuses_the_run_and_is_kept(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / LOCK_NAME).write_text("{half")
    with (
        pytest.raises(HostBusy, match="held by an unreadable owner; wait"),
        host_lock(LocalHost(), PurePosixPath(tmp_path / "state"), "deploy"),
    ):
        pytest.fail("took an unreadable lock")
    assert lock_text(tmp_path / "state") == "{half"


def test_the_end_of_a_run_never_drops_a_lock_that_is_no_longer_its_own(tmp_path: Path) -> None:
    """An operator removed the lock and another run took it: the first run's end leaves it."""
    with host_lock(LocalHost(), PurePosixPath(tmp_path / "state"), "deploy"):
        other = owner_file(tmp_path / "state", token="1" * 32)
    assert lock_text(tmp_path / "state") == other


def test_a_lock_taken_over_ssh_refuses_a_run_on_this_machine(
    ssh_connection: SshHost, tmp_path: Path
) -> None:
    """The sshd test host shares this machine's files: one lock file, two transports."""
    state = PurePosixPath(tmp_path / "state")
    with (
        host_lock(ssh_connection, state, "deploy"),
        pytest.raises(HostBusy),
        host_lock(LocalHost(), state, "patch"),
    ):
        pytest.fail("both transports got the lock")
    with host_lock(LocalHost(), state, "patch"):
        pass


def test_a_changing_action_on_a_busy_host_exits_9_and_touches_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    left = owner_file(state)  # this live process holds it
    rc = main(
        [f"host.state_dir={state}", f"rollout.runs_dir={tmp_path / 'runs'}", "action=rollback"]
    )
    assert rc == 9
    err = capsys.readouterr().err
    assert err.startswith("error: local is busy: ") and "Traceback" not in err
    assert lock_text(state) == left
    assert [p.name for p in state.iterdir()] == [LOCK_NAME]


class LosesConnection(LocalHost):
    """TEST DOUBLE of a transport that dies mid-run: after `cut`, every command fails to connect."""

    cut = False

    def _execute(self, argv: Sequence[str], stdin: bytes | None, timeout_s: float) -> CommandResult:
        if self.cut:
            raise UnreachableHost("Cannot reach local: connection reset")
        return super()._execute(argv, stdin, timeout_s)


def test_a_lost_connection_at_the_end_keeps_the_runs_own_error(tmp_path: Path) -> None:
    host = LosesConnection()
    events: list[dict[str, Any]] = []
    with (
        sink_installed(events.append),
        pytest.raises(RuntimeError, match="the step failed"),
        host_lock(host, PurePosixPath(tmp_path / "state"), "deploy") as owner,
    ):
        host.cut = True
        raise RuntimeError("the step failed")
    assert events[-1]["event"] == "lock.left"
    assert LockOwner.parse(lock_text(tmp_path / "state")) == owner  # left for the next run


def test_status_table_says_who_holds_the_lock() -> None:
    status = HostStatus(
        host="ct200", service_managed=True, generation=1, lineage=(1,), algo="DFLASH",
        summary="linear", unit="sglang.service", unit_state="active (running)",
        enabled="enabled", interrupted=None, pending_restart=(), patch_set="0.5.11: applied",
        patch_files=(), kernels="installed", drift=(), locked_by="action=deploy by ops@a",
    )  # fmt: skip
    with console.stdout.capture() as held:
        render.status_table(status)
    with console.stdout.capture() as free:
        render.status_table(replace(status, locked_by=None))
    assert "held by action=deploy by ops@a" in held.get()
    assert "│ lock" in free.get() and "free" in free.get().split("│ lock", 1)[1].splitlines()[0]
