"""Timed passes straight over SGLang's HTTP API: the overhead table's rounds after round 0.

Round 0 of `run.py --overhead` goes through the product (`action=validate`: the gates, DFLASH's
stored baseline). Later rounds only measure speed, and a validate run spends about 8 s of
start-up and gate checks around each measured pass (run 16: 20 s a pass, so three rounds of three
servers at three levels did not fit a 600 s call). Here a pass is just requests: `level` at a
time, greedy, each answering its prompt's `max_new_tokens` in full, new ones started until `seconds` have
passed, so the servers compared see the same work, one after another.
"""

from __future__ import annotations

import itertools
import statistics
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

REQUEST_TIMEOUT_S = 120.0


def timed_pass(
    url: str,
    prompts: Sequence[dict[str, Any]],
    *,
    level: int,
    seconds: float,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Keep `level` requests in flight over `prompts` (in turn; each its `text` and
    `max_new_tokens`) until `seconds` have passed, then wait for the last ones: tokens, wall seconds, tokens/s, the server's tokens per verify step
    (`spec_verify_ct`, SGLang's own count) and the mean ms per verify step of the requests."""
    if not prompts:
        raise ValueError("a timed pass needs at least one prompt")
    order = itertools.cycle(prompts)
    lock = threading.Lock()
    done: list[tuple[int, int, float]] = []  # (tokens, verify steps, seconds) per request

    def worker(deadline: float) -> None:
        with httpx.Client(base_url=url, headers=headers or {}, timeout=REQUEST_TIMEOUT_S) as client:
            while time.monotonic() < deadline:
                with lock:
                    prompt = next(order)
                params = {"temperature": 0, "max_new_tokens": prompt["max_new_tokens"],
                          "ignore_eos": True}  # fmt: skip
                began = time.monotonic()
                answer = client.post("/generate", json={"text": prompt["text"],
                                                         "sampling_params": params})  # fmt: skip
                answer.raise_for_status()
                meta = answer.json()["meta_info"]
                took = time.monotonic() - began
                with lock:
                    done.append((int(meta["completion_tokens"]),
                                 int(meta.get("spec_verify_ct") or 0), took))  # fmt: skip

    start = time.monotonic()
    with ThreadPoolExecutor(level) as pool:
        list(pool.map(worker, [start + seconds] * level))
    wall = time.monotonic() - start
    tokens = sum(t for t, _, _ in done)
    verify_steps = sum(v for _, v, _ in done)
    step_s = [took / v for _, v, took in done if v]
    return {
        "requests": len(done),
        "tokens": tokens,
        "wall_s": round(wall, 3),
        "tokens_per_s": round(tokens / wall, 2),
        "accept_length": round(tokens / verify_steps, 4) if verify_steps else None,
        "step_ms": round(1000 * statistics.mean(step_s), 3) if step_s else None,
    }
