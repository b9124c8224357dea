"""Container test hosts: the cached rootfs booted with systemd-nspawn, one network namespace each.

Each host is an overlay (or, where overlayfs cannot be mounted, a reflink copy) of the cached
rootfs, with a fresh machine id and the test's public key for root; the container joins its
namespace, whose `eth0` already carries the address, so sshd is reachable as soon as it starts.
Real systemd runs as PID 1 inside. The copy lives under /var/tmp (disk, not RAM), since tests
may install into it.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .host import TestHost, generate_key, ssh_argv, write_known_hosts
from .netns import Lease, NetNS, create_netns, release
from .proc import HostlabError, run

log = logging.getLogger(__name__)

WORK_ROOT = Path("/var/tmp/ddtree-hostlab")
_NSPAWN = "systemd-nspawn"


@dataclass
class Container:
    """A booted container; `host` is what tests connect to, `failed_units` what `degraded` meant."""

    host: TestHost
    netns: NetNS
    lease: Lease
    root: Path
    failed_units: tuple[str, ...]

    def stop(self, *, timeout_s: float = 30.0) -> None:
        """Power the container off over SSH, then kill what is left by pid and remove it all.

        Idempotent; a container that no longer answers is stopped by SIGTERM to its nspawn pid
        (nspawn then shuts the container down), SIGKILL after a grace period.
        """
        nspawn_pids = [pid for pid, marker in self.lease.pids if marker == _NSPAWN]
        if nspawn_pids and Path(f"/proc/{nspawn_pids[0]}").exists():
            run(
                ssh_argv(self.host, "systemctl", "poweroff", verify_host_key=False),
                check=False,
                timeout_s=15,
            )
            _wait_gone(nspawn_pids[0], timeout_s)
        release(self.netns, self.lease)


def boot_container(
    rootfs: Path,
    *,
    timeout_s: float = 120.0,
    binds_ro: Sequence[Path] = (),
    overlays: Sequence[Path] = (),
) -> Container:
    """Boot a new container host from `rootfs` and wait until systemd finished booting.

    `binds_ro`: directories of this machine mounted read-only at the same path inside (e.g. the
    Python a venv was made with). `overlays`: directories mounted writable at the same path,
    their writes kept in a temporary upper layer that goes with the container (e.g. a prepared
    SGLang venv that a deploy installs kernels into or patches).

    Raises HostlabError with the console log if it does not come up within `timeout_s`.
    """
    ns, lease = create_netns()
    try:
        return _boot(rootfs, ns, lease, timeout_s, binds_ro, overlays)
    except BaseException:
        release(ns, lease)
        raise


def _boot(
    rootfs: Path,
    ns: NetNS,
    lease: Lease,
    timeout_s: float,
    binds_ro: Sequence[Path],
    overlays: Sequence[Path],
) -> Container:
    work = WORK_ROOT / ns.name
    lease.dirs.append(str(work))  # journal intent first, so a sweep after a crash removes it
    ns.record(lease)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    root = _make_root(rootfs, work, ns, lease)
    for path in overlays:  # nspawn creates bind targets itself, but not overlay targets
        (root / path.relative_to("/")).mkdir(parents=True, exist_ok=True)
    # A target under /tmp lands on the container's fresh tmpfs, where those folders are gone:
    # a read-only bind of its parent (made first; nspawn mounts in argv order) brings it back.
    parents = [p.parent for p in overlays if not _covered(p, binds_ro)]

    client_key = generate_key(ns.state_dir / "id_ed25519", f"hostlab-{ns.name}-client")
    ssh_dir = root / "root" / ".ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    (ssh_dir / "authorized_keys").write_text(client_key.with_suffix(".pub").read_text())
    (ssh_dir / "authorized_keys").chmod(0o600)
    # Copies of one rootfs are still distinct machines: their own id and name.
    (root / "etc" / "machine-id").write_text(uuid.uuid4().hex + "\n")
    (root / "etc" / "hostname").write_text(ns.name + "\n")
    known_hosts = write_known_hosts(
        ns.state_dir / "known_hosts",
        ns.guest_address,
        22,
        (root / "etc/ssh/ssh_host_ed25519_key.pub").read_text(),
    )
    host = TestHost(
        name=ns.name,
        address=ns.guest_address,
        port=22,
        user="root",
        key_path=client_key,
        known_hosts_path=known_hosts,
    )

    console = ns.state_dir / "console.log"
    argv = [
        "setsid",
        _NSPAWN,
        "-q",
        "--register=no",
        "--keep-unit",
        "-D",
        str(root),
        "-M",
        ns.name,
        f"--network-namespace-path={ns.path}",
        *(f"--bind-ro={path}" for path in [*binds_ro, *parents]),
        *(f"--overlay={path}::{path}" for path in overlays),  # empty upper: a temporary one
        "--boot",
    ]
    with console.open("wb") as out:
        # setsid execs in place (our child is no group leader), so this pid is nspawn's.
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    lease.pids.append((proc.pid, _NSPAWN))
    ns.record(lease)
    failed = _wait_booted(host, proc, console, timeout_s)
    return Container(host=host, netns=ns, lease=lease, root=root, failed_units=failed)


def _make_root(rootfs: Path, work: Path, ns: NetNS, lease: Lease) -> Path:
    """Mount an overlay of `rootfs` under `work`; fall back to a reflink copy if that fails."""
    merged = work / "root"
    for sub in ("upper", "work", "root"):
        (work / sub).mkdir()
    options = f"lowerdir={rootfs},upperdir={work / 'upper'},workdir={work / 'work'}"
    lease.mounts.append(str(merged))  # journaled before mounting: release unmounts only mounts
    ns.record(lease)
    mounted = run(["mount", "-t", "overlay", "overlay", "-o", options, merged], check=False)
    if mounted.returncode == 0:
        return merged
    lease.mounts.remove(str(merged))
    ns.record(lease)
    log.info(
        "overlayfs unavailable for %s (%s); copying the rootfs", ns.name, mounted.stderr.strip()
    )
    merged.rmdir()
    run(["cp", "-a", "--reflink=auto", rootfs, merged], timeout_s=600)
    return merged


def _wait_booted(
    host: TestHost, proc: subprocess.Popen[bytes], console: Path, timeout_s: float
) -> tuple[str, ...]:
    """Poll `systemctl is-system-running --wait` over SSH; return the failed units if degraded."""
    deadline = time.monotonic() + timeout_s
    state = "no answer"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise HostlabError(
                f"systemd-nspawn for {host.name} exited {proc.returncode}: "
                f"{console.read_text(errors='replace')[-3000:]}"
            )
        left_s = max(1, int(deadline - time.monotonic()))
        answer = run(
            ssh_argv(host, "timeout", str(left_s), "systemctl", "is-system-running", "--wait"),
            check=False,
            timeout_s=left_s + 10,
        )
        state = answer.stdout.strip() or answer.stderr.strip()
        if state == "running":
            return ()
        if state == "degraded":
            listed = run(
                ssh_argv(host, "systemctl", "list-units", "--failed", "--plain", "--no-legend"),
                timeout_s=15,
            ).stdout
            failed = tuple(line.split()[0] for line in listed.splitlines() if line.strip())
            log.warning("%s booted degraded; failed units: %s", host.name, ", ".join(failed))
            return failed
        time.sleep(0.5)
    raise HostlabError(
        f"{host.name} did not finish booting within {timeout_s:.0f} s (last: {state!r}): "
        f"{console.read_text(errors='replace')[-3000:]}"
    )


def _wait_gone(pid: int, timeout_s: float) -> None:
    """Wait for our child `pid` to exit (reaping it), up to `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid if not Path(f"/proc/{pid}").exists() else 0
        if done == pid:
            return
        time.sleep(0.2)


def _covered(path: Path, binds: Sequence[Path]) -> bool:
    return any(path == bind or bind in path.parents for bind in binds)
