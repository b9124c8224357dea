"""`action=tune`'s grid, judgement and report for the GPU lab, in the lab's venv.

The lab machine has no systemd, so `action=tune` (which deploys each candidate as a generation)
cannot run there; run.py is the service manager instead: it serves linear DFlash, records the
baseline at each concurrency with `action=validate`, then serves every candidate and judges it
with `action=validate` at each concurrency. This script gives run.py the product's grid and
turns those validate reports into the product's tune table (`rollout.tune.judge_cells`,
`pick_winner`, `tune_table`, the run report), so the lab judges a sweep exactly as a deploy does:

    python tune_lab.py grid OVERRIDES...            -> JSON: candidates and concurrency levels
    python tune_lab.py report SWEEP.json OUTDIR OVERRIDES...  -> OUTDIR/report.{md,json}
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from ddtree_deploy.config import compose_config
from ddtree_deploy.config.schema import DeployConfig
from ddtree_deploy.report.run_report import write_run_report
from ddtree_deploy.rollout.tune import (
    Candidate,
    CandidateResult,
    candidates,
    fail_unmeasured,
    judge_cells,
    pick_winner,
    tune_table,
)
from ddtree_deploy.validate.gates import Decision, GateResult, Outcome
from ddtree_deploy.validate.record import ValidationRecord


def grid(cfg: DeployConfig) -> dict[str, Any]:
    return {
        "candidates": [[c.budget, c.topk] for c in candidates(cfg)],
        "concurrency": list(cfg.tune.concurrency),
    }


def candidate_result(cfg: DeployConfig, served: dict[str, Any]) -> CandidateResult:
    """One candidate from what the lab recorded: its server's start, a validate report per level."""
    result = CandidateResult(Candidate(int(served["budget"]), int(served["topk"])))
    levels = list(cfg.tune.concurrency)
    if served.get("start_error"):
        why = served["start_error"].strip().splitlines()[-1][-300:]
        gate = GateResult("server_start", Outcome.failed, f"the server did not start: {why}")
        fail_unmeasured(result, gate, levels)
        return result

    def judge(level: int) -> list[GateResult]:
        report = served["reports"].get(str(level))
        if not report or not report.get("phases"):
            return [GateResult("validate", Outcome.failed, "action=validate wrote no report")]
        return [GateResult.from_dict(g) for g in report["phases"][-1]["gates"]]

    judge_cells(result, levels, judge, cfg.validation.on_inconclusive)
    return result


def report(cfg: DeployConfig, sweep: list[dict[str, Any]], out: Path) -> str:
    """Judge the sweep, pick as `action=tune` picks, write the run report; its Markdown."""
    results = [candidate_result(cfg, served) for served in sweep]
    winner = pick_winner(results)
    grid_text = f"budgets {list(cfg.tune.budgets)} x topks {list(cfg.tune.topks)}"
    record = ValidationRecord(cfg.host.name, f"tune (GPU lab): DDTREE tree, {grid_text}")
    record.tune = tune_table(cfg, results, winner)
    if winner is None:
        record.decide(Decision.no_winner, "No candidate passed every gate at every concurrency.")
    else:
        record.decide(Decision.promote, f"Promoted {winner.candidate.label} ({winner.sentence}).")
    out.mkdir(parents=True, exist_ok=True)
    _, markdown = write_run_report(out, record.to_dict())
    return markdown.read_text()


def main(argv: list[str]) -> int:
    command, rest = argv[0], argv[1:]
    if command == "grid":
        print(json.dumps(grid(compose_config(rest))))
        return 0
    sweep_file, out, overrides = Path(rest[0]), Path(rest[1]), rest[2:]
    print(report(compose_config(overrides), json.loads(sweep_file.read_text()), out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
