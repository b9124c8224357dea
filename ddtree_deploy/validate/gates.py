"""Gate verdicts, as pure functions of measurements: what passed, what failed, what could not judge.

Nothing here talks to a host, so every rule (token identity, first divergence, acceptance
collapse, speedup, the inconclusive policy) is unit-tested on hand-made measurements.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ddtree_deploy.config.schema import HybridDivergencePolicy, InconclusivePolicy
from ddtree_deploy.validate.measure import Measurement

CONTEXT_TOKENS = 12  # tokens of each continuation shown at a divergence


class Outcome(StrEnum):
    passed = "passed"
    failed = "failed"
    inconclusive = "inconclusive"


class Decision(StrEnum):
    """What the run does with the new generation after its gates."""

    promote = "promote"
    rollback = "rollback"
    pause = "pause"


@dataclass(frozen=True)
class Divergence:
    """Where a candidate's tokens first differ from the baseline's, and what each said next."""

    prompt: str
    position: int
    baseline: tuple[int, ...]
    candidate: tuple[int, ...]

    def sentence(self) -> str:
        return (
            f"prompt {self.prompt!r} diverges at token {self.position}: baseline continues "
            f"{list(self.baseline)}, candidate {list(self.candidate)}"
        )


@dataclass(frozen=True)
class GateResult:
    """One gate's verdict: `sentence` is what the user reads, `figures` what was measured."""

    gate: str
    outcome: Outcome
    sentence: str
    figures: dict[str, Any] = field(default_factory=dict)
    divergence: Divergence | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "gate": self.gate,
            "outcome": self.outcome.value,
            "sentence": self.sentence,
            "figures": self.figures,
        }
        if self.divergence is not None:
            data["divergence"] = {
                "prompt": self.divergence.prompt,
                "position": self.divergence.position,
                "baseline": list(self.divergence.baseline),
                "candidate": list(self.divergence.candidate),
            }
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GateResult:
        """A gate read back from a run report (`to_dict`'s shape)."""
        div = data.get("divergence")
        return cls(
            str(data["gate"]),
            Outcome(data["outcome"]),
            str(data["sentence"]),
            dict(data.get("figures") or {}),
            Divergence(
                str(div["prompt"]),
                int(div["position"]),
                tuple(div["baseline"]),
                tuple(div["candidate"]),
            )
            if div
            else None,
        )


def first_divergence(baseline: Measurement, candidate: Measurement) -> Divergence | None:
    """The first prompt (in baseline order) and token position where the two differ."""
    theirs = {r.name: r.output_ids for r in candidate.first_pass}
    for ours in baseline.first_pass:
        got = theirs.get(ours.name)
        if got is None or got == ours.output_ids:
            continue
        pos = next(
            (i for i, (a, b) in enumerate(zip(ours.output_ids, got, strict=False)) if a != b),
            min(len(ours.output_ids), len(got)),
        )
        return Divergence(
            prompt=ours.name,
            position=pos,
            baseline=ours.output_ids[pos : pos + CONTEXT_TOKENS],
            candidate=got[pos : pos + CONTEXT_TOKENS],
        )
    return None


def _missing_prompts(baseline: Measurement, candidate: Measurement) -> list[str]:
    have = {r.name for r in candidate.first_pass}
    return [r.name for r in baseline.first_pass if r.name not in have]


def judge_shadow(
    baseline: Measurement | None,
    shadow: Measurement,
    *,
    tolerance: float,
    collapse_ratio: float,
) -> GateResult:
    """Shadow-linear must equal the baseline token for token, with its acceptance length."""
    gate = "shadow_linear"
    if baseline is None or not baseline.results:
        return GateResult(gate, Outcome.inconclusive, "No linear-DFlash baseline was recorded.")
    base_acc, shadow_acc = baseline.mean_accept_length, shadow.mean_accept_length
    figures = {
        "baseline_accept_length": _round(base_acc),
        "shadow_accept_length": _round(shadow_acc),
        "required_accept_length": _round(base_acc * (1 - tolerance) if base_acc else None),
        "baseline_tokens_per_s": round(baseline.tokens_per_s, 2),
        "shadow_tokens_per_s": round(shadow.tokens_per_s, 2),
        "prompts": len(baseline.first_pass),
    }
    if missing := _missing_prompts(baseline, shadow):
        return GateResult(
            gate, Outcome.inconclusive, f"Prompts {missing} were not measured.", figures
        )
    if divergence := first_divergence(baseline, shadow):
        return GateResult(
            gate,
            Outcome.failed,
            f"Shadow-linear output differs from linear DFlash: {divergence.sentence()}.",
            figures,
            divergence,
        )
    if base_acc is None or shadow_acc is None:
        which = "baseline" if base_acc is None else "shadow-linear service"
        return GateResult(
            gate,
            Outcome.inconclusive,
            f"The {which} reported no spec_verify_ct, so acceptance cannot be compared.",
            figures,
        )
    if shadow_acc < base_acc * collapse_ratio:
        return GateResult(
            gate,
            Outcome.failed,
            f"Shadow-linear acceptance collapsed from {base_acc:.2f} to {shadow_acc:.2f} tokens "
            "per verify: the drafter is not getting the target's hidden states (an unpatched "
            "DFLASH-only gate skips their capture under DDTREE).",
            figures,
        )
    if shadow_acc < base_acc * (1 - tolerance):
        return GateResult(
            gate,
            Outcome.failed,
            f"Shadow-linear acceptance {shadow_acc:.2f} is below {1 - tolerance:.2f} x the "
            f"baseline's {base_acc:.2f}.",
            figures,
        )
    return GateResult(
        gate,
        Outcome.passed,
        f"Shadow-linear matches linear DFlash token for token; acceptance {shadow_acc:.2f} vs "
        f"{base_acc:.2f}.",
        figures,
    )


