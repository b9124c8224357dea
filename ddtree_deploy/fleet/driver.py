"""One fleet host's run: the single-host action, in its own run folder, as a `HostRun`.

Each host gets `<fleet run>/<host>/` with its own `events.jsonl` and report files, exactly what
`ddtree-deploy host=<host> action=...` leaves: the runner `cli` hands the driver is the one a
single-host run goes through (`report.action_run`), with the host's own connection and lock (a
host another run holds is refused, not waited for). The driver only places the run and reads
its verdict. The step it is at goes to the fleet's sinks as `fleet.step` events (the live table).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Any

from ddtree_deploy.config.schema import DeployConfig
from ddtree_deploy.errors import DeployError, PreflightRefused, UnreachableHost
from ddtree_deploy.events import JsonLinesSink, emit, sink_installed
from ddtree_deploy.fleet.schedule import Started
from ddtree_deploy.fleet.strategy import HostRun, Verdict
from ddtree_deploy.hosts.factory import connect
from ddtree_deploy.hosts.lock import HostBusy, host_lock
from ddtree_deploy.rollout.generations import GenerationStore, HostState
from ddtree_deploy.rollout.outcomes import ActionRun
from ddtree_deploy.rollout.rollback import rollback
from ddtree_deploy.service.secret import load_api_key
from ddtree_deploy.validate.record import ValidationRecord

# Actions that change a host: the generation it had before is journaled (rollback_all).
_CHANGING = frozenset({"deploy", "rollback", "tune"})
# Actions after which the host's generation is read for the recap.
_SERVING = frozenset({"deploy", "rollback", "tune", "validate"})

# Runs a host's action, writes its reports in the folder given, returns what it gave.
RunAction = Callable[[DeployConfig, Path], ActionRun]


class ActionDriver:
    """Runs the fleet's action on each member (`HostDriver` for `fleet.schedule`)."""

    def __init__(
        self,
        members: Mapping[str, DeployConfig],
        fleet_dir: Path,
        fleet_emit: Callable[..., None],
        run_action: RunAction,
        *,
        record_before: bool,
    ) -> None:
        """`run_action`: the single-host runner. `record_before`: read each changing host's
        generation before its run for the journal (what `on_failure=rollback_all` returns it
        to); otherwise no extra connection."""
        self.members = members
        self.fleet_dir = fleet_dir
        self.fleet_emit = fleet_emit
        self.run_action = run_action
        self.record_before = record_before

    def run(self, name: str, started: Started) -> HostRun:
        cfg = self.members[name]
        return self._in_run_dir(name, name, lambda run_dir: self._act(cfg, run_dir, started))

    def restore(self, name: str, generation: int | None) -> HostRun:
        """Return the host to `generation` (None: the unit found before its first) in one
        restart, under its lock; `ok` when it is there already."""
        cfg = self.members[name]
        return self._in_run_dir(name, f"{name}-rollback", lambda _: self._restore(cfg, generation))

    # -- one host ----------------------------------------------------------------------------

    def _in_run_dir(self, name: str, folder: str, body: Callable[[Path], HostRun]) -> HostRun:
        """`body` with the host's events going to `<fleet run>/<folder>/events.jsonl`."""
        run_dir = self.fleet_dir / folder
        run_dir.mkdir(parents=True, exist_ok=True)
        sink = JsonLinesSink(run_dir / "events.jsonl")
        began = time.monotonic()
        try:
            with sink_installed(sink), sink_installed(self._progress(name)):
                emit("run.start", action=self.members[name].action, host=name, folder=folder)
                run = body(run_dir)
                emit("run.end", exit_code=run.exit_code, verdict=run.verdict.value)
        finally:
            sink.close()
        return replace(run, name=name, wall_s=time.monotonic() - began, run_dir=str(run_dir))

    def _act(self, cfg: DeployConfig, run_dir: Path, started: Started) -> HostRun:
        name = cfg.host.name
        if self.record_before and cfg.action in _CHANGING:
            try:
                started(_state(cfg).generation)
            except DeployError as err:
                emit("run.failed", error=str(err), kind=type(err).__name__)
                return self._failed(cfg, err, None)
        run = self.run_action(cfg, run_dir)
        if run.error is not None:
            return self._failed(cfg, run.error, run.record)
        outcome = run.outcome
        assert outcome is not None, "an action returns its outcome or raises"
        state = outcome.serving
        if state is None:  # validate, tune: ask the host; a read-only action: nothing to show
            state = _state(cfg) if cfg.action in _SERVING else HostState()
        tokens, speedup = figures(outcome.record)
        verdict = Verdict.changed if outcome.changed else Verdict.ok
        if outcome.exit_code:
            verdict = Verdict.failed
        return HostRun(
            name,
            verdict,
            (outcome.recap or verdict.value).removeprefix(f"{name}: "),
            outcome.exit_code,
            generation=state.generation,
            algo=state.summary or state.algo or "",
            tokens_per_s=tokens,
            speedup=speedup,
            outcome=outcome,
        )

    def _failed(
        self, cfg: DeployConfig, err: DeployError, record: ValidationRecord | None
    ) -> HostRun:
        if isinstance(err, UnreachableHost):
            verdict = Verdict.unreachable
        elif isinstance(err, PreflightRefused | HostBusy):
            verdict = Verdict.refused
        else:
            verdict = Verdict.failed
        state = HostState()
        if verdict is Verdict.failed and cfg.action in _SERVING:
            try:  # where the host's own rollback left it
                state = _state(cfg)
            except DeployError:
                state = HostState()
        tokens, speedup = figures(record)
        return HostRun(
            cfg.host.name,
            verdict,
            str(err),
            err.exit_code,
            generation=state.generation,
            algo=state.summary or state.algo or "",
            tokens_per_s=tokens,
            speedup=speedup,
        )

    def _restore(self, cfg: DeployConfig, generation: int | None) -> HostRun:
        name = cfg.host.name
        try:
            with (
                connect(cfg.host) as host,
                host_lock(host, PurePosixPath(cfg.host.state_dir), "rollback"),
            ):
                generations = GenerationStore(host, PurePosixPath(cfg.host.state_dir))
                state = generations.state()
                if state.generation == generation and state.in_progress is None:
                    return HostRun(
                        name,
                        Verdict.ok,
                        f"already at generation {generation}",
                        generation=generation,
                        algo=state.summary or "",
                    )
                outcome = rollback(
                    cfg,
                    host,
                    api_key=load_api_key(cfg.service),
                    to_generation=generation or 0,
                    generations=generations,
                )
        except DeployError as err:
            emit("run.failed", error=str(err), kind=type(err).__name__)
            return HostRun(
                name, Verdict.failed, f"rollback_all could not restore it: {err}", err.exit_code
            )
        return HostRun(
            name,
            Verdict.rolled_back,
            outcome.sentence(),
            generation=outcome.to_generation,
            algo=outcome.summary,
        )

    def _progress(self, name: str) -> Callable[[dict[str, Any]], None]:
        """A host sink that tells the fleet which step the host is at."""

        def sink(record: dict[str, Any]) -> None:
            step = _step_of(record)
            if step is not None:
                self.fleet_emit("fleet.step", host=name, step=step)

        return sink


