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
