"""The stored baseline a revalidation compares its sample of prompts against."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

import pytest

from ddtree_deploy.config import compose_config
from ddtree_deploy.config.schema import DeployConfig
from ddtree_deploy.rollout.revalidate import _subset
from ddtree_deploy.rollout.tune import at_concurrency
from ddtree_deploy.rollout.validation_flow import prompts_hash
from ddtree_deploy.validate.measure import BusyWindow, Measurement, PromptResult


def answer(name: str, repeat: int, started_s: float | None, wall_s: float) -> PromptResult:
    return PromptResult(name, repeat, (1,), 100, 50, wall_s, started_s)


def test_a_subset_of_a_batched_baseline_runs_at_its_own_prompts_rate_in_flight() -> None:
    """Two slots busy from 0 to 4 s, then a drain: `a` decodes 100 tokens/s, `b` 50."""
    stored = Measurement(
        "linear",
        (
            answer("a", 0, 0.0, 1.0),
            answer("b", 0, 0.0, 2.0),
            answer("a", 1, 1.0, 1.0),
            answer("a", 2, 2.0, 1.0),
            answer("b", 1, 2.0, 2.0),
            answer("a", 3, 3.0, 1.0),
            answer("b", 2, 4.0, 2.0),  # the drain: alone in flight
        ),
        elapsed_s=6.0,
        window=BusyWindow(0.0, 4.0),
    )
    assert stored.tokens_per_s == pytest.approx(600 / 4.0)
    assert _subset(stored, {"a"}).tokens_per_s == pytest.approx(2 * 100.0)
    assert _subset(stored, {"b"}).tokens_per_s == pytest.approx(2 * 50.0)
    assert _subset(stored, {"a", "b"}).tokens_per_s == pytest.approx(stored.tokens_per_s)


def test_a_subset_of_a_baseline_stored_without_a_window_scales_its_time_as_before() -> None:
    stored = Measurement("linear", (answer("a", 0, None, 1.0), answer("b", 0, None, 3.0)), 4.0)
    kept = _subset(stored, {"b"})
    assert kept.window is None and kept.elapsed_s == pytest.approx(3.0)
    assert kept.tokens_per_s == pytest.approx(100 / 3.0)


def _hash_before_busy_windows(cfg: DeployConfig) -> str:
    """`prompts_hash` as it was when a batched measurement counted the drain too."""
    val = cfg.validation
    data: list[dict[str, Any]] = [dataclasses.asdict(p) for p in val.prompts]
    data.append({"repeats": val.repeats})
    if val.concurrency != 1:
        data.append({"concurrency": val.concurrency})
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def test_a_batched_baseline_counted_with_its_drain_is_not_reused_a_batch_1_one_is() -> None:
    """A batched baseline stored before the busy window reads slower than a tree measured now
    would; under its old hash it is not found, so the gates measure linear DFlash again."""
    cfg = compose_config(["algo=ddtree"])
    batched = at_concurrency(cfg, 8)
    assert prompts_hash(batched) != _hash_before_busy_windows(batched)
    assert prompts_hash(cfg) == _hash_before_busy_windows(cfg)
