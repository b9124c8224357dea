"""Build the right `ShellHost` for a host config.

The SSH transport (Fabric, paramiko) is imported only for an SSH host, so the tool runs on a
local host, such as the GPU lab's machine, without the SSH stack installed.
"""

from __future__ import annotations

from ddtree_deploy.config.schema import HostConfig, Transport
from ddtree_deploy.hosts.connection import ShellHost
from ddtree_deploy.hosts.local import LocalHost


def connect(host: HostConfig) -> ShellHost:
    """A host object for `host`; nothing is opened until its first command."""
    if host.transport is Transport.local:
        return LocalHost(host.name, default_timeout_s=host.command_timeout_s)
    assert host.address, "config.rules guarantees an address for ssh hosts"
    from ddtree_deploy.hosts.ssh import SshHost

    return SshHost(
        host.name,
        address=host.address,
        port=host.port,
        user=host.user,
        key_file=host.key_file,
        connect_timeout_s=host.connect_timeout_s,
        default_timeout_s=host.command_timeout_s,
        use_sudo=host.sudo or None,
    )
