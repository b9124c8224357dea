"""Timed passes straight over SGLang's HTTP API: the overhead table's rounds after round 0.

Round 0 of `run.py --overhead` goes through the product (`action=validate`: the gates, DFLASH's
stored baseline). Later rounds only measure speed, and a validate run spends about 8 s of
start-up and gate checks around each measured pass (run 16: 20 s a pass, so three rounds of three
servers at three levels did not fit a 600 s call). Here a pass is just requests: a fixed list of
them (the prompts in turn, each answered greedily to its `max_new_tokens`), `level` at a time, so
every server compared does the same work (run 16's passes timed by the clock gave one server four
requests and the next five, other prompts at other acceptance: 5-17% apart round to round).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

REQUEST_TIMEOUT_S = 120.0


def pass_requests(level: int, seconds: float, warm: dict[str, Any], answer_tokens: float) -> int:
    """Requests per timed pass at `level` in flight: about `seconds` of answers at the speed of
    DFLASH's round-0 pass (`warm`: its tokens_per_s), `answer_tokens` each, in whole waves of
    `level` (at least one), so no pass ends on a few stragglers; one wave where DFLASH's pass
    measured nothing (its failure is in the table)."""
    if not warm.get("tokens_per_s"):
        return level
    per_wave = level * answer_tokens / float(warm["tokens_per_s"])
    return level * max(1, round(seconds / per_wave))


def timed_pass(
    url: str,
    prompts: Sequence[dict[str, Any]],
    *,
    level: int,
    requests: int,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Answer `requests` requests over `prompts` in turn from the first (each its `text` and
    `max_new_tokens`), `level` in flight: tokens, wall seconds, tokens/s, the server's tokens per
    verify step (`spec_verify_ct`, SGLang's own count) and the mean ms per verify step."""
    if not prompts:
        raise ValueError("a timed pass needs at least one prompt")
    queue = iter([prompts[i % len(prompts)] for i in range(requests)])
    lock = threading.Lock()
    done: list[tuple[int, int, float]] = []  # (tokens, verify steps, seconds) per request

    def worker(_: int) -> None:
        with httpx.Client(base_url=url, headers=headers or {}, timeout=REQUEST_TIMEOUT_S) as client:
            while True:
                with lock:
                    prompt = next(queue, None)
                if prompt is None:
                    return
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
        list(pool.map(worker, range(level)))
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