def judge_tree(
    baseline: Measurement | None,
    tree: Measurement,
    *,
    min_speedup: float,
    min_tokens: int,
    hybrid: bool,
    hybrid_policy: HybridDivergencePolicy,
) -> GateResult:
    """Tree mode must keep the tokens (pure attention) and beat the baseline's tokens/s."""
    gate = "tree"
    if baseline is None or not baseline.results:
        return GateResult(gate, Outcome.inconclusive, "No linear-DFlash baseline was recorded.")
    speedup = tree.tokens_per_s / baseline.tokens_per_s if baseline.tokens_per_s else 0.0
    figures = {
        "baseline_tokens_per_s": round(baseline.tokens_per_s, 2),
        "tree_tokens_per_s": round(tree.tokens_per_s, 2),
        "speedup": round(speedup, 4),
        "min_speedup": min_speedup,
        "baseline_accept_length": _round(baseline.mean_accept_length),
        "tree_accept_length": _round(tree.mean_accept_length),
        "measured_tokens": tree.total_tokens,
        "hybrid_target": hybrid,
    }
    if missing := _missing_prompts(baseline, tree):
        return GateResult(
            gate, Outcome.inconclusive, f"Prompts {missing} were not measured.", figures
        )
    divergence = first_divergence(baseline, tree)
    note = ""
    if divergence is not None:
        if not hybrid or hybrid_policy is HybridDivergencePolicy.fail:
            target = "a hybrid target (policy fail)" if hybrid else "a pure-attention target"
            return GateResult(
                gate,
                Outcome.failed,
                f"Tree mode changed the output on {target}: {divergence.sentence()}.",
                figures,
                divergence,
            )
        if hybrid_policy is HybridDivergencePolicy.inconclusive:
            return GateResult(
                gate,
                Outcome.inconclusive,
                f"Tree mode diverges on this hybrid target (policy inconclusive): "
                f"{divergence.sentence()}.",
                figures,
                divergence,
            )
        note = f" (hybrid divergence accepted by policy: {divergence.sentence()})"
    if min(tree.total_tokens, baseline.total_tokens) < min_tokens:
        return GateResult(
            gate,
            Outcome.inconclusive,
            f"Only {min(tree.total_tokens, baseline.total_tokens)} tokens were measured, fewer "
            f"than validation.min_measured_tokens={min_tokens}, so the speedup is not judged.",
            figures,
            divergence,
        )
    if speedup < min_speedup:
        return GateResult(
            gate,
            Outcome.failed,
            f"Tree mode runs {tree.tokens_per_s:.1f} tok/s, {speedup:.2f} x the baseline's "
            f"{baseline.tokens_per_s:.1f}, below validation.min_speedup={min_speedup:g}{note}.",
            figures,
            divergence,
        )
    return GateResult(
        gate,
        Outcome.passed,
        f"Tree mode runs {tree.tokens_per_s:.1f} tok/s, {speedup:.2f} x the baseline's "
        f"{baseline.tokens_per_s:.1f}, with identical tokens{note}.",
        figures,
        divergence,
    )


def decide(results: Sequence[GateResult], policy: InconclusivePolicy) -> Decision:
    """Any failure rolls back; an inconclusive gate does what `policy` says; else promote."""
    if any(r.outcome is Outcome.failed for r in results):
        return Decision.rollback
    if any(r.outcome is Outcome.inconclusive for r in results):
        return Decision(policy.value)
    return Decision.promote


def deciding_gate(results: Sequence[GateResult]) -> GateResult | None:
    """The gate that stopped the deployment: the first failure, else the first inconclusive."""
    for outcome in (Outcome.failed, Outcome.inconclusive):
        for result in results:
            if result.outcome is outcome:
                return result
    return None


def _round(value: float | None) -> float | None:
    return round(value, 4) if value is not None else None
