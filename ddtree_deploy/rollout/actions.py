"""What each `action=` does, in order. The only module that knows the order of steps.

Each action returns its own `ActionOutcome` type (rollout/outcomes.py): the exit code and what
its renderer shows. Actions print nothing themselves; they emit events.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path, PurePosixPath

from ddtree_deploy.config.schema import DeployConfig, Output
from ddtree_deploy.errors import ConfigError, DeployError, ExitCode
from ddtree_deploy.events import emit
from ddtree_deploy.hosts.connection import ShellHost
from ddtree_deploy.hosts.factory import connect
from ddtree_deploy.hosts.facts import HostFacts, probe_facts
from ddtree_deploy.hosts.lock import host_lock
from ddtree_deploy.hosts.staging import prepare_staging_venv
from ddtree_deploy.hosts.state import HostStateStore
from ddtree_deploy.kernel_build import KernelsStep
from ddtree_deploy.patching.audit import audit
from ddtree_deploy.patching.port import PortRefused, port_patch_set
from ddtree_deploy.patching.step import PatchStep, locate_site_packages
from ddtree_deploy.rollout.generations import GenerationStore, HostState
from ddtree_deploy.rollout.outcomes import (
    ActionOutcome,
    AuditOutcome,
    DeployedOutcome,
    FactsOutcome,
    GatedOutcome,
    KernelsOutcome,
    PatchStepOutcome,
    PlannedStep,
    PlanOutcome,
    PortOutcome,
    PrepareOutcome,
    RenderOutcome,
    RolledBackOutcome,
    StatusOutcome,
)
from ddtree_deploy.rollout.pipeline import kernels_step, preflight, prepare
from ddtree_deploy.rollout.preflight import PreflightReport, run_preflight
from ddtree_deploy.rollout.revalidate import revalidate
from ddtree_deploy.rollout.rollback import rollback
from ddtree_deploy.rollout.status import host_status, installed_patch_step
from ddtree_deploy.rollout.tune import tune
from ddtree_deploy.rollout.validation_flow import (
    ValidationFailed,
    deploy_validated,
    validate_running,
)
from ddtree_deploy.rollout.watch_install import install_watch, refresh_watch
from ddtree_deploy.rollout.watch_record import metrics_text, note_validation, record_validated
from ddtree_deploy.service.lint import lint_unit
from ddtree_deploy.service.render import render_service
from ddtree_deploy.service.secret import load_api_key
from ddtree_deploy.steps import check_steps
from ddtree_deploy.validate.gates import Decision
from ddtree_deploy.validate.record import ValidationRecord


def _locked(cfg: DeployConfig, host: ShellHost) -> AbstractContextManager[object]:
    """The host's lock, held by every action that changes the host (see hosts/lock.py)."""
    return host_lock(host, PurePosixPath(cfg.host.state_dir), cfg.action)


def gather_facts(cfg: DeployConfig) -> HostFacts:
    """Probe the configured host through its SGLang venv's Python."""
    with connect(cfg.host) as host:
        facts = probe_facts(host, cfg.host.sglang_python)
    emit("facts", **facts.to_dict())
    return facts


def facts_action(cfg: DeployConfig) -> FactsOutcome:
    return FactsOutcome(facts=gather_facts(cfg))


def plan_action(cfg: DeployConfig) -> PlanOutcome:
    """Preflight, then what each step would do; changes nothing (one connection, one probe)."""
    with connect(cfg.host) as host:
        facts = probe_facts(host, cfg.host.sglang_python)
        emit("facts", **facts.to_dict())
        report = run_preflight(cfg, facts)
        emit("preflight", refusals=report.refusals)
        steps = [
            _patch_step_plan(cfg, facts, host),
            _kernels_step_plan(cfg, report, host),
            *_service_step_plans(cfg, host),
        ]
    return PlanOutcome(
        exit_code=ExitCode.PREFLIGHT_REFUSED if report.refusals else ExitCode.OK,
        preflight=report,
        steps=steps,
    )


