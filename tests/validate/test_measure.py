"""How `measure` paces requests and counts tokens/s, against a client that answers in its own
time (no server): one pool for the whole measurement, and throughput while every slot is busy."""

from __future__ import annotations

import json
import threading
import time
from typing import cast

import pytest

from ddtree_deploy.config.schema import PromptConfig
from ddtree_deploy.validate.client import Completion, SglangClient
from ddtree_deploy.validate.errors import ValidationError
from ddtree_deploy.validate.measure import BusyWindow, Measurement, PromptResult, measure

TOKEN_S = 0.001  # the paced client's decode time per token
# Answers of very different lengths: a round's longest takes 20 x its shortest.
UNEVEN = [
    PromptConfig(name=f"p{n}", kind="chat", text=f"prompt {n}", max_new_tokens=n)
    for n in (5, 10, 20, 100)
]


class PacedClient:
    """TEST DOUBLE for `SglangClient.generate`: answers `max_new_tokens` tokens after sleeping
    `TOKEN_S` a token (decode at one steady rate, so a long answer takes long), with its own
    wall time as the real client measures it, and counts how often nothing was in flight once
    `slots` requests had been (before that, a loaded machine may start the threads slowly)."""

    def __init__(self, slots: int = 1) -> None:
        self._lock = threading.Lock()
        self._slots = slots
        self.in_flight = 0
        self.most_in_flight = 0
        self.idle = 0  # times the last request in flight ended, once the slots were all full

    def generate(self, text: str, max_new_tokens: int) -> Completion:
        with self._lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        start = time.perf_counter()
        time.sleep(max_new_tokens * TOKEN_S)
        wall_s = time.perf_counter() - start
        with self._lock:
            self.in_flight -= 1
            self.idle += self.in_flight == 0 and self.most_in_flight >= self._slots
        return Completion(
            output_ids=tuple(range(max_new_tokens)),
            text=text,
            completion_tokens=max_new_tokens,
            verify_ct=max(1, max_new_tokens // 2),
            accept_length=None,
            wall_s=wall_s,
        )


def paced(client: PacedClient) -> SglangClient:
    return cast(SglangClient, client)


def steady_rate(got: Measurement, slots: int) -> float:
    """What `slots` requests in flight decode at: slots x tokens per request-second."""
    return slots * got.total_tokens / sum(r.wall_s for r in got.results)


def test_in_flight_tokens_per_s_is_the_steady_rate_without_the_drain_between_rounds() -> None:
    """Issue 45: at 8 in flight a pass lasted 5-6 s, and each round's drain was in its figure."""
    fake = PacedClient()
    got = measure(paced(fake), UNEVEN, label="t", repeats=1, timeout_s=60,
                  concurrency=4, min_pass_s=0.8)  # fmt: skip
    assert got.tokens_per_s == pytest.approx(steady_rate(got, 4), rel=0.12)  # was 0.31 x
    assert got.window is not None and got.busy_window is got.window
    assert got.summary()["window_s"] == pytest.approx(got.window.seconds, abs=1e-4)


def test_the_pool_never_drains_between_rounds_and_passes_are_numbered_on() -> None:
    fake = PacedClient(slots=4)
    got = measure(paced(fake), UNEVEN, label="t", repeats=1, timeout_s=60,
                  concurrency=4, min_pass_s=0.5)  # fmt: skip
    assert fake.idle == 1  # only at the very end (round by round: once a round)
    assert fake.most_in_flight == 4
    passes = max(r.repeat for r in got.results) + 1
    assert passes >= 3  # more rounds than asked for, until min_pass_s
    assert [(r.repeat, r.name) for r in got.results] == [
        (repeat, p.name) for repeat in range(passes) for p in UNEVEN
    ]
    first = [r for r in got.results if r.repeat == 0]
    second = [r for r in got.results if r.repeat == 1]
    first_end = max((r.started_s or 0) + r.wall_s for r in first)
    assert min(r.started_s or 0 for r in second) < first_end  # round 2 began before 1 ended
    assert got.elapsed_s is not None and got.elapsed_s >= 0.5


@pytest.mark.parametrize("slots", [4, 5])
def test_a_pool_never_full_counts_all_tokens_over_the_whole_time(slots: int) -> None:
    """As many items as slots (they go out at once, then drain) or fewer: no busy window."""
    got = measure(paced(PacedClient()), UNEVEN, label="t", repeats=1, timeout_s=60,
                  concurrency=slots)  # fmt: skip
    assert len(got.results) == 4 and got.window is None
    assert got.elapsed_s is not None
    assert got.tokens_per_s == got.total_tokens / got.elapsed_s
    assert got.summary()["window_s"] is None


def test_one_at_a_time_counts_the_passes_time_without_the_pauses() -> None:
    fake = PacedClient()
    got = measure(paced(fake), UNEVEN[:2], label="t", repeats=3, timeout_s=60, pause_s=0.1)
    assert fake.most_in_flight == 1 and got.window is None
    starts = [r.started_s for r in got.results]
    assert all(s is not None for s in starts) and starts == sorted(starts)  # type: ignore[type-var]
    last = got.results[-1]
    assert got.elapsed_s is not None and got.elapsed_s < (last.started_s or 0) + last.wall_s - 0.15
    assert got.tokens_per_s == got.total_tokens / got.elapsed_s


def test_in_flight_past_the_deadline_stops_every_worker() -> None:
    slow = [PromptConfig(name="long", kind="chat", text="x", max_new_tokens=100)]
    fake = PacedClient()
    with pytest.raises(ValidationError, match=r"took longer than 0\.15 s"):
        measure(paced(fake), slow, label="t", repeats=1, timeout_s=0.15, concurrency=3,
                min_pass_s=30)  # fmt: skip
    assert fake.in_flight == 0


def result(name: str, repeat: int, started_s: float | None, wall_s: float) -> PromptResult:
    return PromptResult(name, repeat, (1, 2), 100, 50, wall_s, started_s)


def test_a_stored_baseline_gives_the_figure_it_was_measured_with_old_formats_included() -> None:
    """Baselines stored before busy windows have no start offsets: all tokens over elapsed_s."""
    old = {
        "label": "linear",
        "elapsed_s": 4.0,
        "results": [
            {k: v for k, v in vars(result("a", 0, None, 1.0)).items() if k != "started_s"},
            {k: v for k, v in vars(result("b", 0, None, 3.0)).items() if k != "started_s"},
        ],
    }
    loaded = Measurement.from_dict(old)
    assert loaded.window is None and loaded.tokens_per_s == 200 / 4.0
    # Two slots busy from 1 s to 3 s: a's second answer and b's middle, the drain after it out.
    new = Measurement(
        "linear",
        (result("a", 0, 0.0, 1.0), result("b", 0, 0.0, 4.0), result("a", 1, 1.0, 2.0)),
        elapsed_s=4.0,
        window=BusyWindow(1.0, 3.0),
    )
    again = Measurement.from_dict(json.loads(json.dumps(new.to_dict())))
    assert again == new
    assert again.tokens_per_s == pytest.approx((100 + 50) / 2.0)
