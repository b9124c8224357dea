"""What each `action=` does, in order. The only module that knows the order of steps.

Each action returns an `ActionOutcome`: the objects the CLI renders and the exit code. Actions
print nothing themselves; they emit events.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePosixPath

from ddtree_deploy.config.schema import DeployConfig
from ddtree_deploy.errors import ConfigError
from ddtree_deploy.hosts.factory import connect
from ddtree_deploy.hosts.facts import HostFacts, probe_facts
from ddtree_deploy.hosts.staging import StagingResult, prepare_staging_venv
from ddtree_deploy.patching.manifest import UnsupportedRelease, select_patch_set
from ddtree_deploy.report.events import emit
from ddtree_deploy.rollout.preflight import PreflightReport, run_preflight, sglang_python


@dataclass(frozen=True)
class PlannedStep:
    """One line of `action=plan`: what a step would do on this host."""

    name: str
    status: str  # ok | would_change | unknown | staging
    detail: str


@dataclass
class ActionOutcome:
    """What an action produced, for the CLI to render; `exit_code` 0 means success."""

    exit_code: int = 0
    facts: HostFacts | None = None
    preflight: PreflightReport | None = None
    steps: list[PlannedStep] = field(default_factory=list)
    staging: StagingResult | None = None


def gather_facts(cfg: DeployConfig) -> HostFacts:
    """Probe the configured host through its SGLang venv's Python."""
    with connect(cfg.host) as host:
        facts = probe_facts(host, sglang_python(cfg))
    emit("facts", **facts.to_dict())
    return facts


def facts_action(cfg: DeployConfig) -> ActionOutcome:
    return ActionOutcome(facts=gather_facts(cfg))


def plan_action(cfg: DeployConfig) -> ActionOutcome:
    """Preflight, then what each implemented step would do; changes nothing."""
    facts = gather_facts(cfg)
    report = run_preflight(cfg, facts)
    emit("preflight", refusals=report.refusals)
    steps = [_patch_step_plan(cfg, facts)]
    return ActionOutcome(
        exit_code=0 if not report.refusals else 4, facts=facts, preflight=report, steps=steps
    )


def prepare_action(cfg: DeployConfig) -> ActionOutcome:
    """Build the staging host's SGLang venv (staging hosts only)."""
    if not cfg.host.staging:
        raise ConfigError(
            f"action=prepare builds the SGLang venv of a staging host, and {cfg.host.name} is "
            "not one; install SGLang on it as its operators do, then run action=plan."
        )
    with connect(cfg.host) as host:
        result = prepare_staging_venv(
            host,
            PurePosixPath(cfg.host.sglang_venv),
            base_python=f"python{cfg.abi.python}",
            sglang_version=cfg.sglang.version,
            requirements=cfg.sglang.staging_requirements,
        )
    return ActionOutcome(staging=result)


def _patch_step_plan(cfg: DeployConfig, facts: HostFacts) -> PlannedStep:
    version = facts.sglang_version or cfg.sglang.version
    try:
        patch_set = select_patch_set(version)
    except UnsupportedRelease as err:
        return PlannedStep("patch", "unknown", str(err))
    files = {f.path for p in patch_set.patches for f in p.files}
    return PlannedStep(
        "patch",
        "unknown",
        f"apply patch set {patch_set.name} ({len(patch_set.patches)} patches, "
        f"{len(files)} files) to SGLang {version}",
    )
