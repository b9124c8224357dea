"""A validated deploy: baseline on linear DFlash, then shadow-linear, then tree, then promote.

The order (ARCHITECTURE "Validation gates"): the running linear-DFlash service answers the
prompt set (the baseline, stored in its generation); the pipeline switches to DDTREE
shadow_linear and runs the polled gates plus the shadow-linear gate; then to tree mode with the
polled gates plus the tree gate; then the tree generation is promoted. `algo=dflash` runs the
polled gates and records a fresh baseline; `algo=ddtree_shadow` stops after shadow-linear.

Any failed gate raises inside the pipeline, which rolls back; this flow then keeps rolling back
until linear DFlash serves again and proves it with the same polled gates. An inconclusive gate
does what `validation.on_inconclusive` says. A run killed mid-validation leaves its generation
in progress; the next run reuses the stored baseline and finishes it (or rolls it back).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from ddtree_deploy.config.schema import Algo, DeployConfig, TreeMode
from ddtree_deploy.errors import DeployError, ExitCode
from ddtree_deploy.events import emit
from ddtree_deploy.hosts.connection import ShellHost
from ddtree_deploy.rollout.generations import VALIDATION_FILE, GenerationStore, generation_folder
from ddtree_deploy.rollout.killpoints import boundary
from ddtree_deploy.rollout.pipeline import DeployOutcome, GateContext, deploy
from ddtree_deploy.rollout.rollback import rollback
from ddtree_deploy.service.render import render_service
from ddtree_deploy.service.secret import Secret
from ddtree_deploy.validate.errors import ValidationError
from ddtree_deploy.validate.gates import (
    Decision,
    GateResult,
    Outcome,
    decide,
    deciding_gate,
    first_divergence,
    judge_shadow,
    judge_tree,
)
from ddtree_deploy.validate.measure import Measurement, measure, score_answers
from ddtree_deploy.validate.probes import Expected, ServiceProbe
from ddtree_deploy.validate.record import ValidationRecord
from ddtree_deploy.validate.scoring import TieRule


class GateFailed(ValidationError):
    """A gate failed (or was inconclusive under on_inconclusive=rollback) inside the pipeline."""


class ValidationFailed(ValidationError):
    """The validated deploy did not promote; carries the record for the run report."""

    def __init__(self, message: str, record: ValidationRecord, *, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.record = record


class ValidationPaused(ValidationFailed):
    """An inconclusive gate under on_inconclusive=pause: the generation serves, unpromoted."""

    exit_code = ExitCode.VALIDATION_PAUSED


Judge = Callable[[ServiceProbe, GateContext], tuple[list[GateResult], Measurement | None]]


@dataclass(frozen=True)
class StoredBaseline:
    """A linear-DFlash baseline kept in a generation's folder, and when it was measured."""

    generation: int
    measurement: Measurement
    # Unix time; a baseline stored before the time was kept gets its generation's creation
    # (it was measured no earlier); None where neither is known.
    measured_at: float | None

    def age_h(self, now: float) -> float | None:
        """Hours since it was measured; None where that is not known."""
        return None if self.measured_at is None else (now - self.measured_at) / 3600


def deploy_validated(
    cfg: DeployConfig,
    host: ShellHost,
    api_key: Secret | None,
    record: ValidationRecord,
    generations: GenerationStore,
) -> DeployOutcome:
    """Deploy `cfg` through the gates its algorithm needs; raise `ValidationFailed` if not promoted.

    Host effects: the pipeline's (generations, unit, restarts), a `baseline-<hash>.json` in the
    linear-DFlash generation, a `validation.json` in the promoted one. Idempotent: a host that
    already runs `cfg` is left alone (no gates, decision `unchanged`). `generations`: the host's
    record as the action holds it; `api_key`: the key it read once.
    """
    state = generations.state()
    if state.serves(cfg):
        outcome = deploy(cfg, host, api_key=api_key, gates=[], generations=generations)
        record.decide(Decision.unchanged, f"{cfg.host.name} already runs {cfg.algo.summary}.")
        return outcome
    if state.in_progress is not None:
        record.notes.append(
            f"Generation {state.in_progress.generation} was left in progress by a killed "
            "run; this run finishes it through the gates (or rolls it back)."
        )
    if not cfg.host.systemd:
        outcome = deploy(cfg, host, api_key=api_key, gates=[], generations=generations)
        record.decide(
            Decision.staging, "host.systemd=false: the unit was rendered and linted, not run."
        )
        return outcome
    if cfg.algo.name is Algo.DFLASH:
        outcome = run_phase(cfg, host, api_key, record, "linear", _record_baseline, generations)
        record.decide(Decision.promote, f"Linear DFlash serves on {cfg.host.name}; baseline kept.")
        return outcome
    baseline = measure_baseline(cfg, host, api_key, generations, record)
    shadow_cfg = variant(cfg, TreeMode.shadow_linear)
    outcome = run_phase(
        shadow_cfg, host, api_key, record, "shadow_linear", shadow_judge(baseline), generations
    )
    if cfg.algo.mode is TreeMode.tree:
        outcome = run_phase(cfg, host, api_key, record, "tree", tree_judge(baseline), generations)
    promote(cfg, host, generations, outcome.generation, record)
    return outcome


