"""The lab's table from the product's run reports, on reports recorded on the GPU (2026-12-01).

`recorded/attention-tree-report.json`: tree mode passing on the pure-attention target (run 2);
`recorded/attention-tree-diverged-report.json`: the tree gate failing at a divergence (run 1).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpulab.tables import (
    inflation_table,
    matrix_table,
    median_interval,
    overhead_table,
    pooled_table,
    render_table,
    speed_table,
    summarize,
    timeline_table,
)
from gpulab.tables import main as tables_main

RECORDED = Path(__file__).with_name("recorded")


def _report(name: str) -> dict[str, object]:
    data: dict[str, object] = json.loads((RECORDED / name).read_text())
    return data


def test_summary_of_a_passing_tree_run() -> None:
    got = summarize(_report("attention-tree-report.json"), 0)
    assert got["gates"] == {
        "health": "passed", "server_info": "passed", "health_generate": "passed", "tree": "passed",
    }  # fmt: skip
    assert got["divergence"] is None
    assert (got["accept_length"], got["tokens_per_s"], got["tokens"]) == (1.6574, 451.52, 416)
    assert got["step_ms"] == 3.826  # mean over prompts of accept length / tokens per second


def test_table_names_the_diverging_cell() -> None:
    run = summarize(_report("attention-tree-diverged-report.json"), 10)
    assert run["gates"]["tree"] == "failed"  # type: ignore[index]
    results = {
        "release": "0.5.11",
        "wall_s": 1.0,
        "steps": [{"name": "patch", "exit_code": 0, "wall_s": 6.5}],
        "cells": [
            {"target": "attention", "algo": "ddtree", "start_s": 51.7, "start_error": None,
             "runs": {"batch1": run}},
            {"target": "hybrid", "algo": "dflash", "start_s": None, "start_error": "boom",
             "runs": {}},
        ],
    }  # fmt: skip
    table = render_table(results)
    assert (
        "| attention | ddtree | batch1 | 51.7 | health:p server_info:p health_generate:p tree:f | 10 | code-python@113 |"
        in table
    )
    assert "| hybrid | dflash | - | failed | 'boom' |" in table


def test_table_notes_each_cells_api_key_check() -> None:
    run = summarize(_report("attention-tree-report.json"), 0)
    cells = [
        {"target": "attention", "algo": algo, "start_s": 1.0, "start_error": None,
         "runs": {"batch1": run}, "key_check": check}
        for algo, check in (("dflash", "clean (5 processes; HTTP 401 without the key)"),
                            ("ddtree", "KEY EXPOSED: the server log (5 processes)"))
    ]  # fmt: skip
    rows = matrix_table(cells)[2:]
    assert rows[0].endswith("| API key: clean (5 processes; HTTP 401 without the key) |")
    assert rows[1].endswith("| API key: KEY EXPOSED: the server log (5 processes) |")


def test_overhead_table_pairs_warm_rounds() -> None:
    def one(algo: str, rnd: int, tps: float, gate: str = "passed") -> dict[str, object]:
        gates = {"dflash": {"baseline": "passed"}, "ddtree_shadow": {"shadow_linear": gate},
                 "ddtree-15": {"tree": gate}}[algo]  # fmt: skip
        gap = {"max_gap": 0.125} if algo == "ddtree-15" else {}
        return {"algo": algo, "round": rnd, "concurrency": 1, "tokens_per_s": tps,
                "step_ms": {"dflash": 3.0, "ddtree_shadow": 3.1, "ddtree-15": 3.25}[algo] + rnd,
                "gates": gates, "repeats": 1 if rnd == 0 else 6,
                "accept_length": 3.5, **gap}  # fmt: skip

    passes = [
        {"algo": "dflash", "start_s": 40.0, "key_check": "clean (4 processes)"},
        one("dflash", 0, 50.0), one("ddtree_shadow", 0, 95.0), one("ddtree-15", 0, 20.0),
        one("ddtree_shadow", 1, 90.0), one("ddtree-15", 1, 96.0, "failed"), one("dflash", 1, 80.0),
        one("ddtree-15", 2, 121.0), one("dflash", 2, 110.0), one("ddtree_shadow", 2, 99.0),
        one("dflash", 3, 100.0), one("ddtree_shadow", 3, 95.0), one("ddtree-15", 3, 130.0),
    ]  # fmt: skip
    dflash, shadow, tree, blank, key = overhead_table(passes)[2:]
    # shadow: warm paired ratios 1.125, 0.9, 0.95 -> median 0.950 (with round 0's 1.9: 1.0375)
    assert shadow.endswith("| 3.5 | shadow_linear:passed | 0.950 (0.900-1.125) | +0.10 |")
    assert shadow.startswith("| 1 | ddtree_shadow | 1/6/6/6 | 95.0 (3.1), 90.0 (4.1),")
    # tree: 1.2, 1.1, 1.3 -> 1.2; one round's speed gate failed, its worst gap beside the verdict
    assert tree.endswith(
        "| tree:failed,tree:passed (worst gap 0.125) | 1.200 (1.100-1.300) | +0.25 |"
    )
    assert dflash.endswith("| baseline:passed | 1.000 | +0.00 |")
    assert (blank, key) == ("", "- API key, dflash: clean (4 processes)")


@pytest.mark.parametrize(("n", "rank"), [(6, 1), (9, 2), (20, 6), (100, 40)])
def test_the_median_interval_takes_the_ranks_of_the_binomial_table(n: int, rank: int) -> None:
    """The published ranks of the 95% distribution-free interval of a median, on 1..n."""
    values = [float(v) for v in range(n, 0, -1)]  # unsorted: the function sorts
    assert median_interval(values) == (rank, n + 1 - rank)


def test_fewer_than_six_rounds_have_no_interval_and_the_table_shows_only_the_range() -> None:
    assert median_interval([0.9, 1.0, 1.1, 1.2, 1.3]) is None
    rounds = [0.96, 1.10, 0.98, 0.99, 0.97, 1.01]  # shadow over DFLASH, rounds 1-6
    passes = [
        {"algo": algo, "round": rnd, "concurrency": 1, "gates": {},
         "tokens_per_s": 100.0 * (ratio if algo == "ddtree_shadow" else 1.0)}
        for rnd, ratio in enumerate([1.0, *rounds]) for algo in ("dflash", "ddtree_shadow")
    ]  # fmt: skip
    shadow = overhead_table(passes)[3]
    assert "| 0.985 (0.960-1.100; 0.960-1.100) |" in shadow  # six rounds: the extremes cover 97%
    fewer = overhead_table([p for p in passes if p["round"] < 6])[3]
    assert "| 0.980 (0.960-1.100) |" in fewer


def test_a_planted_bug_must_fail_on_the_tree_gate() -> None:
    failed = summarize(_report("attention-tree-diverged-report.json"), 10)
    passed = summarize(_report("attention-tree-report.json"), 0)
    crashed = {"exit": 10, "gates": {"health": "failed"}, "sentence": "down"}

    def row(run: dict[str, object], seen: bool | None) -> str:
        cell = {"target": "attention", "algo": "ddtree", "extra": ["algo.budget=15"],
                "planted": "wrong_child", "plant_seen": seen, "start_s": 40.0,
                "start_error": None, "runs": {"batch1": run}}  # fmt: skip
        (line,) = matrix_table([cell])[2:]
        assert line.startswith("| attention | ddtree 15 (planted wrong_child) | batch1 |")
        return line

    assert row(failed, True).endswith("| planted bug: failed, as it must |")
    assert row(passed, True).endswith("| planted bug PASSED: the gate missed it |")
    assert "planted bug: no verdict (exit 10, tree gate not run)" in row(crashed, True)
    assert "planted bug NOT IN PLACE" in row(failed, False)  # a pass there would prove nothing
    plain = {"target": "attention", "algo": "ddtree", "start_s": 40.0, "start_error": None,
             "runs": {"batch1": failed}}  # fmt: skip
    # A report from before the tie rule: no gaps to show.
    assert matrix_table([plain])[2].endswith(
        "| code-python@113 |  |  | 1.0639 | 268.1 | 3.974 |  |"
    )


def test_table_shows_the_tie_rule_s_gaps() -> None:
    """The tree gate's figures: the divergence's gap, prompts diverged, worst gaps."""
    divergence = {
        "prompt": "code-python",
        "position": 21,
        "baseline": [5],
        "candidate": [7],
        "baseline_logprob": -1.0,
        "candidate_logprob": -1.053,
        "gap": 0.053,
    }
    gate = {
        "gate": "tree",
        "outcome": "passed",
        "sentence": "ok",
        "divergence": divergence,
        "figures": {"max_gap": 0.061, "baseline_max_gap": 0.02, "divergences": 2},
    }
    report = {"sentence": "passes", "phases": [{"gates": [gate], "measurement": {}}]}
    run = summarize(report, 0)
    cell = {"target": "attention", "algo": "ddtree", "start_s": 30.0, "start_error": None,
            "runs": {"batch1": run}}  # fmt: skip
    assert "| code-python@21 (0.0530) | 2 | 0.061 (0.02) |" in matrix_table([cell])[2]


def test_speed_table_sets_each_cell_beside_dflash_at_the_same_level() -> None:
    def cell(algo: str, extra: list[str], runs: dict[str, tuple[float, float]]) -> dict[str, Any]:
        return {"target": "attention", "algo": algo, "extra": extra, "start_s": 9.0,
                "start_error": None, "planted": None,
                "runs": {k: {"accept_length": a, "tokens_per_s": t, "gates": {}, "exit": 0}
                         for k, (a, t) in runs.items()}}  # fmt: skip

    cells = [
        cell("dflash", [], {"batch1": (4.0, 800.0), "c8": (3.9, 3000.0)}),
        cell("ddtree", ["algo.budget=31"], {"batch1": (5.2, 960.0), "c8": (5.0, 2700.0)}),
    ]
    lines = speed_table(cells, {"acceptance": {"mean_accept_len": 4.1}})
    assert lines[0].startswith("Acceptance of DFLASH on the held-out prompts: predicted by "
                               "training 4.1, served at batch 1 4.0 (served / predicted 0.976)")  # fmt: skip
    assert lines[-1] == "| ddtree 31 | 5.2, 960.0, 1.200 | 5.0, 2700.0, 0.900 |"
    assert "speed" not in render_table({"release": "0.5.11", "steps": [], "cells": cells})
    assert lines[0] in render_table(
        {
            "release": "0.5.11",
            "steps": [],
            "cells": cells,
            "training": {"acceptance": {"mean_accept_len": 4.1}},
        }
    )


def test_the_timeline_table_puts_each_servers_kernels_side_by_side() -> None:
    def timeline(kernels: list[tuple[str, float]], graphs: float) -> dict[str, object]:
        return {"steps": 39, "step_ms": 9.0, "host_ms": 8.0, "gpu_ms": 5.0, "sync_ms": 1.0,
                "syncs": 13.8, "functions": [], "kernels": kernels, "graph_launches": graphs}  # fmt: skip

    lines = timeline_table({
        "dflash": timeline([("gemm", 2.5), ("attention", 1.0)], 2.0),
        "ddtree-15": timeline([("attention", 3.1), ("gemm", 2.5), ("mask", 0.2)], 1.0),
        "dflash_control": "no finished trace within 240 s",
    })  # fmt: skip
    assert lines[2].endswith("| 13.8 | 2.0 |") and lines[3].endswith("| 13.8 | 1.0 |")
    at = lines.index("| GPU kernel (ms per step) | dflash | ddtree-15 |")
    assert lines[at + 2 :] == [
        "| gemm | 2.5 | 2.5 |",
        "| attention | 1.0 | 3.1 |",
        "| mask |  | 0.2 |",
    ]
    assert not any("function (inclusive" in line for line in lines)  # no functions: no table


def _call(
    release: str, ratios: dict[int, list[float]], target: str | None = None
) -> dict[str, Any]:
    """A results.json of one --overhead call: shadow_linear's ratio over DFLASH by round, per
    level (round 0 first, at twice DFLASH's speed so that it shows if it is not left out), on
    `target` (None: a call from before run.py recorded it)."""
    passes: list[dict[str, Any]] = [{"algo": "dflash", "start_s": 1.0}]
    for level, by_round in ratios.items():
        for rnd, ratio in enumerate([2.0, *by_round]):
            passes += [{"algo": "dflash", "round": rnd, "concurrency": level, "gates": {},
                        "tokens_per_s": 500.0},
                       {"algo": "ddtree_shadow", "round": rnd, "concurrency": level, "gates": {},
                        "tokens_per_s": 500.0 * ratio}]  # fmt: skip
    return {"release": release, "overhead": passes,
            **({"overhead_target": target} if target else {})}  # fmt: skip


def test_the_pooled_table_joins_the_rounds_of_several_calls_per_release_target_and_level() -> None:
    first = _call("0.5.11", {32: [0.93, 0.97], 8: [1.01]})
    second = _call("0.5.11", {32: [1.00, 0.99, 1.02, 0.98]}, target="attention")
    hybrid = _call("0.5.11", {32: [0.90, 0.91]}, target="hybrid")
    other = _call("0.5.14", {32: [1.01]})
    header, _, *rows = pooled_table([first, second, hybrid, other])
    assert header.startswith("| release | target | in flight | server | calls | rounds |")
    assert rows == [
        "| 0.5.11 | attention | 8 | ddtree_shadow | 1 | 1 | 1.010 |",
        "| 0.5.11 | attention | 32 | ddtree_shadow | 2 | 6 | 0.985 (0.930-1.020; 0.930-1.020) |",
        "| 0.5.11 | hybrid | 32 | ddtree_shadow | 1 | 2 | 0.905 (0.900-0.910) |",
        "| 0.5.14 | attention | 32 | ddtree_shadow | 1 | 1 | 1.010 |",
    ]


def test_the_results_table_names_the_target_the_comparison_served() -> None:
    for target, named in ((None, "attention"), ("hybrid", "hybrid")):
        table = render_table({**_call("0.5.11", {1: [1.0]}, target=target), "steps": [],
                              "cells": []})  # fmt: skip
        assert f"Interleaved comparison on the {named} target:" in table.splitlines()


def test_pooling_a_file_that_is_no_comparison_is_refused_in_one_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    matrix = tmp_path / "results.json"
    matrix.write_text(json.dumps({"release": "0.5.11", "overhead": [], "cells": []}))
    listed = tmp_path / "list.json"
    listed.write_text("[]")
    missing = tmp_path / "none.json"
    refusals = {missing: f"error: cannot read {missing} as a lab results.json",
                matrix: f"error: {matrix} holds no interleaved comparison",
                listed: f"error: {listed} holds no interleaved comparison"}  # fmt: skip
    for path, sentence in refusals.items():
        with pytest.raises(SystemExit) as exited:
            tables_main([str(path)])
        assert exited.value.code == 2
        assert sentence in capsys.readouterr().err


def test_the_pooled_table_reads_the_results_the_gpu_lab_wrote() -> None:
    """Runs 19 and 20's results (recorded/run*-overhead.json, as run.py wrote them on the H200)
    are read as written, and their shadow_linear rounds at batch 1 pool into one row."""
    calls = [json.loads((RECORDED / f"run{n}-0.5.11-overhead.json").read_text()) for n in (19, 20)]
    shadow_at_batch_1 = "| 0.5.11 | attention | 1 | ddtree_shadow |"  # no target recorded then
    alone = [next(r for r in pooled_table([c]) if r.startswith(shadow_at_batch_1)) for c in calls]
    assert [row.split(" | ")[5] for row in alone] == ["23", "3"]
    together = next(r for r in pooled_table(calls) if r.startswith(shadow_at_batch_1))
    assert together.split(" | ")[4:6] == ["2", "26"]  # two calls, their rounds together


def test_the_inflation_table_sets_the_trained_pairs_acceptance_beside_the_inflated_pairs() -> None:
    """--small-beside: per level, each small server's token-weighted acceptance beside its
    inflated counterpart's over the rounds the small one was timed in (the same requests), and
    their ratio; the small servers stay out of the noise table (timed in two rounds, not every
    round). Run 21 first set all nine inflated rounds against the small pair's two."""
    passes = [
        {"algo": "dflash", "round": 0, "concurrency": 1, "tokens": 400, "accept_length": 4.0},
        {"algo": "dflash", "round": 1, "concurrency": 1, "tokens": 600, "accept_length": 5.0},
        {"algo": "dflash", "round": 2, "concurrency": 1, "tokens": 900, "accept_length": 3.0},
        {"algo": "small-dflash", "round": 0, "concurrency": 1, "tokens": 500, "accept_length": 5.0},
        {"algo": "small-dflash", "round": 1, "concurrency": 1, "tokens": 500, "accept_length": 5.0},
        {"algo": "ddtree-63", "round": 1, "concurrency": 1, "tokens": 600, "accept_length": 6.0},
    ]
    lines = inflation_table(passes)
    # inflated DFLASH over rounds 0 and 1: 1000 tokens over 100 + 120 steps; small: 1000 over 200
    assert lines[2] == "| 1 | dflash | 4.5455 | 5.0 | 0.9091 |"
    assert len(lines) == 3  # ddtree-63 had no small server beside it
    assert inflation_table(passes[:2]) == []