def build_kernels_action(cfg: DeployConfig) -> KernelsOutcome:
    """Preflight, then build (or reuse), install and smoke-test the kernels on the host."""
    with connect(cfg.host) as host, _locked(cfg, host):
        facts = probe_facts(host, cfg.host.sglang_python)
        report = run_preflight(cfg, facts)
        emit("preflight", refusals=report.refusals)
        report.raise_if_refused()
        result = kernels_step(cfg, report).apply(host)
    return KernelsOutcome(preflight=report, kernels=result)


def render_action(cfg: DeployConfig) -> RenderOutcome:
    """Render the unit and env file for this config and lint them; touches no host."""
    rendered = render_service(cfg, load_api_key(cfg.service))
    lint = lint_unit(rendered, cfg.service.max_exposure)
    emit("service.lint", unit=lint.unit, ok=lint.ok, summary=lint.summary())
    return RenderOutcome(
        exit_code=ExitCode.OK if lint.ok else ExitCode.DRIFTED_FILE, rendered=rendered, lint=lint
    )


def deploy_action(cfg: DeployConfig) -> DeployedOutcome:
    """Run the deploy pipeline on the configured host, through the validation gates."""
    record = ValidationRecord(cfg.host.name, cfg.algo.summary)
    api_key = load_api_key(cfg.service)  # once: the unit and the gates hold the same key
    with connect(cfg.host) as host, _locked(cfg, host):
        generations = _generations(cfg, host)
        with _noted_on_failure(cfg, host, generations):
            outcome = deploy_validated(cfg, host, api_key, record, generations)
        watched = None
        if record.decision is Decision.promote:
            record_validated(cfg, host, outcome.preflight.facts, generations)
            note_validation(cfg, host, record, generations, failed=False)
            watched = install_watch(cfg, host)
        elif record.decision is Decision.unchanged:
            watched = refresh_watch(cfg, host)
        if watched is not None:
            record.notes.append(watched)
    results = [PlannedStep(r.name, r.status, r.detail) for r in outcome.steps]
    where = f"generation {outcome.generation}" if outcome.generation else "no generation"
    return DeployedOutcome(
        preflight=outcome.preflight,
        lint=outcome.lint,
        results=results,
        summary=f"{cfg.host.name}: {outcome.changed} step(s) changed; {where} is current.",
        validation=record,
        now=HostState(generation=outcome.generation, summary=cfg.algo.summary),
    )


def validate_action(cfg: DeployConfig) -> GatedOutcome:
    """Run the gates against the service as it runs now (after a driver or model update, or
    on a host whose server this tool does not start); stores a baseline when it serves DFLASH."""
    if cfg.host.staging:
        raise ConfigError(
            f"action=validate judges a running SGLang server, and {cfg.host.name} is a staging "
            "host where none runs; point it at a host that serves (host.staging=false)."
        )
    record = ValidationRecord(cfg.host.name, cfg.algo.summary)
    api_key = load_api_key(cfg.service)
    with connect(cfg.host) as host, _locked(cfg, host):
        report = preflight(cfg, host)
        generations = _generations(cfg, host)
        with _noted_on_failure(cfg, host, generations):
            validate_running(cfg, host, api_key, record, generations)
        record_validated(cfg, host, report.facts, generations)
        note_validation(cfg, host, record, generations, failed=False)
    return GatedOutcome(summary=record.sentence, validation=record)


def tune_action(cfg: DeployConfig) -> GatedOutcome:
    """Sweep the tune grid on the live service and promote the fastest passing candidate."""
    if not cfg.host.systemd:
        raise ConfigError(
            f"action=tune deploys each candidate as a generation of the service, and "
            f"{cfg.host.name} has no managed service (host.systemd=false); run it on a host "
            "that serves."
        )
    grid = cfg.tune
    record = ValidationRecord(
        cfg.host.name,
        f"tune: DDTREE tree, budgets {list(grid.budgets)} x topks {list(grid.topks)} at "
        f"concurrency {list(grid.concurrency)}",
    )
    api_key = load_api_key(cfg.service)
    with connect(cfg.host) as host, _locked(cfg, host):
        winner = tune(cfg, host, api_key, record, _generations(cfg, host))
    return GatedOutcome(
        summary=f"{cfg.host.name}: promoted {winner.candidate.label} "
        f"(geometric-mean speedup {winner.score or 0:.2f}).",
        validation=record,
    )