def variant(cfg: DeployConfig, mode: TreeMode) -> DeployConfig:
    """`cfg` in DDTREE `mode`; shadow_linear verifies the linear chain (top-k 1, the block)."""
    algo = cfg.algo
    if mode is TreeMode.shadow_linear:
        algo = dataclasses.replace(algo, mode=mode, topk=1, budget=algo.block_size - 1)
    return dataclasses.replace(cfg, algo=algo)


def _linear(cfg: DeployConfig) -> DeployConfig:
    return dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo, name=Algo.DFLASH))


# -- one phase: deploy a configuration through its gates -----------------------------------------


def run_phase(
    cfg: DeployConfig,
    host: ShellHost,
    api_key: Secret | None,
    record: ValidationRecord,
    name: str,
    judge: Judge,
    generations: GenerationStore,
) -> DeployOutcome:
    """Deploy `cfg` with the polled gates plus `judge`; roll back and prove it on failure."""
    emit("validate.phase", phase=name, algo=cfg.algo.summary)
    seen: list[GateResult] = []
    paused: list[GateResult] = []

    def gate(ctx: GateContext) -> None:
        probe = ServiceProbe(ctx.cfg, ctx.host, ctx.api_key)
        results = probe.first_gates(Expected.of(ctx.cfg))
        measurement = None
        if all(r.outcome is Outcome.passed for r in results):
            boundary(f"validate.{name}")
            extra, measurement = judge(probe, ctx)
            results += extra
        seen.extend(results)
        record_gates(record, name, ctx.cfg.algo.summary, ctx.generation, results, measurement)
        decision = decide(results, cfg.validation.on_inconclusive)
        stopper = deciding_gate(results)
        if decision is Decision.rollback and stopper is not None:
            raise GateFailed(
                f"Gate {stopper.gate} {stopper.outcome.value} on {ctx.host.name} "
                f"({ctx.cfg.algo.summary}): {stopper.sentence}"
            )
        if decision is Decision.pause and stopper is not None:
            paused.append(stopper)

    try:
        outcome = deploy(cfg, host, api_key=api_key, gates=[gate], generations=generations)
    except DeployError as err:
        cause = err.__cause__ if isinstance(err.__cause__, DeployError) else err
        reason = str(cause).split("\n", 1)[0]
        if not seen:  # the unit never came up, so no gate ran: that is the unit gate failing
            record.add(
                name, cfg.algo.summary, None, [GateResult("unit_active", Outcome.failed, reason)]
            )
            reason = f"Gate unit_active failed on {host.name} ({cfg.algo.summary}): {reason}"
        raise roll_back_after_failure(cfg, host, api_key, record, reason, err, generations) from err
    if paused:
        stopper = paused[0]
        sentence = (
            f"Gate {stopper.gate} was inconclusive on {cfg.host.name} ({stopper.sentence}); "
            f"generation {outcome.generation} keeps serving unpromoted "
            "(validation.on_inconclusive=pause)."
        )
        record.decide(Decision.pause, sentence)
        raise ValidationPaused(
            sentence,
            record,
            hint="Promote with validation.on_inconclusive=promote, or run action=rollback.",
        )
    return outcome


def record_gates(
    record: ValidationRecord,
    phase: str,
    algo: str,
    generation: int | None,
    results: list[GateResult],
    measurement: Measurement | None,
) -> None:
    """Add the gates a run judged now to `record`, and emit each (`validate.gate`: what a
    fleet's progress shows); a stored or failed-to-start phase is only added."""
    record.add(phase, algo, generation, results, measurement)
    for result in results:
        emit("validate.gate", phase=phase, **result.to_dict())


