"""A second reading of a server's step time, from SGLang's own decode log: issue 22 at more
requests in flight than a server runs.

There a request's time includes its wait in the queue, so the timed passes compare only tokens/s
(which the acceptance of each pass moves too). The scheduler logs a window every 40 decode steps
with the requests running, their accept length, the tokens/s since the window before and the
requests queued; a window of `running` requests at accept length `a` and `t` tokens/s took
running * a / t seconds a step. Pure functions of the log's text (0.5.11's and 0.5.14's servers
wrote the same line in run 20), tested on CPU (test_decode_log.py).
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_WINDOW = re.compile(
    r"Decode batch, #running-req: (?P<running>\d+),.* accept len: (?P<accept>[\d.]+),"
    r".* gen throughput \(token/s\): (?P<throughput>[\d.]+), #queue-req: (?P<queued>\d+)"
)
SERVER_LOG = "server-overhead-{}.log"  # run.py's log of an --overhead server


@dataclass(frozen=True)
class Window:
    """One decode-log line: `running` requests at `accept` tokens a step, `throughput` tokens/s
    over the window, `queued` requests waiting."""

    running: int
    accept: float
    throughput: float
    queued: int

    @property
    def step_ms(self) -> float:
        return 1000 * self.running * self.accept / self.throughput


def read_windows(text: str) -> list[Window]:
    """Every decode window the log holds, in order (a window at 0 tokens/s has no step)."""
    found = (_WINDOW.search(line) for line in text.splitlines())
    windows = [Window(int(m["running"]), float(m["accept"]), float(m["throughput"]),
                      int(m["queued"])) for m in found if m]  # fmt: skip
    return [w for w in windows if w.throughput > 0]


def full_batch_steps(text: str) -> dict[str, Any] | None:
    """Median ms a step over the windows at the server's fullest batch, those with requests
    queued and those without, and how many windows each; None without any window.

    A window whose tokens/s is under half the median of those windows spans idle time and is
    left out: the log's clock runs from the window before, and the interleaved passes leave each
    server idle while the others are timed."""
    windows = read_windows(text)
    if not windows:
        return None
    running = max(w.running for w in windows)
    full = [w for w in windows if w.running == running]
    floor = statistics.median(w.throughput for w in full) / 2
    busy = [w for w in full if w.throughput >= floor]
    summary: dict[str, Any] = {"running": running}
    for key, queued in (("queued", True), ("unqueued", False)):
        steps = [w.step_ms for w in busy if (w.queued > 0) == queued]
        summary[key] = {"step_ms": round(statistics.median(steps), 2) if steps else None,
                        "windows": len(steps)}  # fmt: skip
    return summary


def overhead_servers_steps(logs: Path, names: list[str]) -> dict[str, dict[str, Any] | None]:
    """`full_batch_steps` of the --overhead servers `names` (this call's: a reused root still
    holds the logs of servers an earlier call ran), from their logs in `logs`."""
    steps = {}
    for name in names:
        path = logs / SERVER_LOG.format(name)
        steps[name] = full_batch_steps(path.read_text(errors="replace")) if path.exists() else None
    return steps
