# --- hostlab: real SSH and systemd test hosts (tests/hostlab/) -------------------------------
# sshd_host: sshd in its own network namespace. nspawn_hosts / nspawn_host: Debian containers
# booted with systemd-nspawn (real systemd as PID 1), reached over SSH. Without root or the
# Debian packages (tests/hostlab/install-debs.sh) they skip, or fail when DDTREE_REQUIRE_HOSTLAB=1.
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling

_TESTS_DIR = str(Path(__file__).resolve().parent)
if _TESTS_DIR not in sys.path:  # --import-mode=importlib leaves sys.path alone
    sys.path.insert(0, _TESTS_DIR)

from fast_loop import HeavyReach, heavy_reason  # noqa: E402
from hostlab import (  # noqa: E402
    Container,
    TestHost,
    boot_container,
    ensure_rootfs,
    start_sshd_host,
    unavailable_reason,
)
from product_hosts import connect  # noqa: E402
from scheduling import make_scheduler  # noqa: E402

from ddtree_deploy.hosts.ssh import SshHost  # noqa: E402

MAX_NSPAWN_HOSTS = 2  # each boot costs seconds and a rootfs overlay; no test needs more


def pytest_configure(config: pytest.Config) -> None:
    """Register the hostlab markers (one pytest_configure per conftest: extend this one)."""
    config.addinivalue_line("markers", "sshd: uses sshd_host, a real sshd in a network namespace")
    config.addinivalue_line(
        "markers", "nspawn: uses nspawn_host(s), systemd containers booted with systemd-nspawn"
    )
    config.addinivalue_line(
        "markers", "clone: runs tests in a fresh clone of this checkout under /tmp (minutes)"
    )
    config.addinivalue_line(
        "markers",
        "fast: needs no container, staging venv or SGLang wheel (set at collection from the "
        "test's code, tests/fast_loop.py; `-m fast`, scripts/test --fast)",
    )
    config.addinivalue_line(
        "markers",
        "slow(reason): keep a test out of the fast loop although it needs no heavy part; "
        "say why (its measured time)",
    )


def _require_hostlab(*, containers: bool) -> None:
    """Skip when the hostlab cannot run here; fail instead when CI demands it."""
    reason = unavailable_reason(containers=containers)
    if reason is None:
        return
    if os.environ.get("DDTREE_REQUIRE_HOSTLAB") == "1":
        pytest.fail(f"DDTREE_REQUIRE_HOSTLAB=1 but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def sshd_host() -> Iterator[TestHost]:
    """One sshd-only host (port 2222, user root); commands run on this machine's filesystem."""
    _require_hostlab(containers=False)
    host = start_sshd_host()
    try:
        yield host.host
    finally:
        host.stop()


@pytest.fixture
def ssh_connection(sshd_host: TestHost) -> Iterator[SshHost]:
    """The product's SSH connection (Fabric) to `sshd_host`, closed after the test."""
    host = connect(sshd_host, "sshd-lab")
    yield host
    host.close()


@pytest.fixture(scope="session")
def nspawn_hosts() -> Iterator[Callable[[int], list[TestHost]]]:
    """`nspawn_hosts(n)` gives n (<= 2) booted container hosts, booting only those not yet up.

    Hosts live for the whole session and are shared between tests: name what you install
    uniquely and remove it when done.
    """
    _require_hostlab(containers=True)
    rootfs = ensure_rootfs()  # built once per machine; every boot overlays the same tree
    containers: list[Container] = []
    with ExitStack() as stops:  # stops every container, even when one stop raises

        def hosts(count: int) -> list[TestHost]:
            if not 1 <= count <= MAX_NSPAWN_HOSTS:
                raise ValueError(f"nspawn_hosts boots 1 to {MAX_NSPAWN_HOSTS} hosts, not {count}")
            while len(containers) < count:
                container = boot_container(rootfs)
                stops.callback(container.stop)
                containers.append(container)
            return [c.host for c in containers[:count]]

        yield hosts


@pytest.fixture(scope="session")
def nspawn_host(nspawn_hosts: Callable[[int], list[TestHost]]) -> TestHost:
    """The first booted container host (root over SSH on port 22)."""
    return nspawn_hosts(1)[0]


# --- pytest-xdist: which tests one worker runs together, and in what order (tests/scheduling.py) --
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> LoadScopeScheduling:
    return make_scheduler(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the fast loop's tests `fast` (tests/fast_loop.py says which)."""
    reach = HeavyReach()
    for item in items:
        if heavy_reason(item, reach) is None:
            item.add_marker(pytest.mark.fast)
