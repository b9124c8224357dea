"""The run report: JSON and Markdown hold every gate's figures, the divergence and the decision."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddtree_deploy.report.run_report import write_run_report
from ddtree_deploy.validate.gates import Decision, GateResult, Outcome, judge_shadow, judge_tree
from ddtree_deploy.validate.measure import Measurement, PromptResult
from ddtree_deploy.validate.record import ValidationRecord
from ddtree_deploy.validate.scoring import ScoredOutput, Scoring, TieRule, TokenScore

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


def test_report_shows_the_tie_rule_per_prompt_with_the_divergence_s_scores(
    tmp_path: Path,
) -> None:
    """A tree that flips a near-tie: the report names both tokens, their scores and the gap."""
    tree = Measurement("tree", (PromptResult("code", 0, (1, 2, 9, 4), 4, 2, 0.4),))
    scores = [TokenScore(t, -0.1, t, -0.1) for t in (1, 2, 9, 4)]
    scores[2] = TokenScore(9, -0.15, 3, -0.1)
    base_scores = tuple(TokenScore(t, -0.1, t, -0.1) for t in (1, 2, 3, 4))
    scoring = Scoring((ScoredOutput("code", tuple(scores)),), (ScoredOutput("code", base_scores),))
    gate = judge_tree(
        BASE,
        tree,
        scoring,
        ties=TieRule(0.5, 2.0, 2.0),
        min_speedup=1.0,
        min_tokens=1,
        hybrid=False,
    )
    record = ValidationRecord("ct200", "DDTREE tree, budget 15, topk 4")
    record.add("tree", "DDTREE tree, budget 15, topk 4", 3, [gate], tree)
    record.decide(Decision.promote, "promoted")

    _, md_path = write_run_report(tmp_path, record.to_dict())

    markdown = md_path.read_text()
    assert "baseline's token -0.1, candidate's -0.15 (gap 0.05 nats)" in markdown
    assert (
        "| code | 4 | 1 | 0.05 | token 2: 3 vs 9 (-0.1 vs -0.15, gap 0.05) | near-tie |" in markdown
    )


@pytest.mark.parametrize(
    ("floor", "line"),
    [
        (0.1, "every emitted token within 0.5 nats of the target's top-1 in its own prefill "
              "scores (validation.tie_tolerance=0.5); 4 tokens scored"),
        (0.6, "every emitted token within 1.2 nats of the target's top-1 in its own prefill "
              "scores (validation.tie_tolerance=0.5, widened to validation.tie_noise_factor=2.0 "
              "x the baseline's own worst gap); 4 tokens scored"),
        (3.0, "every emitted token within 0.5 nats of the target's top-1 in its own prefill "
              "scores (validation.tie_tolerance=0.5; the baseline's own worst gap would widen it "
              "past validation.max_tie_tolerance=2.0, so the prefill is no judge here)"),
    ],
)  # fmt: skip
def test_report_says_which_tolerance_judged_the_tree(
    tmp_path: Path, floor: float, line: str
) -> None:
    """The tie rule's line: the configured tolerance, the one the baseline's noise floor widened
    it to, or that the floor is too wide for the prefill to judge by."""
    tree = Measurement("tree", (PromptResult("code", 0, (1, 2, 3, 4), 4, 2, 0.4),))
    scores = tuple(TokenScore(t, -0.1, t, -0.1) for t in (1, 2, 3, 4))
    stray = list(scores)
    stray[1] = TokenScore(2, -0.1 - floor, 7, -0.1)
    scoring = Scoring((ScoredOutput("code", scores),), (ScoredOutput("code", tuple(stray)),))
    gate = judge_tree(
        BASE, tree, scoring, ties=TieRule(0.5, 2.0, 2.0), min_speedup=1.0, min_tokens=1,
        hybrid=False,
    )  # fmt: skip
    record = ValidationRecord("ct200", "DDTREE tree, budget 15, topk 4")
    record.add("tree", "DDTREE tree, budget 15, topk 4", 3, [gate], tree)
    record.decide(Decision.promote, "promoted")
    _, md_path = write_run_report(tmp_path, record.to_dict())
    assert line in " ".join(md_path.read_text().split())
