"""`ddtree-deploy fleet=... action=deploy|plan|status` on three systemd containers running the
stand-in.

Each container runs the stand-in SGLang server (a test double, see tests/standin/server.py) as
its unit; the first is the session's `standin_lab`, two more are booted here (about 10 s each).
The tests share one unit per host ("fleet") and run in file order (ONE_WORKER_FILES): a rollout
killed between its canary and its batch, finished by the same command; the same command again,
a no-op; a host whose lock another run holds; a failed gate under halt, then under
rollback_all; status over the fleet, one host unreachable; the watch's status columns, one
host drifted. Linear DFlash (algo=dflash) keeps each validated deploy short: the gates still run
(unit, health, server info, health_generate, the baseline measurement).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from hostlab import Container, TestHost
from product_hosts import ssh_host_overrides
from standin.lab import MODEL_DIR
from validate.conftest import StandinLab, boot_standin_lab, key_file

from ddtree_deploy.cli import main
from ddtree_deploy.hosts.lock import host_lock
from ddtree_deploy.report import console
from ddtree_deploy.rollout.generations import GenerationStore, HostState
from ddtree_deploy.rollout.killpoints import KILL_AT_ENV
from ddtree_deploy.service import systemd

pytestmark = pytest.mark.nspawn

UNIT = "fleet"
PORT = 31260
STATE_DIR = PurePosixPath(f"/var/lib/ddtree-test/{UNIT}")
NAMES = ("lab1", "lab2", "lab3")
# Overrides that say which host a config reaches (the fleet file gives them per host).
_PER_HOST = ("host=", "host.name=", "host.address=", "host.port=", "host.user=", "host.key_file=")


@pytest.fixture(scope="module")
def labs(
    standin_lab: StandinLab, standin_root: tuple[Path, Path]
) -> Iterator[dict[str, StandinLab]]:
    containers: list[Container] = []
    try:
        for _ in range(2):
            container, _lab = boot_standin_lab(standin_root)
            containers.append(container)
        others = [StandinLab(c.host, standin_lab.venv) for c in containers]
        yield dict(zip(NAMES, [standin_lab, *others], strict=True))
    finally:
        for container in containers:
            container.stop()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fleet-runs")


def fleet_args(
    labs: dict[str, StandinLab],
    runs: Path,
    *,
    canary: Sequence[str] = (),
    batch_size: int = 2,
    on_failure: str = "halt",
    per_host: dict[str, list[str]] | None = None,
    unreachable: TestHost | None = None,
) -> list[str]:
    """Writes conf/fleet/lab.yaml under `runs` and returns the command line that uses it."""
    first = next(iter(labs.values()))
    shared = [
        arg
        for arg in first.overrides(UNIT, runs, key_file(runs), PORT)
        if not arg.startswith(_PER_HOST) and not arg.startswith("hydra.searchpath=")
    ]
    # The command line wins over a host's own overrides: a key that one host sets differently
    # moves from the command line into every host's overrides.
    per_host = per_host or {}
    own = {arg.split("=", 1)[0] for extra in per_host.values() for arg in extra}
    moved = [arg for arg in shared if arg.split("=", 1)[0] in own]
    shared = [arg for arg in shared if arg not in moved]
    hosts: dict[str, Any] = {}
    for name, lab in labs.items():
        mine = per_host.get(name, [])
        keys = {arg.split("=", 1)[0] for arg in mine}
        common = [arg for arg in moved if arg.split("=", 1)[0] not in keys]
        hosts[name] = {
            "option": "local",
            "overrides": [*ssh_host_overrides(lab.host, name)[1:], *common, *mine],
        }
    if unreachable is not None:
        hosts["gone"] = {
            "option": "local",
            "overrides": ssh_host_overrides(unreachable, "gone")[1:],
        }
    fleet = {
        "defaults": ["base_fleet", "_self_"],
        "name": "lab",
        "hosts": hosts,
        "canary": list(canary),
        "batch_size": batch_size,
        "on_failure": on_failure,
    }
    conf = runs / "conf"
    (conf / "fleet").mkdir(parents=True, exist_ok=True)
    (conf / "fleet" / "lab.yaml").write_text(json.dumps(fleet, indent=2))  # JSON is YAML
    standin_conf = Path(__file__).parents[1] / "validate" / "conf"
    searchpath = f"hydra.searchpath=[file://{conf},file://{standin_conf}]"
    return [*shared, searchpath, "fleet=lab", "algo=dflash"]


def state(lab: StandinLab) -> HostState:
    with lab.connect() as host:
        return GenerationStore(host, STATE_DIR).state()


def watch_section(lab: StandinLab) -> dict[str, Any]:
    """The watch's own section of `state.json` (HostState holds the generations' fields only)."""
    with lab.connect() as host:
        return GenerationStore(host, STATE_DIR).store.load().get("watch") or {}


def main_pid(lab: StandinLab) -> int:
    with lab.connect() as host:
        unit = systemd.unit_state(host, f"{UNIT}.service")
        assert unit.running
        return unit.main_pid


def last_recap(runs: Path) -> dict[str, Any]:
    latest = max(runs.glob("*-fleet-lab-*/recap.json"), key=lambda p: p.stat().st_mtime)
    recap: dict[str, Any] = json.loads(latest.read_text())
    return recap


def verdicts(recap: dict[str, Any]) -> dict[str, str]:
    return {h["host"]: h["verdict"] for h in recap["hosts"]}


def fleet_events(recap_dir: Path) -> list[dict[str, Any]]:
    lines = (recap_dir / "events.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_killed_after_its_canary_the_same_command_deploys_the_batch_in_parallel(
    labs: dict[str, StandinLab], runs: Path
) -> None:
    args = [*fleet_args(labs, runs, canary=["lab1"]), "action=deploy"]
    killed = subprocess.run(
        [str(Path(sys.executable).parent / "ddtree-deploy"), *args],
        env={**os.environ, KILL_AT_ENV: "fleet.batch"},
        capture_output=True,
        timeout=600,
    )
    assert killed.returncode == -9, killed.stderr.decode()[-2000:]
    assert state(labs["lab1"]).algo == "DFLASH"  # the canary passed, then the kill
    assert state(labs["lab2"]).generation is None
    assert state(labs["lab3"]).generation is None

    assert main(args) == 0
    recap = last_recap(runs)
    assert verdicts(recap) == {"lab1": "done", "lab2": "changed", "lab3": "changed"}
    assert recap["resumed_from"] is not None
    latest = max(runs.glob("*-fleet-lab-deploy*"), key=lambda p: p.stat().st_mtime)
    events = fleet_events(latest)
    starts = [e["ts"] for e in events if e["event"] == "fleet.host.start"]
    ends = [e["ts"] for e in events if e["event"] == "fleet.host.end"]
    assert len(starts) == 2 and max(starts) < min(ends)  # lab2 and lab3 ran at once
    assert not (latest / "lab1").exists()  # the canary that passed was not run again
    for name in ("lab2", "lab3"):
        assert "deploy.committed" in [e["event"] for e in fleet_events(latest / name)]
    for lab in labs.values():
        assert state(lab).algo == "DFLASH"
        assert main_pid(lab) > 0


def test_same_command_again_touches_no_service(labs: dict[str, StandinLab], runs: Path) -> None:
    pids = {name: main_pid(lab) for name, lab in labs.items()}
    args = [*fleet_args(labs, runs, canary=["lab1"]), "action=deploy"]
    assert main(args) == 0
    recap = last_recap(runs)
    assert verdicts(recap) == dict.fromkeys(NAMES, "ok")
    assert {name: main_pid(lab) for name, lab in labs.items()} == pids
    print(
        "no-op re-deploy, tool's own time per host:",
        {h["host"]: h["wall_s"] for h in recap["hosts"]},
    )


def test_host_another_run_holds_is_refused_while_the_others_go_on(
    labs: dict[str, StandinLab], runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [*fleet_args(labs, runs, batch_size=3), "fleet.max_failures=1"]
    with labs["lab3"].connect() as host, host_lock(host, STATE_DIR, "deploy"):
        assert main([*args, "action=deploy"]) == 9  # HostBusy's code
    recap = last_recap(runs)
    assert verdicts(recap) == {"lab1": "ok", "lab2": "ok", "lab3": "refused"}
    assert "lab3 is busy" in recap["hosts"][2]["detail"]

    capsys.readouterr()
    assert main([*args, "action=plan"]) == 0  # every host's plan, read only
    out = capsys.readouterr().out
    assert [name for name in NAMES if f"plan: {name}" in out] == list(NAMES)


# lab2's server refuses an unknown flag, so its unit crash-loops and its first gate fails.
LAB2_FAILS = {"lab2": ["service.extra_args=[--device,cpu,--no-such-flag]"]}


def test_failed_gate_under_halt_finishes_its_batch_and_starts_no_other(
    labs: dict[str, StandinLab], runs: Path
) -> None:
    before = {name: state(lab).generation for name, lab in labs.items()}
    args = fleet_args(labs, runs, per_host=LAB2_FAILS)
    assert main([*args, "+service.environment.FLEET_ROUND=halt", "action=deploy"]) == 10
    recap = last_recap(runs)
    assert verdicts(recap) == {"lab1": "changed", "lab2": "failed", "lab3": "skipped"}
    assert "unit_active" in recap["hosts"][1]["detail"]
    assert "max_failures=0" in recap["halted"]
    after = {name: state(lab) for name, lab in labs.items()}
    assert after["lab1"].generation != before["lab1"]
    assert (after["lab2"].generation, after["lab2"].algo) == (before["lab2"], "DFLASH")
    assert after["lab3"].generation == before["lab3"]  # untouched
    assert main_pid(labs["lab2"]) > 0  # linear DFlash serves again


def test_failed_gate_under_rollback_all_returns_changed_hosts_to_where_they_were(
    labs: dict[str, StandinLab], runs: Path
) -> None:
    """Each host starts from a generation of its own, deployed here (run alone or after the
    others, the same start): a host with none would go back to the unit found before its first
    generation, as a new generation (docs/fleet.md), not to "no generation"."""
    setup = fleet_args(labs, runs, batch_size=3)
    assert main([*setup, "+service.environment.FLEET_ROUND=before-all", "action=deploy"]) == 0
    before = {name: state(lab).generation for name, lab in labs.items()}
    assert None not in before.values()
    args = fleet_args(labs, runs, on_failure="rollback_all", per_host=LAB2_FAILS)
    assert main([*args, "+service.environment.FLEET_ROUND=all", "action=deploy"]) == 10
    recap = last_recap(runs)
    assert verdicts(recap) == {"lab1": "rolled back", "lab2": "failed", "lab3": "skipped"}
    assert {name: state(lab).generation for name, lab in labs.items()} == before
    for lab in labs.values():
        assert main_pid(lab) > 0


def test_status_over_the_fleet_is_one_table_and_an_unreachable_host_fails_it(
    labs: dict[str, StandinLab], runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gone = TestHost(
        name="gone",
        address=labs["lab1"].host.address,
        port=1,  # nothing listens there
        user="root",
        key_path=labs["lab1"].host.key_path,
        known_hosts_path=labs["lab1"].host.known_hosts_path,
    )
    capsys.readouterr()
    assert main([*fleet_args(labs, runs, unreachable=gone), "action=status"]) == 3
    out = capsys.readouterr().out
    assert out.count("status: fleet lab") == 1
    for name in (*NAMES, "gone"):
        assert f"│ {name} " in out
    recap = last_recap(runs)
    assert verdicts(recap) == {"lab1": "ok", "lab2": "ok", "lab3": "ok", "gone": "unreachable"}
    assert recap["hosts"][3]["detail"].startswith("Cannot reach gone")
    assert "gone: Cannot reach gone" in " ".join(out.split())


def test_status_columns_show_each_hosts_last_validation_acceptance_and_drift(
    labs: dict[str, StandinLab],
    runs: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The watch's columns (docs/watch.md, "The fleet view") read each host's own state: a
    drafter config changed on lab3 since its last passed validation shows there alone."""
    for name in ("lab1", "lab2", "lab3"):  # each validated at least once (run alone too)
        if not watch_section(labs[name]).get("last"):
            assert main([*fleet_args(labs, runs, batch_size=3), "action=deploy"]) == 0
            break
    config = PurePosixPath(MODEL_DIR) / "draft" / "config.json"
    with labs["lab3"].connect() as host:
        original = host.read_text(config) or ""
        host.write_atomic(config, json.dumps({**json.loads(original), "_revision": "b"}))
    monkeypatch.setattr(console.stdout, "width", 600)
    try:
        capsys.readouterr()
        code = main([*fleet_args(labs, runs), "action=status"])
        out = capsys.readouterr().out
    finally:
        with labs["lab3"].connect() as host:
            host.write_atomic(config, original)
    assert code == 1, out
    rows = {
        cells[0]: cells
        for line in out.splitlines()
        if (cells := [c.strip() for c in line.split("│")[1:-1]]) and cells[0] in NAMES
    }
    for name, lab in labs.items():
        watch = watch_section(lab)
        verdict, accept, drift = rows[name][6:9]
        assert verdict.startswith("passed " if watch["last"]["passed"] else "failed "), name
        assert accept == f"{watch['figures']['acceptance_length']:.2f}", name
        if name == "lab3":
            assert drift.startswith("drafter config.json changed since the last passed validation")
        else:
            assert drift == "none", name
