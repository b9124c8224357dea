"""Deploy, redeploy, rollback and status on a real systemd container reached over SSH."""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from ddtree_deploy.events import sink_installed
from ddtree_deploy.hosts.lock import host_lock
from ddtree_deploy.patching.step import PatchStep
from ddtree_deploy.rollout.actions import plan_action, rollback_action
from ddtree_deploy.rollout.pipeline import deploy
from ddtree_deploy.rollout.rollback import rollback
from ddtree_deploy.rollout.status import host_status
from ddtree_deploy.steps import PlanStatus
from rollout.lab import LabHost, arg, double_record, journal_events, running_pid

pytestmark = pytest.mark.nspawn


def test_deploy_second_run_changes_nothing_and_budget_change_restarts_once(
    lab: LabHost, tmp_path: Path
) -> None:
    name = "lc-idem"
    events: list[dict[str, Any]] = []
    with lab.connect() as host:
        with sink_installed(events.append):
            first = deploy(
                lab.config(name, tmp_path, "algo=ddtree", "algo.budget=12"), host, api_key=None
            )
        assert first.generation == 1
        # One probe per run (each imports torch on the host): preflight's facts key the kernels.
        assert [e["event"] for e in events].count("facts.probe") == 1
        # The container's SGLang venv is shared by this session's tests: an earlier test may
        # have patched it and installed the kernels already.
        assert [r.name for r in first.steps[:2]] == ["patch", "kernels"]
        assert {r.status for r in first.steps[:2]} <= {"changed", "ok"}
        # A new unit file is loaded on demand, so the first run needs no daemon-reload.
        assert [r.name for r in first.steps[2:] if r.status == "changed"] == [
            "unit",
            "enable",
            "restart",
        ]
        pid = running_pid(host, name)
        argv = double_record(host, name)["argv"]
        assert arg(argv, "--speculative-algorithm") == "DDTREE"
        assert arg(argv, "--speculative-ddtree-budget") == "12"

        again = deploy(
            lab.config(name, tmp_path, "algo=ddtree", "algo.budget=12"), host, api_key=None
        )
        assert (again.generation, again.changed) == (1, 0)
        assert running_pid(host, name) == pid

        changed = deploy(
            lab.config(name, tmp_path, "algo=ddtree", "algo.budget=8"), host, api_key=None
        )
        assert changed.generation == 2
        assert [r.name for r in changed.steps if r.status == "changed"] == [
            "unit",
            "daemon-reload",
            "restart",
        ]
        assert arg(double_record(host, name)["argv"], "--speculative-ddtree-budget") == "8"
        assert running_pid(host, name) != pid
        assert journal_events(host, name).count("restart.done") == 2


def test_rollback_returns_to_linear_dflash_and_status_reports_it(
    lab: LabHost, tmp_path: Path
) -> None:
    name = "lc-rollback"
    with lab.connect() as host:
        deploy(lab.config(name, tmp_path, "algo=dflash"), host, api_key=None)
        deploy(lab.config(name, tmp_path, "algo=ddtree"), host, api_key=None)
        deploy(lab.config(name, tmp_path, "algo=ddtree", "algo.budget=8"), host, api_key=None)
        assert arg(double_record(host, name)["argv"], "--speculative-algorithm") == "DDTREE"
        restarts = journal_events(host, name).count("restart.done")

        # Past both DDTREE generations to linear DFLASH, in one restart.
        done = rollback_action(
            lab.config(name, tmp_path, "action=rollback", "rollback.to_linear=true")
        )
        assert done.summary is not None and "from generation 3 to generation 1" in done.summary
        assert journal_events(host, name).count("restart.done") == restarts + 1
        argv = double_record(host, name)["argv"]
        assert arg(argv, "--speculative-algorithm") == "DFLASH"
        assert not any(a.startswith("--speculative-ddtree") for a in argv)
        running_pid(host, name)

        status = host_status(lab.config(name, tmp_path), host)
        assert (status.generation, status.algo, status.drift) == (1, "DFLASH", ())
        assert status.unit_state == "active (running)"
        assert status.locked_by is None
        with host_lock(host, PurePosixPath(f"/var/lib/ddtree-test/{name}"), "deploy") as owner:
            assert host_status(lab.config(name, tmp_path), host).locked_by == owner.describe()


def test_rollback_with_revert_patches_restores_pristine_sglang(
    lab: LabHost, tmp_path: Path
) -> None:
    name = "lc-revert"
    with lab.connect() as host:
        deploy(lab.config(name, tmp_path, "algo=dflash"), host, api_key=None)
        deploy(lab.config(name, tmp_path, "algo=ddtree"), host, api_key=None)
        cfg = lab.config(name, tmp_path, "algo=ddtree", "rollback.revert_patches=true")
        state_dir = PurePosixPath(cfg.host.state_dir)
        applied = PatchStep.for_release(cfg.sglang.version, cfg.host.sglang_python, state_dir)
        pristine = PatchStep.for_release(
            cfg.sglang.version, cfg.host.sglang_python, state_dir, reverting=True
        )
        assert applied.check(host).status is PlanStatus.OK

        outcome = rollback(cfg, host, api_key=None)
        assert outcome.to_generation == 1
        assert ("patch", "changed") in [(r.name, r.status) for r in outcome.steps]
        # Pristine means every target hashes to the wheel's RECORD entry again.
        assert pristine.check(host).status is PlanStatus.OK
        assert applied.check(host).status is PlanStatus.WOULD_CHANGE
        assert arg(double_record(host, name)["argv"], "--speculative-algorithm") == "DFLASH"
        running_pid(host, name)


def test_plan_after_deploy_lists_each_step_once_all_ok(lab: LabHost, tmp_path: Path) -> None:
    name = "lc-plan"
    cfg = lab.config(name, tmp_path, "algo=ddtree_shadow")
    with lab.connect() as host:
        deploy(cfg, host, api_key=None)
    outcome = plan_action(cfg)
    assert outcome.exit_code == 0
    assert [s.name for s in outcome.steps] == [
        "patch",
        "kernels",
        "lint",
        "unit",
        "daemon-reload",
        "enable",
        "restart",
    ]
    assert {s.status for s in outcome.steps} == {"ok"}
