"""Walk a fleet: each canary alone, then batches whose hosts run at once, in threads.

A host's run is I/O (SSH, HTTP), so threads suffice; each host drives the existing per-host
action through a `HostDriver` and never raises here. A batch always finishes: its hosts run to
their end even when one fails. After a batch, the failure budget decides whether the next one
starts; when it is spent, `on_failure=halt` stops there (failed hosts already rolled back by
themselves, untouched ones stay as they are) and `rollback_all` also returns every host this
rollout changed to the generation it had before. `rollout.killpoints` marks the gap between
batches (`fleet.batch`), where the tests kill a rollout.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Protocol

from ddtree_deploy.config.schema import FleetConfig, OnFailure
from ddtree_deploy.events import bound_emit
from ddtree_deploy.fleet.journal import FleetJournal
from ddtree_deploy.fleet.strategy import (
    FAILURES,
    FleetResult,
    HostRun,
    Verdict,
    batches,
    over_budget,
)
from ddtree_deploy.rollout.killpoints import boundary

_log = logging.getLogger(__name__)
# Actions that only read: every host at once, none stops the others (no canary, no budget).
READ_ONLY = frozenset({"plan", "status", "audit"})

Started = Callable[[int | None], None]  # the generation the host had before this run


class HostDriver(Protocol):
    """Runs one host's part of the fleet's action; returns its result and never raises."""

    def run(self, name: str, started: Started) -> HostRun: ...

    def restore(self, name: str, generation: int | None) -> HostRun: ...


def walk(
    fleet: FleetConfig,
    action: str,
    driver: HostDriver,
    journal: FleetJournal | None = None,
) -> FleetResult:
    """Run `action` over `fleet`'s hosts by its strategy; `journal` (mutating actions) is
    where it resumes from and records to."""
    began = time.monotonic()
    emit = bound_emit()
    if journal is not None and fleet.restart:
        journal.start_over()
    finished = journal.finished() if journal is not None else set()
    plan = batches(list(fleet.hosts), fleet.canary, fleet.batch_size)
    if action in READ_ONLY:
        plan = [list(fleet.hosts)]
    emit("fleet.start", fleet=fleet.name, action=action, batches=plan, finished=sorted(finished))
    results: dict[str, HostRun] = {
        name: HostRun(name, Verdict.done, "finished by an earlier run of this rollout")
        for name in finished
    }
    halted = None
    started_any = False
    for number, batch in enumerate(plan, 1):
        todo = [name for name in batch if name not in finished]
        if not todo:
            continue
        if started_any:
            boundary("fleet.batch")
        started_any = True
        emit("fleet.batch", batch=number, hosts=todo)
        for run in _run_batch(todo, number, driver, journal, emit):
            results[run.name] = run
        if action not in READ_ONLY:
            halted = _halt_sentence(fleet, todo, results)
        if halted is not None:
            emit("fleet.halted", sentence=halted)
            break
    for name in fleet.hosts:
        results.setdefault(name, HostRun(name, Verdict.skipped, "not started: the rollout halted"))
    if halted and fleet.on_failure is OnFailure.rollback_all:
        results.update(_roll_back_all(results, driver, journal, emit))
    ordered = tuple(results[name] for name in fleet.hosts)
    if journal is not None:
        journal.close([r.verdict for r in ordered])
    emit("fleet.end", verdicts={r.name: r.verdict.value for r in ordered})
    return FleetResult(
        fleet.name,
        action,
        ordered,
        halted,
        journal.resumed_from if journal is not None else None,
        time.monotonic() - began,
    )


def _halt_sentence(
    fleet: FleetConfig, batch: Sequence[str], results: dict[str, HostRun]
) -> str | None:
    """Why no further batch may start after `batch`, or None. A canary exists to stop a bad
    rollout on its first host, so a failed canary halts whatever `max_failures` allows."""
    failed = [r.name for r in results.values() if r.verdict in FAILURES]
    canaries = [name for name in batch if name in fleet.canary and name in failed]
    if canaries:
        return (
            f"canary {canaries[0]} failed; no further batch started "
            f"(on_failure={fleet.on_failure.value})."
        )
    if over_budget(list(results.values()), fleet.max_failures):
        return (
            f"{len(failed)} host(s) failed ({', '.join(failed)}), more than "
            f"max_failures={fleet.max_failures}; no further batch started "
            f"(on_failure={fleet.on_failure.value})."
        )
    return None


def _run_batch(
    names: Sequence[str],
    number: int,
    driver: HostDriver,
    journal: FleetJournal | None,
    emit: Callable[..., None],
) -> list[HostRun]:
    def one(name: str) -> HostRun:
        emit("fleet.host.start", host=name, batch=number)
        if journal is not None:
            journal.record(name, running=True, batch=number)

        def started(generation: int | None) -> None:
            if journal is not None:
                journal.record(name, before=generation)

        run = _guarded(name, lambda: driver.run(name, started))
        run = replace(run, batch=number)
        _finished(run, journal, emit)
        return run

    with ThreadPoolExecutor(max_workers=len(names), thread_name_prefix="fleet") as pool:
        return list(pool.map(one, names))


def _roll_back_all(
    results: dict[str, HostRun],
    driver: HostDriver,
    journal: FleetJournal | None,
    emit: Callable[..., None],
) -> dict[str, HostRun]:
    """Every host this rollout changed (or left failed) back to its generation before, at once."""
    touched = [
        r
        for r in results.values()
        if r.verdict in (Verdict.changed, Verdict.done, Verdict.failed)
        and (journal is None or journal.knows_before(r.name))
    ]
    emit("fleet.rollback_all", hosts=[r.name for r in touched])

    def one(run: HostRun) -> HostRun:
        emit("fleet.host.start", host=run.name, batch=run.batch, rollback=True)
        before = journal.before(run.name) if journal is not None else None
        restored = _guarded(run.name, lambda: driver.restore(run.name, before))
        if restored.verdict is Verdict.ok:  # already where the rollout found it
            result = run
        elif run.verdict is Verdict.failed and restored.verdict is Verdict.rolled_back:
            # A failed host stays a failure, now back where the rollout found it.
            result = replace(
                run,
                detail=f"{run.detail} {restored.detail}",
                generation=restored.generation,
                algo=restored.algo,
            )
        else:
            result = replace(restored, batch=run.batch, wall_s=run.wall_s + restored.wall_s)
        _finished(result, journal, emit)
        return result

    if not touched:
        return {}
    with ThreadPoolExecutor(max_workers=len(touched), thread_name_prefix="fleet") as pool:
        return {run.name: run for run in pool.map(one, touched)}


def _guarded(name: str, call: Callable[[], HostRun]) -> HostRun:
    """A driver's bug fails its host, not the fleet (the traceback goes to the debug log)."""
    try:
        return call()
    except Exception as err:  # the fleet loop: one host's bug must not stop the others
        _log.exception("fleet host %s raised", name)
        return HostRun(name, Verdict.failed, f"internal error: {type(err).__name__}: {err}", 1)


def _finished(run: HostRun, journal: FleetJournal | None, emit: Callable[..., None]) -> None:
    if journal is not None:
        journal.record(
            run.name, verdict=run.verdict, generation=run.generation, batch=run.batch, running=False
        )
    emit("fleet.host.end", **run.to_dict())