def roll_back_after_failure(
    cfg: DeployConfig,
    host: ShellHost,
    api_key: Secret | None,
    record: ValidationRecord,
    reason: str,
    raised: DeployError,
    generations: GenerationStore,
) -> ValidationFailed:
    """Finish the rollback to linear DFlash, prove it, and build the error the CLI prints."""
    if not cfg.rollout.rollback_on_failure:
        record.decide(Decision.failed, reason)
        return ValidationFailed(
            f"{reason} Not rolled back (rollout.rollback_on_failure=false).", record
        )
    try:
        for _ in range(2):  # twice: a rollback left interrupted is finished before this one
            if generations.state().serves_linear:
                break
            rollback(cfg, host, api_key=api_key, to_linear=True, generations=generations)
        state = generations.state()
    except DeployError as err:
        record.decide(Decision.failed, f"{reason} Rolling back failed too: {err}")
        return ValidationFailed(record.sentence, record, hint=raised.hint)
    record.rolled_back_to = state.generation
    linear = _linear(cfg)
    proof = ServiceProbe(linear, host, api_key).first_gates(Expected.of(linear))
    record.add("rollback_proof", linear.algo.summary, state.generation, proof)
    healthy = all(r.outcome is Outcome.passed for r in proof)
    verdict = (
        "which passed the health gates"
        if healthy
        else f"which is NOT healthy: {proof[-1].gate} {proof[-1].sentence}"
    )
    number = state.generation
    back = (
        f"Rolled back to generation {number} ({state.summary or state.algo})"
        if number is not None
        else "Rolled back to what ran before (linear DFLASH)"
    )
    sentence = f"{reason} {back}, {verdict}."
    record.decide(Decision.rollback, sentence)
    return ValidationFailed(sentence, record, hint=raised.hint)


# -- baseline ------------------------------------------------------------------------------------


def prompts_hash(cfg: DeployConfig) -> str:
    """Identifies how a baseline was measured: the prompt set, its passes and the requests in
    flight (a stored baseline is reused only for the same; each has its own file)."""
    val = cfg.validation
    data: list[dict[str, Any]] = [dataclasses.asdict(p) for p in val.prompts]
    data.append({"repeats": val.repeats})
    if val.concurrency != 1:  # batch-1 baselines keep the hash they were stored under
        # A batched baseline stored before tokens/s was counted over the busy window counted
        # the drain too (it reads slower): under another hash, it is measured again.
        data.append({"concurrency": val.concurrency, "counted": "busy window"})
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def _measure(probe: ServiceProbe, label: str, timing_gate: str) -> Measurement:
    val = probe.cfg.validation
    timing = getattr(val, timing_gate)
    time.sleep(timing.initial_delay_s)
    with probe.client() as client:
        return measure(
            client,
            val.prompts,
            label=label,
            repeats=val.repeats,
            min_pass_s=val.min_pass_s,
            timeout_s=timing.timeout_s,
            pause_s=timing.interval_s,
            concurrency=val.concurrency,
        )


def _baseline_path(cfg: DeployConfig, generation: int | None) -> PurePosixPath:
    name = f"baseline-{prompts_hash(cfg)}.json"
    return generation_folder(cfg.host.state_dir, generation) / name


def _store_baseline(
    cfg: DeployConfig, host: ShellHost, generation: int | None, baseline: Measurement
) -> float:
    """Keep `baseline` in the generation's folder with the time it was measured (returned):
    the watch measures it again once older than `watch.baseline_max_age_h`."""
    measured_at = round(time.time(), 3)
    data = {
        "prompts_hash": prompts_hash(cfg),
        "measured_at": measured_at,
        "measurement": baseline.to_dict(),
    }
    host.write_atomic(
        _baseline_path(cfg, generation), json.dumps(data) + "\n", mode=0o600, sudo=True
    )
    emit("validate.baseline.stored", generation=generation, **baseline.summary())
    return measured_at


def _load_baseline(
    cfg: DeployConfig, host: ShellHost, generation: int
) -> tuple[Measurement, float | None] | None:
    """The baseline stored in `generation` for this prompt set, and when it was measured."""
    text = host.read_text(_baseline_path(cfg, generation), sudo=True)
    if text is None:
        return None
    data: dict[str, Any] = json.loads(text)
    if data.get("prompts_hash") != prompts_hash(cfg):
        return None
    return Measurement.from_dict(data["measurement"]), data.get("measured_at")


