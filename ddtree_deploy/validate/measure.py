"""Answer the prompt set and keep what the gates compare: tokens, acceptance, tokens/s.

Every measurement (baseline, shadow-linear, tree) is taken the same way: temperature 0,
wall-clock time on the control machine, `repeats` passes, and more until the generation has
lasted `validation.min_pass_s` (a sub-second pass measures noise). With `concurrency` 1 the
prompts go one after another (batch 1); above 1, each round of passes goes out at once with at
most `concurrency` requests in flight, which is how a serving batch is measured. Tokens are
compared on the first pass; throughput is completion tokens over the time the passes took.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from ddtree_deploy.config.schema import PromptConfig
from ddtree_deploy.validate.client import SglangClient
from ddtree_deploy.validate.errors import ValidationError
from ddtree_deploy.validate.scoring import ScoredOutput, Scoring


@dataclass(frozen=True)
class PromptResult:
    """One prompt's answer in one pass."""

    name: str
    repeat: int
    output_ids: tuple[int, ...]
    completion_tokens: int
    verify_ct: int | None
    wall_s: float

    @property
    def accept_length(self) -> float | None:
        return self.completion_tokens / self.verify_ct if self.verify_ct else None


@dataclass(frozen=True)
class Measurement:
    """The prompt set answered by one service configuration (`label` says which)."""

    label: str
    results: tuple[PromptResult, ...]
    elapsed_s: float | None = None  # the passes' wall time; None: the requests' summed times

    @property
    def first_pass(self) -> tuple[PromptResult, ...]:
        return tuple(r for r in self.results if r.repeat == 0)

    @property
    def total_tokens(self) -> int:
        return sum(r.completion_tokens for r in self.results)

    @property
    def total_wall_s(self) -> float:
        if self.elapsed_s is not None:
            return self.elapsed_s
        return sum(r.wall_s for r in self.results)

    @property
    def tokens_per_s(self) -> float:
        return self.total_tokens / self.total_wall_s if self.total_wall_s > 0 else 0.0

    @property
    def mean_accept_length(self) -> float | None:
        """Completion tokens per verify pass over the set; None if a request did not say."""
        if not self.results or any(r.verify_ct is None for r in self.results):
            return None
        return self.total_tokens / sum(r.verify_ct or 0 for r in self.results)

    def summary(self) -> dict[str, Any]:
        """The figures a report shows (no token ids)."""
        accept = self.mean_accept_length
        return {
            "label": self.label,
            "prompts": len(self.first_pass),
            "tokens": self.total_tokens,
            "wall_s": round(self.total_wall_s, 4),
            "tokens_per_s": round(self.tokens_per_s, 2),
            "mean_accept_length": round(accept, 4) if accept is not None else None,
            "per_prompt": [
                {
                    "name": r.name,
                    "tokens": r.completion_tokens,
                    "accept_length": round(a, 4) if (a := r.accept_length) is not None else None,
                    "tokens_per_s": round(r.completion_tokens / r.wall_s, 2) if r.wall_s else 0,
                }
                for r in self.first_pass
            ],
        }

    def to_dict(self) -> dict[str, Any]:
        """Everything, token ids included (what the generation stores as its baseline)."""
        return {
            "label": self.label,
            "elapsed_s": self.elapsed_s,
            "results": [asdict(r) for r in self.results],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Measurement:
        results = tuple(
            PromptResult(
                name=str(r["name"]),
                repeat=int(r["repeat"]),
                output_ids=tuple(int(i) for i in r["output_ids"]),
                completion_tokens=int(r["completion_tokens"]),
                verify_ct=None if r["verify_ct"] is None else int(r["verify_ct"]),
                wall_s=float(r["wall_s"]),
            )
            for r in data["results"]
        )
        elapsed = data.get("elapsed_s")  # absent in baselines stored before concurrency
        return cls(
            label=str(data["label"]),
            results=results,
            elapsed_s=None if elapsed is None else float(elapsed),
        )


WARMUP_TOKENS = 8


def measure(
    client: SglangClient,
    prompts: Sequence[PromptConfig],
    *,
    label: str,
    repeats: int,
    timeout_s: float,
    pause_s: float = 0.0,
    concurrency: int = 1,
    min_pass_s: float = 0.0,
) -> Measurement:
    """Answer every prompt `repeats` times after a warm-up, and again in rounds of `repeats`
    until the generation has lasted `min_pass_s`; `ValidationError` past `timeout_s`.

    `pause_s` separates sequential passes (the gate's `interval_s`), so repeats sample
    different moments; with `concurrency` above 1 each round of passes is one batch of requests.
    """
    deadline = time.monotonic() + timeout_s
    if prompts:  # one short, uncounted request first: every measurement starts warm
        client.generate(prompts[0].text, WARMUP_TOKENS)

    def answer(prompt: PromptConfig, repeat: int) -> PromptResult:
        if time.monotonic() > deadline:
            raise ValidationError(
                f"Measuring {label} took longer than {timeout_s:g} s "
                f"(stopped before prompt {prompt.name!r}, pass {repeat + 1})."
            )
        got = client.generate(prompt.text, prompt.max_new_tokens)
        return PromptResult(
            name=prompt.name,
            repeat=repeat,
            output_ids=got.output_ids,
            completion_tokens=got.completion_tokens,
            verify_ct=got.verify_ct,
            wall_s=got.wall_s,
        )

    results: list[PromptResult] = []
    generating = 0.0  # seconds spent answering, the pauses between sequential passes left out
    done = 0
    while prompts and (done == 0 or generating < min_pass_s):
        passes = range(done, done + repeats)
        if concurrency > 1:
            start = time.perf_counter()
            work = [(prompt, repeat) for repeat in passes for prompt in prompts]
            with ThreadPoolExecutor(max_workers=concurrency) as pool:
                results += pool.map(lambda item: answer(*item), work)
            generating += time.perf_counter() - start
        else:
            for repeat in passes:
                if repeat:
                    time.sleep(pause_s)
                start = time.perf_counter()
                results += [answer(prompt, repeat) for prompt in prompts]
                generating += time.perf_counter() - start
        done += repeats
    return Measurement(label, tuple(results), elapsed_s=generating)


def score_answers(
    client: SglangClient,
    prompts: Sequence[PromptConfig],
    candidate: Measurement,
    baseline: Measurement,
) -> Scoring:
    """The target's prefill scores of every distinct answer the candidate and the baseline gave
    (all passes, so both are sampled alike), read from the service `client` reaches; where that
    service cannot score (it refuses or answers malformed), `Scoring.error` says why.
    """
    texts = {p.name: p.text for p in prompts}

    def scored(results: Sequence[PromptResult]) -> tuple[ScoredOutput, ...]:
        distinct = {(r.name, r.output_ids): None for r in results if r.name in texts}
        return tuple(ScoredOutput(name, client.score(texts[name], ids)) for name, ids in distinct)

    try:
        return Scoring(candidate=scored(candidate.results), baseline=scored(baseline.results))
    except ValidationError as err:
        return Scoring(error=str(err))
