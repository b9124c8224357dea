"""Gate verdicts, as pure functions of measurements: what passed, what failed, what could not judge.

Nothing here talks to a host, so every rule (token identity, first divergence, the tie rule on
the target's scores, acceptance collapse, speedup, the inconclusive policy) is unit-tested on
hand-made measurements.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from ddtree_deploy.config.schema import InconclusivePolicy
from ddtree_deploy.validate.measure import Measurement
from ddtree_deploy.validate.scoring import (
    ScoredOutput,
    Scoring,
    TieRule,
    TieVerdict,
    TokenScore,
    score_of,
)

CONTEXT_TOKENS = 12  # tokens of each continuation shown at a divergence


class Outcome(StrEnum):
    passed = "passed"
    failed = "failed"
    inconclusive = "inconclusive"


class Decision(StrEnum):
    """How a run that judged the host ended: what it did with the new generation after its
    gates (the first three, also what `decide` returns), or why it made none."""

    promote = "promote"
    rollback = "rollback"
    pause = "pause"
    unchanged = "unchanged"  # the host already ran the config: no gates, no generation
    staging = "staging"  # a host without a managed service: nothing ran to judge
    failed = "failed"  # a gate failed and nothing was rolled back, or the rollback failed
    passed = "passed"  # action=validate or revalidate: every gate passed, nothing changed
    no_winner = "no_winner"  # action=tune: no candidate passed; linear DFlash serves


@dataclass(frozen=True)
class Divergence:
    """Where a candidate's tokens first differ from the baseline's, and what each said next.

    The log-probs are the target's prefill scores of the two tokens at that position, where a
    scoring request read them (the tree gate's), else None.
    """

    prompt: str
    position: int
    baseline: tuple[int, ...]
    candidate: tuple[int, ...]
    baseline_logprob: float | None = None
    candidate_logprob: float | None = None

    @property
    def gap(self) -> float | None:
        """How much the target prefers the baseline's token here (negative: the candidate's)."""
        if self.baseline_logprob is None or self.candidate_logprob is None:
            return None
        return self.baseline_logprob - self.candidate_logprob

    def sentence(self) -> str:
        text = (
            f"prompt {self.prompt!r} diverges at token {self.position}: baseline continues "
            f"{list(self.baseline)}, candidate {list(self.candidate)}"
        )
        if self.gap is not None:
            text += (
                f" (target log-probs {self.baseline_logprob:.4f} vs "
                f"{self.candidate_logprob:.4f}, gap {abs(self.gap):.4f} nats)"
            )
        return text

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "prompt": self.prompt,
            "position": self.position,
            "baseline": list(self.baseline),
            "candidate": list(self.candidate),
        }
        if self.gap is not None:
            data |= {
                "baseline_logprob": self.baseline_logprob,
                "candidate_logprob": self.candidate_logprob,
                "gap": round(abs(self.gap), 6),
            }
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Divergence:
        return cls(
            str(data["prompt"]),
            int(data["position"]),
            tuple(data["baseline"]),
            tuple(data["candidate"]),
            data.get("baseline_logprob"),
            data.get("candidate_logprob"),
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
            data["divergence"] = self.divergence.to_dict()
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
            Divergence.from_dict(div) if div else None,
        )


def divergences(baseline: Measurement, candidate: Measurement) -> list[Divergence]:
    """Per prompt (in baseline order), the first token position where the two differ."""
    theirs = {r.name: r.output_ids for r in candidate.first_pass}
    found = []
    for ours in baseline.first_pass:
        got = theirs.get(ours.name)
        if got is None or got == ours.output_ids:
            continue
        pos = next(
            (i for i, (a, b) in enumerate(zip(ours.output_ids, got, strict=False)) if a != b),
            min(len(ours.output_ids), len(got)),
        )
        found.append(
            Divergence(
                prompt=ours.name,
                position=pos,
                baseline=ours.output_ids[pos : pos + CONTEXT_TOKENS],
                candidate=got[pos : pos + CONTEXT_TOKENS],
            )
        )
    return found


def first_divergence(baseline: Measurement, candidate: Measurement) -> Divergence | None:
    """The first prompt (in baseline order) and token position where the two differ."""
    return next(iter(divergences(baseline, candidate)), None)


def _missing_prompts(baseline: Measurement, candidate: Measurement) -> list[str]:
    have = {r.name for r in candidate.first_pass}
    return [r.name for r in baseline.first_pass if r.name not in have]


def judge_shadow(
    baseline: Measurement | None,
    shadow: Measurement,
    *,
    tolerance: float,
    collapse_ratio: float,
    scoring: Scoring | None = None,
    ties: TieRule | None = None,
) -> GateResult:
    """Shadow-linear must equal the baseline token for token, with its acceptance length.

    Batched (several requests in flight) the batch's make-up at each step depends on timing, so
    bf16 logits differ from run to run, linear DFlash's against its own too (GPU lab, run 16: a
    divergence at 32 in flight that the same server did not repeat). There the caller passes the
    target's scores (`scoring`) and the tie rule: a divergence within it passes as the tree
    gate's near-ties do (`judge_ties`); one beyond it still fails."""
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
    agreement = "token for token"
    if (divergence := first_divergence(baseline, shadow)) is not None:
        if scoring is None or ties is None:
            return GateResult(
                gate,
                Outcome.failed,
                f"Shadow-linear output differs from linear DFlash: {divergence.sentence()}.",
                figures,
                divergence,
            )
        judged = judge_ties("Shadow-linear", baseline, shadow, scoring, ties)
        figures.update(judged.figures)
        divergence = judged.first
        if judged.outcome is not None:
            return GateResult(gate, judged.outcome, judged.sentence, figures, divergence)
        agreement = f"with a batch's bf16 noise, {judged.sentence}"
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
        f"Shadow-linear matches linear DFlash {agreement}; acceptance {shadow_acc:.2f} vs "
        f"{base_acc:.2f}.",
        figures,
        divergence,
    )


