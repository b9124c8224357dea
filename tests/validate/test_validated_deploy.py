"""`ddtree-deploy ... action=deploy` through the gates, on a systemd container running the stand-in.

The unit runs `python -m standin` (a test double for SGLang; see tests/standin/server.py), whose
command line the real patched SGLang parser resolves. Faults are injected through the unit's
environment file; each applies only to DDTREE, so the linear baseline and every rollback are
healthy. The fault tests share one unit that starts on linear DFlash and is rolled back to it
after each test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from state_reads import counting_state_reads

from ddtree_deploy.cli import main
from ddtree_deploy.hosts.lock import LOCK_NAME
from ddtree_deploy.rollout.generations import GenerationStore
from ddtree_deploy.rollout.killpoints import KILL_AT_ENV
from ddtree_deploy.service import systemd
from validate.conftest import StandinLab, key_file

# One xdist worker runs this file: the fault tests share one unit
# (ONE_WORKER_FILES in tests/conftest.py).
pytestmark = pytest.mark.nspawn


# Issue 46: a deploy reads the host's state.json at most twice, however many phases, generations
# and rollbacks it goes through (it keeps the copy its own writes update).
MAX_STATE_READS = 2


def deploy(lab: StandinLab, name: str, tmp: Path, port: int, *extra: str) -> int:
    with counting_state_reads(f"/var/lib/ddtree-test/{name}") as reads:
        code = main([*lab.overrides(name, tmp, key_file(tmp), port), "action=deploy", *extra])
    assert reads["state.json"] <= MAX_STATE_READS, reads
    return code


def last_report(runs: Path) -> dict[str, Any]:
    latest = max(runs.glob("*-lab-deploy*/report.json"), key=lambda p: p.stat().st_mtime)
    report: dict[str, Any] = json.loads(latest.read_text())
    return report


def host_state(lab: StandinLab, name: str) -> dict[str, Any]:
    with lab.connect() as host:
        return GenerationStore(host, PurePosixPath(f"/var/lib/ddtree-test/{name}")).store.load()


def unit_running(lab: StandinLab, name: str) -> bool:
    with lab.connect() as host:
        return systemd.unit_state(host, f"{name}.service").running


def gates(report: dict[str, Any]) -> dict[str, str]:
    """`phase/gate -> outcome` over the whole report."""
    return {
        f"{phase['name']}/{gate['gate']}": gate["outcome"]
        for phase in report["phases"]
        for gate in phase["gates"]
    }


def test_ddtree_deploy_goes_from_linear_baseline_through_shadow_to_promoted_tree(
    standin_lab: StandinLab, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name = "val-promote"
    assert deploy(standin_lab, name, tmp_path, 31201, "algo=dflash") == 0
    assert deploy(standin_lab, name, tmp_path, 31201, "algo=ddtree") == 0

    report = last_report(tmp_path)
    assert report["decision"] == "promote"
    assert [p["name"] for p in report["phases"]] == ["baseline", "shadow_linear", "tree"]
    assert set(gates(report).values()) == {"passed"}
    tree = report["phases"][2]["gates"][-1]["figures"]
    assert tree["speedup"] >= tree["min_speedup"]
    assert tree["tree_accept_length"] > tree["baseline_accept_length"]
    shadow = report["phases"][1]["gates"][-1]["figures"]
    assert shadow["shadow_accept_length"] == shadow["baseline_accept_length"]
    state = host_state(standin_lab, name)
    assert (state["algo"], state["in_progress"]) == ("DDTREE", None)
    assert "standin-test-key" not in capsys.readouterr().out
    assert "standin-test-key" not in "".join(p.read_text() for p in tmp_path.rglob("report.*"))

    assert deploy(standin_lab, name, tmp_path, 31201, "algo=ddtree") == 0
    assert last_report(tmp_path)["decision"] == "unchanged"


@pytest.fixture(scope="module")
def faults_host(standin_lab: StandinLab, tmp_path_factory: pytest.TempPathFactory) -> str:
    """One unit serving linear DFlash; every fault test starts and ends there."""
    name = "val-faults"
    assert deploy(standin_lab, name, tmp_path_factory.mktemp(name), 31202, "algo=dflash") == 0
    return name


@pytest.mark.parametrize(
    ("fault", "gate", "extra"),
    [
        ("crash_loop", "shadow_linear/unit_active", ()),
        (
            "slow_start",
            "shadow_linear/health",
            # Also the rollback proof's wait for linear DFlash: a stand-in start takes 15-40 s
            # on a loaded 2-core machine (25 s failed there once).
            ("validation.health={timeout_s: 60, interval_s: 0.5, initial_delay_s: 0}",),
        ),
        ("wrong_algorithm", "shadow_linear/server_info", ()),
        ("acceptance_collapse", "shadow_linear/shadow_linear", ()),
        ("wrong_child", "tree/tree", ()),  # the planted bug the GPU lab plants in SGLang
        ("tree_slow", "tree/tree", ()),
    ],
)
def test_injected_fault_rolls_back_to_healthy_linear_dflash(
    standin_lab: StandinLab,
    faults_host: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    fault: str,
    gate: str,
    extra: tuple[str, ...],
) -> None:
    rc = deploy(
        standin_lab,
        faults_host,
        tmp_path,
        31202,
        "algo=ddtree",
        f"+service.environment.STANDIN_FAULT={fault}",
        *extra,
    )
    assert rc == 10  # ValidationError
    report = last_report(tmp_path)
    outcomes = gates(report)
    assert outcomes[gate] == "failed"
    assert report["decision"] == "rollback"
    assert report["phases"][-1]["name"] == "rollback_proof"
    assert {v for k, v in outcomes.items() if k.startswith("rollback_proof/")} == {"passed"}
    error = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(error) == 1
    assert f"Gate {gate.split('/')[1]} failed on lab" in error[0]
    assert "(linear DFLASH), which passed the health gates." in error[0]
    state = host_state(standin_lab, faults_host)
    assert (state["algo"], state["in_progress"]) == ("DFLASH", None)
    assert unit_running(standin_lab, faults_host)
    # The failure counts in the host's metrics (docs/watch.md), the rollback too.
    assert state["watch"]["last"]["passed"] is False
    assert state["watch"]["gates"][gate]["passed"] is False
    assert state["watch"]["counters"]["rollbacks"] >= 1


def test_acceptance_collapse_is_reported_as_missing_hidden_states(
    standin_lab: StandinLab, faults_host: str, tmp_path: Path
) -> None:
    deploy(
        standin_lab,
        faults_host,
        tmp_path,
        31202,
        "algo=ddtree",
        "+service.environment.STANDIN_FAULT=acceptance_collapse",
    )
    shadow = last_report(tmp_path)["phases"][1]["gates"][-1]
    assert "collapsed" in shadow["sentence"]
    assert "hidden states" in shadow["sentence"]
    assert shadow["figures"]["shadow_accept_length"] == 1.0


def test_run_killed_during_tree_validation_is_finished_by_the_next_run(
    standin_lab: StandinLab, tmp_path: Path
) -> None:
    name = "val-killed"
    assert deploy(standin_lab, name, tmp_path, 31203, "algo=dflash") == 0
    argv = [
        str(Path(sys.executable).parent / "ddtree-deploy"),
        *standin_lab.overrides(name, tmp_path, key_file(tmp_path), 31203),
        "algo=ddtree",
        "action=deploy",
    ]
    killed = subprocess.run(
        argv, env={**os.environ, KILL_AT_ENV: "validate.tree"}, capture_output=True, timeout=600
    )
    assert killed.returncode == -9, killed.stderr.decode()[-2000:]
    assert host_state(standin_lab, name)["in_progress"] is not None
    with standin_lab.connect() as host:  # the killed run's lock is still there
        assert host.exists(PurePosixPath(f"/var/lib/ddtree-test/{name}/{LOCK_NAME}"))

    assert deploy(standin_lab, name, tmp_path, 31203, "algo=ddtree") == 0
    latest = max(tmp_path.glob("*-lab-deploy*/events.jsonl"), key=lambda p: p.stat().st_mtime)
    events = [json.loads(line)["event"] for line in latest.read_text().splitlines()]
    assert "lock.stale" in events  # taken over from the killed run of this controller
    report = last_report(tmp_path)
    assert report["decision"] == "promote"
    assert any("left in progress" in note for note in report["notes"])
    assert any("Baseline reused" in note for note in report["notes"])
    state = host_state(standin_lab, name)
    assert (state["algo"], state["in_progress"]) == ("DDTREE", None)
