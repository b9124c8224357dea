"""A fleet's strategy as plain data: batches, each host's verdict, the failure budget, the exit.

No host is touched here; `walk` applies these rules to real runs (and the CPU tests to doubles).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ddtree_deploy.errors import ExitCode
from ddtree_deploy.rollout.outcomes import ActionOutcome


class Verdict(StrEnum):
    """What happened to one host in this run (the recap's result column)."""

    changed = "changed"  # the action changed the host and it passed
    ok = "ok"  # nothing to change, or a read-only action that succeeded
    done = "done"  # finished by an earlier run of this rollout; not run again
    failed = "failed"  # the action failed (a failed gate rolled the host back by itself)
    refused = "refused"  # preflight refused it, or another run holds its lock
    unreachable = "unreachable"
    rolled_back = "rolled back"  # on_failure=rollback_all returned it to where the run found it
    skipped = "skipped"  # not started: the rollout halted first


FAILURES = frozenset({Verdict.failed, Verdict.refused, Verdict.unreachable})
# Verdicts the next run of the same command does not repeat.
FINISHED = frozenset({Verdict.changed, Verdict.ok, Verdict.done})


@dataclass(frozen=True)
class HostRun:
    """One host's result: the verdict, its one-line reason and what the host serves after it."""

    name: str
    verdict: Verdict
    detail: str
    exit_code: int = 0
    batch: int = 0  # 1-based; 0 when the host was not started
    generation: int | None = None
    algo: str = ""
    tokens_per_s: float | None = None
    speedup: float | None = None
    wall_s: float = 0.0
    run_dir: str = ""
    # What the action returned (plan steps, status...) for the CLI to render; not in reports.
    outcome: ActionOutcome | None = field(default=None, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.name,
            "verdict": self.verdict.value,
            "detail": self.detail,
            "exit_code": self.exit_code,
            "batch": self.batch,
            "generation": self.generation,
            "algo": self.algo,
            "tokens_per_s": self.tokens_per_s,
            "speedup": self.speedup,
            "wall_s": round(self.wall_s, 3),
            "run_dir": self.run_dir,
        }


@dataclass(frozen=True)
class FleetResult:
    """The whole rollout: every host in fleet order, and why it stopped early (if it did)."""

    fleet: str
    action: str
    hosts: tuple[HostRun, ...]
    halted: str | None  # the sentence saying why no further batch started
    resumed_from: str | None  # the run folder of the earlier run this one continued
    wall_s: float

    @property
    def exit_code(self) -> int:
        """0 when no host failed; else the first failed host's own code (a one-host fleet
        exits as that host's single run would)."""
        for run in self.hosts:
            if run.verdict in FAILURES:
                return run.exit_code or ExitCode.FAILED
        return ExitCode.OK

    def to_dict(self) -> dict[str, Any]:
        return {
            "fleet": self.fleet,
            "action": self.action,
            "exit_code": self.exit_code,
            "halted": self.halted,
            "resumed_from": self.resumed_from,
            "wall_s": round(self.wall_s, 3),
            "counts": {v.value: sum(r.verdict is v for r in self.hosts) for v in Verdict},
            "hosts": [run.to_dict() for run in self.hosts],
        }


def batches(order: Sequence[str], canary: Sequence[str], batch_size: int) -> list[list[str]]:
    """Each canary host alone, in the canary's order, then the others in fleet order,
    `batch_size` at a time."""
    rest = [name for name in order if name not in canary]
    return [[name] for name in canary] + [
        rest[i : i + batch_size] for i in range(0, len(rest), batch_size)
    ]


def over_budget(runs: Sequence[HostRun], max_failures: int) -> bool:
    """Whether more hosts failed than the strategy allows (the rollout then halts)."""
    return sum(run.verdict in FAILURES for run in runs) > max_failures