def judge_tree(
    baseline: Measurement | None,
    tree: Measurement,
    scoring: Scoring,
    *,
    ties: TieRule,
    min_speedup: float,
    min_tokens: int,
    hybrid: bool,
) -> GateResult:
    """Tree mode must emit only the target's greedy choices and beat the baseline's tokens/s.

    The target's own prefill scores (`scoring`) judge every token tree mode emitted
    (`judge_ties`): one further below the target's top-1 than the rule allows fails the gate, a
    bug and not a tie; a divergence from the baseline within it is a bf16 near-tie between the
    two verify shapes. Hybrid and pure-attention targets are judged alike: the prefill that
    scores them runs the recurrent layers as a plain sequence, not along the tree's links, so
    a state leak between branches shows as tokens far off the target's choice.
    """
    gate = "tree"
    if baseline is None or not baseline.results:
        return GateResult(gate, Outcome.inconclusive, "No linear-DFlash baseline was recorded.")
    speedup = tree.tokens_per_s / baseline.tokens_per_s if baseline.tokens_per_s else 0.0
    figures: dict[str, Any] = {
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
    ties_judged = judge_ties("Tree mode", baseline, tree, scoring, ties)
    figures.update(ties_judged.figures)
    first = ties_judged.first
    if ties_judged.outcome is not None:
        return GateResult(gate, ties_judged.outcome, ties_judged.sentence, figures, first)
    agreement = ties_judged.sentence
    if min(tree.total_tokens, baseline.total_tokens) < min_tokens:
        return GateResult(
            gate,
            Outcome.inconclusive,
            f"Only {min(tree.total_tokens, baseline.total_tokens)} tokens were measured, fewer "
            f"than validation.min_measured_tokens={min_tokens}, so the speedup is not judged.",
            figures,
            first,
        )
    speed = (
        f"Tree mode runs {tree.tokens_per_s:.1f} tok/s, {speedup:.2f} x the baseline's "
        f"{baseline.tokens_per_s:.1f}"
    )
    if speedup < min_speedup:
        return GateResult(
            gate,
            Outcome.failed,
            f"{speed}, below validation.min_speedup={min_speedup:g} ({agreement}).",
            figures,
            first,
        )
    return GateResult(gate, Outcome.passed, f"{speed}, {agreement}.", figures, first)


@dataclass(frozen=True)
class TieJudgement:
    """The tie rule on a candidate's tokens: `outcome` failed or inconclusive with its
    `sentence`, or None with the agreement clause a passing gate says; the report's figures and
    the first divergence from linear DFlash."""

    outcome: Outcome | None
    sentence: str
    figures: dict[str, Any]
    first: Divergence | None


def judge_ties(
    subject: str,
    baseline: Measurement,
    candidate: Measurement,
    scoring: Scoring,
    ties: TieRule,
) -> TieJudgement:
    """Whether every token `subject` ("Tree mode") emitted is the target's greedy choice within
    the tie rule, by the target's own prefill scores (`scoring`); a divergence from the baseline
    within it is a bf16 near-tie. The baseline's answers are scored too: their worst gap is the
    target's measured noise floor, which widens the tolerance (`TieRule.applied`), and where it
    is too wide to judge by, a token beyond the configured tolerance is inconclusive."""
    found = [
        _with_scores(d, baseline, candidate, scoring) for d in divergences(baseline, candidate)
    ]
    first = found[0] if found else None
    floor = max((o.max_gap for o in scoring.baseline), default=0.0)
    tolerance = ties.applied(floor)
    verdict = TieVerdict(tolerance, scoring.candidate)
    # Where the prefill is no judge, the report marks each token by the configured tolerance
    # (and a token beyond it is inconclusive, below).
    shown = verdict if ties.judges(floor) else TieVerdict(ties.tolerance, scoring.candidate)
    figures = _tie_figures(candidate, scoring, shown, found)
    figures.update(
        tie_tolerance=ties.tolerance,
        tie_noise_factor=ties.noise_factor,
        max_tie_tolerance=ties.max_tolerance,
        baseline_max_gap=_round(floor),
        tie_tolerance_applied=_round(tolerance),
    )
    rule = f"validation.tie_tolerance={ties.tolerance:g}"
    if tolerance > ties.tolerance:
        rule += (
            f", widened to {tolerance:.4f} = validation.tie_noise_factor={ties.noise_factor:g} x "
            f"linear DFlash's own worst gap ({floor:.4f}, this target's noise floor)"
        )
    if scoring.error is not None:
        if first is not None:
            return TieJudgement(
                Outcome.inconclusive,
                f"{subject} diverges from linear DFlash ({first.sentence()}), and the target's "
                f"scores that tell a near-tie from a bug could not be read: {scoring.error}",
                figures,
                first,
            )
    elif (beyond := verdict.beyond) is not None:
        return TieJudgement(
            Outcome.failed,
            f"{subject} emitted a token the target does not choose: {_where(*beyond)}, beyond "
            f"{rule}.",
            figures,
            first,
        )
    elif shown is not verdict and (stray := shown.beyond) is not None:
        # The judge itself is off here: linear DFlash, which the candidate must match, strays so
        # far from the prefill (its verify and the prefill disagree beyond a near-tie) that the
        # tolerance it implies exceeds the most the operator allows.
        return TieJudgement(
            Outcome.inconclusive,
            f"{subject} emitted a token beyond validation.tie_tolerance={ties.tolerance:g} "
            f"({_where(*stray)}), but linear DFlash's own tokens sit up to {floor:.4f} nats "
            "below the target's prefill choice on this target, beyond what "
            f"validation.max_tie_tolerance={ties.max_tolerance:g} lets the rule widen to, so "
            "its scores cannot tell a near-tie from a bug here.",
            figures,
            first,
        )
    agreement = (
        "with identical tokens"
        if first is None
        else f"its tokens differing from linear DFlash's only at near-ties of the target "
        f"({len(found)} of {len(baseline.first_pass)} prompts; every emitted token within "
        f"{verdict.max_gap:.4f} nats of the target's top-1, {rule})"
    )
    return TieJudgement(None, agreement, figures, first)


def _with_scores(
    divergence: Divergence, baseline: Measurement, tree: Measurement, scoring: Scoring
) -> Divergence:
    """`divergence` with the target's log-probs of both tokens at its position."""
    position, prompt = divergence.position, divergence.prompt
    ours = next(r.output_ids for r in baseline.first_pass if r.name == prompt)
    theirs = next(r.output_ids for r in tree.first_pass if r.name == prompt)
    if position >= min(len(ours), len(theirs)):
        return divergence  # one output is a prefix of the other: no competing tokens
    base = score_of(scoring.find(prompt, ours, baseline=True), position, ours[position])
    cand = score_of(scoring.find(prompt, theirs, baseline=False), position, theirs[position])
    return replace(divergence, baseline_logprob=base, candidate_logprob=cand)


def _where(output: ScoredOutput, position: int, score: TokenScore) -> str:
    """Where an emitted token sits off the target's choice, for a gate's sentence."""
    return (
        f"prompt {output.prompt!r} token {position} is {score.token} (log-prob "
        f"{score.logprob:.4f}) where the target's top-1 is {score.top_token} "
        f"({score.top_logprob:.4f}), {score.gap:.4f} nats apart"
    )


def _tie_figures(
    tree: Measurement,
    scoring: Scoring,
    ties: TieVerdict,
    found: Sequence[Divergence],
) -> dict[str, Any]:
    """The tie rule's figures for the report: overall, then per prompt."""
    by_prompt = {d.prompt: d for d in found}
    rows = []
    for result in tree.first_pass:
        outputs = [o for o in scoring.candidate if o.prompt == result.name]
        worst = max((o.max_gap for o in outputs), default=None)
        div = by_prompt.get(result.name)
        if worst is not None and worst > ties.tolerance:
            verdict = "beyond tolerance"
        elif div is None:
            verdict = "identical"
        elif worst is None:
            verdict = "diverged, not scored"
        else:
            verdict = "near-tie"
        rows.append(
            {
                "prompt": result.name,
                "tokens": len(result.output_ids),
                "outputs_scored": len(outputs),
                "max_gap": _round(worst),
                "divergence": div.to_dict() if div else None,
                "verdict": verdict,
            }
        )
    figures: dict[str, Any] = {
        "tokens_scored": ties.tokens,
        "max_gap": _round(ties.max_gap),
        "off_top_tokens": ties.off_top,
        "near_tie_positions": ties.near_ties,
        "divergences": len(found),
        "per_prompt": rows,
    }
    if scoring.error is not None:
        figures["scoring_error"] = scoring.error
    return figures


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
