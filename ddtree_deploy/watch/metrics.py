"""Prometheus metrics of a host's validations, in the text exposition format.

Each validation (a deploy's gates, `action=validate`, a re-validation) folds its record into
`state.json`'s `watch` entry (`fold`): the last verdict of every gate with its time, the last
acceptance, tokens/s, speedup and worst tie gap, when the linear baseline was measured, and
counters that only grow (runs, failures, rollbacks; kept in the state so they persist across
runs, as Prometheus counters must).
`exposition` renders that entry, every sample labelled with the host, for node_exporter's
textfile collector and for `action=status output=prometheus`.

Written by hand rather than through `prometheus_client`: the file holds a dozen samples, and
the product should not need the client library on the control machine for that; the tests parse
it with the library's own parser.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

PREFIX = "ddtree_"
COUNTERS = ("runs", "failures", "rollbacks")


@dataclass(frozen=True)
class Family:
    """One metric family: its samples as (extra labels, value)."""

    name: str
    kind: str  # gauge | counter
    help: str
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)


def fold(
    entry: Mapping[str, Any] | None,
    record: Mapping[str, Any],
    *,
    failed: bool,
    rolled_back: bool,
    drift: int,
    tree: Mapping[str, int] | None,
) -> dict[str, Any]:
    """The `watch` state entry after one validation whose record (`ValidationRecord.to_dict`)
    is `record`: counters advanced, gate verdicts and figures replaced by this run's. `tree`:
    the budget and top-k validated (None for linear DFlash)."""
    out: dict[str, Any] = {
        "counters": dict.fromkeys(COUNTERS, 0),
        "gates": {},
        "figures": {},
        **{k: v for k, v in (entry or {}).items() if k in ("counters", "gates", "figures")},
    }
    counters = {name: int(out["counters"].get(name, 0)) for name in COUNTERS}
    counters["runs"] += 1
    counters["failures"] += int(failed)
    counters["rollbacks"] += int(rolled_back)
    out["counters"] = counters
    when = float(record.get("finished") or time.time())
    gates = dict(out["gates"])
    figures: dict[str, float | None] = {}
    for phase in record.get("phases", []):
        for gate in phase.get("gates", []):
            gates[f"{phase['name']}/{gate['gate']}"] = {
                "phase": phase["name"],
                "gate": gate["gate"],
                "passed": gate["outcome"] == "passed",
                "outcome": gate["outcome"],
                "timestamp": when,
            }
            found = gate.get("figures") or {}
            if "speedup" in found:
                figures["speedup_ratio"] = found["speedup"]
            if found.get("max_gap") is not None:
                figures["tie_gap_max_nats"] = found["max_gap"]
            if gate["gate"] == "baseline" and found.get("measured_at") is not None:
                figures["baseline_timestamp_seconds"] = found["measured_at"]
        summary = phase.get("measurement")
        if summary and phase["name"] != "baseline":
            figures["acceptance_length"] = summary.get("mean_accept_length")
            figures["tokens_per_second"] = summary.get("tokens_per_s")
        elif summary:
            figures["baseline_tokens_per_second"] = summary.get("tokens_per_s")
    out["gates"] = gates
    out["figures"] = {**out["figures"], **figures}
    out["last"] = {"timestamp": when, "passed": not failed, "drift": drift}
    out["tree"] = dict(tree) if tree else None
    return out


def families(state: Mapping[str, Any], *, drift: int | None = None) -> list[Family]:
    """The metric families of a host's `state.json` (`drift`: parts changed now, where the
    caller has just compared; else what the last validation found)."""
    entry: Mapping[str, Any] = state.get("watch") or {}
    last: Mapping[str, Any] = entry.get("last") or {}
    algo = str(state.get("algo") or "none")
    tree = entry.get("tree") or {}
    out = [
        Family("generation", "gauge", "The host's current generation (0: none).",
               [({}, float(state.get("generation") or 0))]),
        Family("algorithm_info", "gauge", "What the host serves (1 on the current one).",
               [({"algorithm": algo, "summary": str(state.get("summary") or "")}, 1.0)]),
    ]  # fmt: skip
    if algo == "DDTREE" and tree:
        out += [
            Family("tree_budget", "gauge", "DDTree's budget (non-root nodes per step).",
                   [({}, float(tree["budget"]))]),
            Family("tree_topk", "gauge", "DDTree's top-k (children per draft position).",
                   [({}, float(tree["topk"]))]),
        ]  # fmt: skip
    gates = list((entry.get("gates") or {}).values())
    out += [
        Family("gate_passed", "gauge", "The gate's last verdict: 1 passed, 0 not.",
               [({"phase": g["phase"], "gate": g["gate"]}, float(g["passed"])) for g in gates]),
        Family("gate_timestamp_seconds", "gauge", "When the gate last ran (Unix time).",
               [({"phase": g["phase"], "gate": g["gate"]}, float(g["timestamp"])) for g in gates]),
    ]  # fmt: skip
    if last:
        out += [
            Family("validation_passed", "gauge", "1 when the last validation passed.",
                   [({}, float(bool(last.get("passed"))))]),
            Family("validation_timestamp_seconds", "gauge", "When the last validation ended.",
                   [({}, float(last["timestamp"]))]),
        ]  # fmt: skip
    helps = {
        "acceptance_length": "Tokens accepted per verify step in the last measurement.",
        "tokens_per_second": "Tokens/s of the last measurement of the deployed algorithm.",
        "baseline_tokens_per_second": "Tokens/s of the last linear-DFlash baseline.",
        "baseline_timestamp_seconds": "When the baseline judged against was measured.",
        "speedup_ratio": "The last tree measurement's tokens/s over the baseline's.",
        "tie_gap_max_nats": "The worst gap (nats) of an emitted token below the target's top-1.",
    }
    for name, value in (entry.get("figures") or {}).items():
        if value is not None and name in helps:
            out.append(Family(name, "gauge", helps[name], [({}, float(value))]))
    drifted = drift if drift is not None else last.get("drift")
    if drifted is not None:
        out.append(Family("drift_parts", "gauge",
                          "Fingerprint parts changed since the last passed validation.",
                          [({}, float(drifted))]))  # fmt: skip
    counters = entry.get("counters") or {}
    for name, what in (("runs", "Validations run"), ("failures", "Validations failed"),
                       ("rollbacks", "Rollbacks after a failed validation")):  # fmt: skip
        out.append(Family(f"{name}", "counter", f"{what}.", [({}, float(counters.get(name, 0)))]))
    return out


def exposition(host: str, fams: Iterable[Family]) -> str:
    """The text format (version 0.0.4): HELP, TYPE, then the samples, each labelled `host`."""
    lines = []
    for fam in fams:
        name = PREFIX + fam.name
        lines += [f"# HELP {name} {_escape_help(fam.help)}", f"# TYPE {name} {fam.kind}"]
        sample = f"{name}_total" if fam.kind == "counter" else name
        for labels, value in fam.samples:
            pairs = ",".join(
                f'{k}="{_escape_label(v)}"' for k, v in {"host": host, **labels}.items()
            )
            lines.append(f"{sample}{{{pairs}}} {_number(value)}")
    return "\n".join(lines) + "\n"


def _escape_label(value: str) -> str:
    """A label value as the format wants it: backslash, double quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))
