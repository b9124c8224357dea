"""Network namespaces for test hosts, and the record that lets a later run clean up after us.

Each host gets namespace `ddt-<i>` with a veth pair: `ddt-<i>-h` (10.213.<i>.1/30) stays here,
`eth0` (10.213.<i>.2/30) lives inside. The index is claimed by creating
`/run/ddtree-hostlab/ddt-<i>` atomically, so parallel runs never share a subnet. That directory
also holds `lease.json`: the owning pid and every pid, mount and directory made for the host, so
`sweep_stale` can undo a killed run. Traffic stays inside namespaces this run made.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .proc import HostlabError, run, stop_pid

PREFIX = "ddt-"
STATE_ROOT = Path("/run/ddtree-hostlab")
_MAX_INDEX = 254
_CLAIM_GRACE_S = 60.0  # a claim without a lease this old was abandoned mid-creation


@dataclass
class Lease:
    """Everything made for one host, written to disk before it is relied on, undone in reverse."""

    owner_pid: int
    pids: list[tuple[int, str]] = field(default_factory=list)  # (pid, cmdline marker)
    mounts: list[str] = field(default_factory=list)
    dirs: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class NetNS:
    """A namespace with one veth link to this machine."""

    name: str
    index: int

    @property
    def path(self) -> Path:
        return Path("/run/netns") / self.name

    @property
    def host_veth(self) -> str:
        return f"{self.name}-h"

    @property
    def host_address(self) -> str:
        return f"10.213.{self.index}.1"

    @property
    def guest_address(self) -> str:
        return f"10.213.{self.index}.2"

    @property
    def state_dir(self) -> Path:
        """Root-only directory for this host's files; removed with the namespace."""
        return STATE_ROOT / self.name

    def record(self, lease: Lease) -> None:
        """Persist `lease` (write temp, then rename) so a sweep after a crash sees it."""
        tmp = self.state_dir / "lease.json.tmp"
        tmp.write_text(json.dumps(asdict(lease)))
        tmp.rename(self.state_dir / "lease.json")


def create_netns() -> tuple[NetNS, Lease]:
    """Claim a free index, create its namespace and veth pair, bring both ends and `lo` up."""
    sweep_stale()
    STATE_ROOT.mkdir(mode=0o755, parents=True, exist_ok=True)
    for index in range(1, _MAX_INDEX + 1):
        ns = NetNS(f"{PREFIX}{index}", index)
        try:
            ns.state_dir.mkdir(mode=0o755)
        except FileExistsError:
            continue
        if ns.path.exists():  # a namespace nobody records: leftover of a crash mid-claim
            _delete_netns(ns)
        lease = Lease(owner_pid=os.getpid(), dirs=[str(ns.state_dir)])
        ns.record(lease)
        try:
            run(["ip", "netns", "add", ns.name])
            run(
                [
                    "ip",
                    "link",
                    "add",
                    ns.host_veth,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    "eth0",
                    "netns",
                    ns.name,
                ]
            )
            run(["ip", "addr", "add", f"{ns.host_address}/30", "dev", ns.host_veth])
            run(["ip", "link", "set", ns.host_veth, "up"])
            run(["ip", "-n", ns.name, "addr", "add", f"{ns.guest_address}/30", "dev", "eth0"])
            run(["ip", "-n", ns.name, "link", "set", "eth0", "up"])
            run(["ip", "-n", ns.name, "link", "set", "lo", "up"])
        except HostlabError:
            release(ns, lease)
            raise
        return ns, lease
    raise HostlabError(
        f"All {_MAX_INDEX} hostlab namespaces under {STATE_ROOT} are taken; "
        "stop other test runs or delete stale ones."
    )


def release(ns: NetNS, lease: Lease) -> None:
    """Undo `lease` and delete the namespace; safe to call twice or on a half-made host."""
    for pid, marker in reversed(lease.pids):
        stop_pid(pid, marker)
    if ns.path.exists():
        for leftover in run(["ip", "netns", "pids", ns.name], check=False).stdout.split():
            # Anything still inside a namespace we made was started through our host.
            stop_pid(int(leftover), "", grace_s=5.0)
    for mount in reversed(lease.mounts):
        if Path(mount).is_mount():
            run(["umount", "--lazy", mount], check=False)
    _delete_netns(ns)
    for directory in reversed(lease.dirs):
        shutil.rmtree(directory, ignore_errors=True)


def _delete_netns(ns: NetNS) -> None:
    """Remove the veth (gone already if its peer's namespace went) and the namespace."""
    run(["ip", "link", "del", ns.host_veth], check=False)
    if ns.path.exists():
        deleted = run(["ip", "netns", "del", ns.name], check=False)
        # Two workers sweeping one stale lease race here: gone is what either wanted.
        if deleted.returncode != 0 and ns.path.exists():
            raise HostlabError(f"ip netns del {ns.name} exited {deleted.returncode}: "
                               f"{deleted.stderr.strip()[-2000:]}")  # fmt: skip


def sweep_stale() -> None:
    """Release every `ddt-*` host whose owning process is gone (a killed earlier run)."""
    if STATE_ROOT.is_dir():
        for state in STATE_ROOT.glob(f"{PREFIX}*"):
            ns = NetNS(state.name, int(state.name.removeprefix(PREFIX)))
            lease_file = state / "lease.json"
            if lease_file.is_file():
                lease = Lease(**json.loads(lease_file.read_text()))
                lease.pids = [(pid, marker) for pid, marker in lease.pids]
                if Path(f"/proc/{lease.owner_pid}").exists():
                    continue
            elif time.time() - state.stat().st_mtime < _CLAIM_GRACE_S:
                continue
            else:
                lease = Lease(owner_pid=0, dirs=[str(state)])
            release(ns, lease)
    for line in run(["ip", "netns", "list"]).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if (
            name.startswith(PREFIX)
            and name.removeprefix(PREFIX).isdigit()
            and not (STATE_ROOT / name).exists()
        ):
            _delete_netns(NetNS(name, int(name.removeprefix(PREFIX))))
