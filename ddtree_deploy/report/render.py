"""Console renderings of action outcomes (facts, preflight verdicts, plans)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ddtree_deploy.hosts.facts import HostFacts
from ddtree_deploy.kernel_build import KernelsResult
from ddtree_deploy.patching.audit import AuditReport
from ddtree_deploy.patching.engine import FilePlan
from ddtree_deploy.report import console
from ddtree_deploy.rollout.outcomes import PlannedStep, PlanOutcome
from ddtree_deploy.rollout.preflight import PreflightReport, Verdict
from ddtree_deploy.rollout.status import HostStatus
from ddtree_deploy.service.lint import LintReport
from ddtree_deploy.service.render import RenderedService

# Fleet verdicts (ddtree_deploy.fleet.strategy.Verdict values): as asked, and failures.
_AS_ASKED = frozenset({"changed", "ok", "done"})
_FLEET_FAILURES = frozenset({"failed", "refused", "unreachable"})
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


def plan(host: str, outcome: PlanOutcome) -> None:
    """A host's plan (alone or one of a fleet's): the preflight, then what each step would do."""
    preflight_table(outcome.preflight)
    rows = [(s.name, s.status, s.detail) for s in outcome.steps]
    console.print_table(f"plan: {host}", ("step", "status", "what it would do"), rows)


def service_json(rendered: RenderedService, lint: LintReport) -> None:
    """`action=render output=json`: the files, the argv and the environment, secret masked."""
    data: dict[str, object] = rendered.to_dict()
    data["lint"] = {"ok": lint.ok, "summary": lint.summary()}
    console.stdout.print_json(json.dumps(data))


def service_files(rendered: RenderedService) -> None:
    """The unit and the env file as rendered; the env file with its secret masked."""
    console.print_line(f"# {rendered.unit_path}", style="bold")
    # soft_wrap: a unit line must stay one line, whatever the terminal width.
    console.stdout.print(rendered.unit_text.rstrip(), markup=False, soft_wrap=True)
    console.print_line(f"# {rendered.env_path} (mode 0600)", style="bold")
    console.stdout.print(rendered.env_masked.rstrip(), markup=False, soft_wrap=True)


def lint_result(lint: LintReport) -> None:
    console.print_line(f"lint {lint.unit}: {lint.summary()}", style="green" if lint.ok else "red")
    for finding in lint.verify_findings:
        console.print_line(f"  {finding}", style="red")


def results_table(title: str, results: list[PlannedStep]) -> None:
    rows = [(s.name, s.status, s.detail) for s in results]
    console.print_table(title, ("step", "result", "detail"), rows)


def status_table(status: HostStatus) -> None:
    generation = "none" if status.generation is None else str(status.generation)
    rows = [
        ("generation", generation),
        ("lineage", " -> ".join(str(g) for g in status.lineage) or "-"),
        ("algorithm", f"{status.algo} ({status.summary})"),
        ("unit", f"{status.unit}: {status.unit_state}, {status.enabled}"),
        (
            "interrupted run",
            "none" if status.interrupted is None else status.interrupted.describe(),
        ),
        *((("next run", status.interrupted.next_run),) if status.interrupted else ()),
        ("pending restart", ", ".join(status.pending_restart) or "no"),
        ("patch set", status.patch_set),
        *((f"  {state}", path) for path, state in status.patch_files),
        ("kernels", status.kernels),
        ("drift", "; ".join(status.drift) or "none"),
        ("last validation", status.last_verdict or "none recorded"),
        ("acceptance", _acceptance(status)),
        ("lock", f"held by {status.locked_by}" if status.locked_by else "free"),
    ]
    console.print_table(f"status: {status.host}", ("what", "value"), rows)
    if not status.service_managed:
        console.print_line(
            f"No service is managed on {status.host} (host.systemd=false): deploys patch SGLang "
            "and install the kernels there, and only render and lint the unit."
        )


def kernels_result(host: str, result: KernelsResult) -> None:
    """What action=build-kernels did: the key, cache hit or miss, the path ops take, the smoke."""
    source = {"installed": "already installed", "cache": "hit", "build": "miss (built on host)"}
    path = result.key.variant + (" (staging: no GPU)" if result.staging else "")
    rows = [
        ("key", result.key.slug),
        ("cache", source[result.source.value]),
        ("path", path),
        ("smoke", result.smoke.summary),
        ("wheel sha256", result.wheel_sha256),
        ("result", result.status.value),
    ]
    console.print_table(f"kernels: {host}", ("item", "value"), rows)


def audit_summary(report: AuditReport) -> None:
    """File states, then the gate count and every unreviewed site (the audit's findings)."""
    rows = [(str(f.path), f.state.value, _offsets(f)) for f in report.plan.files]
    console.print_table(
        f"audit: {report.plan.host} (patch set {report.plan.patch_set})",
        ("file", "state", "hunk offsets"),
        rows,
    )
    unreviewed = report.unreviewed
    style = "green" if report.passed else "red"
    console.print_line(
        f"{len(report.gates)} DFLASH gate sites in {report.modules_scanned} modules, "
        f"{len(unreviewed)} unreviewed; {'passed' if report.passed else 'failed'}.",
        style=style,
    )
    for finding in unreviewed:
        site = finding.site
        console.print_line(f"unreviewed: {site.file}:{site.line} ({site.function}) {site.text}")
    console.print_line(
        f"ddtree_kernels.sglang: {report.module_api.sentence}",
        style=None if report.module_api.matches else "yellow",
    )


def _offsets(plan: FilePlan) -> str:
    """`5 hunks` when all apply where stated, else the moved ones (`0004#2+3`)."""
    if not plan.hunks:
        return "-"
    moved = [f"{h.patch[:4]}#{h.index}{h.offset:+d}" for h in plan.hunks if h.offset]
    count = f"{len(plan.hunks)} hunk" + ("s" if len(plan.hunks) != 1 else "")
    return count + (f", moved {' '.join(moved)}" if moved else "")


def fleet_recap(recap: dict[str, Any]) -> None:
    """The fleet's recap (`FleetResult.to_dict()`): one row per host, then one line for each
    host that did not end as asked (the full sentences are also in recap.md)."""
    rows = []
    for host in recap["hosts"]:
        tokens, speedup = host["tokens_per_s"], host["speedup"]
        rows.append(
            (
                host["host"],
                str(host["batch"] or "-"),
                host["verdict"],
                "-" if host["generation"] is None else str(host["generation"]),
                host["algo"] or "-",
                "-" if tokens is None else f"{tokens:.1f}",
                "-" if speedup is None else f"{speedup:.2f}x",
                f"{host['wall_s']:.1f}s",
            )
        )
    columns = ("host", "batch", "result", "gen", "algorithm", "tok/s", "speedup", "time")
    console.print_table(f"fleet {recap['fleet']}: action={recap['action']}", columns, rows)
    for host in recap["hosts"]:
        if host["verdict"] not in _AS_ASKED:
            style = "red" if host["verdict"] in _FLEET_FAILURES else "yellow"
            console.print_line(f"{host['host']}: {host['verdict']}: {host['detail']}", style=style)
    if recap["resumed_from"]:
        console.print_line(f"continued the rollout begun in {recap['resumed_from']}")
    if recap["halted"]:
        console.print_line(recap["halted"], style="red")


def _acceptance(status: HostStatus) -> str:
    return "-" if status.acceptance is None else f"{status.acceptance:.2f}"


def fleet_status_table(fleet: str, rows: Sequence[tuple[str, HostStatus | None, str, str]]) -> None:
    """`action=status` over a fleet in one table; a line below says why a host has none."""
    cells = []
    for name, status, verdict, _ in rows:
        if status is None:
            cells.append((name, "-", "-", verdict, "-", "-", "-", "-", "-", "-"))
            continue
        cells.append(
            (
                name,
                "none" if status.generation is None else str(status.generation),
                f"{status.algo} ({status.summary})",
                f"{status.unit_state}, {status.enabled}",
                status.patch_set,
                status.kernels,
                status.last_verdict or "-",
                _acceptance(status),
                "; ".join(status.drift) or "none",
                f"held by {status.locked_by}" if status.locked_by else "free",
            )
        )
    columns = (
        "host", "gen", "algorithm", "unit", "patch set", "kernels",
        "last validation", "accept", "drift", "lock",
    )  # fmt: skip
    console.print_table(f"status: fleet {fleet}", columns, cells)
    for name, status, _, detail in rows:
        if status is None:
            console.print_line(f"{name}: {detail}", style="red")
