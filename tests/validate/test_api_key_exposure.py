"""The server's API key on a systemd host: on no command line, in no process's environment.

The unit runs the stand-in (a test double; tests/standin/server.py) through the product's
launcher, and the real patched SGLang parser reads the key the launcher hands it. The stand-in
starts a spawned child and multiprocessing its resource tracker, as SGLang's server does, so the
service has more than one process to look at.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import pytest

from ddtree_deploy.hosts.connection import ShellHost
from ddtree_deploy.rollout.pipeline import deploy
from ddtree_deploy.service import systemd
from ddtree_deploy.service.secret import Secret, load_api_key
from ddtree_deploy.validate.errors import BadResponse
from ddtree_deploy.validate.gates import Outcome
from ddtree_deploy.validate.probes import Expected, ServiceProbe
from validate.conftest import API_KEY, StandinLab

pytestmark = pytest.mark.nspawn


def service_pids(host: ShellHost, unit: str) -> list[int]:
    """Every process of the unit's cgroup (`ps` reads the unit from it, cgroup v1 or v2)."""
    table = host.run(["ps", "-e", "-o", "pid=,unit="]).stdout
    return [
        int(pid) for pid, owner in (line.split() for line in table.splitlines()) if owner == unit
    ]


def proc_file(host: ShellHost, pid: int, name: str) -> str:
    data = host.read_bytes(PurePosixPath(f"/proc/{pid}/{name}"))
    assert data is not None, f"process {pid} is gone"
    return data.replace(b"\0", b" ").decode(errors="replace")


def test_api_key_is_on_no_command_line_and_in_no_environment_of_the_service(
    standin_lab: StandinLab, tmp_path: Path
) -> None:
    name = "val-key"
    cfg = standin_lab.config(name, tmp_path, 31221, "algo=dflash")
    with standin_lab.connect() as host:
        deploy(cfg, host, api_key=load_api_key(cfg.service))
        gates = ServiceProbe(cfg, host, Secret(API_KEY)).first_gates(Expected.of(cfg))
        assert [(g.gate, g.outcome) for g in gates] == [
            (gate, Outcome.passed)
            for gate in ("unit_active", "health", "server_info", "health_generate")
        ]
        with (
            ServiceProbe(cfg, host, None).client() as client,
            pytest.raises(BadResponse, match="answered HTTP 401"),
        ):
            client.server_info()

        main_pid = systemd.unit_state(host, f"{name}.service").main_pid
        pids = service_pids(host, f"{name}.service")
        cmdlines = {pid: proc_file(host, pid, "cmdline") for pid in pids}
        environs = {pid: proc_file(host, pid, "environ") for pid in pids}

    assert main_pid in pids and len(pids) >= 3, cmdlines  # server, its child, resource tracker
    # The launcher's second start: the same main process, the key in a pipe it has read.
    assert " -m ddtree_launch --api-key-fd " in cmdlines[main_pid]
    assert [pid for pid, line in cmdlines.items() if API_KEY in line] == []
    assert [pid for pid, env in environs.items() if API_KEY in env] == []
    assert all("SGLANG_API_KEY" not in environs[pid] for pid in pids)