def rollback_action(cfg: DeployConfig) -> RolledBackOutcome:
    """Return the configured host to its previous generation (or its linear-DFLASH one)."""
    api_key = load_api_key(cfg.service)
    with connect(cfg.host) as host, _locked(cfg, host):
        outcome = rollback(
            cfg,
            host,
            api_key=api_key,
            to_linear=cfg.rollback.to_linear,
            generations=_generations(cfg, host),
        )
    results = [PlannedStep(r.name, r.status, r.detail) for r in outcome.steps]
    return RolledBackOutcome(
        results=results,
        summary=f"{cfg.host.name}: {outcome.sentence()}",
        now=HostState(generation=outcome.to_generation, summary=outcome.summary),
    )


def status_action(cfg: DeployConfig) -> StatusOutcome:
    """Report the host's generation, algorithm, unit state, patch set, kernels and drift
    (`output=prometheus`: as the metrics of its validations, drift measured now)."""
    with connect(cfg.host) as host:
        generations = _generations(cfg, host)
        status = host_status(cfg, host, generations)
        metrics = None
        if cfg.output is Output.prometheus:
            metrics = metrics_text(cfg, generations, len(status.fingerprint_drift))
    return StatusOutcome(
        exit_code=ExitCode.DRIFT if status.drift else ExitCode.OK, status=status, metrics=metrics
    )


def revalidate_action(cfg: DeployConfig) -> GatedOutcome:
    """The watch timer's run: re-validate the running service, `watch.policy` on a failure."""
    if not cfg.host.systemd:
        raise ConfigError(
            f"action=revalidate watches a service this tool manages, and {cfg.host.name} has "
            "none (host.systemd=false); use action=validate there."
        )
    record = ValidationRecord(cfg.host.name, f"re-validation: {cfg.algo.summary}")
    changed: list[str] = []
    api_key = load_api_key(cfg.service)
    with connect(cfg.host) as host, _locked(cfg, host):
        report = preflight(cfg, host)
        generations = _generations(cfg, host)
        with _noted_on_failure(cfg, host, generations, changed):
            revalidate(cfg, host, api_key, record, report.facts, changed, generations)
        note_validation(cfg, host, record, generations, failed=False)
    return GatedOutcome(summary=record.sentence, validation=record)


def _generations(cfg: DeployConfig, host: ShellHost) -> GenerationStore:
    """The host's record for one action: read from the host once, then kept current by the
    action's own writes (it holds the host's lock, so nothing else writes it)."""
    return GenerationStore(host, PurePosixPath(cfg.host.state_dir))


@contextmanager
def _noted_on_failure(
    cfg: DeployConfig,
    host: ShellHost,
    generations: GenerationStore,
    changed: list[str] | None = None,
) -> Iterator[None]:
    """A validation that fails inside the block still counts in the host's metrics
    (`changed`: the fingerprint parts found drifted by then)."""
    try:
        yield
    except ValidationFailed as failed:
        try:
            note_validation(
                cfg,
                host,
                failed.record,
                generations,
                failed=True,
                drift_parts=len(changed or []),
            )
        except DeployError as err:  # the failure itself is what the operator must read
            emit("watch.metrics_failed", error=str(err))
        raise


def _service_step_plans(cfg: DeployConfig, host: ShellHost) -> list[PlannedStep]:
    if not cfg.host.systemd:
        return [PlannedStep("unit", "staging", "rendered and linted only (host.systemd=false)")]
    # The patch and kernels rows come first, from the probe already made; not checked twice.
    prepared = prepare(cfg, _generations(cfg, host), load_api_key(cfg.service))
    plans = check_steps(prepared.service, host)
    rows = [PlannedStep("lint", "ok" if prepared.lint.ok else "failed", prepared.lint.summary())]
    return rows + [PlannedStep(step.name, plan.status.value, plan.reason) for step, plan in plans]


