"""What each `action=` returns: a small common core (`ActionOutcome`) and one type per family.

The core is what the exit code and a fleet read of any action; each subclass holds only what
its actions produce and is rendered by its own renderer (`report.outcomes`), so adding an
action means adding its type and its renderer, never a field every other action leaves empty.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddtree_deploy.errors import DeployError, ExitCode
from ddtree_deploy.hosts.facts import HostFacts
from ddtree_deploy.hosts.staging import StagingResult
from ddtree_deploy.kernel_build import KernelsResult
from ddtree_deploy.patching.audit import AuditReport
from ddtree_deploy.patching.port import PortReport
from ddtree_deploy.rollout.generations import HostState
from ddtree_deploy.rollout.preflight import PreflightReport
from ddtree_deploy.rollout.status import HostStatus
from ddtree_deploy.rollout.validation_flow import ValidationFailed
from ddtree_deploy.service.lint import LintReport
from ddtree_deploy.service.render import RenderedService
from ddtree_deploy.validate.gates import Decision
from ddtree_deploy.validate.record import ValidationRecord


@dataclass(frozen=True)
class PlannedStep:
    """One line of `action=plan`: what a step would do on this host."""

    name: str
    status: str  # ok | would_change | unknown | staging
    detail: str


@dataclass(frozen=True, kw_only=True)
class ActionOutcome:
    """The core every action's outcome shares: its exit code (0: success) and what a fleet
    reads of it, whatever the action (the properties a family overrides where it has them)."""

    exit_code: int = ExitCode.OK

    @property
    def changed(self) -> bool:
        """Whether the action changed the host (a fleet counts the host `changed`)."""
        return False

    @property
    def recap(self) -> str | None:
        """The fleet recap's line for this host; None where its verdict says enough."""
        return None

    @property
    def record(self) -> ValidationRecord | None:
        """The gates' record (a fleet's recap shows its figures); None where no gate ran."""
        return None

    @property
    def serving(self) -> HostState | None:
        """The host's generation and what it serves after the action, where it knows them."""
        return None


@dataclass(frozen=True, kw_only=True)
class FactsOutcome(ActionOutcome):
    """action=facts: what the probe found."""

    facts: HostFacts


@dataclass(frozen=True, kw_only=True)
class PlanOutcome(ActionOutcome):
    """action=plan: the preflight's verdicts and what each step would do."""

    preflight: PreflightReport
    steps: list[PlannedStep]

    @property
    def recap(self) -> str:
        would = [s.name for s in self.steps if s.status == "would_change"]
        return f"would change: {', '.join(would)}" if would else "nothing to change"


@dataclass(frozen=True, kw_only=True)
class KernelsOutcome(ActionOutcome):
    """action=build-kernels: the preflight's verdicts and the wheel built (or reused)."""

    preflight: PreflightReport
    kernels: KernelsResult


@dataclass(frozen=True, kw_only=True)
class RenderOutcome(ActionOutcome):
    """action=render: the unit and env file (secrets only in `env_text`) and their lint."""

    rendered: RenderedService
    lint: LintReport


@dataclass(frozen=True, kw_only=True)
class GatedOutcome(ActionOutcome):
    """action=validate, tune and revalidate: the gates' record and its one-line recap."""

    summary: str
    validation: ValidationRecord

    @property
    def changed(self) -> bool:
        return _gates_changed(self.validation)

    @property
    def recap(self) -> str:
        return self.summary

    @property
    def record(self) -> ValidationRecord:
        return self.validation


@dataclass(frozen=True, kw_only=True)
class DeployedOutcome(GatedOutcome):
    """action=deploy: a gated outcome with the preflight, lint, what each step did, and the
    generation it left current (its own renderer draws them: tests/report/test_outcomes.py
    holds every type to a renderer of its own, not its parent's)."""

    preflight: PreflightReport
    lint: LintReport
    results: list[PlannedStep]
    now: HostState

    @property
    def changed(self) -> bool:
        return super().changed or _any_changed(self.results)

    @property
    def serving(self) -> HostState:
        return self.now


@dataclass(frozen=True, kw_only=True)
class RolledBackOutcome(ActionOutcome):
    """action=rollback: what each step did and the generation it made current."""

    results: list[PlannedStep]
    summary: str
    now: HostState

    @property
    def changed(self) -> bool:
        return _any_changed(self.results)

    @property
    def recap(self) -> str:
        return self.summary

    @property
    def serving(self) -> HostState:
        return self.now


@dataclass(frozen=True, kw_only=True)
class StatusOutcome(ActionOutcome):
    """action=status: the host's state; with `output=prometheus` also its metrics text."""

    status: HostStatus
    metrics: str | None = None

    @property
    def recap(self) -> str:
        return f"{self.status.unit_state}; drift: {len(self.status.drift)}"


@dataclass(frozen=True, kw_only=True)
class PrepareOutcome(ActionOutcome):
    """action=prepare: the staging venv, built or found ready."""

    staging: StagingResult


@dataclass(frozen=True, kw_only=True)
class PatchStepOutcome(ActionOutcome):
    """action=patch and unpatch: what the patch step did."""

    step: PlannedStep

    @property
    def changed(self) -> bool:
        return _any_changed([self.step])


@dataclass(frozen=True, kw_only=True)
class AuditOutcome(ActionOutcome):
    """action=audit: the installed SGLang's files, hunks and DFLASH gates."""

    audit: AuditReport


@dataclass(frozen=True, kw_only=True)
class PortOutcome(ActionOutcome):
    """action=port: the hunks' fit on the new release and, if all fit, the candidate set."""

    port: PortReport


@dataclass(frozen=True)
class ActionRun:
    """What running an action on one host gave: its outcome, or the error it raised."""

    outcome: ActionOutcome | None
    error: DeployError | None = None

    @property
    def record(self) -> ValidationRecord | None:
        """The gates' record, a failed validation's included."""
        if isinstance(self.error, ValidationFailed):
            return self.error.record
        return self.outcome.record if self.outcome is not None else None


def _gates_changed(record: ValidationRecord) -> bool:
    """Whether a fleet counts the gates' decision as a change: any but unchanged and staging."""
    return record.decision is not None and record.decision not in (
        Decision.unchanged,
        Decision.staging,
    )


def _any_changed(results: list[PlannedStep]) -> bool:
    return any(r.status == "changed" for r in results)
