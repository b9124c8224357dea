"""Answer the prompt set and keep what the gates compare: tokens, acceptance, tokens/s.

Every measurement (baseline, shadow-linear, tree) is taken the same way: temperature 0,
wall-clock time on the control machine, `repeats` passes, and more until the generation has
lasted `validation.min_pass_s` (a sub-second pass measures noise). With `concurrency` 1 the
prompts go one after another (batch 1) and throughput is completion tokens over the time the
passes took. Above 1, one pool of `concurrency` workers takes whole passes from one feed, which
starts another round of passes without waiting for the pool to drain, and throughput is
counted only while every slot was busy (the busy window, `BusyWindow`): a serving batch's rate,
without the tail where the last requests finish alone. Tokens are compared on the first pass.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
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
    started_s: float | None = None  # s after the measurement began; None in older baselines

    @property
    def accept_length(self) -> float | None:
        return self.completion_tokens / self.verify_ct if self.verify_ct else None


@dataclass(frozen=True)
class BusyWindow:
    """When all `concurrency` slots held a request: from the moment the pool first held them all
    to the moment the feed handed out its last item (after it the slots drain), in seconds after
    the measurement began. `share` is the part of the slots' time inside it that the
    measurement's results account for: 1, or less for a subset of its prompts (revalidate)."""

    start_s: float
    end_s: float
    share: float = 1.0

    @property
    def seconds(self) -> float:
        """What the window counts as its length (scaled by `share`)."""
        return (self.end_s - self.start_s) * self.share

    def overlap_s(self, result: PromptResult) -> float:
        """Seconds of `result`'s request, from its start to its start plus `wall_s`, inside."""
        if result.started_s is None:
            return 0.0
        end = min(self.end_s, result.started_s + result.wall_s)
        return max(0.0, end - max(self.start_s, result.started_s))

    def tokens_of(self, result: PromptResult) -> float:
        """`result`'s completion tokens in proportion to the part of its request inside the
        window: decode runs close to uniformly over a request's life (only the short prefill at
        its start bends that), and a request that straddles an edge is counted by its share."""
        if result.wall_s <= 0:
            return 0.0
        return result.completion_tokens * self.overlap_s(result) / result.wall_s