def prepare_action(cfg: DeployConfig) -> PrepareOutcome:
    """Build the staging host's SGLang venv on the shared layer (staging hosts only)."""
    if not cfg.host.staging:
        raise ConfigError(
            f"action=prepare builds the SGLang venv of a staging host, and {cfg.host.name} is "
            "not one; install SGLang on it as its operators do, then run action=plan."
        )
    with connect(cfg.host) as host, _locked(cfg, host):
        result = prepare_staging_venv(
            host,
            PurePosixPath(cfg.host.sglang_venv),
            base_python=f"python{cfg.abi.python}",
            sglang_version=cfg.sglang.version,
            requirements=cfg.sglang.staging_requirements,
            shared_requirements=cfg.sglang.staging_shared_requirements,
        )
    return PrepareOutcome(staging=result)


def _kernels_step_plan(cfg: DeployConfig, report: PreflightReport, host: ShellHost) -> PlannedStep:
    plan = kernels_step(cfg, report).check(host)
    return PlannedStep(KernelsStep.name, plan.status.value, plan.reason)


def _patch_step_plan(cfg: DeployConfig, facts: HostFacts, host: ShellHost) -> PlannedStep:
    try:
        plan = installed_patch_step(cfg, facts).check(host)
    except DeployError as err:  # no patch set, no SGLang: the preflight rows say why
        return PlannedStep(PatchStep.name, "unknown", str(err))
    return PlannedStep(PatchStep.name, plan.status.value, plan.reason)


def patch_action(cfg: DeployConfig) -> PatchStepOutcome:
    """Apply the release's patch set after preflight (action=patch); idempotent."""
    return _patch_change(cfg, reverting=False)


def unpatch_action(cfg: DeployConfig) -> PatchStepOutcome:
    """Restore RECORD-identical SGLang files after preflight (action=unpatch); idempotent."""
    return _patch_change(cfg, reverting=True)


def audit_action(cfg: DeployConfig) -> AuditOutcome:
    """File states, hunks and every DFLASH gate of the installed SGLang (action=audit)."""
    with connect(cfg.host) as host:
        patch_set = preflight(cfg, host).passed_patch_set()
        site = locate_site_packages(host, cfg.host.sglang_python, patch_set.package)
        state = HostStateStore(host, PurePosixPath(cfg.host.state_dir))
        report = audit(host, site, patch_set, state, sudo=True)
    emit("audit", passed=report.passed)
    return AuditOutcome(exit_code=report.exit_code, audit=report)


def port_action(cfg: DeployConfig) -> PortOutcome:
    """Port the nearest reviewed patch set to sglang.version (action=port); touches no host."""
    if cfg.port.out and Path(cfg.port.out).exists():
        raise PortRefused(
            f"port.out={cfg.port.out} already exists; nothing was written: choose a new folder."
        )
    report = port_patch_set(cfg.sglang.version, root=Path(cfg.port.sets) if cfg.port.sets else None)
    emit(
        "port",
        release=report.release,
        source=report.source,
        failed=len(report.failed),
        unreviewed=len(report.unreviewed),
    )
    return PortOutcome(exit_code=report.exit_code, port=report)


def _patch_change(cfg: DeployConfig, *, reverting: bool) -> PatchStepOutcome:
    step = PatchStep.for_release(
        cfg.sglang.version,
        cfg.host.sglang_python,
        PurePosixPath(cfg.host.state_dir),
        reverting=reverting,
    )
    with connect(cfg.host) as host, _locked(cfg, host):
        preflight(cfg, host)
        result = step.apply(host)
    return PatchStepOutcome(step=PlannedStep(step.name, result.status.value, result.detail))


# What each `action=` runs (cli dispatches on it; a fleet runs it on each host).
HANDLERS: dict[str, Callable[[DeployConfig], ActionOutcome]] = {
    "plan": plan_action,
    "facts": facts_action,
    "prepare": prepare_action,
    "render": render_action,
    "deploy": deploy_action,
    "rollback": rollback_action,
    "status": status_action,
    "build-kernels": build_kernels_action,
    "patch": patch_action,
    "unpatch": unpatch_action,
    "audit": audit_action,
    "validate": validate_action,
    "port": port_action,
    "tune": tune_action,
    "revalidate": revalidate_action,
}
