"""The fleet's scheduling logic on CPU: batches, the failure budget, halt, rollback_all, resume
(and the recap's figures, read from a validation record).

`ScriptedHosts` is a TEST DOUBLE for the per-host runs, standing in for the scheduling logic
only: each host's verdict is scripted, and what the walk asked of each host is recorded. The
real per-host runs (SSH, systemd, the gates) are tested on container hosts in test_fleet_hosts.py.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path

import pytest

from ddtree_deploy.config.schema import FleetConfig, FleetHostConfig, OnFailure
from ddtree_deploy.events import sink_installed
from ddtree_deploy.fleet import FleetJournal, HostRun, Verdict, walk
from ddtree_deploy.fleet.driver import figures
from ddtree_deploy.fleet.journal import FleetBusy, command_key
from ddtree_deploy.fleet.schedule import Started
from ddtree_deploy.fleet.strategy import batches
from ddtree_deploy.validate.gates import GateResult, Outcome
from ddtree_deploy.validate.record import PhaseRecord, ValidationRecord

COMMAND = ["fleet=lab", "algo=ddtree", "action=deploy"]


class ScriptedHosts:
    """TEST DOUBLE for `HostDriver`: scripted verdicts, recorded calls (see the module doc)."""

    def __init__(
        self,
        verdicts: Mapping[str, Verdict] | None = None,
        *,
        generations: Mapping[str, int] | None = None,
        together: set[str] | frozenset[str] = frozenset(),
    ) -> None:
        self.verdicts = dict(verdicts or {})
        self.generations = dict(generations or {})  # before the run
        self.ran: list[str] = []
        self.restored: dict[str, int | None] = {}
        # Hosts that must be running at the same moment: each waits for the others.
        self.barrier = threading.Barrier(len(together)) if together else None
        self.together = together
        self._lock = threading.Lock()

    def run(self, name: str, started: Started) -> HostRun:
        with self._lock:
            self.ran.append(name)
        before = self.generations.get(name)
        started(before)
        if self.barrier is not None and name in self.together:
            self.barrier.wait(timeout=10)  # BrokenBarrierError unless they overlap
        verdict = self.verdicts.get(name, Verdict.changed)
        if verdict is Verdict.changed:
            return HostRun(name, verdict, "deployed", generation=(before or 0) + 1)
        if verdict is Verdict.failed:
            return HostRun(name, verdict, "gate tree failed", 10, generation=before)
        if verdict is Verdict.unreachable:
            return HostRun(name, verdict, "cannot reach it", 3)
        return HostRun(name, verdict, "as asked", generation=before)

    def restore(self, name: str, generation: int | None) -> HostRun:
        self.restored[name] = generation
        if generation == self.generations.get(name) and self.verdicts.get(name) is Verdict.failed:
            return HostRun(name, Verdict.ok, "already there", generation=generation)
        return HostRun(name, Verdict.rolled_back, "rolled back", generation=generation)


def fleet(
    *names: str,
    canary: tuple[str, ...] = (),
    batch_size: int = 2,
    max_failures: int = 0,
    on_failure: OnFailure = OnFailure.halt,
    restart: bool = False,
) -> FleetConfig:
    return FleetConfig(
        name="lab",
        hosts={name: FleetHostConfig() for name in names},
        canary=list(canary),
        batch_size=batch_size,
        max_failures=max_failures,
        on_failure=on_failure,
        restart=restart,
    )


class Killed(BaseException):
    """Stands for the SIGKILL the `fleet.batch` kill point sends (nothing after it runs)."""


@pytest.fixture
def kill_between_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first `fleet.batch` boundary ends the walk, as DDTREE_DEPLOY_KILL_AT does a process."""

    def boundary(name: str) -> None:
        monkeypatch.undo()
        raise Killed(name)

    monkeypatch.setattr("ddtree_deploy.fleet.schedule.boundary", boundary)


def journal(tmp_path: Path) -> FleetJournal:
    return FleetJournal.for_fleet(tmp_path, "lab", COMMAND, tmp_path / "run")


def events_of(call: list[dict[str, object]], name: str) -> list[dict[str, object]]:
    return [r for r in call if r["event"] == name]


def test_batches_put_each_canary_alone_then_the_rest_in_fleet_order() -> None:
    order = ["a", "b", "c", "d", "e"]
    assert batches(order, ["c"], 2) == [["c"], ["a", "b"], ["d", "e"]]
    assert batches(order, ["b", "a"], 3) == [["b"], ["a"], ["c", "d", "e"]]
    assert batches(order, [], 10) == [order]


