"""The lifecycle test host: a container with a prepared SGLang venv bound in, and helpers that
read what the tests check on it (the test double's record, unit state, the state journal).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from hostlab import TestHost
from product_hosts import connect, ssh_host_overrides

from ddtree_deploy.config import DeployConfig, compose_config
from ddtree_deploy.hosts.connection import ShellHost
from ddtree_deploy.hosts.ssh import SshHost
from ddtree_deploy.service import systemd

DOUBLE_DIR = "/opt/ddtree-test"
DOUBLE_MODULE = "sglang_double"


@dataclass(frozen=True)
class LabHost:
    """The container and the overrides that point a config at it."""

    host: TestHost
    venv: Path

    def overrides(self, name: str, runs_dir: Path) -> list[str]:
        """Config overrides for a test: its own unit `name` and state dir on the container."""
        return [
            *ssh_host_overrides(self.host),
            f"host.sglang_venv={self.venv}",
            f"host.state_dir=/var/lib/ddtree-test/{name}",
            "host.systemd=true",
            f"service.unit_name={name}",
            f"service.launch_module={DOUBLE_MODULE}",
            "service.settle_s=1",
            "service.active_wait_s=60",
            "service.restart_delay_s=1",
            f"+service.environment.PYTHONPATH={DOUBLE_DIR}",
            f"+service.environment.DDTREE_DOUBLE_ARGV_FILE=/run/ddtree-test/{name}.json",
            f"rollout.runs_dir={runs_dir}",
        ]

    def config(self, name: str, runs_dir: Path, *extra: str) -> DeployConfig:
        return compose_config([*self.overrides(name, runs_dir), *extra])

    def connect(self) -> SshHost:
        return connect(self.host)


def venv_binds(venv: Path) -> list[Path]:
    """The venv, the Python install it points at, and venvs its .pth files reach into."""
    binds = [venv]
    cfg = dict(
        line.split(" = ", 1)
        for line in (venv / "pyvenv.cfg").read_text().splitlines()
        if " = " in line
    )
    binds.append(Path(cfg["home"]).parent)
    for pth in venv.glob("lib/python*/site-packages/*.pth"):
        for line in pth.read_text().splitlines():
            target = Path(line.strip())
            if line.startswith("/") and target.is_dir():
                root = next((p for p in target.parents if (p / "pyvenv.cfg").exists()), None)
                if root is not None and root not in binds:
                    binds.append(root)
    return binds


def double_record(host: ShellHost, name: str) -> dict[str, Any]:
    """What the running test double wrote: its argv, pid and selected environment."""
    text = host.read_text(PurePosixPath(f"/run/ddtree-test/{name}.json"))
    assert text is not None, f"the double of {name} never started"
    record: dict[str, Any] = json.loads(text)
    return record


def arg(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def running_pid(host: ShellHost, name: str) -> int:
    state = systemd.unit_state(host, f"{name}.service")
    assert state.running, f"{name}.service is {state.describe()}"
    return state.main_pid


def journal_events(host: ShellHost, name: str) -> list[str]:
    text = host.read_text(PurePosixPath(f"/var/lib/ddtree-test/{name}/journal.jsonl")) or ""
    return [json.loads(line)["event"] for line in text.splitlines() if line.strip()]
