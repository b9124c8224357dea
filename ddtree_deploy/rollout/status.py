"""`action=status`: a host's generation, algorithm, unit state, drift, and who holds its lock.

Drift is anything changed outside the tool since the current generation was committed: the unit
or env file's bytes or mode, a unit file systemd has not reloaded, a disabled unit. It reads the
host only; it never changes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

from ddtree_deploy.config.schema import DeployConfig
from ddtree_deploy.events import emit
from ddtree_deploy.hosts.connection import ShellHost
from ddtree_deploy.hosts.lock import lock_holder
from ddtree_deploy.rollout.generations import GenerationStore
from ddtree_deploy.service import systemd
from ddtree_deploy.service.render import sha256_text, unit_paths


@dataclass(frozen=True)
class HostStatus:
    host: str
    generation: int | None
    lineage: tuple[int, ...]
    algo: str
    summary: str
    unit: str
    unit_state: str
    enabled: str
    interrupted: int | None  # a generation a killed run left in progress
    pending_restart: tuple[str, ...]
    drift: tuple[str, ...]
    locked_by: str | None  # the run holding the host's lock, if any


def host_status(cfg: DeployConfig, host: ShellHost) -> HostStatus:
    generations = GenerationStore(host, PurePosixPath(cfg.host.state_dir))
    state = generations.state()
    unit_path, env_path = unit_paths(cfg)
    unit = unit_path.name
    systemd_state = systemd.unit_state(host, unit)
    drift: list[str] = []
    if state["generation"] is not None:
        for path, key in ((unit_path, "unit_sha256"), (env_path, "env_sha256")):
            text = host.read_text(path, sudo=True)
            if text is None:
                drift.append(f"{path} was removed")
            elif sha256_text(text) != state.get(key):
                drift.append(f"{path} was changed outside ddtree-deploy")
        mode = host.run(["stat", "-c", "%a", "--", str(env_path)], sudo=True, check=False)
        if mode.ok and mode.stdout.strip() != "600":
            drift.append(f"{env_path} is mode {mode.stdout.strip()}, not 600")
        if systemd_state.need_daemon_reload:
            drift.append(f"systemd runs an older copy of {unit} (daemon-reload pending)")
        if systemd_state.unit_file_state not in ("enabled", ""):
            drift.append(f"{unit} is {systemd_state.unit_file_state}")
    owed = state["pending_restart"]
    status = HostStatus(
        host=cfg.host.name,
        generation=state["generation"],
        lineage=tuple(state["lineage"]),
        algo=state.get("algo", "none"),
        summary=state.get("summary", "no generation recorded"),
        unit=unit,
        unit_state=systemd_state.describe(),
        enabled=systemd_state.unit_file_state or "not installed",
        interrupted=(state["in_progress"] or {}).get("generation"),
        pending_restart=tuple(owed["reasons"]) if owed else (),
        drift=tuple(drift),
        locked_by=lock_holder(host, PurePosixPath(cfg.host.state_dir)),
    )
    emit(
        "status",
        generation=status.generation,
        algo=status.algo,
        drift=list(status.drift),
        unit_state=status.unit_state,
    )
    return status
