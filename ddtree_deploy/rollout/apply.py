"""Apply a list of steps: inside one generation (the loop deploy and rollback share), or
outside any on a staging host."""

from __future__ import annotations

from collections.abc import Sequence

from ddtree_deploy.events import emit
from ddtree_deploy.hosts.connection import ShellHost
from ddtree_deploy.rollout.generations import GenerationStore
from ddtree_deploy.rollout.killpoints import boundary
from ddtree_deploy.steps import PlanStatus, Step, StepReport


def apply_steps(
    steps: Sequence[Step], host: ShellHost, generations: GenerationStore, number: int
) -> list[StepReport]:
    """Apply each step that differs; a restart owed by a step is persisted before it runs."""
    reports = []
    for step in steps:
        plan = step.check(host)
        if plan.status is PlanStatus.OK:
            reports.append(StepReport(step.name, "ok", plan.reason))
            continue
        if step.restarts_service:
            generations.owe_restart(number, step.name)
            boundary(f"{step.name}.owed")
        generations.journal("step.apply", generation=number, step=step.name, reason=plan.reason)
        result = step.apply(host)
        emit("step.result", step=step.name, status=result.status.value, detail=result.detail)
        reports.append(StepReport(step.name, result.status.value, result.detail))
        boundary(f"{step.name}.done")
    return reports


def apply_staged(
    steps: Sequence[Step], host: ShellHost, generations: GenerationStore, action: str
) -> list[StepReport]:
    """Apply `steps` outside any generation (a host without a managed service keeps none),
    marked on the host while they run, so `status` tells a run that stopped between them."""
    generations.begin_staged(action, [step.name for step in steps])
    reports = []
    for step in steps:
        plan = step.check(host)
        if plan.status is PlanStatus.OK:
            reports.append(StepReport(step.name, "ok", plan.reason))
        else:
            result = step.apply(host)
            reports.append(StepReport(step.name, result.status.value, result.detail))
        generations.staged_step_done(step.name)
        boundary(f"{step.name}.done")
    generations.end_staged()
    return reports