def test_canary_goes_alone_then_the_batch_runs_its_hosts_at_once(tmp_path: Path) -> None:
    hosts = ScriptedHosts(together={"b", "c"})  # b and c each wait until the other runs
    records: list[dict[str, object]] = []
    with sink_installed(records.append):
        result = walk(fleet("a", "b", "c", canary=("a",)), "deploy", hosts, journal(tmp_path))

    assert hosts.ran[0] == "a"
    assert [r["hosts"] for r in events_of(records, "fleet.batch")] == [["a"], ["b", "c"]]
    assert [r.verdict for r in result.hosts] == [Verdict.changed] * 3
    assert [r.batch for r in result.hosts] == [1, 2, 2]
    assert result.exit_code == 0 and result.halted is None


def test_failed_gate_under_halt_lets_its_batch_finish_and_starts_no_new_batch(
    tmp_path: Path,
) -> None:
    hosts = ScriptedHosts({"b": Verdict.failed}, together={"a", "b"})
    result = walk(fleet("a", "b", "c", "d"), "deploy", hosts, journal(tmp_path))

    verdicts = {r.name: r.verdict for r in result.hosts}
    assert verdicts == {
        "a": Verdict.changed,  # its batch finished
        "b": Verdict.failed,
        "c": Verdict.skipped,  # no new batch
        "d": Verdict.skipped,
    }
    assert sorted(hosts.ran) == ["a", "b"]
    assert hosts.restored == {}  # halt leaves every host as it is
    assert result.halted is not None and "max_failures=0" in result.halted
    assert result.exit_code == 10  # the failed host's own code


def test_failure_within_the_budget_lets_the_rollout_go_on(tmp_path: Path) -> None:
    hosts = ScriptedHosts({"a": Verdict.unreachable})
    result = walk(
        fleet("a", "b", "c", batch_size=1, max_failures=1), "deploy", hosts, journal(tmp_path)
    )

    assert [r.verdict for r in result.hosts] == [
        Verdict.unreachable,
        Verdict.changed,
        Verdict.changed,
    ]
    assert result.halted is None
    assert result.exit_code == 3  # an unreachable host still fails the run


def test_failed_canary_halts_even_within_the_failure_budget(tmp_path: Path) -> None:
    hosts = ScriptedHosts({"a": Verdict.failed})
    result = walk(
        fleet("a", "b", "c", canary=("a",), max_failures=1), "deploy", hosts, journal(tmp_path)
    )

    assert [r.verdict for r in result.hosts] == [Verdict.failed, Verdict.skipped, Verdict.skipped]
    assert hosts.ran == ["a"]
    assert result.halted == "canary a failed; no further batch started (on_failure=halt)."


def test_rollback_all_returns_every_changed_host_to_its_generation_before(tmp_path: Path) -> None:
    hosts = ScriptedHosts({"c": Verdict.failed}, generations={"a": 4, "b": 7, "c": 2, "d": 1})
    result = walk(
        fleet("a", "b", "c", "d", canary=("a",), on_failure=OnFailure.rollback_all),
        "deploy",
        hosts,
        journal(tmp_path),
    )

    verdicts = {r.name: r.verdict for r in result.hosts}
    assert verdicts == {
        "a": Verdict.rolled_back,
        "b": Verdict.rolled_back,
        "c": Verdict.failed,  # rolled itself back already; stays the failure
        "d": Verdict.skipped,
    }
    assert hosts.restored == {"a": 4, "b": 7, "c": 2}  # d was never touched
    assert {r.name: r.generation for r in result.hosts if r.name != "d"} == {"a": 4, "b": 7, "c": 2}
    assert result.exit_code == 10


@pytest.mark.usefixtures("kill_between_batches")
def test_killed_rollout_resumes_after_its_canary_and_finishes(tmp_path: Path) -> None:
    strategy = fleet("a", "b", "c", canary=("a",))
    first = ScriptedHosts(generations={"a": 1, "b": 1, "c": 1})
    with pytest.raises(Killed):
        walk(strategy, "deploy", first, journal(tmp_path))
    assert first.ran == ["a"]

    again = journal(tmp_path)
    assert again.resumed_from == str(tmp_path / "run")
    assert again.finished() == {"a"}
    second = ScriptedHosts(generations={"a": 2, "b": 1, "c": 1}, together={"b", "c"})
    result = walk(strategy, "deploy", second, again)

    assert sorted(second.ran) == ["b", "c"]  # the canary that passed is not run again
    assert [r.verdict for r in result.hosts] == [Verdict.done, Verdict.changed, Verdict.changed]
    assert result.resumed_from == str(tmp_path / "run")
    # The rollout is complete: the next run of the command starts a new one.
    assert journal(tmp_path).resumed_from is None


