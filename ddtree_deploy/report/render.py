"""Console renderings of action outcomes (facts, preflight verdicts, plans)."""

from __future__ import annotations

import json

from ddtree_deploy.hosts.facts import HostFacts
from ddtree_deploy.report import console
from ddtree_deploy.rollout.actions import PlannedStep
from ddtree_deploy.rollout.preflight import PreflightReport, Verdict

_VERDICT_STYLE = {Verdict.ok: "green", Verdict.mismatch: "red", Verdict.staging: "yellow"}


def facts_table(facts: HostFacts) -> None:
    gpus = ", ".join(f"{g.index}: {g.name} ({g.arch}, {g.memory_mib} MiB)" for g in facts.gpus)
    rows = [
        ("python", f"{facts.python_version or 'missing'} ({facts.python_path})"),
        ("torch", facts.torch_version or facts.torch_error or "missing"),
        ("torch CUDA", facts.torch_cuda or "none"),
        ("cxx11 ABI", str(facts.cxx11_abi)),
        ("sglang", f"{facts.sglang_version or 'missing'} ({facts.sglang_path or '-'})"),
        ("gpus", gpus or "none"),
        ("driver", facts.driver_version or "none"),
        ("driver CUDA", facts.cuda_driver_version or "none"),
        ("systemd PID 1", str(facts.systemd_pid1)),
    ]
    console.print_table(f"facts: {facts.host}", ("fact", "value"), rows)


def facts_json(facts: HostFacts) -> None:
    console.stdout.print_json(json.dumps(facts.to_dict()))


def preflight_table(report: PreflightReport) -> None:
    rows = [(c.name, c.expected, c.actual, c.verdict.value) for c in report.checks]
    console.print_table(
        f"preflight: {report.host}", ("check", "expected", "actual", "verdict"), rows
    )
    for check in report.checks:
        if check.sentence:
            style = _VERDICT_STYLE[check.verdict]
            console.print_line(f"{check.name}: {check.sentence}", style=style)


def plan_table(host: str, steps: list[PlannedStep]) -> None:
    rows = [(s.name, s.status, s.detail) for s in steps]
    console.print_table(f"plan: {host}", ("step", "status", "what it would do"), rows)
