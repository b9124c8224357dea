"""`action=revalidate`: the watch timer's run against the service as it runs now.

Routine (the fingerprint of what was validated is unchanged): the polled gates, then the prompt
sample (`watch.prompt_sample` first prompts of the set) through the deployed mode's gate (the
tie rule on the tree's tokens by the target's own scores, tokens/s against the linear-DFlash
baseline stored at deploy) and an acceptance gate against the acceptance the deploy recorded
for those prompts. Nothing restarts when all holds. On a failure `watch.policy` decides:
`rollback` (to linear DFlash, proven healthy, as a failed deploy does), `alert` (nothing
changes; exit 13 with the sentence in the journal, the metrics say failed) or `pause` (as
alert, and the timer stops until a deploy or the operator starts it; exit 11).

Changed fingerprint (a driver, CUDA, torch, SGLang file, model, drafter or kernels change since
the last passed validation): the deploy's proof no longer holds, and its baseline was measured
on what changed, so the run re-validates in full as a deploy does: back to linear DFlash, a
fresh baseline, shadow-linear, tree, promote (a failure leaves linear DFlash serving, whatever
the policy), and records the new fingerprint when it passes. A stored baseline older than
`watch.baseline_max_age_h` is measured again the same way (measuring it needs linear DFlash
serving, so a restart), before any speed is judged against it.

A host that serves linear DFlash (the deploy was algo=dflash, or a rollback happened) gets the
polled gates only.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

from ddtree_deploy.config.schema import Algo, DeployConfig, PromptConfig, TreeMode, WatchPolicy
from ddtree_deploy.errors import ExitCode
from ddtree_deploy.events import emit
from ddtree_deploy.hosts.connection import ShellHost
from ddtree_deploy.hosts.facts import HostFacts
from ddtree_deploy.rollout.generations import VALIDATION_FILE, GenerationStore, generation_folder
from ddtree_deploy.rollout.pipeline import GateContext
from ddtree_deploy.rollout.rollback import rollback
from ddtree_deploy.rollout.validation_flow import (
    GateFailed,
    StoredBaseline,
    ValidationFailed,
    deploy_validated,
    note_stored_baseline,
    record_gates,
    roll_back_after_failure,
    shadow_judge,
    stored_baseline,
    tree_judge,
)
from ddtree_deploy.rollout.watch_record import record_validated
from ddtree_deploy.service.render import render_service
from ddtree_deploy.service.secret import Secret
from ddtree_deploy.validate.gates import Decision, GateResult, Outcome, decide, deciding_gate
from ddtree_deploy.validate.measure import Measurement
from ddtree_deploy.validate.probes import Expected, ServiceProbe
from ddtree_deploy.validate.record import ValidationRecord
from ddtree_deploy.watch.fingerprint import RecordedFingerprint, drift, read_fingerprint
from ddtree_deploy.watch.timer import watch_name


class WatchAlert(ValidationFailed):
    """A re-validation failed under watch.policy=alert: reported, nothing changed."""

    exit_code = ExitCode.WATCH_ALERT


class WatchPaused(ValidationFailed):
    """A re-validation failed under watch.policy=pause: reported, the timer stopped."""

    exit_code = ExitCode.VALIDATION_PAUSED


def revalidate(
    cfg: DeployConfig,
    host: ShellHost,
    api_key: Secret | None,
    record: ValidationRecord,
    facts: HostFacts,
    changed: list[str],
    generations: GenerationStore,
) -> None:
    """Re-validate the host (routine or full, see the module); `changed` receives the drifted
    fingerprint parts. Raises `ValidationFailed` (or the policy's subclass) on a failure.
    `api_key`: the key the action read once."""
    state = generations.state()
    recorded = RecordedFingerprint.from_state(generations.store.load())
    now = read_fingerprint(cfg, host, facts, cfg.host.sglang_python)
    changed += drift(recorded.parts, now) if recorded else ["no fingerprint was recorded"]
    if state.algo != Algo.DDTREE.value or cfg.algo.name is Algo.DFLASH:
        _check_linear(cfg, host, api_key, record, state.generation)
        return
    found = stored_baseline(cfg, host, generations)
    stale = _stale_baseline(cfg, found)
    if changed:
        record.notes.append(
            "The fingerprint changed since the last passed validation ("
            + "; ".join(changed)
            + "); re-validating in full: linear DFlash, shadow-linear, tree."
        )
    if stale:
        record.notes.append(stale)
    if changed or stale:
        emit("watch.full", changed=changed, stale_baseline=stale)
        rollback(cfg, host, api_key=api_key, to_linear=True, generations=generations)
        deploy_validated(cfg, host, api_key, record, generations)
        record_validated(cfg, host, facts, generations)
        return
    results = _routine(cfg, host, api_key, found, state.generation, record)
    stopper = deciding_gate(results)
    if decide(results, cfg.validation.on_inconclusive) is not Decision.promote and stopper:
        sentence = (
            f"Re-validation gate {stopper.gate} {stopper.outcome.value} on {cfg.host.name} "
            f"({cfg.algo.summary}): {stopper.sentence}"
        )
        raise _on_failure(cfg, host, api_key, record, sentence, generations)
    sample = len(_sample(cfg))
    record.decide(
        Decision.passed,
        f"{cfg.host.name} still passes every gate for {cfg.algo.summary} on {sample} "
        "prompt(s); nothing was restarted.",
    )


def _sample(cfg: DeployConfig) -> list[PromptConfig]:
    """The prompts a routine run sends: the first `watch.prompt_sample` of the set."""
    return list(cfg.validation.prompts[: max(1, cfg.watch.prompt_sample)])


def _stale_baseline(cfg: DeployConfig, found: StoredBaseline | None) -> str | None:
    """The note of a run that must measure the baseline again (older than
    `watch.baseline_max_age_h`, or of unknown age); None while it is fresh or absent."""
    limit = cfg.watch.baseline_max_age_h
    if found is None or limit is None:
        return None
    age = found.age_h(time.time())
    if age is not None and age <= limit:
        return None
    when = f"{age:.1f} h ago" if age is not None else "at an unknown time"
    return (
        f"The linear-DFlash baseline (generation {found.generation}) was measured {when}, "
        f"over watch.baseline_max_age_h={limit:g}; re-validating in full to measure it again "
        "before judging speed: linear DFlash, shadow-linear, tree."
    )


def _routine(
    cfg: DeployConfig,
    host: ShellHost,
    api_key: Secret | None,
    found: StoredBaseline | None,
    number: int | None,
    record: ValidationRecord,
) -> list[GateResult]:
    """The polled gates, then the sample through the mode's gate (against `found`, the stored
    baseline) and the acceptance gate."""
    sample = _sample(cfg)
    sample_cfg = dataclasses.replace(
        cfg, validation=dataclasses.replace(cfg.validation, prompts=sample)
    )
    probe = ServiceProbe(sample_cfg, host, api_key)
    results = probe.first_gates(Expected.of(sample_cfg))
    measurement = None
    if found is None:
        results.append(
            GateResult(
                "baseline",
                Outcome.inconclusive,
                f"{cfg.host.name} has no stored linear-DFlash baseline for this prompt set; "
                "deploy algo=dflash, then algo=ddtree again.",
            )
        )
    elif all(r.outcome is Outcome.passed for r in results):
        note_stored_baseline(record, found)
        names = {p.name for p in sample}
        baseline = _subset(found.measurement, names)
        shadow = cfg.algo.mode is TreeMode.shadow_linear
        judge = shadow_judge(baseline) if shadow else tree_judge(baseline)
        ctx = GateContext(sample_cfg, host, number or 0, render_service(cfg, api_key), api_key)
        judged, measurement = judge(probe, ctx)
        recorded = _recorded_acceptance(cfg, host, number, names)
        if recorded is not None and measurement is not None:
            results.append(_acceptance_gate(cfg, recorded, measurement))
        results += judged
    record_gates(record, "revalidate", cfg.algo.summary, number, results, measurement)
    return results


def _subset(measurement: Measurement, names: set[str]) -> Measurement:
    """The prompts of `names` from a stored measurement, its time scaled to their share of it
    (of the passes' time, and of the slots' time in its busy window where it has one), so its
    tokens/s is the rate those prompts ran at, as a sample measured alone would give."""
    kept = tuple(r for r in measurement.results if r.name in names)
    elapsed = None
    if measurement.elapsed_s is not None and measurement.results:
        share = sum(r.wall_s for r in kept) / max(sum(r.wall_s for r in measurement.results), 1e-9)
        elapsed = measurement.elapsed_s * share
    window = measurement.busy_window
    if window is not None:
        inside = sum(window.overlap_s(r) for r in measurement.results)
        share = sum(window.overlap_s(r) for r in kept) / max(inside, 1e-9)
        window = dataclasses.replace(window, share=window.share * share)
    return Measurement(measurement.label, kept, elapsed, window)


def _recorded_acceptance(
    cfg: DeployConfig, host: ShellHost, number: int | None, names: set[str]
) -> float | None:
    """The acceptance the promoting validation measured on `names` (tokens per verify step),
    from the generation's `validation.json`; None where it recorded none."""
    path = generation_folder(cfg.host.state_dir, number) / VALIDATION_FILE
    text = host.read_text(path, sudo=True)
    if text is None:
        return None
    phase = "shadow_linear" if cfg.algo.mode is TreeMode.shadow_linear else "tree"
    data: dict[str, Any] = json.loads(text)
    for entry in data.get("phases", []):
        rows = [
            row
            for row in ((entry.get("measurement") or {}).get("per_prompt") or [])
            if row["name"] in names and row.get("accept_length")
        ]
        if entry["name"] == phase and rows:
            tokens = float(sum(row["tokens"] for row in rows))
            steps = sum(float(row["tokens"]) / float(row["accept_length"]) for row in rows)
            return tokens / steps
    return None