@dataclass(frozen=True)
class Measurement:
    """The prompt set answered by one service configuration (`label` says which)."""

    label: str
    results: tuple[PromptResult, ...]
    elapsed_s: float | None = None  # the passes' wall time; None: the requests' summed times
    window: BusyWindow | None = None  # None: sequential, degenerate, or stored before windows

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
    def busy_window(self) -> BusyWindow | None:
        """The window tokens/s is counted over, None where it counts all the passes' time:
        no window, one of no length, or results without start offsets to place in it."""
        window = self.window
        if window is None or window.seconds <= 0:
            return None
        if any(r.started_s is None for r in self.results):
            return None
        return window

    @property
    def tokens_per_s(self) -> float:
        """Completion tokens per second while every slot was busy where there is such a window
        (the drain after the feed ran out left out), else over all the passes' time."""
        window = self.busy_window
        if window is not None:
            return sum(window.tokens_of(r) for r in self.results) / window.seconds
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
        window = self.busy_window
        return {
            "label": self.label,
            "prompts": len(self.first_pass),
            "tokens": self.total_tokens,
            "wall_s": round(self.total_wall_s, 4),
            "window_s": round(window.seconds, 4) if window is not None else None,
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
            "window": asdict(self.window) if self.window is not None else None,
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
                started_s=None if r.get("started_s") is None else float(r["started_s"]),
            )
            for r in data["results"]
        )
        elapsed = data.get("elapsed_s")  # absent in baselines stored before concurrency
        window = data.get("window")  # absent in baselines stored before busy windows
        return cls(
            label=str(data["label"]),
            results=results,
            elapsed_s=None if elapsed is None else float(elapsed),
            window=None
            if window is None
            else BusyWindow(
                float(window["start_s"]), float(window["end_s"]), float(window.get("share", 1.0))
            ),
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
    different moments; with `concurrency` above 1 the passes flow through one pool of that many
    requests in flight (`_Feed`), and tokens/s is counted over its busy window.
    """
    deadline = time.monotonic() + timeout_s
    if prompts:  # one short, uncounted request first: every measurement starts warm
        client.generate(prompts[0].text, WARMUP_TOKENS)
    began = time.perf_counter()

    def answer(prompt: PromptConfig, repeat: int) -> PromptResult:
        if time.monotonic() > deadline:
            raise ValidationError(
                f"Measuring {label} took longer than {timeout_s:g} s "
                f"(stopped before prompt {prompt.name!r}, pass {repeat + 1})."
            )
        started = time.perf_counter() - began
        got = client.generate(prompt.text, prompt.max_new_tokens)
        return PromptResult(
            name=prompt.name,
            repeat=repeat,
            output_ids=got.output_ids,
            completion_tokens=got.completion_tokens,
            verify_ct=got.verify_ct,
            wall_s=got.wall_s,
            started_s=started,
        )

    if not prompts:
        return Measurement(label, (), elapsed_s=0.0)
    if concurrency > 1:
        feed = _Feed(prompts, repeats, min_pass_s, began)
        results = feed.answer_all(answer, concurrency)
        elapsed = time.perf_counter() - began
        return Measurement(label, results, elapsed, _busy_window(feed.handed_s, concurrency))
    collected: list[PromptResult] = []
    generating = 0.0  # seconds spent answering, the pauses between sequential passes left out
    done = 0
    while done == 0 or generating < min_pass_s:
        for repeat in range(done, done + repeats):
            if repeat:
                time.sleep(pause_s)
            start = time.perf_counter()
            collected += [answer(prompt, repeat) for prompt in prompts]
            generating += time.perf_counter() - start
        done += repeats
    return Measurement(label, tuple(collected), elapsed_s=generating)


class _Feed:
    """The (prompt, pass) items the pool's workers take, one at a time: whole passes in order,
    and each time a round of `repeats` passes is all handed out, another while the generation
    has lasted less than `min_pass_s`, so no slot waits for the round to drain."""

    def __init__(
        self, prompts: Sequence[PromptConfig], repeats: int, min_pass_s: float, began: float
    ) -> None:
        self._prompts = prompts
        self._round = max(1, repeats) * len(prompts)
        self._min_pass_s = min_pass_s
        self._began = began
        self._lock = threading.Lock()
        self._closed = False
        self.handed_s: list[float] = []  # when each item went out, seconds after `began`

    def take(self) -> tuple[int, PromptConfig, int] | None:
        """The next item (its place in the feed, the prompt, its pass), None once it ran out."""
        with self._lock:
            now = time.perf_counter() - self._began
            given = len(self.handed_s)
            if given and given % self._round == 0 and now >= self._min_pass_s:
                self._closed = True
            if self._closed:
                return None
            self.handed_s.append(now)
            repeat, index = divmod(given, len(self._prompts))
            return given, self._prompts[index], repeat

    def close(self) -> None:
        with self._lock:
            self._closed = True

    def answer_all(
        self, answer: Callable[[PromptConfig, int], PromptResult], workers: int
    ) -> tuple[PromptResult, ...]:
        """Every item answered by `workers` threads, in feed order; the first failure (the
        deadline's `ValidationError`) stops the others at their next item and is raised."""
        answered: dict[int, PromptResult] = {}

        def work() -> None:
            try:
                while (item := self.take()) is not None:
                    place, prompt, repeat = item
                    answered[place] = answer(prompt, repeat)
            except BaseException:
                self.close()
                raise

        with ThreadPoolExecutor(max_workers=workers) as pool:
            running = [pool.submit(work) for _ in range(workers)]
        for worker in running:
            worker.result()
        return tuple(answered[place] for place in sorted(answered))


def _busy_window(handed_s: Sequence[float], slots: int) -> BusyWindow | None:
    """From the `slots`-th item handed out (the pool is full) to the last (then it drains).

    None where there is no such window, and tokens/s falls back to all tokens over the whole
    time: fewer items than slots (the pool was never full), or a window of no length (as many
    items as slots: they all went out at once, and every one of them ends in the drain).
    """
    if len(handed_s) < slots:
        return None
    start, end = handed_s[slots - 1], handed_s[-1]
    if end <= start:
        return None
    return BusyWindow(start, end)


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
