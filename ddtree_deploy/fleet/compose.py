"""Each fleet host's config, composed as `ddtree-deploy host=<option>` would compose it.

The order is the host's option, then its overrides from the fleet file, then the command line's
(without `fleet` ones), so a host on another release or ABI keeps its own preflight, patch set
and kernels; each host's config passes every rule a single-host run checks.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ddtree_deploy.config import DeployConfig, compose_config
from ddtree_deploy.config.schema import FleetConfig
from ddtree_deploy.errors import ConfigError

_FLEET_OVERRIDE = re.compile(r"^[+~]*fleet(=|\.|$)")
_FLEET_OPTION = re.compile(r"^\+*fleet=")
_HOST_OPTION = re.compile(r"^[+~]*host=")
# What the fleet's own config reads besides the fleet: the action, the run folder, the search path.
_FLEET_LEVEL = re.compile(r"^[+~]*(action|output)=|^[+~]*(rollout|hydra)\.")


@dataclass(frozen=True)
class FleetMember:
    """One host of the fleet: its name in the fleet and its composed config."""

    name: str
    cfg: DeployConfig


def is_fleet_override(arg: str) -> bool:
    """Whether a command-line override concerns the fleet (`fleet=ct`, `fleet.batch_size=3`)."""
    return bool(_FLEET_OVERRIDE.match(arg))


def fleet_level(args: Sequence[str]) -> list[str] | None:
    """The overrides the fleet's own config is composed from when `args` name a fleet (None
    when they do not); every other override applies to each host, and is checked there."""
    if not any(_FLEET_OPTION.match(arg) for arg in args):
        return None
    return [arg for arg in args if is_fleet_override(arg) or _FLEET_LEVEL.match(arg)]


def compose_members(fleet: FleetConfig, args: Sequence[str]) -> list[FleetMember]:
    """Compose every host of `fleet`, in its order; `ConfigError` naming the host that fails."""
    if any(_HOST_OPTION.match(arg) for arg in args):
        raise ConfigError(
            f"fleet={fleet.name} names its hosts itself; drop host= from the command line "
            f"(or drop fleet= to act on one host)."
        )
    shared = [arg for arg in args if not is_fleet_override(arg)]
    members = []
    for name, entry in fleet.hosts.items():
        overrides = [f"host={entry.option or name}", *entry.overrides, *shared]
        try:
            cfg = compose_config(overrides)
        except ConfigError as err:
            raise ConfigError(f"fleet {fleet.name}, host {name}: {err}", hint=err.hint) from err
        members.append(FleetMember(name, cfg))
    seen: dict[str, str] = {}
    for member in members:
        if (other := seen.setdefault(member.cfg.host.name, member.name)) != member.name:
            raise ConfigError(
                f"fleet {fleet.name}'s hosts {other} and {member.name} both compose to "
                f"host.name={member.cfg.host.name}; give each its own host.name."
            )
    return members
