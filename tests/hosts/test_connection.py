"""The Connection contract, on the local transport and over a real sshd in a network namespace."""

from __future__ import annotations

import sys
import time
from pathlib import Path, PurePosixPath

import fabric.runners
import pytest

from ddtree_deploy.errors import CommandFailed, HostError, UnreachableHost
from ddtree_deploy.hosts.connection import ShellHost
from ddtree_deploy.hosts.facts import probe_facts
from ddtree_deploy.hosts.local import LocalHost
from ddtree_deploy.hosts.ssh import SshHost

HOSTILE = 'it\'s $(touch /tmp/ddt-pwned) `id` ; rm -rf / & "q" *'


def test_run_passes_hostile_argument_literally(any_host: ShellHost, tmp_path: Path) -> None:
    canary = Path("/tmp/ddt-pwned")
    canary.unlink(missing_ok=True)
    result = any_host.run(["printf", "%s", HOSTILE])
    assert result.stdout == HOSTILE
    assert not canary.exists()


def test_run_passes_environment_and_stdin(any_host: ShellHost) -> None:
    result = any_host.run(
        ["sh", "-c", 'printf "%s|" "$GREETING"; cat'], env={"GREETING": "a b"}, stdin=b"in"
    )
    assert result.stdout == "a b|in"


def test_run_raises_with_exit_code_and_tail_when_check(any_host: ShellHost) -> None:
    with pytest.raises(CommandFailed) as caught:
        any_host.run(["sh", "-c", "echo first >&2; echo last-words >&2; exit 7"])
    assert "exit code 7" in str(caught.value)
    assert "last-words" in str(caught.value)


def test_run_returns_failure_without_check(any_host: ShellHost) -> None:
    result = any_host.run(["sh", "-c", "exit 3"], check=False)
    assert (result.ok, result.exit_code) == (False, 3)


def test_run_times_out_with_one_sentence(any_host: ShellHost) -> None:
    with pytest.raises(HostError, match=r"did not finish within 0.5 s"):
        any_host.run(["sleep", "5"], timeout_s=0.5)


@pytest.mark.sshd
def test_ssh_timeout_is_a_timeout_while_the_timer_thread_is_still_alive(
    ssh_connection: SshHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The order a loaded machine produces: the channel is closed, the timer thread not yet done."""
    close_channel = fabric.runners.Remote.kill

    def close_then_linger(runner: fabric.runners.Remote) -> None:
        close_channel(runner)
        time.sleep(1.5)  # the main thread sees exit -1 and finishes while this thread lives

    monkeypatch.setattr(fabric.runners.Remote, "kill", close_then_linger)
    with pytest.raises(HostError, match=r"did not finish within 0.5 s"):
        ssh_connection.run(["sleep", "5"], timeout_s=0.5)


def test_write_atomic_round_trips_binary_with_mode(any_host: ShellHost, tmp_path: Path) -> None:
    target = PurePosixPath(tmp_path / "dir with space" / "it's.bin")
    payload = bytes(range(256)) * 3
    any_host.write_atomic(target, payload, mode=0o600)
    assert any_host.read_bytes(target) == payload
    assert Path(target).stat().st_mode & 0o777 == 0o600
    assert [p.name for p in (tmp_path / "dir with space").iterdir()] == ["it's.bin"]  # no temp


def test_write_atomic_replaces_existing_file(any_host: ShellHost, tmp_path: Path) -> None:
    target = tmp_path / "unit"
    target.write_text("old")
    any_host.write_atomic(PurePosixPath(target), "new")
    assert target.read_text() == "new"


def test_read_bytes_of_missing_file_is_none(any_host: ShellHost, tmp_path: Path) -> None:
    assert any_host.read_bytes(PurePosixPath(tmp_path / "absent")) is None
    assert not any_host.exists(PurePosixPath(tmp_path / "absent"))


@pytest.mark.sshd
def test_facts_probe_gives_same_answer_locally_and_over_ssh(ssh_connection: SshHost) -> None:
    python = PurePosixPath(sys.executable)
    local = probe_facts(LocalHost(), python)
    remote = probe_facts(ssh_connection, python)
    assert local.python_version is not None and local.torch_version is not None
    assert {**remote.to_dict(), "host": "x"} == {**local.to_dict(), "host": "x"}


def test_facts_probe_reports_missing_python(any_host: ShellHost) -> None:
    facts = probe_facts(any_host, PurePosixPath("/nonexistent/venv/bin/python"))
    assert facts.python_version is None and facts.torch_version is None


def test_unreachable_ssh_host_is_one_sentence() -> None:
    host = SshHost("ghost", address="127.0.0.1", port=1, connect_timeout_s=2)
    with pytest.raises(UnreachableHost) as caught:
        host.run(["true"])
    message = str(caught.value)
    assert message.startswith("Cannot reach ghost at root@127.0.0.1:1 over SSH")
    assert "\n" not in message
