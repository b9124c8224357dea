"""The metrics file: folded from validation records, parsed by the Prometheus client's own
parser (what node_exporter's textfile collector and Prometheus read)."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from ddtree_deploy.watch.metrics import exposition, families, fold


def _record(*, tree_outcome: str, finished: float) -> dict[str, Any]:
    """A ValidationRecord.to_dict() of a deploy: baseline, then tree."""
    return {
        "finished": finished,
        "phases": [
            {
                "name": "baseline",
                "measurement": {"tokens_per_s": 100.0, "mean_accept_length": 3.0},
                "gates": [{"gate": "health", "outcome": "passed", "figures": {}}],
            },
            {
                "name": "tree",
                "measurement": {"tokens_per_s": 134.5, "mean_accept_length": 4.2},
                "gates": [
                    {"gate": "health", "outcome": "passed", "figures": {}},
                    {
                        "gate": "tree",
                        "outcome": tree_outcome,
                        "figures": {"speedup": 1.345, "max_gap": 0.125},
                    },
                ],
            },
        ],
    }


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def test_metrics_parse_with_the_client_parser_and_carry_the_host_on_every_sample() -> None:
    host = 'gpu "7"\\x'  # a label value needing every escape the format has
    state: dict[str, Any] = {"generation": 4, "algo": "DDTREE", "summary": "DDTREE tree, budget 15"}
    state["watch"] = fold(
        None, _record(tree_outcome="passed", finished=1000.0),
        failed=False, rolled_back=False, drift=0, tree={"budget": 15, "topk": 4},
    )  # fmt: skip
    state["watch"] = fold(
        state["watch"], _record(tree_outcome="failed", finished=2000.0),
        failed=True, rolled_back=True, drift=2, tree={"budget": 15, "topk": 4},
    )  # fmt: skip
    text = exposition(host, families(state))
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert fams["ddtree_runs"].type == "counter"
    assert fams["ddtree_gate_passed"].type == "gauge"
    samples = _samples(text)
    assert all(dict(labels)["host"] == host for _, labels in samples)
    h = ("host", host)
    assert samples[("ddtree_runs_total", (h,))] == 2
    assert samples[("ddtree_failures_total", (h,))] == 1
    assert samples[("ddtree_rollbacks_total", (h,))] == 1
    assert samples[("ddtree_generation", (h,))] == 4
    assert samples[("ddtree_tree_budget", (h,))] == 15
    assert samples[("ddtree_tree_topk", (h,))] == 4
    tree_gate = (("gate", "tree"), h, ("phase", "tree"))
    assert samples[("ddtree_gate_passed", tree_gate)] == 0
    assert samples[("ddtree_gate_timestamp_seconds", tree_gate)] == 2000.0
    assert samples[("ddtree_acceptance_length", (h,))] == 4.2
    assert samples[("ddtree_tokens_per_second", (h,))] == 134.5
    assert samples[("ddtree_baseline_tokens_per_second", (h,))] == 100.0
    assert samples[("ddtree_speedup_ratio", (h,))] == 1.345
    assert samples[("ddtree_tie_gap_max_nats", (h,))] == 0.125
    assert samples[("ddtree_validation_passed", (h,))] == 0
    assert samples[("ddtree_drift_parts", (h,))] == 2
    info = [labels for name, labels in samples if name == "ddtree_algorithm_info"]
    assert dict(info[0])["algorithm"] == "DDTREE"
    # Drift measured now (action=status) replaces what the last validation found.
    assert _samples(exposition(host, families(state, drift=0)))[("ddtree_drift_parts", (h,))] == 0


def test_a_gate_not_run_again_keeps_its_last_verdict_and_time() -> None:
    first = fold(
        None, _record(tree_outcome="passed", finished=1000.0),
        failed=False, rolled_back=False, drift=0, tree=None,
    )  # fmt: skip
    only_health = {
        "finished": 3000.0,
        "phases": [{"name": "tree", "gates": [{"gate": "health", "outcome": "failed"}]}],
    }
    later = fold(first, only_health, failed=True, rolled_back=False, drift=0, tree=None)
    assert later["gates"]["tree/tree"] == {**first["gates"]["tree/tree"]}
    assert later["gates"]["tree/health"]["passed"] is False
    assert later["gates"]["tree/health"]["timestamp"] == 3000.0
    assert later["counters"] == {"runs": 2, "failures": 1, "rollbacks": 0}
    # Linear DFlash serving: no tree settings are exported.
    text = exposition("h", families({"algo": "DFLASH", "watch": later}))
    assert "ddtree_tree_budget" not in text