def _acceptance_gate(cfg: DeployConfig, recorded: float, now: Measurement) -> GateResult:
    """Acceptance must stay above `validation.collapse_ratio` of what the deploy recorded: a
    collapse (the draft no longer sees the target's hidden states) changes no token."""
    accept = now.mean_accept_length
    floor = cfg.validation.collapse_ratio
    figures = {"accept_length": accept, "recorded_accept_length": round(recorded, 4)}
    if accept is None:
        return GateResult(
            "acceptance", Outcome.inconclusive, "The server reported no acceptance.", figures
        )
    ratio = accept / recorded
    figures["ratio"] = round(ratio, 4)
    said = f"Acceptance is {accept:.2f} tokens per step, {ratio:.2f} x the {recorded:.2f} recorded"
    if ratio < floor:
        return GateResult(
            "acceptance",
            Outcome.failed,
            f"{said} when it was validated, below validation.collapse_ratio={floor:g}: "
            "acceptance collapsed.",
            figures,
        )
    return GateResult("acceptance", Outcome.passed, f"{said} when it was validated.", figures)


def _check_linear(
    cfg: DeployConfig,
    host: ShellHost,
    api_key: Secret | None,
    record: ValidationRecord,
    number: int | None,
) -> None:
    """A host serving linear DFlash: its polled gates; a failure is reported (no rollback
    target is left below linear DFlash)."""
    linear = dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo, name=Algo.DFLASH))
    results = ServiceProbe(linear, host, api_key).first_gates(Expected.of(linear))
    record.add("revalidate", linear.algo.summary, number, results)
    stopper = deciding_gate(results)
    if stopper is not None and stopper.outcome is not Outcome.passed:
        sentence = f"Linear DFlash fails gate {stopper.gate} on {cfg.host.name}: {stopper.sentence}"
        record.decide(Decision.failed, sentence)
        raise WatchAlert(sentence, record)
    record.decide(
        Decision.passed, f"{cfg.host.name} serves linear DFlash and passes its health gates."
    )


