"""The target's own scores for a continuation, and the tie rule that judges them.

Greedy speculative decoding is lossless when every token it emits is the target's greedy choice
given the tokens before it. Tree verify and chain verify run the target through different
kernel shapes, so in bf16 they can pick different tokens where the target's top two are nearly
tied; neither is wrong. So the tree gate asks the target itself: a prompt-scoring request
(prompt plus the emitted tokens, `max_new_tokens: 0`, prompt log-probs with the top two per
position) runs the target's plain prefill, and each emitted token's gap to the top-1 there says
whether it was a near-tie (gap within `validation.tie_tolerance`, or within a multiple of linear
DFlash's own worst gap where the target's prefill is noisier: `TieRule`) or a token the target
does not choose (beyond it: a bug). Gaps are in nats of log-probability, which at one position
are also logit differences (both tokens share the position's normaliser).

Every release's patch set admits such a request for DFLASH and DDTREE alike (0.5.11 to 0.5.17
refuse every other log-prob request; 0.5.18's set refuses DDTREE's generating ones).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class TokenScore:
    """One emitted token as the target's prefill scores it."""

    token: int
    logprob: float
    top_token: int  # the target's top-1 at this position
    top_logprob: float
    second_logprob: float | None = None  # the runner-up's, how close the position is to a tie

    @property
    def margin(self) -> float:
        """How far apart the target's top two are here (infinite when the runner-up is unknown)."""
        if self.token != self.top_token:
            return self.gap  # the emitted token is itself a runner-up
        if self.second_logprob is None:
            return float("inf")
        return self.top_logprob - self.second_logprob

    @property
    def gap(self) -> float:
        """How far below the target's top-1 the emitted token sits (0 when it is the top-1)."""
        return 0.0 if self.token == self.top_token else max(0.0, self.top_logprob - self.logprob)


@dataclass(frozen=True)
class ScoredOutput:
    """One output of one prompt, token by token, with the target's scores."""

    prompt: str
    scores: tuple[TokenScore, ...]

    def worst(self) -> tuple[int, TokenScore] | None:
        """The position and score of the emitted token farthest below the target's top-1."""
        if not self.scores:
            return None
        position = max(range(len(self.scores)), key=lambda i: self.scores[i].gap)
        return position, self.scores[position]

    @property
    def max_gap(self) -> float:
        found = self.worst()
        return found[1].gap if found else 0.0

    @property
    def output_ids(self) -> tuple[int, ...]:
        return tuple(s.token for s in self.scores)


@dataclass(frozen=True)
class Scoring:
    """What the target's prefill said of the outputs the tree gate compares."""

    candidate: tuple[ScoredOutput, ...] = ()  # every distinct output of the candidate
    baseline: tuple[ScoredOutput, ...] = ()  # every distinct output of the baseline
    error: str | None = None  # why the scores could not be read (the rest is then empty)

    def find(
        self, prompt: str, output_ids: Sequence[int], *, baseline: bool
    ) -> ScoredOutput | None:
        """The scored output of `prompt` with exactly these tokens, if it was scored."""
        wanted = tuple(output_ids)
        pool = self.baseline if baseline else self.candidate
        return next((o for o in pool if o.prompt == prompt and o.output_ids == wanted), None)


@dataclass(frozen=True)
class TieRule:
    """How far below the target's top-1 an emitted tree token may sit, in nats.

    `tolerance` always holds. The prefill that scores is a third path with bf16 noise of its own,
    and on some targets (a GDN hybrid's recurrent state, a MoE router's near-tied experts) linear
    DFlash's own tokens, lossless by construction, sit further off it: that worst gap, measured in
    the same run, is the target's noise floor, and the rule allows `noise_factor` times it. Where
    that would exceed `max_tolerance`, the prefill is too far from the verify to tell a near-tie
    from a bug.
    """

    tolerance: float
    noise_factor: float
    max_tolerance: float

    def applied(self, noise_floor: float) -> float:
        """The tolerance a run with linear DFlash's own worst gap `noise_floor` is judged by."""
        return max(self.tolerance, self.noise_factor * noise_floor)

    def judges(self, noise_floor: float) -> bool:
        """Whether the prefill can tell a near-tie from a bug at this noise floor."""
        return self.applied(noise_floor) <= self.max_tolerance


@dataclass(frozen=True)
class TieVerdict:
    """Whether a set of outputs keeps to the target's greedy choices within `tolerance`."""

    tolerance: float
    outputs: tuple[ScoredOutput, ...]

    @property
    def beyond(self) -> tuple[ScoredOutput, int, TokenScore] | None:
        """The output whose worst token is farthest beyond the tolerance, if any is."""
        found = [
            (output, *worst)
            for output in self.outputs
            if (worst := output.worst()) is not None and worst[1].gap > self.tolerance
        ]
        return max(found, key=lambda f: f[2].gap, default=None)

    @property
    def max_gap(self) -> float:
        return max((o.max_gap for o in self.outputs), default=0.0)

    @property
    def tokens(self) -> int:
        return sum(len(o.scores) for o in self.outputs)

    @property
    def near_ties(self) -> int:
        """Positions whose top two the target scores within the tolerance: where a flip of the
        verify's bf16 logits is expected, so what the rule was exercised on."""
        return sum(1 for o in self.outputs for s in o.scores if s.margin <= self.tolerance)

    @property
    def off_top(self) -> int:
        """Emitted tokens that are not the prefill's top-1 (near-ties or worse)."""
        return sum(1 for o in self.outputs for s in o.scores if s.gap > 0.0)


def score_of(scored: ScoredOutput | None, position: int, token: int) -> float | None:
    """`token`'s log-prob at `position` where the scoring saw it (emitted there or the top-1)."""
    if scored is None or position >= len(scored.scores):
        return None
    score = scored.scores[position]
    if token == score.token:
        return score.logprob
    if token == score.top_token:
        return score.top_logprob
    return None
