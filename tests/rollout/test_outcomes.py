"""What a fleet reads of an action's outcome, through the core alone: whether the host changed,
its recap line and what it serves (fleet.driver turns these into the host's verdict and row)."""

from __future__ import annotations

import pytest

from ddtree_deploy.hosts.facts import HostFacts
from ddtree_deploy.rollout.generations import HostState
from ddtree_deploy.rollout.outcomes import (
    ActionOutcome,
    DeployedOutcome,
    GatedOutcome,
    PatchStepOutcome,
    PlannedStep,
    PlanOutcome,
)
from ddtree_deploy.rollout.preflight import PreflightReport
from ddtree_deploy.service.lint import LintReport
from ddtree_deploy.validate.gates import Decision
from ddtree_deploy.validate.record import ValidationRecord

PREFLIGHT = PreflightReport("h1", (), HostFacts(host="h1", python_path="/nowhere/bin/python"))


def _record(decision: Decision) -> ValidationRecord:
    record = ValidationRecord("h1", "DDTREE tree")
    record.decide(decision, f"h1: {decision.value}.")
    return record


@pytest.mark.parametrize(
    ("decision", "changed"),
    [
        (Decision.promote, True),
        (Decision.passed, True),
        (Decision.unchanged, False),
        (Decision.staging, False),
    ],
)
def test_gated_outcome_changed_follows_the_decision(decision: Decision, changed: bool) -> None:
    outcome = GatedOutcome(summary="h1: judged.", validation=_record(decision))
    assert outcome.changed is changed
    assert outcome.recap == "h1: judged." and outcome.record is outcome.validation


def test_deploy_with_unchanged_gates_still_changed_when_a_step_changed() -> None:
    now = HostState(generation=3, summary="DDTREE tree")
    outcome = DeployedOutcome(
        preflight=PREFLIGHT,
        lint=LintReport("ddtree.service", available=False),
        results=[PlannedStep("patch", "changed", "patched 8 files")],
        summary="h1: 1 step(s) changed; generation 3 is current.",
        validation=_record(Decision.unchanged),
        now=now,
    )
    assert outcome.changed and outcome.serving is now


@pytest.mark.parametrize(
    ("statuses", "recap"),
    [
        (("would_change", "ok", "would_change"), "would change: s0, s2"),
        (("ok", "staging"), "nothing to change"),
    ],
)
def test_plan_recap_names_the_steps_that_would_change(
    statuses: tuple[str, ...], recap: str
) -> None:
    steps = [PlannedStep(f"s{i}", status, "") for i, status in enumerate(statuses)]
    outcome = PlanOutcome(preflight=PREFLIGHT, steps=steps)
    assert outcome.recap == recap and not outcome.changed


@pytest.mark.parametrize(("status", "changed"), [("changed", True), ("ok", False)])
def test_patch_step_changed_when_the_step_changed(status: str, changed: bool) -> None:
    assert PatchStepOutcome(step=PlannedStep("patch", status, "")).changed is changed


def test_the_core_alone_changed_nothing_and_serves_nothing_new() -> None:
    core = ActionOutcome()
    assert (core.changed, core.recap, core.record, core.serving) == (False, None, None, None)
