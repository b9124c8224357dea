"""`action=tune`: sweep (budget, top-k) candidates on the live service and promote the fastest.

The sweep reuses the validated deploy's pieces (`rollout.validation_flow`): the linear-DFlash
baseline is measured (or a stored one reused) at every concurrency of `tune.concurrency`; the
shadow-linear gate runs once; then every candidate of `tune.budgets` x `tune.topks` (topk <=
budget) is deployed as a generation and judged by the polled gates and the tree gate at each
concurrency against the baseline measured at that concurrency. A candidate passes when every
cell passes (every emitted token the target's choice within `validation.tie_tolerance`,
acceptance reported, speedup >= `validation.min_speedup`). The promoted candidate is the
passing one with the best geometric mean of its speedups over the named concurrencies (ties:
the smaller budget, then top-k); the report also names the best candidate at each concurrency.
When none passes, linear DFlash is put back and proven healthy (`TuneNoWinner`, exit 12).

Host safety: a candidate's generation stays only once judged; a failing one is rolled back by
the pipeline to the judged generation below it (shadow-linear or the previous passing
candidate), which it replaces in the lineage (`deploy(replace_top=True)`), so the lineage is
at most linear -> shadow -> one candidate. Each judged candidate is written to
`<state_dir>/tune.json` before its generation commits; a killed tune leaves its candidate in
progress, and the next `action=tune` with the same grid rolls that back, keeps what was judged
and finishes the sweep (`action=rollback` undoes it instead). A tune that starts on a host
serving DDTREE first returns to linear DFlash, so every sweep measures fresh baselines.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from ddtree_deploy.config.schema import Algo, DeployConfig, InconclusivePolicy, TreeMode
from ddtree_deploy.errors import DeployError, ExitCode
from ddtree_deploy.events import emit
from ddtree_deploy.hosts.connection import ShellHost
from ddtree_deploy.rollout.generations import GenerationStore
from ddtree_deploy.rollout.killpoints import boundary
from ddtree_deploy.rollout.pipeline import GateContext, deploy
from ddtree_deploy.rollout.rollback import rollback
from ddtree_deploy.rollout.validation_flow import (
    GateFailed,
    ValidationFailed,
    measure_baseline,
    promote,
    prompts_hash,
    roll_back_after_failure,
    run_phase,
    shadow_judge,
    tree_judge,
    variant,
)
from ddtree_deploy.service.secret import Secret
from ddtree_deploy.validate.gates import Decision, GateResult, Outcome, decide, deciding_gate
from ddtree_deploy.validate.measure import Measurement
from ddtree_deploy.validate.probes import Expected, ServiceProbe
from ddtree_deploy.validate.record import ValidationRecord

TUNE_FILE = "tune.json"
TUNE_FORMAT = 1


class TuneNoWinner(ValidationFailed):
    """No candidate passed every gate at every concurrency; linear DFlash serves again."""

    exit_code = ExitCode.NO_WINNER


@dataclass(frozen=True)
class Candidate:
    """One point of the grid."""

    budget: int
    topk: int

    @property
    def slug(self) -> str:
        return f"b{self.budget}k{self.topk}"

    @property
    def label(self) -> str:
        return f"budget {self.budget}, topk {self.topk}"


@dataclass(frozen=True)
class Cell:
    """One candidate measured at one concurrency (None figures: not measured)."""

    concurrency: int
    outcome: str  # passed | failed | inconclusive | not_run
    sentence: str
    tokens_per_s: float | None = None
    baseline_tokens_per_s: float | None = None
    accept_length: float | None = None
    speedup: float | None = None


@dataclass
class CandidateResult:
    """What the sweep found for one candidate: its cells, then one verdict."""

    candidate: Candidate
    generation: int | None = None
    cells: list[Cell] = field(default_factory=list)
    verdict: str = "not_run"  # passed | failed | inconclusive | not_run
    sentence: str = ""

    @property
    def passed(self) -> bool:
        return self.verdict == Outcome.passed.value

    @property
    def score(self) -> float | None:
        """Geometric mean of the cells' speedups (None unless every cell was measured)."""
        speedups = [c.speedup for c in self.cells]
        if not speedups or any(s is None or s <= 0 for s in speedups):
            return None
        return math.exp(sum(math.log(s) for s in speedups if s) / len(speedups))

    def to_dict(self) -> dict[str, Any]:
        score = self.score
        return {
            "candidate": self.candidate.slug,
            "budget": self.candidate.budget,
            "topk": self.candidate.topk,
            "generation": self.generation,
            "verdict": self.verdict,
            "sentence": self.sentence,
            "geomean_speedup": round(score, 4) if score is not None else None,
            "cells": [dataclasses.asdict(c) for c in self.cells],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CandidateResult:
        return cls(
            Candidate(int(data["budget"]), int(data["topk"])),
            data.get("generation"),
            [Cell(**c) for c in data["cells"]],
            str(data["verdict"]),
            str(data["sentence"]),
        )


def candidates(cfg: DeployConfig) -> list[Candidate]:
    """The grid in sweep order: budgets as given, then top-ks; pairs with topk > budget skipped."""
    return [Candidate(b, k) for b in cfg.tune.budgets for k in cfg.tune.topks if k <= b]


def at_concurrency(cfg: DeployConfig, concurrency: int) -> DeployConfig:
    """`cfg` measured with `concurrency` requests in flight; enough passes over the prompts
    that that many requests really are in flight (at least `validation.repeats`)."""
    val = cfg.validation
    repeats = max(val.repeats, math.ceil(concurrency / max(1, len(val.prompts))))
    return dataclasses.replace(
        cfg, validation=dataclasses.replace(val, concurrency=concurrency, repeats=repeats)
    )


def _candidate_cfg(cfg: DeployConfig, candidate: Candidate) -> DeployConfig:
    algo = dataclasses.replace(
        cfg.algo, mode=TreeMode.tree, budget=candidate.budget, topk=candidate.topk
    )
    return dataclasses.replace(cfg, algo=algo)


def sweep_key(cfg: DeployConfig) -> str:
    """What makes two tune runs the same sweep (a killed one is resumed only by the same)."""
    base = _candidate_cfg(cfg, Candidate(1, 1))
    val = cfg.validation
    data = {
        "config": base.serving_hash,
        "grid": [c.slug for c in candidates(cfg)],
        "concurrency": list(cfg.tune.concurrency),
        "prompts": [prompts_hash(at_concurrency(cfg, c)) for c in cfg.tune.concurrency],
        "gates": [val.min_speedup, val.acceptance_tolerance, val.collapse_ratio],
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class _Progress:
    """`<state_dir>/tune.json`: the sweep's judged candidates, written before each commit."""

    key: str
    shadow_generation: int | None = None
    results: dict[str, CandidateResult] = field(default_factory=dict)
    finished: bool = False

    def to_json(self) -> str:
        data = {
            "format": TUNE_FORMAT,
            "key": self.key,
            "shadow_generation": self.shadow_generation,
            "finished": self.finished,
            "results": {slug: r.to_dict() for slug, r in self.results.items()},
        }
        return json.dumps(data, indent=2) + "\n"


def _progress_path(cfg: DeployConfig) -> PurePosixPath:
    return PurePosixPath(cfg.host.state_dir) / TUNE_FILE


def _load_progress(cfg: DeployConfig, host: ShellHost) -> _Progress | None:
    text = host.read_text(_progress_path(cfg), sudo=True)
    if not text:
        return None
    data: dict[str, Any] = json.loads(text)
    if data.get("format") != TUNE_FORMAT:
        return None
    results = {k: CandidateResult.from_dict(v) for k, v in data["results"].items()}
    return _Progress(data["key"], data.get("shadow_generation"), results, data["finished"])


def _save_progress(cfg: DeployConfig, host: ShellHost, progress: _Progress) -> None:
    host.write_atomic(_progress_path(cfg), progress.to_json(), mode=0o600, sudo=True)


# -- the sweep ------------------------------------------------------------------------------------


def tune(
    cfg: DeployConfig,
    host: ShellHost,
    api_key: Secret | None,
    record: ValidationRecord,
    generations: GenerationStore,
) -> CandidateResult:
    """Sweep the grid on `host` and promote the winner; returns its result.

    Host effects: generations (shadow-linear, one per candidate, the winner's), baselines and
    `tune.json` under `host.state_dir`, `validation.json` in the promoted generation. Raises
    `ValidationFailed` (exit 10) when the baseline or shadow-linear gate fails, `TuneNoWinner`
    (exit 12) when no candidate passes; in both cases linear DFlash serves, proven healthy.
    `api_key`: the key the action read once; every candidate's unit and gate hold it.
    """
    key = sweep_key(cfg)
    progress = _resume_or_start(cfg, host, api_key, generations, key, record)
    levels = list(cfg.tune.concurrency)
    grid = candidates(cfg)
    emit("tune.start", total=len(grid), concurrency=levels, resumed=bool(progress.results))
    baselines: dict[int, Measurement] = {}
    for level in levels:
        baselines[level] = measure_baseline(
            at_concurrency(cfg, level), host, api_key, generations, record
        )
        _rename_last_phase(record, f"baseline@c{level}")
    if progress.shadow_generation is None:
        shadow_cfg = variant(at_concurrency(cfg, levels[0]), TreeMode.shadow_linear)
        outcome = run_phase(
            shadow_cfg,
            host,
            api_key,
            record,
            "shadow_linear",
            shadow_judge(baselines[levels[0]]),
            generations,
        )
        progress.shadow_generation = outcome.generation
        _save_progress(cfg, host, progress)
    else:
        record.notes.append(
            f"Shadow-linear passed earlier in this sweep (generation {progress.shadow_generation})."
        )
    for index, candidate in enumerate(grid):
        emit("tune.candidate", index=index, total=len(grid), candidate=candidate.label)
        if candidate.slug in progress.results:
            record.notes.append(f"Candidate {candidate.label} was judged earlier in this sweep.")
        else:
            result = _judge_candidate(
                cfg, host, api_key, record, progress, candidate, baselines, generations
            )
            progress.results[candidate.slug] = result
            _save_progress(cfg, host, progress)
            boundary("tune.judged")
        emit("tune.candidate.done", index=index, verdict=progress.results[candidate.slug].verdict)
    results = [progress.results[c.slug] for c in grid]
    winner = pick_winner(results)
    record.tune = tune_table(cfg, results, winner)
    emit("tune.end", winner=winner.candidate.slug if winner else None)
    if winner is None:
        progress.finished = True
        _save_progress(cfg, host, progress)
        raise _no_winner(cfg, host, api_key, record, results, generations)
    _serve_winner(cfg, host, api_key, generations, progress, winner, record)
    progress.finished = True
    _save_progress(cfg, host, progress)
    return winner


def _resume_or_start(
    cfg: DeployConfig,
    host: ShellHost,
    api_key: Secret | None,
    generations: GenerationStore,
    key: str,
    record: ValidationRecord,
) -> _Progress:
    """Resume an unfinished sweep of the same grid, or start one from linear DFlash."""
    state = generations.state()
    stored = _load_progress(cfg, host)
    if state.in_progress is not None:
        record.notes.append(
            f"Generation {state.in_progress.generation} was left in progress by a killed "
            "run, unjudged; it was rolled back before the sweep went on."
        )
        rollback(cfg, host, api_key=api_key, generations=generations)
        state = generations.state()
    if stored is not None and stored.key == key and not stored.finished:
        shadow = stored.shadow_generation
        if shadow is not None and shadow not in state.lineage:
            stored.shadow_generation = None
        if stored.shadow_generation is not None or stored.results:
            record.notes.append(
                f"Resumed the sweep: {len(stored.results)} candidate(s) judged before."
            )
        return stored
    if state.algo not in (None, Algo.DFLASH.value):  # a fresh sweep measures it afresh
        rollback(cfg, host, api_key=api_key, to_linear=True, generations=generations)
        state = generations.state()
        record.notes.append(
            f"Returned to generation {state.generation} ({state.summary}) so the sweep "
            "starts on linear DFlash."
        )
    progress = _Progress(key)
    _save_progress(cfg, host, progress)
    generations.journal("tune.begin", key=key)
    return progress


def _rename_last_phase(record: ValidationRecord, name: str) -> None:
    record.phases[-1] = dataclasses.replace(record.phases[-1], name=name)


def _judge_candidate(
    cfg: DeployConfig,
    host: ShellHost,
    api_key: Secret | None,
    record: ValidationRecord,
    progress: _Progress,
    candidate: Candidate,
    baselines: dict[int, Measurement],
    generations: GenerationStore,
) -> CandidateResult:
    """Deploy one candidate through its gates; a failure is rolled back and recorded."""
    cand_cfg = _candidate_cfg(cfg, candidate)
    result = CandidateResult(candidate)
    emit("validate.phase", phase=f"tune.{candidate.slug}", algo=cand_cfg.algo.summary)

    def gate(ctx: GateContext) -> None:
        result.generation = ctx.generation
        probe = ServiceProbe(ctx.cfg, ctx.host, ctx.api_key)
        polled = probe.first_gates(Expected.of(ctx.cfg))
        record.add(f"tune.{candidate.slug}", ctx.cfg.algo.summary, ctx.generation, polled)
        if (bad := deciding_gate(polled)) is not None:
            fail_unmeasured(result, bad, cfg.tune.concurrency)
            raise GateFailed(result.sentence)
        boundary(f"tune.candidate.{candidate.slug}")
        _measure_cells(ctx, record, result, candidate, baselines)
        if not result.passed:
            raise GateFailed(result.sentence)
        # Judged and passed: written down before the generation commits.
        progress.results[candidate.slug] = result
        _save_progress(cfg, host, progress)

    top = generations.state().lineage[-1:]
    replace_top = bool(top) and top[0] != progress.shadow_generation
    try:
        deploy(
            cand_cfg,
            host,
            api_key=api_key,
            gates=[gate],
            replace_top=replace_top,
            generations=generations,
        )
    except DeployError as err:
        if result.verdict == "not_run":  # no verdict yet: the unit or a measurement failed
            reason = (str(err.__cause__ or err)).split("\n", 1)[0]
            failed = "unit_active" if result.generation is None else "tree"
            fail_unmeasured(
                result, GateResult(failed, Outcome.failed, reason), cfg.tune.concurrency
            )
        state = generations.state()
        if state.in_progress is not None:  # the pipeline's rollback failed too
            reason = f"{candidate.label}: {result.sentence}"
            raise roll_back_after_failure(
                cfg, host, api_key, record, reason, err, generations
            ) from err
        record.notes.append(
            f"Candidate {candidate.label} did not pass ({result.sentence}); rolled back to "
            f"generation {state.generation} ({state.summary})."
        )
    return result


def _measure_cells(
    ctx: GateContext,
    record: ValidationRecord,
    result: CandidateResult,
    candidate: Candidate,
    baselines: dict[int, Measurement],
) -> None:
    """The tree gate at every concurrency of the live candidate, each cell in the record."""

    def judge(level: int) -> list[GateResult]:
        cell_cfg = at_concurrency(ctx.cfg, level)
        probe = ServiceProbe(cell_cfg, ctx.host, ctx.api_key)
        gates, measurement = tree_judge(baselines[level])(
            probe, dataclasses.replace(ctx, cfg=cell_cfg)
        )
        phase = f"tune.{candidate.slug}@c{level}"
        record.add(phase, ctx.cfg.algo.summary, ctx.generation, gates, measurement)
        emit("validate.gate", phase=phase, **gates[-1].to_dict())
        return gates

    judge_cells(result, ctx.cfg.tune.concurrency, judge, ctx.cfg.validation.on_inconclusive)


def judge_cells(
    result: CandidateResult,
    levels: Sequence[int],
    judge: Callable[[int], Sequence[GateResult]],
    policy: InconclusivePolicy,
) -> None:
    """A candidate's cells and verdict from `judge(level)`, the gates ending in the tree gate.

    A failed cell (a token beyond the tie rule, or too slow) stops the candidate at once (no
    point measuring it on). Kept apart from the live service so the GPU lab, which starts its
    own servers, judges the same.
    """
    for level in levels:
        if result.verdict == Outcome.failed.value:
            result.cells.append(Cell(level, "not_run", "not measured after a failed cell"))
            continue
        gates = judge(level)
        tree = gates[-1]
        # As a deploy judges it: on_inconclusive=promote counts an inconclusive cell as a pass.
        outcome = {Decision.promote: "passed", Decision.rollback: "failed"}.get(
            decide(gates, policy), "inconclusive"
        )
        figures = tree.figures
        result.cells.append(
            Cell(
                level,
                outcome,
                tree.sentence,
                figures.get("tree_tokens_per_s"),
                figures.get("baseline_tokens_per_s"),
                figures.get("tree_accept_length"),
                figures.get("speedup"),
            )
        )
        if tree.divergence is not None and outcome == "failed":
            result.verdict, result.sentence = outcome, f"c={level}: {tree.sentence}"
    if result.verdict == "failed":
        return
    stopper = next((c for c in result.cells if c.outcome != Outcome.passed.value), None)
    if stopper is None:
        score = result.score
        result.verdict = Outcome.passed.value
        result.sentence = (
            f"passes at every concurrency; geometric-mean speedup {score:.2f}"
            if score is not None
            else "passes at every concurrency"
        )
    else:
        result.verdict = stopper.outcome
        result.sentence = f"c={stopper.concurrency}: {stopper.sentence}"


def fail_unmeasured(result: CandidateResult, gate: GateResult, levels: Sequence[int]) -> None:
    """A candidate that never reached the tree gate: `gate` decides it, no cell measured."""
    result.verdict = gate.outcome.value
    result.sentence = f"{gate.gate} {gate.outcome.value}: {gate.sentence}"
    result.cells = [Cell(c, "not_run", "not measured") for c in levels]


def pick_winner(results: list[CandidateResult]) -> CandidateResult | None:
    """The passing candidate with the best geometric-mean speedup; ties: smaller budget, top-k."""
    passing = [r for r in results if r.passed and r.score is not None]
    if not passing:
        return None
    return max(passing, key=lambda r: (r.score, -r.candidate.budget, -r.candidate.topk))


def tune_table(
    cfg: DeployConfig, results: list[CandidateResult], winner: CandidateResult | None
) -> dict[str, Any]:
    """The sweep for the report: every candidate's cells, the best per concurrency, the winner."""
    best: dict[str, str | None] = {}
    for level in cfg.tune.concurrency:
        cells = [
            (cell.speedup, r.candidate.slug)
            for r in results
            for cell in r.cells
            if cell.concurrency == level and cell.outcome == "passed" and cell.speedup
        ]
        best[str(level)] = max(cells)[1] if cells else None
    return {
        "concurrency": list(cfg.tune.concurrency),
        "min_speedup": cfg.validation.min_speedup,
        "rule": "promote the candidate that passes at every concurrency with the best "
        "geometric-mean speedup",
        "candidates": [r.to_dict() for r in results],
        "best_per_concurrency": best,
        "winner": winner.candidate.slug if winner else None,
    }


def _serve_winner(
    cfg: DeployConfig,
    host: ShellHost,
    api_key: Secret | None,
    generations: GenerationStore,
    progress: _Progress,
    winner: CandidateResult,
    record: ValidationRecord,
) -> None:
    """Make the winner serve (it may already) and promote it."""
    win_cfg = _candidate_cfg(cfg, winner.candidate)
    state = generations.state()
    number = state.generation
    if not state.serves(win_cfg):
        top = state.lineage[-1:]
        replace_top = bool(top) and top[0] != progress.shadow_generation

        def serving(ctx: GateContext) -> None:  # judged in this sweep: the polled gates suffice
            polled = ServiceProbe(ctx.cfg, ctx.host, ctx.api_key).first_gates(Expected.of(ctx.cfg))
            record.add("winner", ctx.cfg.algo.summary, ctx.generation, polled)
            if (bad := deciding_gate(polled)) is not None:
                raise GateFailed(f"Gate {bad.gate} {bad.outcome.value}: {bad.sentence}")

        try:
            number = deploy(
                win_cfg,
                host,
                api_key=api_key,
                gates=[serving],
                replace_top=replace_top,
                generations=generations,
            ).generation
        except DeployError as err:
            reason = f"The winner {winner.candidate.label} did not come back: {err}"
            raise roll_back_after_failure(
                cfg, host, api_key, record, reason, err, generations
            ) from err
    promote(win_cfg, host, generations, number, record)
    record.decide(
        Decision.promote,
        f"{cfg.host.name} promoted generation {number} ({win_cfg.algo.summary}): the best "
        f"geometric-mean speedup ({winner.score:.2f} x linear DFlash) over concurrency "
        f"{', '.join(map(str, cfg.tune.concurrency))} among the candidates that pass every gate.",
    )


def _no_winner(
    cfg: DeployConfig,
    host: ShellHost,
    api_key: Secret | None,
    record: ValidationRecord,
    results: list[CandidateResult],
    generations: GenerationStore,
) -> TuneNoWinner:
    reason = (
        f"No candidate of {len(results)} passed every gate at concurrency "
        f"{', '.join(map(str, cfg.tune.concurrency))} (validation.min_speedup="
        f"{cfg.validation.min_speedup:g}); linear DFlash stays."
    )
    failed = roll_back_after_failure(
        cfg, host, api_key, record, reason, GateFailed(reason), generations
    )
    record.decide(Decision.no_winner, failed.message)
    return TuneNoWinner(
        failed.message,
        record,
        hint="The report's tune table shows each candidate's speedup and verdict.",
    )