def _on_failure(
    cfg: DeployConfig,
    host: ShellHost,
    api_key: Secret | None,
    record: ValidationRecord,
    sentence: str,
    generations: GenerationStore,
) -> ValidationFailed:
    """What `watch.policy` does after a failed routine re-validation; the error to raise."""
    policy = cfg.watch.policy
    generations.journal("watch.failed", policy=policy.value, sentence=sentence)
    emit("watch.failed", policy=policy.value, sentence=sentence)
    if policy is WatchPolicy.rollback:
        return roll_back_after_failure(
            cfg, host, api_key, record, sentence, GateFailed(sentence), generations
        )
    if policy is WatchPolicy.pause:
        timer = f"{watch_name(cfg)}.timer"
        host.run(["systemctl", "stop", "--", timer], sudo=True, check=False)
        record.decide(
            Decision.pause,
            f"{sentence} Nothing was changed and {timer} is stopped (watch.policy=pause).",
        )
        return WatchPaused(
            record.sentence,
            record,
            hint=f"Investigate, then deploy again or run `systemctl start {timer}`.",
        )
    record.decide(Decision.failed, f"{sentence} Nothing was changed (watch.policy=alert).")
    return WatchAlert(
        record.sentence, record, hint="Investigate, then deploy again or run action=rollback."
    )