def _record_baseline(
    probe: ServiceProbe, ctx: GateContext
) -> tuple[list[GateResult], Measurement | None]:
    """The gate of an `algo=dflash` deploy: measure the new linear service and keep it."""
    baseline = _measure(probe, "linear DFlash", "baseline")
    measured_at = _store_baseline(ctx.cfg, ctx.host, ctx.generation, baseline)
    return [_baseline_result(baseline, measured_at)], baseline


def _baseline_result(baseline: Measurement, measured_at: float | None) -> GateResult:
    """The baseline's row; its `measured_at` figure is what the metrics' baseline time shows."""
    accept = baseline.mean_accept_length
    figures = {k: v for k, v in baseline.summary().items() if k != "per_prompt"}
    return GateResult(
        "baseline",
        Outcome.passed,
        f"Linear DFlash answered {len(baseline.first_pass)} prompts: "
        f"{baseline.tokens_per_s:.1f} tok/s, acceptance "
        + (f"{accept:.2f}." if accept is not None else "not reported."),
        {**figures, "measured_at": measured_at},
    )


def note_stored_baseline(record: ValidationRecord, found: StoredBaseline) -> None:
    """Add the stored baseline a run compares with to its record, as its baseline phase."""
    when = (
        time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(found.measured_at))
        if found.measured_at is not None
        else "at an unknown time"
    )
    record.notes.append(f"Baseline reused from generation {found.generation} (measured {when}).")
    record.add(
        "baseline",
        "linear DFlash (stored)",
        found.generation,
        [_baseline_result(found.measurement, found.measured_at)],
        found.measurement,
    )


def measure_baseline(
    cfg: DeployConfig,
    host: ShellHost,
    api_key: Secret | None,
    generations: GenerationStore,
    record: ValidationRecord,
) -> Measurement:
    """Measure the running linear-DFlash service, or reuse what a killed run stored."""
    state = generations.state()
    current = state.generation
    if state.serves_linear:
        linear = _linear(cfg)
        probe = ServiceProbe(linear, host, api_key)
        gates = probe.first_gates(Expected.of(linear))
        baseline = None
        if all(g.outcome is Outcome.passed for g in gates):
            baseline = _measure(probe, "linear DFlash", "baseline")
            measured_at = _store_baseline(cfg, host, current, baseline)
            gates.append(_baseline_result(baseline, measured_at))
        record.add("baseline", linear.algo.summary, current, gates, baseline)
        if baseline is None:
            bad = deciding_gate(gates) or gates[-1]
            sentence = (
                f"The linear-DFlash service on {cfg.host.name} fails gate {bad.gate} before any "
                f"change ({bad.sentence}); nothing was changed."
            )
            record.decide(Decision.failed, sentence)
            raise ValidationFailed(sentence, record)
        boundary("validate.baseline")
        return baseline
    found = stored_baseline(cfg, host, generations)
    if found is not None:
        note_stored_baseline(record, found)
        return found.measurement
    sentence = (
        f"{cfg.host.name} does not serve linear DFlash now and has no stored baseline for this "
        "prompt set; deploy algo=dflash first, then algo=ddtree."
    )
    record.decide(Decision.failed, sentence)
    raise ValidationFailed(sentence, record)


def stored_baseline(
    cfg: DeployConfig, host: ShellHost, generations: GenerationStore
) -> StoredBaseline | None:
    """The newest baseline of this prompt set that a linear-DFlash generation stored.

    Generation 0 holds what was recorded before any generation (a staging or lab host's).
    """
    for number in reversed([*generations.state().lineage, 0]):
        meta = generations.meta(number) if number else None
        if number and (meta is None or meta.algo != Algo.DFLASH.value):
            continue
        stored = _load_baseline(cfg, host, number)
        if stored is not None:
            measurement, measured_at = stored
            if measured_at is None and meta is not None:
                measured_at = meta.created
            return StoredBaseline(number, measurement, measured_at)
    return None


# -- action=validate: the gates against the service as it runs now --------------------------------


