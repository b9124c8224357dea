"""Failing starts, automatic rollback, secrets, and runs killed at every step boundary."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest

from ddtree_deploy.hosts.state import HostStateStore
from ddtree_deploy.kernel_build import KernelsStep
from ddtree_deploy.patching.step import PatchStep
from ddtree_deploy.rollout.pipeline import DeployRolledBack, deploy
from ddtree_deploy.rollout.rollback import rollback
from ddtree_deploy.rollout.status import host_status
from ddtree_deploy.service.render import sha256_text
from ddtree_deploy.steps import PlanStatus
from rollout.lab import LabHost, arg, double_record, running_pid

pytestmark = pytest.mark.nspawn

SECRET = "tok-3f9a'\"$HOME;x y"  # quotes, $, ; and a space: every quoting path at once
DRIVER = [sys.executable, str(Path(__file__).with_name("pipeline_driver.py")), "deploy"]


def _cli(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*DRIVER, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "DDTREE_TEST_API_KEY": SECRET, **env},
        timeout=300,
        check=False,
    )


def _no_secret_under(path: Path) -> None:
    for file in path.rglob("*"):
        if file.is_file():
            assert SECRET not in file.read_text(errors="replace"), file


def test_unit_that_fails_to_start_is_reported_with_journal_and_no_secret(
    lab: LabHost, tmp_path: Path
) -> None:
    name = "lc-fail"
    args = [
        *lab.overrides(name, tmp_path),
        "algo=ddtree",
        "service.api_key_env=DDTREE_TEST_API_KEY",
        "+service.environment.DDTREE_DOUBLE_FAIL_ALGO=DDTREE",
        "rollout.rollback_on_failure=false",
    ]
    done = _cli(args)
    assert done.returncode == 7, done.stderr
    assert "failing on purpose" in done.stderr  # the journal lines
    assert "--api-key ***" in done.stderr, done.stderr  # the server logged its argv; masked
    assert SECRET not in done.stdout + done.stderr
    _no_secret_under(tmp_path)
    with lab.connect() as host:
        unit = host.read_text(PurePosixPath(f"/etc/systemd/system/{name}.service"))
        assert unit is not None and SECRET not in unit
        mode = host.run(["stat", "-c", "%a", f"/etc/ddtree-deploy/{name}.env"]).stdout.strip()
        assert mode == "600"


def test_api_key_reaches_the_server_exactly_through_the_env_file(
    lab: LabHost, tmp_path: Path
) -> None:
    name = "lc-secret"
    done = _cli(
        [
            *lab.overrides(name, tmp_path),
            "algo=dflash",
            "service.api_key_env=DDTREE_TEST_API_KEY",
            "service.extra_args=['--weird', 'a b%c$$d\"e\\\\f']",
        ]
    )
    assert done.returncode == 0, done.stderr
    with lab.connect() as host:
        argv = double_record(host, name)["argv"]
    assert arg(argv, "--api-key") == SECRET
    assert arg(argv, "--weird") == 'a b%c$$d"e\\\\f'  # Hydra keeps both backslashes
    assert SECRET not in done.stdout + done.stderr
    _no_secret_under(tmp_path)


def test_failed_deploy_rolls_back_to_previous_generation(lab: LabHost, tmp_path: Path) -> None:
    name = "lc-auto"
    fail = "+service.environment.DDTREE_DOUBLE_FAIL_ALGO=DDTREE"
    with lab.connect() as host:
        deploy(lab.config(name, tmp_path, "algo=dflash", fail), host, api_key=None)
        with pytest.raises(DeployRolledBack, match="Rolled back to generation 1") as caught:
            deploy(lab.config(name, tmp_path, "algo=ddtree", fail), host, api_key=None)
        assert caught.value.hint and "failing on purpose" in caught.value.hint
        assert arg(double_record(host, name)["argv"], "--speculative-algorithm") == "DFLASH"
        status = host_status(lab.config(name, tmp_path), host)
        assert (status.generation, status.algo, status.interrupted) == (1, "DFLASH", None)
        assert status.unit_state == "active (running)"


BOUNDARIES = [
    "preflight",
    "begin",
    "unit.owed",
    "unit.env-written",
    "unit.done",
    "daemon-reload.done",
    "restart.issued",
    "restart.done",
    "commit",
]


# The next run after the kill alternates: finish the deploy, or roll back.
CASES = [(where, ("deploy", "rollback")[i % 2]) for i, where in enumerate(BOUNDARIES)]


@pytest.mark.parametrize(("where", "then"), CASES)
def test_deploy_killed_at_boundary_is_finished_or_undone_by_next_run(
    lab: LabHost, tmp_path: Path, where: str, then: str
) -> None:
    name = f"lc-kill-{BOUNDARIES.index(where)}-{then[0]}"
    base = lab.config(name, tmp_path, "algo=dflash")
    with lab.connect() as host:
        deploy(base, host, api_key=None)
        unit_path = PurePosixPath(f"/etc/systemd/system/{name}.service")
        old_unit = host.read_text(unit_path)
        killed = _cli(
            [*lab.overrides(name, tmp_path), "algo=ddtree"],
            DDTREE_DEPLOY_KILL_AT=where,
        )
        assert killed.returncode == -9, killed.stderr
        # Never a half-written file: the unit is the old one or the new one, whole.
        left = host.read_text(unit_path)
        new_unit = host.read_text(PurePosixPath(f"/var/lib/ddtree-test/{name}/generations/2/unit"))
        assert left in (old_unit, new_unit)
        litter = host.run(["sh", "-c", "ls -a /etc/systemd/system | grep -c tmp || true"])
        assert litter.stdout.strip() == "0"
        # Status tells the stopped run, the steps it got to and what the next run does.
        stopped = host_status(base, host).interrupted
        if where == "preflight":  # before the generation was recorded: nothing changed
            assert stopped is None
        else:
            assert stopped is not None and stopped.what == "deploy of generation 2"
            assert stopped.next_run.startswith("action=deploy finishes generation 2 ")
            assert stopped.next_run.endswith("action=rollback undoes it, back to generation 1.")
            assert ("unit" in stopped.started) is (BOUNDARIES.index(where) > 2)

        if then == "deploy":
            deploy(lab.config(name, tmp_path, "algo=ddtree"), host, api_key=None)
            want_algo, want_generation = "DDTREE", 2
        else:
            rollback(base, host, api_key=None)
            want_algo, want_generation = "DFLASH", 1
        running_pid(host, name)
        assert arg(double_record(host, name)["argv"], "--speculative-algorithm") == want_algo
        status = host_status(base, host)
        assert (status.generation, status.algo) == (want_generation, want_algo)
        assert (status.interrupted, status.pending_restart, status.drift) == (None, (), ())
        unit_text = host.read_text(unit_path)
        assert unit_text is not None
        assert sha256_text(unit_text) == host_state_unit_sha(host, name)


def host_state_unit_sha(host: object, name: str) -> str:
    import json

    from ddtree_deploy.hosts.connection import ShellHost

    assert isinstance(host, ShellHost)
    text = host.read_text(PurePosixPath(f"/var/lib/ddtree-test/{name}/state.json"))
    assert text is not None
    return str(json.loads(text)["unit_sha256"])


@pytest.mark.parametrize("where", ["patch.owed", "patch.done", "kernels.owed", "kernels.done"])
def test_restart_owed_by_a_killed_patch_or_kernels_step_is_paid_by_the_next_run(
    lab: LabHost, tmp_path: Path, where: str
) -> None:
    """SGLang reads its sources and imports the kernels only at start: a run killed after changing
    them must leave a restart owed, or the next run (which finds nothing left to change) would
    keep the old process serving the old code."""
    name = f"lc-owed-{where.replace('.', '-')}"
    base = lab.config(name, tmp_path, "algo=dflash")
    state_dir = PurePosixPath(base.host.state_dir)
    with lab.connect() as host:
        deploy(base, host, api_key=None)
        before = running_pid(host, name)
        if where.startswith("patch"):  # give the patch step work: SGLang back to its wheel
            PatchStep.for_release(
                base.sglang.version, base.host.sglang_python, state_dir, reverting=True
            ).apply(host)
        else:  # give the kernels step work: forget the install, so it is made again
            store = HostStateStore(host, state_dir)
            state = store.load()
            del state["kernels"]
            store.save(state)

        killed = _cli([*lab.overrides(name, tmp_path), "algo=dflash"], DDTREE_DEPLOY_KILL_AT=where)
        assert killed.returncode == -9, killed.stderr
        assert running_pid(host, name) == before  # killed before any restart

        deploy(base, host, api_key=None)
        assert running_pid(host, name) != before  # the owed restart was paid
        status = host_status(base, host)
        assert (status.interrupted, status.pending_restart, status.drift) == (None, (), ())
        patch = PatchStep.for_release(base.sglang.version, base.host.sglang_python, state_dir)
        assert patch.check(host).status is PlanStatus.OK
        assert KernelsStep.from_config(base).check(host).status is PlanStatus.OK
