"""Both transports as fixtures, so one test body runs locally and over real SSH."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hostlab import TestHost

from ddtree_deploy.hosts.connection import ShellHost
from ddtree_deploy.hosts.local import LocalHost
from ddtree_deploy.hosts.ssh import SshHost


@pytest.fixture
def ssh_connection(sshd_host: TestHost) -> Iterator[SshHost]:
    host = SshHost(
        sshd_host.name,
        address=sshd_host.address,
        port=sshd_host.port,
        user=sshd_host.user,
        key_file=str(sshd_host.key_path),
    )
    yield host
    host.close()


@pytest.fixture(params=["local", "ssh"])
def any_host(request: pytest.FixtureRequest) -> ShellHost:
    """The same host reached locally and over SSH (the sshd host shares this filesystem)."""
    if request.param == "local":
        return LocalHost()
    ssh: ShellHost = request.getfixturevalue("ssh_connection")
    return ssh
