"""Why the hostlab cannot be had on this machine, if it cannot (fixtures turn it into a skip)."""

from __future__ import annotations

import os
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

from .proc import HostlabError
from .rootfs import SUITE, cached_rootfs, debian_mirror

INSTALL_HINT = "run tests/hostlab/install-debs.sh as root"


def unavailable_reason(*, containers: bool) -> str | None:
    """None if sshd hosts (and, with `containers`, nspawn hosts) can run here, else why not."""
    if os.geteuid() != 0:
        return "hostlab needs root (network namespaces, sshd, systemd-nspawn)"
    for tool in ("ip", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"hostlab needs `{tool}` on PATH; {INSTALL_HINT}"
    if not Path("/usr/sbin/sshd").is_file():
        return f"hostlab needs /usr/sbin/sshd (openssh-server); {INSTALL_HINT}"
    if (reason := _netns_reason()) is not None:
        return reason
    if not containers:
        return None
    if shutil.which("systemd-nspawn") is None:
        return f"hostlab containers need systemd-nspawn (systemd-container); {INSTALL_HINT}"
    if cached_rootfs() is not None:
        return None
    if shutil.which("debootstrap") is None:
        return f"hostlab containers need debootstrap to build the rootfs; {INSTALL_HINT}"
    return _mirror_reason()


def _netns_reason() -> str | None:
    """Creating a network namespace needs CAP_SYS_ADMIN, which root in some sandboxes lacks."""
    probe = f"ddt-probe-{os.getpid()}"
    made = subprocess.run(
        ["ip", "netns", "add", probe], capture_output=True, text=True, check=False
    )
    if made.returncode != 0:
        return f"hostlab cannot create network namespaces here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


def _mirror_reason() -> str | None:
    """No cached rootfs: debootstrap needs apt's Debian mirror to answer."""
    try:
        release = f"{debian_mirror().rstrip('/')}/dists/{SUITE}/Release"
        urllib.request.urlopen(urllib.request.Request(release, method="HEAD"), timeout=10).close()
    except (HostlabError, urllib.error.URLError, OSError) as err:
        return f"no cached rootfs and the Debian mirror cannot be reached for debootstrap: {err}"
    return None
