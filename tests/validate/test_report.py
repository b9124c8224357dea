"""The run report: JSON and Markdown hold every gate's figures, the divergence and the decision."""

from __future__ import annotations

import json
from pathlib import Path

from ddtree_deploy.report.run_report import write_run_report
from ddtree_deploy.validate.gates import Decision, GateResult, Outcome, judge_shadow
from ddtree_deploy.validate.measure import Measurement, PromptResult
from ddtree_deploy.validate.record import ValidationRecord

BASE = Measurement("linear", (PromptResult("code", 0, (1, 2, 3, 4), 4, 2, 0.5),))
SHADOW = Measurement("shadow", (PromptResult("code", 0, (1, 2, 9, 4), 4, 2, 0.5),))


def test_report_shows_gates_figures_divergence_and_decision(tmp_path: Path) -> None:
    record = ValidationRecord("ct200", "DDTREE tree, budget 15, topk 4")
    record.add("baseline", "linear DFLASH", 1, [GateResult("health", Outcome.passed, "200")], BASE)
    shadow = judge_shadow(BASE, SHADOW, tolerance=0.02, collapse_ratio=0.6)
    record.add("shadow_linear", "DDTREE shadow_linear, budget 15", 2, [shadow], SHADOW)
    record.decide(Decision.rollback, "Gate shadow_linear failed on ct200.")

    json_path, md_path = write_run_report(tmp_path, record.to_dict())

    data = json.loads(json_path.read_text())
    assert data["decision"] == "rollback"
    assert data["phases"][1]["gates"][0]["divergence"] == {
        "prompt": "code",
        "position": 2,
        "baseline": [3, 4],
        "candidate": [9, 4],
    }
    markdown = md_path.read_text()
    assert "- **Decision:** rollback" in markdown
    assert "First divergence (shadow_linear): prompt `code`, token 2." in markdown
    assert "| health | passed | 200 |" in markdown
    assert "mean acceptance length **2.0**" in markdown
