"""The lab's sweep judged as `action=tune` judges it, on reports recorded on the GPU."""

from __future__ import annotations

import json
from pathlib import Path

from ddtree_deploy.config import compose_config
from gpulab.tune_lab import grid, report

RECORDED = Path(__file__).with_name("recorded")
LAB = ["host=h200_lab", "service=lab", "validation=lab", "action=tune", "tune.concurrency=[1,32]"]


def _recorded(name: str) -> dict[str, object]:
    data: dict[str, object] = json.loads((RECORDED / name).read_text())
    return data


def test_grid_is_the_products() -> None:
    cfg = compose_config([*LAB, "tune.budgets=[2,8]", "tune.topks=[2,4]"])
    assert grid(cfg) == {"candidates": [[2, 2], [8, 2], [8, 4]], "concurrency": [1, 32]}


def test_a_divergence_or_a_dead_server_is_never_promoted(tmp_path: Path) -> None:
    passing = _recorded("attention-tree-report.json")
    diverged = _recorded("attention-tree-diverged-report.json")
    sweep = [
        {"budget": 8, "topk": 2, "reports": {"1": diverged, "32": passing}},
        {"budget": 8, "topk": 4, "start_error": "boom\nRuntimeError: out of memory\n"},
        {"budget": 15, "topk": 4, "reports": {"1": passing, "32": passing}},
        {"budget": 15, "topk": 2, "reports": {"1": passing}},  # c32's validate wrote nothing
    ]
    markdown = report(compose_config(LAB), sweep, tmp_path)
    table = json.loads((tmp_path / "report.json").read_text())["tune"]
    verdicts = {c["candidate"]: c["verdict"] for c in table["candidates"]}
    assert verdicts == {"b8k2": "failed", "b8k4": "failed", "b15k4": "passed", "b15k2": "failed"}
    assert table["winner"] == "b15k4"
    b8k2 = table["candidates"][0]
    assert [c["outcome"] for c in b8k2["cells"]] == ["failed", "not_run"]  # stops at the divergence
    assert "code-python" in b8k2["sentence"]
    assert "out of memory" in table["candidates"][1]["sentence"]
    assert "wrote no report" in table["candidates"][3]["sentence"]
    assert "Promoted: **b15k4**" in markdown


def test_the_recorded_27b_sweep_keeps_linear_dflash_for_8_in_flight_and_picks_b63_for_batch_1(
    tmp_path: Path,
) -> None:
    """GPU lab run 24 (H100, the trained pair grown to a 27B shape): budgets 31 and 63 pass the
    tie gate and run 1.23x and 1.30x linear DFlash at batch 1, but tie it at 8 in flight. Tuned
    for a host serving both loads, the product promotes nothing and linear DFlash stays; tuned
    for batch 1 alone, it promotes the faster tree."""
    sweep = json.loads((RECORDED / "run24-0.5.11-h100-trained-27b-tune.json").read_text())
    inflated = ["host=h200_lab", "service=lab_inflated", "model=lab_attention_trained_27b",
                "validation=lab", "action=tune", "tune.budgets=[31,63]", "tune.topks=[4]"]  # fmt: skip
    both = report(compose_config([*inflated, "tune.concurrency=[1,8]"]), sweep, tmp_path / "both")
    assert "Promoted: **none**" in both
    assert "below validation.min_speedup=1.05" in both
    batch_1 = report(compose_config([*inflated, "tune.concurrency=[1]"]), sweep, tmp_path / "one")
    table = json.loads((tmp_path / "one" / "report.json").read_text())["tune"]
    assert table["winner"] == "b63k4"
    assert {c["candidate"]: c["verdict"] for c in table["candidates"]} == {
        "b31k4": "passed",
        "b63k4": "passed",
    }
    assert "Promoted: **b63k4**" in batch_1


def test_the_recorded_8b_worker_v2_sweep_picks_the_budget_each_load_favours(
    tmp_path: Path,
) -> None:
    """GPU lab run 25 (H100, SGLang 0.5.14, the trained pair grown to Qwen3-8B's shape): both
    trees pass at 1 and 8 in flight; over both loads budget 15 wins (1.20x and 1.30x), for batch
    1 alone budget 31 does (1.24x against 15's 1.20x)."""
    sweep = json.loads((RECORDED / "run25-0.5.14-h100-trained-8b-tune.json").read_text())
    inflated = ["host=h200_lab", "service=lab_inflated", "model=lab_attention_trained_8b",
                "validation=lab", "action=tune", "tune.budgets=[15,31]", "tune.topks=[4]"]  # fmt: skip
    report(compose_config([*inflated, "tune.concurrency=[1,8]"]), sweep, tmp_path / "both")
    both = json.loads((tmp_path / "both" / "report.json").read_text())["tune"]
    assert both["winner"] == "b15k4"
    assert both["best_per_concurrency"] == {"1": "b31k4", "8": "b15k4"}
    report(compose_config([*inflated, "tune.concurrency=[1]"]), sweep, tmp_path / "one")
    assert json.loads((tmp_path / "one" / "report.json").read_text())["tune"]["winner"] == "b31k4"
