"""Fleets: one action over several hosts, canary first, then batches in parallel (conf/fleet/).

Sits above `rollout` (each host runs the very action a single-host run would, through
`rollout.actions.HANDLERS`) and below `cli`, which prints the live table and the recap. Pieces:
`compose` (each host's config), `strategy` (batches, verdicts, the failure budget), `journal`
(where a killed rollout resumes), `driver` (one host's run, in its own run folder), `schedule`
(the batches, in threads).
"""

from ddtree_deploy.fleet.compose import (
    FleetMember,
    compose_members,
    fleet_level,
    is_fleet_override,
)
from ddtree_deploy.fleet.driver import ActionDriver
from ddtree_deploy.fleet.journal import FleetJournal
from ddtree_deploy.fleet.schedule import HostDriver, walk
from ddtree_deploy.fleet.strategy import FleetResult, HostRun, Verdict

__all__ = [
    "ActionDriver",
    "FleetJournal",
    "FleetMember",
    "FleetResult",
    "HostDriver",
    "HostRun",
    "Verdict",
    "compose_members",
    "fleet_level",
    "is_fleet_override",
    "walk",
]
