"""The step contract every deploy step follows (STYLE section 7, ARCHITECTURE "Data flow").

A leaf module like `errors`: the rooms that own steps (patching, kernel_build, service) and
`rollout`, which orders them, all import it.

`check(host) -> StepPlan` reads only and says ok | would_change | unknown with a reason or a
diff; `apply(host) -> StepResult` does only the difference and says ok | changed (or raises a
`DeployError`); steps that change the host also `revert`, back to a recorded generation. A
step's docstring's first line is what `action=plan` prints beside its name.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar, Protocol

from ddtree_deploy.events import emit
from ddtree_deploy.hosts.connection import ShellHost


class PlanStatus(StrEnum):
    OK = "ok"
    WOULD_CHANGE = "would_change"
    UNKNOWN = "unknown"


class ResultStatus(StrEnum):
    OK = "ok"
    CHANGED = "changed"
    FAILED = "failed"


@dataclass(frozen=True)
class StepPlan:
    """What `check` found; `reason` says why (also for "nothing to do"), `diff` what differs."""

    status: PlanStatus
    reason: str
    diff: str = ""

    @classmethod
    def ok(cls, reason: str) -> StepPlan:
        return cls(PlanStatus.OK, reason)

    @classmethod
    def would_change(cls, reason: str, diff: str = "") -> StepPlan:
        return cls(PlanStatus.WOULD_CHANGE, reason, diff)

    @classmethod
    def unknown(cls, reason: str) -> StepPlan:
        return cls(PlanStatus.UNKNOWN, reason)


@dataclass(frozen=True)
class StepResult:
    """What `apply` did; `detail` is one line for the recap."""

    status: ResultStatus
    detail: str

    @classmethod
    def ok(cls, detail: str) -> StepResult:
        return cls(ResultStatus.OK, detail)

    @classmethod
    def changed(cls, detail: str) -> StepResult:
        return cls(ResultStatus.CHANGED, detail)

    @classmethod
    def failed(cls, detail: str) -> StepResult:
        return cls(ResultStatus.FAILED, detail)


@dataclass(frozen=True)
class StepReport:
    """One row of a plan or a recap: a step, its status (plan or result) and why."""

    name: str
    status: str
    detail: str


class Step(Protocol):
    """One deploy step. `restarts_service`: a change by this step owes the service a restart."""

    name: ClassVar[str]
    restarts_service: ClassVar[bool]

    def check(self, host: ShellHost) -> StepPlan: ...

    def apply(self, host: ShellHost) -> StepResult: ...


def unified_diff(before: str, after: str, label: str) -> str:
    """A unified diff of two texts, labelled with the file it concerns."""
    return "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            fromfile=f"{label} (host)",
            tofile=f"{label} (rendered)",
        )
    )


def check_steps(steps: Sequence[Step], host: ShellHost) -> list[tuple[Step, StepPlan]]:
    plans = []
    for step in steps:
        plan = step.check(host)
        emit("step.check", step=step.name, status=plan.status.value, reason=plan.reason)
        plans.append((step, plan))
    return plans
