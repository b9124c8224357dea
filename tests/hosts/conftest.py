"""Both transports as fixtures, so one test body runs locally and over real SSH."""

from __future__ import annotations

import pytest

from ddtree_deploy.hosts.connection import ShellHost
from ddtree_deploy.hosts.local import LocalHost


@pytest.fixture(params=["local", "ssh"])
def any_host(request: pytest.FixtureRequest) -> ShellHost:
    """The same host reached locally and over SSH (the sshd host shares this filesystem)."""
    if request.param == "local":
        return LocalHost()
    ssh: ShellHost = request.getfixturevalue("ssh_connection")
    return ssh
