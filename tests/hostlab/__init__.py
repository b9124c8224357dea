"""Real test hosts for the suite: sshd in a network namespace, and systemd containers over SSH.

`TestHost` is what a test connects to; `ssh_argv` gives the system ssh command for it;
`unavailable_reason` says why the hosts cannot be had here (fixtures skip or, in CI, fail).
"""

from .availability import unavailable_reason
from .host import TestHost, ssh_argv
from .nspawn import Container, boot_container
from .proc import HostlabError
from .rootfs import ensure_rootfs
from .sshd import SshdHost, start_sshd_host

__all__ = [
    "Container",
    "HostlabError",
    "SshdHost",
    "TestHost",
    "boot_container",
    "ensure_rootfs",
    "ssh_argv",
    "start_sshd_host",
    "unavailable_reason",
]
