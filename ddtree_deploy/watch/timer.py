"""The re-validation timer's files: a oneshot service, its timer, and the configuration it runs.

The timer runs on the GPU host itself, beside the unit it watches, with ddtree-deploy installed
there (`watch.command`): it keeps watching while the operator's machine is off, reaches the
service on localhost without an SSH tunnel, and takes the API key from the service's own 0600
env file, so the key is copied nowhere. Its configuration is the deploy's, stored on the host
(`config.stored`), turned to reach the host locally (`host_side_config`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import PurePosixPath

from ddtree_deploy.config.schema import DeployConfig, GateAccess, Transport
from ddtree_deploy.config.stored import stored_config_text
from ddtree_deploy.service.quoting import exec_command, path_value, unit_value
from ddtree_deploy.service.render import API_KEY_VAR, render_template, unit_paths


@dataclass(frozen=True)
class WatchFiles:
    """What the host gets: the two units and the stored configuration, with their paths."""

    service_path: PurePosixPath
    service_text: str
    timer_path: PurePosixPath
    timer_text: str
    config_path: PurePosixPath
    config_text: str

    @property
    def timer(self) -> str:
        return self.timer_path.name


def watch_name(cfg: DeployConfig) -> str:
    """`ddtree-watch-<unit>`: the service and timer's name."""
    return f"ddtree-watch-{cfg.service.unit_name}"


def host_side_config(cfg: DeployConfig) -> DeployConfig:
    """`cfg` as the timer runs it on the host: local transport, the service on its local port,
    the API key from the env file, run folders in the state folder."""
    state_dir = PurePosixPath(cfg.host.state_dir)
    keyed = cfg.service.api_key_env is not None or cfg.service.api_key_file is not None
    return dataclasses.replace(
        cfg,
        host=dataclasses.replace(
            cfg.host, transport=Transport.local, address=None, key_file=None, sudo=False
        ),
        service=dataclasses.replace(
            cfg.service,
            api_key_env=API_KEY_VAR if keyed else None,
            api_key_file=None,
        ),
        validation=dataclasses.replace(cfg.validation, access=GateAccess.direct),
        rollout=dataclasses.replace(cfg.rollout, runs_dir=str(state_dir / "watch" / "runs")),
        action="revalidate",
        fleet=None,
    )


FULL_REVALIDATION_RESTARTS = 3  # rollout/revalidate.py's full run: linear, shadow-linear, tree


def render_watch(cfg: DeployConfig) -> WatchFiles:
    """The timer's files for `cfg` (pure: the same config gives the same bytes)."""
    name = watch_name(cfg)
    unit_dir = PurePosixPath(cfg.service.unit_dir)
    config_path = PurePosixPath(cfg.host.state_dir) / "watch" / "config.yaml"
    env_path = unit_paths(cfg)[1]
    words = [cfg.watch.command, "--from", str(config_path), "action=revalidate"]
    values = {
        "unit_name": unit_value(cfg.service.unit_name),
        "watch_name": unit_value(name),
        "env_path": path_value(str(env_path)),
        "exec_start": exec_command(words),
        # A full re-validation restarts the service three times (back to linear DFlash,
        # shadow-linear, tree) and loads the model each time; the gates' own time on top.
        "timeout_s": FULL_REVALIDATION_RESTARTS * cfg.service.start_timeout_s + 1800,
        "interval": unit_value(cfg.watch.interval),
        "accuracy": unit_value(cfg.watch.accuracy),
    }
    return WatchFiles(
        service_path=unit_dir / f"{name}.service",
        service_text=render_template("ddtree-watch.service.j2", values),
        timer_path=unit_dir / f"{name}.timer",
        timer_text=render_template("ddtree-watch.timer.j2", values),
        config_path=config_path,
        config_text=stored_config_text(host_side_config(cfg)),
    )
