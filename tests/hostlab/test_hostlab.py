"""The hostlab's hosts are real: sshd answers, systemd boots, units run, hosts are separate."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from hostlab import TestHost, ssh_argv
from hostlab.rootfs import debian_mirror


def ssh(
    host: TestHost, command: str, *, input_text: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `command` on `host` with the system ssh client, trusting any host key."""
    return subprocess.run(
        ssh_argv(host, command, verify_host_key=False),
        capture_output=True,
        text=True,
        input=input_text,
        timeout=60,
        check=False,
    )


@pytest.mark.sshd
def test_sshd_host_echo_returns_exact_text(sshd_host: TestHost) -> None:
    done = ssh(sshd_host, "echo 'hostlab: sshd answers'")
    assert (done.returncode, done.stdout) == (0, "hostlab: sshd answers\n")


@pytest.mark.sshd
def test_sshd_host_key_verifies_against_known_hosts(sshd_host: TestHost) -> None:
    done = subprocess.run(
        ssh_argv(sshd_host, "true"), capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.nspawn
def test_nspawn_host_system_is_running(nspawn_host: TestHost) -> None:
    done = ssh(nspawn_host, "systemctl is-system-running")
    assert done.stdout.strip() in {"running", "degraded"}, ssh(
        nspawn_host, "systemctl --failed"
    ).stdout


@pytest.mark.nspawn
def test_nspawn_host_pid1_is_systemd(nspawn_host: TestHost) -> None:
    done = ssh(nspawn_host, "readlink /proc/1/exe; cat /proc/1/comm")
    assert done.stdout.split() == ["/usr/lib/systemd/systemd", "systemd"]


@pytest.mark.nspawn
def test_nspawn_host_runs_installed_unit(nspawn_host: TestHost) -> None:
    token = uuid.uuid4().hex
    unit = f"hostlab-probe-{token[:8]}.service"
    text = (
        "[Unit]\nDescription=hostlab probe\n\n[Service]\n"
        f"ExecStart=/bin/sh -c 'echo probe-{token}; exec sleep infinity'\n"
    )
    install = ssh(
        nspawn_host,
        f"cat > /etc/systemd/system/{unit} && systemctl daemon-reload && systemctl start {unit}",
        input_text=text,
    )
    try:
        assert install.returncode == 0, install.stderr
        assert ssh(nspawn_host, f"systemctl is-active {unit}").stdout.strip() == "active"
        assert f"probe-{token}" in _journal(nspawn_host, unit, f"probe-{token}")
        ssh(nspawn_host, f"systemctl stop {unit}")
        assert ssh(nspawn_host, f"systemctl is-active {unit}").stdout.strip() == "inactive"
    finally:
        ssh(
            nspawn_host,
            f"systemctl stop {unit}; rm -f /etc/systemd/system/{unit}; systemctl daemon-reload",
        )


def _journal(host: TestHost, unit: str, wanted: str) -> str:
    """`journalctl -u unit`, re-read for a few seconds since journald writes asynchronously."""
    text = ""
    for _ in range(50):
        text = ssh(host, f"journalctl -u {unit} --no-pager -o cat").stdout
        if wanted in text:
            break
        time.sleep(0.2)
    return text


@pytest.mark.nspawn
def test_nspawn_hosts_have_own_addresses_and_files(
    nspawn_hosts: Callable[[int], list[TestHost]],
) -> None:
    first, second = nspawn_hosts(2)
    marker = f"/root/hostlab-{uuid.uuid4().hex}"
    assert first.address != second.address
    assert ssh(first, f"touch {marker}").returncode == 0
    try:
        assert ssh(first, f"test -e {marker}").returncode == 0
        assert ssh(second, f"test -e {marker}").returncode == 1
        assert ssh(first, "hostname").stdout != ssh(second, "hostname").stdout
    finally:
        ssh(first, f"rm -f {marker}")


def test_debian_mirror_reads_one_line_and_deb822_sources(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list").write_text(
        "# none\ndeb [arch=amd64] http://one.invalid/debian-security bookworm-security main\n"
    )
    (tmp_path / "sources.list.d" / "b.sources").write_text(
        "Types: deb-src\nURIs: http://src.invalid/debian\nSuites: bookworm\n\n"
        "Types: deb\n# a comment\nURIs: http://two.invalid/debian\n"
        "Suites: bookworm bookworm-updates\nComponents: main\n"
    )
    assert debian_mirror(tmp_path) == "http://two.invalid/debian"


def test_a_namespace_another_worker_deleted_first_is_released_without_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two xdist workers sweeping one stale lease (a killed earlier run's) both delete its
    namespace; the one that comes second must not fail its container's boot."""
    from hostlab import netns

    ns = netns.NetNS(f"ddt-race-{uuid.uuid4().hex[:6]}", 250)
    netns.run(["ip", "netns", "add", ns.name])
    real_run = netns.run

    def other_worker_first(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        if argv[:3] == ["ip", "netns", "del"]:
            real_run(argv)  # the other worker's delete lands between our check and ours
        return real_run(argv, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(netns, "run", other_worker_first)
    netns._delete_netns(ns)
    assert not ns.path.exists()