@pytest.mark.usefixtures("kill_between_batches")
def test_resumed_rollout_keeps_the_generation_found_first_for_rollback_all(tmp_path: Path) -> None:
    strategy = fleet("a", "b", canary=("a",), on_failure=OnFailure.rollback_all)
    with pytest.raises(Killed):
        walk(strategy, "deploy", ScriptedHosts(generations={"a": 5}), journal(tmp_path))
    # The canary now runs generation 6; the rollout found it at 5.
    hosts = ScriptedHosts({"b": Verdict.failed}, generations={"a": 6, "b": 3})
    result = walk(strategy, "deploy", hosts, journal(tmp_path))

    assert hosts.ran == ["b"]
    assert hosts.restored["a"] == 5
    assert result.hosts[0].verdict is Verdict.rolled_back


@pytest.mark.usefixtures("kill_between_batches")
def test_restart_runs_hosts_a_killed_rollout_finished(tmp_path: Path) -> None:
    with pytest.raises(Killed):
        walk(fleet("a", "b", canary=("a",)), "deploy", ScriptedHosts(), journal(tmp_path))
    hosts = ScriptedHosts()
    walk(fleet("a", "b", canary=("a",), restart=True), "deploy", hosts, journal(tmp_path))
    assert hosts.ran == ["a", "b"]


@pytest.mark.usefixtures("kill_between_batches")
def test_another_command_does_not_resume_the_killed_rollout(tmp_path: Path) -> None:
    with pytest.raises(Killed):
        walk(fleet("a", "b", canary=("a",)), "deploy", ScriptedHosts(), journal(tmp_path))
    other = FleetJournal.for_fleet(
        tmp_path, "lab", command_key(["fleet=lab", "algo=dflash", "action=deploy"]), tmp_path
    )
    assert other.resumed_from is None and other.finished() == set()
    # fleet.restart is no part of the command: it only says whether to resume.
    assert command_key([*COMMAND, "fleet.restart=true"]) == COMMAND


def test_read_only_action_runs_every_host_at_once_past_failures(tmp_path: Path) -> None:
    hosts = ScriptedHosts({"a": Verdict.unreachable}, together={"a", "b", "c"})
    result = walk(fleet("a", "b", "c", canary=("a",), batch_size=1), "status", hosts)
    assert [r.verdict for r in result.hosts] == [
        Verdict.unreachable,
        Verdict.changed,
        Verdict.changed,
    ]
    assert result.halted is None


def test_a_bug_in_one_host_fails_that_host_only(tmp_path: Path) -> None:
    class Buggy(ScriptedHosts):
        def run(self, name: str, started: Started) -> HostRun:
            if name == "b":
                raise KeyError("state")
            return super().run(name, started)

    result = walk(fleet("a", "b", max_failures=1), "deploy", Buggy(), journal(tmp_path))
    assert [r.verdict for r in result.hosts] == [Verdict.changed, Verdict.failed]
    assert "internal error: KeyError" in result.hosts[1].detail


def test_recap_takes_tree_tokens_and_speedup_from_the_tree_gate() -> None:
    record = ValidationRecord("lab1", "DDTREE tree, budget 15, topk 4")
    baseline = {"tokens_per_s": 60.0}
    record.phases.append(PhaseRecord("baseline", "linear DFLASH", 1, (), baseline))
    tree = GateResult(
        "tree", Outcome.passed, "faster", {"tree_tokens_per_s": 81.5, "speedup": 1.358}
    )
    record.phases.append(PhaseRecord("tree", "DDTREE tree", 3, (tree,), {"tokens_per_s": 80.0}))
    assert figures(record) == (81.5, 1.358)
    assert figures(ValidationRecord("lab1", "linear DFLASH")) == (None, None)


def test_second_run_of_a_fleet_on_this_controller_is_refused(tmp_path: Path) -> None:
    first, second = journal(tmp_path), journal(tmp_path)
    with first.held(), pytest.raises(FleetBusy, match=f"pid {os.getpid()}"), second.held():
        pass
    with second.held():  # free again once the first ended
        pass


def test_host_a_kill_left_running_is_run_again(tmp_path: Path) -> None:
    killed = journal(tmp_path)
    killed.record("a", verdict=Verdict.changed, running=False)
    killed.record("b", running=True, batch=2)  # intent written, no verdict: killed mid-run
    assert journal(tmp_path).finished() == {"a"}
