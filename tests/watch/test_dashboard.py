"""docs/watch-dashboard.json loads, and every query in it names metrics the product writes.

The metric names come from a real exposition (`watch.metrics`, folded from a deploy's record
and a re-validation's) read back with the Prometheus client's own parser; the dashboard's
PromQL is parsed with promql-parser (the Rust parser's Python binding), so a renamed metric or
a query Prometheus would refuse fails here rather than as an empty panel.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import promql_parser
from prometheus_client.parser import text_string_to_metric_families

from ddtree_deploy.watch.metrics import exposition, families, fold

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "watch-dashboard.json"


def _written_metrics() -> set[str]:
    """Every sample name the exposition holds for a DDTREE host that has drifted, failed and
    rolled back once (so that every family is written)."""
    gates = [
        {"gate": "health", "outcome": "passed", "figures": {}},
        {"gate": "tree", "outcome": "passed", "figures": {"speedup": 1.3, "max_gap": 0.1}},
    ]
    record = {
        "finished": 2000.0,
        "phases": [
            {
                "name": "baseline",
                "measurement": {"tokens_per_s": 100.0, "mean_accept_length": 3.0},
                "gates": [
                    {"gate": "baseline", "outcome": "passed", "figures": {"measured_at": 1.0}}
                ],
            },
            {
                "name": "tree",
                "measurement": {"tokens_per_s": 130.0, "mean_accept_length": 4.0},
                "gates": gates,
            },
        ],
    }
    entry = fold(
        None, record, failed=True, rolled_back=True, drift=1, tree={"budget": 15, "topk": 4}
    )
    state = {"generation": 3, "algo": "DDTREE", "summary": "DDTREE tree", "watch": entry}
    text = exposition("gpu7", families(state))
    return {sample.name for fam in text_string_to_metric_families(text) for sample in fam.samples}


def _queries(dashboard: dict[str, Any]) -> list[str]:
    """Every panel target's PromQL."""
    return [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]


def _metrics_named(expr: str) -> set[str]:
    """The metric names an expression selects (by name or by a `__name__` matcher)."""
    names: set[str] = set()

    def visit(node: object) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name:
                names.add(node.name)
            names.update(m.value for m in node.matchers.matchers if m.name == "__name__")

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names


def test_the_dashboard_queries_name_only_metrics_the_exposition_writes() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    written = _written_metrics()
    assert {"ddtree_runs_total", "ddtree_baseline_timestamp_seconds"} <= written
    used: set[str] = set()
    for expr in _queries(dashboard):
        named = _metrics_named(expr)
        assert named, f"{expr!r} selects no metric"
        assert named <= written, f"{expr!r} names {sorted(named - written)}, never written"
        used |= named
    # The host variable lists hosts from a metric every host has.
    variable = {v["name"]: v for v in dashboard["templating"]["list"]}["host"]
    found = re.fullmatch(r"label_values\((\w+), host\)", variable["query"]["query"])
    assert found and found[1] in written
    # The panels show the verdicts, the figures and the counters, not a subset of them.
    wanted = {
        "ddtree_validation_passed",
        "ddtree_gate_passed",
        "ddtree_acceptance_length",
        "ddtree_speedup_ratio",
        "ddtree_drift_parts",
        "ddtree_rollbacks_total",
    }
    assert wanted <= used


def test_every_panel_is_placed_and_reads_the_chosen_datasource() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"]), panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for source in [panel["datasource"], *(t["datasource"] for t in panel["targets"])]:
            assert source["uid"].strip("${}") in variables, panel["title"]
