"""The validation record of one run: every gate's figures, in order, and the decision.

The flow appends to it as it goes (so a failure still leaves everything measured so far);
`to_dict` is what the JSON report holds and what the Markdown template renders. It never holds
a secret or token ids of prompts beyond a divergence's few tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ddtree_deploy.validate.gates import Decision, GateResult
from ddtree_deploy.validate.measure import Measurement


@dataclass(frozen=True)
class PhaseRecord:
    """One service configuration under test (baseline, shadow_linear, tree, rollback proof)."""

    name: str
    algo: str  # what the service was asked to run, e.g. "DDTREE tree, budget 15, topk 4"
    generation: int | None
    gates: tuple[GateResult, ...]
    measurement: dict[str, Any] | None = None  # Measurement.summary()


@dataclass
class ValidationRecord:
    """Everything a validated deploy found; filled in as the run goes."""

    host: str
    target: str
    started: float = field(default_factory=time.time)
    phases: list[PhaseRecord] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    decision: Decision | None = None  # None until the run decides
    sentence: str = ""
    rolled_back_to: int | None = None
    finished: float | None = None
    tune: dict[str, Any] | None = None  # action=tune: the sweep's table (rollout.tune)

    def add(
        self,
        name: str,
        algo: str,
        generation: int | None,
        gates: list[GateResult],
        measurement: Measurement | None = None,
    ) -> None:
        summary = measurement.summary() if measurement is not None else None
        self.phases.append(PhaseRecord(name, algo, generation, tuple(gates), summary))

    def decide(self, decision: Decision, sentence: str) -> None:
        self.decision = decision
        self.sentence = sentence
        self.finished = time.time()

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "target": self.target,
            "started": round(self.started, 3),
            "finished": round(self.finished, 3) if self.finished else None,
            "decision": self.decision.value if self.decision else "",
            "sentence": self.sentence,
            "rolled_back_to": self.rolled_back_to,
            "notes": self.notes,
            "phases": [
                {
                    "name": p.name,
                    "algo": p.algo,
                    "generation": p.generation,
                    "measurement": p.measurement,
                    "gates": [g.to_dict() for g in p.gates],
                }
                for p in self.phases
            ],
            "tune": self.tune,
        }