def validate_running(
    cfg: DeployConfig,
    host: ShellHost,
    api_key: Secret | None,
    record: ValidationRecord,
    generations: GenerationStore,
) -> None:
    """Judge the running service as `cfg` describes it; changes nothing but the baseline.

    Linear DFlash: the polled gates, then the prompt set is measured and stored as the
    baseline of the current generation. DDTREE: the polled gates, then the shadow-linear or
    tree gate against the stored baseline. Raises `ValidationFailed` when a gate fails.
    """
    number = generations.state().generation or 0
    judge: Judge
    if cfg.algo.name is Algo.DFLASH:
        phase, judge = "baseline", _record_baseline
    else:
        found = stored_baseline(cfg, host, generations)
        if found is None:
            sentence = (
                f"{cfg.host.name} has no stored linear-DFlash baseline for this prompt set; "
                "run action=validate algo=dflash while linear DFlash serves, then again."
            )
            record.decide(Decision.failed, sentence)
            raise ValidationFailed(sentence, record)
        shadow = cfg.algo.mode is TreeMode.shadow_linear
        phase = "shadow_linear" if shadow else "tree"
        judge = shadow_judge(found.measurement) if shadow else tree_judge(found.measurement)
        record.notes.append(f"Compared with the baseline stored in generation {found.generation}.")
    probe = ServiceProbe(cfg, host, api_key)
    results = probe.first_gates(Expected.of(cfg))
    measurement = None
    if all(r.outcome is Outcome.passed for r in results):
        context = GateContext(cfg, host, number, render_service(cfg, api_key), api_key)
        extra, measurement = judge(probe, context)
        results += extra
    record_gates(record, phase, cfg.algo.summary, number, results, measurement)
    stopper = deciding_gate(results)
    if decide(results, cfg.validation.on_inconclusive) is not Decision.promote and stopper:
        sentence = (
            f"Gate {stopper.gate} {stopper.outcome.value} on {cfg.host.name} "
            f"({cfg.algo.summary}): {stopper.sentence}"
        )
        record.decide(Decision.failed, sentence)
        raise ValidationFailed(sentence, record)
    record.decide(Decision.passed, f"{cfg.host.name} passes every gate for {cfg.algo.summary}.")


# -- the measured gates ---------------------------------------------------------------------------


def shadow_judge(baseline: Measurement) -> Judge:
    def judge(probe: ServiceProbe, ctx: GateContext) -> tuple[list[GateResult], Measurement]:
        val = ctx.cfg.validation
        shadow = _measure(probe, "DDTREE shadow_linear", "shadow_linear")
        scoring = ties = None
        if val.concurrency > 1 and first_divergence(baseline, shadow) is not None:
            # Batched, bf16 rounding follows the batch's make-up: judge by the tie rule.
            with probe.client() as client:
                scoring = score_answers(client, val.prompts, shadow, baseline)
            ties = TieRule(val.tie_tolerance, val.tie_noise_factor, val.max_tie_tolerance)
        result = judge_shadow(
            baseline,
            shadow,
            tolerance=val.acceptance_tolerance,
            collapse_ratio=val.collapse_ratio,
            scoring=scoring,
            ties=ties,
        )
        return [result], shadow

    return judge


def tree_judge(baseline: Measurement) -> Judge:
    def judge(probe: ServiceProbe, ctx: GateContext) -> tuple[list[GateResult], Measurement]:
        val = ctx.cfg.validation
        tree = _measure(probe, "DDTREE tree", "tree")
        with probe.client() as client:
            scoring = score_answers(client, val.prompts, tree, baseline)
        result = judge_tree(
            baseline,
            tree,
            scoring,
            ties=TieRule(val.tie_tolerance, val.tie_noise_factor, val.max_tie_tolerance),
            min_speedup=val.min_speedup,
            min_tokens=val.min_measured_tokens,
            hybrid=ctx.cfg.model.hybrid,
        )
        return [result], tree

    return judge


def promote(
    cfg: DeployConfig,
    host: ShellHost,
    generations: GenerationStore,
    number: int | None,
    record: ValidationRecord,
) -> None:
    """Record the passed validation beside the promoted generation `number`."""
    sentence = f"{cfg.host.name} promoted generation {number} ({cfg.algo.summary})."
    record.decide(Decision.promote, sentence)
    path = generation_folder(cfg.host.state_dir, number) / VALIDATION_FILE
    host.write_atomic(path, json.dumps(record.to_dict()) + "\n", mode=0o600, sudo=True)
    generations.journal("validation.promoted", generation=number)
    emit("validate.promoted", generation=number)
