"""The product's side of a hostlab test host: its SSH connection and the config that reaches it."""

from __future__ import annotations

from hostlab import TestHost

from ddtree_deploy.hosts.ssh import SshHost


def connect(test_host: TestHost, name: str = "lab") -> SshHost:
    """An `SshHost` (Fabric) to `test_host`, as the product would open it from a config."""
    return SshHost(
        name,
        address=test_host.address,
        port=test_host.port,
        user=test_host.user,
        key_file=str(test_host.key_path),
    )


def ssh_host_overrides(test_host: TestHost, name: str = "lab") -> list[str]:
    """Overrides that turn `host=local` into `test_host` reached over SSH."""
    return [
        "host=local",
        f"host.name={name}",
        "host.transport=ssh",
        f"host.address={test_host.address}",
        f"host.port={test_host.port}",
        f"host.user={test_host.user}",
        f"host.key_file={test_host.key_path}",
    ]