def _state(cfg: DeployConfig) -> HostState:
    with connect(cfg.host) as host:
        return GenerationStore(host, PurePosixPath(cfg.host.state_dir)).state()


def _step_of(record: dict[str, Any]) -> str | None:
    """The live table's words for a host event, or None for events it does not show."""
    event = record.get("event")
    if event == "preflight":
        return "preflight refused" if record.get("refusals") else "preflight"
    if event in ("step.check", "step.result"):
        return f"{record['step']}: {record.get('status')}"
    if event == "validate.phase":
        return f"gates {record['phase']}"
    if event == "validate.gate":
        return f"{record.get('phase')}/{record.get('gate')} {record.get('outcome')}"
    if event in ("kernels.build", "rollback.start", "deploy.unchanged", "status", "audit"):
        return str(event).replace(".", " ")
    return None


def figures(record: ValidationRecord | None) -> tuple[float | None, float | None]:
    """The last measured tokens/s and the tree gate's speedup, where the run measured them."""
    if record is None:
        return None, None
    tokens = speedup = None
    for phase in record.phases:
        if phase.measurement is not None:
            tokens = phase.measurement.get("tokens_per_s", tokens)
        for gate in phase.gates:
            figures = gate.to_dict().get("figures") or {}
            if "speedup" in figures:
                speedup = figures["speedup"]
                tokens = figures.get("tree_tokens_per_s", tokens)
    return tokens, speedup
