"""Run one action on one host and write its reports: the one runner that a single-host run
(`cli`) and each host of a fleet (`fleet.driver`, which `cli` hands this runner) go through.

A host of a fleet runs quietly (`show=False`): the same report files in its run folder, nothing
on the console, where the fleet's live table is.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ddtree_deploy.config import DeployConfig, Output
from ddtree_deploy.errors import DeployError
from ddtree_deploy.events import emit, sink_installed
from ddtree_deploy.patching.audit import AuditReport
from ddtree_deploy.patching.port import PortReport, write_candidate
from ddtree_deploy.report import console, render, run_report
from ddtree_deploy.report.audit_report import write_audit_reports
from ddtree_deploy.report.port_report import print_port, write_port_reports
from ddtree_deploy.rollout import actions
from ddtree_deploy.rollout.actions import ActionOutcome, ActionRun
from ddtree_deploy.validate.record import ValidationRecord


def run_action(cfg: DeployConfig, run_dir: Path, *, show: bool) -> ActionRun:
    """Run `cfg.action` on `cfg.host`, write its reports into `run_dir` (a failed validation's
    too) and, with `show`, print its outcome; the error it raised is returned, not raised."""
    try:
        with _tune_progress(cfg, show):
            outcome = actions.HANDLERS[cfg.action](cfg)
    except DeployError as err:
        run = ActionRun(None, err)
        if run.record is not None:  # the report is written for failures too
            _write_report(run_dir, run.record, show)
        emit("run.failed", error=str(err), kind=type(err).__name__)
        return run
    if show:
        _render(cfg, outcome)
    if outcome.audit is not None:
        _write_audit(run_dir, outcome.audit, show)
    if outcome.port is not None:
        _write_port(cfg, run_dir, outcome.port, show)
    if outcome.validation is not None:
        _write_report(run_dir, outcome.validation, show)
    return ActionRun(outcome)


@contextmanager
def _tune_progress(cfg: DeployConfig, show: bool) -> Iterator[None]:
    """A progress bar over the candidates while `action=tune` runs."""
    if cfg.action != "tune" or not show:
        yield
        return
    bar = console.TuneProgress()
    with sink_installed(bar):
        try:
            yield
        finally:
            bar.close()


def _render(cfg: DeployConfig, outcome: ActionOutcome) -> None:
    if cfg.action == "facts" and outcome.facts is not None:
        if cfg.output is Output.json:
            render.facts_json(outcome.facts)
        else:
            render.facts_table(outcome.facts)
    if outcome.preflight is not None:
        render.preflight_table(outcome.preflight)
    if outcome.steps:
        render.plan_table(cfg.host.name, outcome.steps)
    if outcome.staging is not None:
        console.print_line(outcome.staging.reason, style="green")
    if outcome.rendered is not None:
        _render_service(cfg, outcome)
    elif outcome.lint is not None:
        render.lint_result(outcome.lint)
    if outcome.results:
        render.results_table(f"{cfg.action}: {cfg.host.name}", outcome.results)
    if outcome.status is not None:
        _render_status(outcome)
    if outcome.kernels is not None:
        render.kernels_result(cfg.host.name, outcome.kernels)
    if outcome.summary is not None:
        console.print_line(outcome.summary, style="green")


def _render_status(outcome: ActionOutcome) -> None:
    """The status table, or with output=prometheus the metrics text alone (for scripts)."""
    if outcome.metrics is not None:
        console.stdout.out(outcome.metrics, end="", highlight=False)
    elif outcome.status is not None:
        render.status_table(outcome.status)


def _render_service(cfg: DeployConfig, outcome: ActionOutcome) -> None:
    assert outcome.rendered is not None
    if cfg.output is Output.json:  # for scripts (the GPU lab starts exactly this argv)
        render.service_json(outcome.rendered, outcome.lint)
        return
    render.service_files(outcome.rendered)
    if outcome.lint is not None:
        render.lint_result(outcome.lint)


def _write_audit(run_dir: Path, report: AuditReport, show: bool) -> None:
    paths = write_audit_reports(report, run_dir)
    if show:
        render.audit_summary(report)
        console.print_line(f"audit: {paths.json}, {paths.markdown}, {paths.junit}")


def _write_port(cfg: DeployConfig, run_dir: Path, report: PortReport, show: bool) -> None:
    """The candidate (only when every hunk applied), then the reports naming where it is."""
    candidate_dir = None
    if report.candidate is not None:
        dest = Path(cfg.port.out) if cfg.port.out else run_dir / f"candidate-{report.release}"
        candidate_dir = write_candidate(report.candidate, dest)
    paths = write_port_reports(report, run_dir, candidate_dir)
    if show:
        print_port(report, candidate_dir)
        console.print_line(f"port report: {paths.markdown} and {paths.json.name}")


def _write_report(run_dir: Path, record: ValidationRecord, show: bool) -> None:
    data = record.to_dict()
    json_path, md_path = run_report.write_run_report(run_dir, data)
    if show:
        run_report.print_gates(data)
        run_report.print_tune(data)
        console.print_line(f"report: {md_path} and {json_path.name}")
