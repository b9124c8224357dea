"""The deploy pipeline of one host: preflight -> patch -> kernels -> unit -> restart -> gates.

Only this module knows the order. A run first checks every step; when all are `ok` and no
earlier run was interrupted, it changes nothing (idempotence). Otherwise it records a new
generation, applies the steps that differ (a step that owes the service a restart persists
`pending_restart` before it changes anything), runs the validation gates and commits. A failure
after the host changed rolls back to the previous generation (`rollout.rollback_on_failure`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from ddtree_deploy.config.schema import DeployConfig
from ddtree_deploy.errors import DeployError
from ddtree_deploy.events import emit
from ddtree_deploy.hosts.connection import ShellHost
from ddtree_deploy.hosts.facts import probe_facts
from ddtree_deploy.hosts.state import HostStateStore
from ddtree_deploy.kernel_build import KernelsStep
from ddtree_deploy.patching.step import PatchStep
from ddtree_deploy.rollout.apply import apply_staged, apply_steps
from ddtree_deploy.rollout.generations import GenerationStore
from ddtree_deploy.rollout.killpoints import boundary
from ddtree_deploy.rollout.preflight import PreflightReport, run_preflight
from ddtree_deploy.rollout.rollback import rollback
from ddtree_deploy.rollout.service_steps import service_files, service_steps
from ddtree_deploy.service.lint import LintReport, lint_unit
from ddtree_deploy.service.render import RenderedService, render_service
from ddtree_deploy.service.secret import Secret
from ddtree_deploy.steps import PlanStatus, Step, StepReport, check_steps


@dataclass(frozen=True)
class GateContext:
    """What a validation gate gets: the host, its new generation and what was installed."""

    cfg: DeployConfig
    host: ShellHost
    generation: int
    rendered: RenderedService
    api_key: Secret | None


Gate = Callable[[GateContext], None]  # raises a DeployError when the deployment must not stay


@dataclass(frozen=True)
class Prepared:
    """The rendered, linted service of one config and the steps that install it."""

    rendered: RenderedService
    lint: LintReport
    api_key: Secret | None
    software: tuple[Step, ...]  # patch and kernels: a staging host gets these too
    service: tuple[Step, ...]  # the unit's files and what makes systemd run them

    @property
    def steps(self) -> tuple[Step, ...]:
        return (*self.software, *self.service)

    def mask(self, text: str) -> str:
        return self.api_key.mask(text) if self.api_key else text


@dataclass(frozen=True)
class DeployOutcome:
    host: str
    generation: int | None  # current after the run
    changed: int  # steps that changed the host
    steps: tuple[StepReport, ...]
    preflight: PreflightReport
    lint: LintReport


def software_steps(
    cfg: DeployConfig, report: PreflightReport, store: HostStateStore | None = None
) -> tuple[Step, ...]:
    """The patch and kernels steps for the set preflight found for the installed release.

    The kernels step is held to the `ddtree_kernels.sglang` API that set calls, so its smoke
    test refuses kernels of another API before they install; SGLang imports both only at
    start, so a change owes a restart. `store`: the run's host state, when it has read it (see
    `KernelsStep.store`)."""
    state_dir = PurePosixPath(cfg.host.state_dir)
    patch = PatchStep(report.passed_patch_set(), cfg.host.sglang_python, state_dir)
    return patch, kernels_step(cfg, report, store)


def kernels_step(
    cfg: DeployConfig, report: PreflightReport, store: HostStateStore | None = None
) -> KernelsStep:
    """The kernels step, held to the module API of the set preflight found (none when it
    found none: preflight refuses that host)."""
    module_api = report.patch_set.module_api() if report.patch_set else None
    return KernelsStep.from_config(cfg, module_api=module_api, store=store, facts=report.facts)


def prepare(
    cfg: DeployConfig,
    generations: GenerationStore,
    api_key: Secret | None,
    report: PreflightReport | None = None,
) -> Prepared:
    """Render and lint the service for `cfg` and build the steps that install it on the host
    of `generations` (the run's record of it).

    `report`: the run's preflight, which the patch and kernels steps come from; without one
    (action=plan's service rows) only the service steps are built."""
    rendered = render_service(cfg, api_key)
    lint = lint_unit(rendered, cfg.service.max_exposure)
    emit("service.lint", unit=lint.unit, ok=lint.ok, summary=lint.summary())
    mask = api_key.mask if api_key else _identity
    software = software_steps(cfg, report, generations.store) if report else ()
    service = service_steps(cfg, service_files(rendered), generations, mask)
    return Prepared(rendered, lint, api_key, software, tuple(service))


def preflight(cfg: DeployConfig, host: ShellHost) -> PreflightReport:
    """Probe the host and compare; raises `PreflightRefused` before anything is touched."""
    facts = probe_facts(host, cfg.host.sglang_python)
    report = run_preflight(cfg, facts)
    emit("preflight", refusals=report.refusals)
    report.raise_if_refused()
    return report


def deploy(
    cfg: DeployConfig,
    host: ShellHost,
    *,
    api_key: Secret | None,
    gates: Sequence[Gate] = (),
    replace_top: bool = False,
    generations: GenerationStore | None = None,
) -> DeployOutcome:
    """Bring `host` to what `cfg` says; zero changed steps when it already is.

    `api_key`: the key the calling action read once (`load_api_key`), so the unit and the
    gates of one run never hold two different keys.
    `gates`: run after the steps, before the commit; one that raises rolls the deploy back. A
    bare call has none: `action=deploy` goes through `validation_flow.deploy_validated`, which
    passes each phase's (polled health gates, then shadow-linear or tree).
    `generations`: the host's record as the calling action holds it (read once per action);
    a call of its own reads it afresh.

    `replace_top`: the new generation takes the place of the lineage's top on commit instead
    of stacking on it (`action=tune` keeps one judged candidate above shadow-linear, so a
    rollback still walks tree -> shadow -> linear). Raises `DeployError`s: preflight refusals
    and lint failures before the host changes; a failure after it changed rolls back first
    (unless `rollout.rollback_on_failure=false`), to the top it would have replaced.
    """
    report = preflight(cfg, host)
    boundary("preflight")
    generations = generations or GenerationStore(host, PurePosixPath(cfg.host.state_dir))
    prepared = prepare(cfg, generations, api_key, report)
    prepared.lint.raise_if_failed()
    if not cfg.host.systemd:  # staging: SGLang is patched and kernels installed for real
        staged = apply_staged(prepared.software, host, generations, "deploy")
        staged.append(StepReport("unit", "staging", "rendered and linted; host.systemd=false"))
        changed = sum(r.status == "changed" for r in staged)
        return DeployOutcome(cfg.host.name, None, changed, tuple(staged), report, prepared.lint)
    plans = check_steps(prepared.steps, host)
    state = generations.state()
    # Not `state.serves(cfg)`: what decides here is the host's files, not its record of them.
    if state.in_progress is None and all(p.status is PlanStatus.OK for _, p in plans):
        emit("deploy.unchanged", generation=state.generation)
        rows = tuple(StepReport(s.name, "ok", p.reason) for s, p in plans)
        return DeployOutcome(cfg.host.name, state.generation, 0, rows, report, prepared.lint)
    number = generations.begin(
        "deploy",
        service_files(prepared.rendered),
        algo=cfg.algo.name.value,
        summary=cfg.algo.summary,
        config_hash=cfg.serving_hash,
    )
    emit("deploy.generation", generation=number)
    boundary("begin")
    try:
        rows_applied = apply_steps(prepared.steps, host, generations, number)
        context = GateContext(cfg, host, number, prepared.rendered, api_key)
        for gate in gates:
            gate(context)
        boundary("commit")
        below = [g for g in state.lineage if g != number]
        if replace_top and below:
            below = below[:-1]
        lineage = [*below, number]
        generations.commit(number, lineage)
    except DeployError as err:
        if not cfg.rollout.rollback_on_failure:
            raise
        raise _rolled_back(cfg, host, api_key, generations, err) from err
    emit("deploy.committed", generation=number)
    changed = sum(r.status == "changed" for r in rows_applied)
    return DeployOutcome(cfg.host.name, number, changed, tuple(rows_applied), report, prepared.lint)


class DeployRolledBack(DeployError):
    """A deploy failed after it changed the host and was rolled back."""


def _rolled_back(
    cfg: DeployConfig,
    host: ShellHost,
    api_key: Secret | None,
    generations: GenerationStore,
    err: DeployError,
) -> DeployError:
    emit("deploy.failed", error=str(err), kind=type(err).__name__)
    try:
        outcome = rollback(cfg, host, api_key=api_key, generations=generations)
    except DeployError as rollback_err:
        failed = DeployRolledBack(
            f"{err} Rolling back failed too: {rollback_err}",
            hint="\n".join(h for h in (err.hint, rollback_err.hint) if h) or None,
        )
        failed.exit_code = err.exit_code
        return failed
    rolled = DeployRolledBack(
        f"{err} Rolled back to generation {outcome.to_generation} ({outcome.summary}), "
        f"which is {outcome.unit_state}.",
        hint=err.hint,
    )
    rolled.exit_code = err.exit_code
    return rolled


def _identity(text: str) -> str:
    return text
