"""How `action=tune` picks and reports, on hand-made results (no host)."""

from __future__ import annotations

from ddtree_deploy.config import compose_config
from ddtree_deploy.report.run_report import render_markdown
from ddtree_deploy.rollout.tune import Candidate, CandidateResult, Cell, pick_winner, tune_table
from ddtree_deploy.validate.record import ValidationRecord


def result(budget: int, c1: float, c32: float, *, min_speedup: float = 1.05) -> CandidateResult:
    cells = [
        Cell(c, "passed" if s >= min_speedup else "failed", "-", 10 * s, 10.0, 4.0, s)
        for c, s in ((1, c1), (32, c32))
    ]
    verdict = "passed" if all(cell.outcome == "passed" for cell in cells) else "failed"
    return CandidateResult(Candidate(budget, 2), 3, cells, verdict, "-")


def test_tune_promotes_the_best_geomean_of_those_passing_everywhere() -> None:
    cfg = compose_config(["action=tune", "tune.topks=[2]"])
    results = [result(4, 0.9, 2.5), result(8, 1.2, 1.7), result(15, 1.4, 1.1)]
    winner = pick_winner(results)
    assert winner is not None and winner.candidate.slug == "b8k2"  # b4 is best at 32, fails at 1
    table = tune_table(cfg, results, winner)
    assert table["best_per_concurrency"] == {"1": "b15k2", "32": "b4k2"}
    record = ValidationRecord("lab", "tune")
    record.tune = table
    markdown = render_markdown(record.to_dict())
    assert "| b8k2* | 32 | 17.00 | 10.00 | 4.00 | 1.70 | passed | 1.43 | passed |" in markdown
    assert "| b4k2 | 32 | 25.00 | 10.00 | 4.00 | 2.50 best | passed | 1.50 | failed |" in markdown


def test_tune_has_no_winner_when_every_candidate_fails_somewhere() -> None:
    assert pick_winner([result(4, 0.9, 2.5), result(15, 1.4, 1.0)]) is None
