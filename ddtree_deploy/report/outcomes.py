"""Each action outcome's own renderer: its console output (with `show`) and its report files.

`present` dispatches on the outcome's type (`rollout.outcomes`), one function per type; a type
without one is a bug that `tests/report/test_outcomes.py` catches before a user does.
"""

from __future__ import annotations

from functools import singledispatch
from pathlib import Path

from ddtree_deploy.config import DeployConfig, Output
from ddtree_deploy.patching.port import write_candidate
from ddtree_deploy.report import console, render, run_report
from ddtree_deploy.report.audit_report import write_audit_reports
from ddtree_deploy.report.port_report import print_port, write_port_reports
from ddtree_deploy.rollout.outcomes import (
    ActionOutcome,
    AuditOutcome,
    DeployedOutcome,
    FactsOutcome,
    GatedOutcome,
    KernelsOutcome,
    PatchStepOutcome,
    PlanOutcome,
    PortOutcome,
    PrepareOutcome,
    RenderOutcome,
    RolledBackOutcome,
    StatusOutcome,
)
from ddtree_deploy.validate.record import ValidationRecord


@singledispatch
def present(outcome: ActionOutcome, cfg: DeployConfig, run_dir: Path, show: bool) -> None:
    """Write `outcome`'s report files into `run_dir` and, with `show`, print it."""
    raise TypeError(f"no renderer for {type(outcome).__name__}; register one in report.outcomes")


@present.register
def _facts(outcome: FactsOutcome, cfg: DeployConfig, run_dir: Path, show: bool) -> None:
    if not show:
        return
    if cfg.output is Output.json:
        render.facts_json(outcome.facts)
    else:
        render.facts_table(outcome.facts)


@present.register
def _plan(outcome: PlanOutcome, cfg: DeployConfig, run_dir: Path, show: bool) -> None:
    if show:
        render.plan(cfg.host.name, outcome)


@present.register
def _kernels(outcome: KernelsOutcome, cfg: DeployConfig, run_dir: Path, show: bool) -> None:
    if show:
        render.preflight_table(outcome.preflight)
        render.kernels_result(cfg.host.name, outcome.kernels)


@present.register
def _render(outcome: RenderOutcome, cfg: DeployConfig, run_dir: Path, show: bool) -> None:
    if not show:
        return
    if cfg.output is Output.json:  # for scripts (the GPU lab starts exactly this argv)
        render.service_json(outcome.rendered, outcome.lint)
        return
    render.service_files(outcome.rendered)
    render.lint_result(outcome.lint)


@present.register
def _deployed(outcome: DeployedOutcome, cfg: DeployConfig, run_dir: Path, show: bool) -> None:
    if show:
        render.preflight_table(outcome.preflight)
        render.lint_result(outcome.lint)
        render.results_table(f"{cfg.action}: {cfg.host.name}", outcome.results)
        console.print_line(outcome.summary, style="green")
    write_validation(run_dir, outcome.validation, show)


@present.register
def _gated(outcome: GatedOutcome, cfg: DeployConfig, run_dir: Path, show: bool) -> None:
    if show:
        console.print_line(outcome.summary, style="green")
    write_validation(run_dir, outcome.validation, show)


@present.register
def _rolled_back(outcome: RolledBackOutcome, cfg: DeployConfig, run_dir: Path, show: bool) -> None:
    if show:
        render.results_table(f"{cfg.action}: {cfg.host.name}", outcome.results)
        console.print_line(outcome.summary, style="green")


@present.register
def _status(outcome: StatusOutcome, cfg: DeployConfig, run_dir: Path, show: bool) -> None:
    """The status table, or with output=prometheus the metrics text alone (for scripts)."""
    if not show:
        return
    if outcome.metrics is not None:
        console.stdout.out(outcome.metrics, end="", highlight=False)
    else:
        render.status_table(outcome.status)


@present.register
def _prepare(outcome: PrepareOutcome, cfg: DeployConfig, run_dir: Path, show: bool) -> None:
    if show:
        console.print_line(outcome.staging.reason, style="green")


@present.register
def _patch_step(outcome: PatchStepOutcome, cfg: DeployConfig, run_dir: Path, show: bool) -> None:
    if show:
        render.results_table(f"{cfg.action}: {cfg.host.name}", [outcome.step])


@present.register
def _audit(outcome: AuditOutcome, cfg: DeployConfig, run_dir: Path, show: bool) -> None:
    paths = write_audit_reports(outcome.audit, run_dir)
    if show:
        render.audit_summary(outcome.audit)
        console.print_line(f"audit: {paths.json}, {paths.markdown}, {paths.junit}")


@present.register
def _port(outcome: PortOutcome, cfg: DeployConfig, run_dir: Path, show: bool) -> None:
    """The candidate (only when every hunk applied), then the reports naming where it is."""
    report = outcome.port
    candidate_dir = None
    if report.candidate is not None:
        dest = Path(cfg.port.out) if cfg.port.out else run_dir / f"candidate-{report.release}"
        candidate_dir = write_candidate(report.candidate, dest)
    paths = write_port_reports(report, run_dir, candidate_dir)
    if show:
        print_port(report, candidate_dir)
        console.print_line(f"port report: {paths.markdown} and {paths.json.name}")


def write_validation(run_dir: Path, record: ValidationRecord, show: bool) -> None:
    """The gates' record as the run's report (a failed validation's too), printed with `show`."""
    data = record.to_dict()
    json_path, md_path = run_report.write_run_report(run_dir, data)
    if show:
        run_report.print_gates(data)
        run_report.print_tune(data)
        console.print_line(f"report: {md_path} and {json_path.name}")
