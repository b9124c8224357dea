"""sshd-only test hosts: the machine's own sshd, run in a fresh network namespace.

Quick to start (no rootfs, no systemd); commands run as root on this machine's filesystem, so
use them for SSH behaviour, not for anything that installs or must be isolated.
"""

from __future__ import annotations

import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from .host import TestHost, generate_key, ssh_argv, write_known_hosts
from .netns import Lease, NetNS, create_netns, release
from .proc import HostlabError, run

SSHD = Path("/usr/sbin/sshd")
PORT = 2222  # not 22, so the product's port handling is exercised


@dataclass
class SshdHost:
    """A running sshd in its own namespace; `host` is what tests connect to."""

    host: TestHost
    netns: NetNS
    lease: Lease

    def stop(self) -> None:
        """Stop sshd (by its pid) and remove the namespace and files; idempotent."""
        release(self.netns, self.lease)


def start_sshd_host(*, timeout_s: float = 20.0) -> SshdHost:
    """Start sshd in a new namespace with fresh ed25519 host and client keys; wait for it."""
    ns, lease = create_netns()
    try:
        return _start(ns, lease, timeout_s)
    except BaseException:
        release(ns, lease)
        raise


def _start(ns: NetNS, lease: Lease, timeout_s: float) -> SshdHost:
    # The state dir is under /run (root-owned, not world-writable): sshd's StrictModes accepts it.
    state = ns.state_dir
    host_key = generate_key(state / "ssh_host_ed25519_key", f"hostlab-{ns.name}-host")
    client_key = generate_key(state / "id_ed25519", f"hostlab-{ns.name}-client")
    authorized = state / "authorized_keys"
    authorized.write_text(client_key.with_suffix(".pub").read_text())
    authorized.chmod(0o600)
    known_hosts = write_known_hosts(
        state / "known_hosts", ns.guest_address, PORT, host_key.with_suffix(".pub").read_text()
    )
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
    log = state / "sshd.log"
    argv = [
        "ip",
        "netns",
        "exec",
        ns.name,
        str(SSHD),
        "-D",
        "-e",
        "-f",
        "/dev/null",
        "-h",
        str(host_key),
        "-p",
        str(PORT),
        "-o",
        f"AuthorizedKeysFile={authorized}",
        "-o",
        f"PidFile={state / 'sshd.pid'}",
        "-o",  # a stock sshd_config serves SFTP; the product uploads files through it
        "Subsystem=sftp internal-sftp",
    ]
    with log.open("wb") as out:
        # `ip netns exec` execs sshd in place, so this pid is sshd's.
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
        )
    lease.pids.append((proc.pid, str(SSHD)))
    ns.record(lease)
    host = TestHost(
        name=ns.name,
        address=ns.guest_address,
        port=PORT,
        user="root",
        key_path=client_key,
        known_hosts_path=known_hosts,
    )
    _wait_for_echo(host, proc, log, timeout_s)
    return SshdHost(host=host, netns=ns, lease=lease)


def _wait_for_echo(
    host: TestHost, proc: subprocess.Popen[bytes], log: Path, timeout_s: float
) -> None:
    """Poll until sshd accepts a connection and runs a command, or fail with its log."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise HostlabError(
                f"sshd for {host.name} exited {proc.returncode}: {log.read_text()[-2000:]}"
            )
        try:
            socket.create_connection((host.address, host.port), timeout=1).close()
        except OSError:
            time.sleep(0.1)
            continue
        if run(ssh_argv(host, "true"), check=False, timeout_s=10).returncode == 0:
            return
        time.sleep(0.2)
    raise HostlabError(
        f"sshd for {host.name} did not answer within {timeout_s:.0f} s: {log.read_text()[-2000:]}"
    )
