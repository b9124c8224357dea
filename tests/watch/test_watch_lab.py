"""The re-validation timer on a systemd container that runs the stand-in as its SGLang unit.

The stand-in (TEST DOUBLE: real SGLang cannot serve on a CPU, see tests/standin/server.py) is
deployed through the real gates from this machine over SSH; the timer and its oneshot service
run ddtree-deploy inside the container, from this checkout's venv bound in read-only (the
"installed on the host" of docs/watch.md). Regressions are planted as an operator's change
would arrive: a systemd drop-in that sets the stand-in's STANDIN_FAULT, then a restart; it is
cleared without one where the next step restarts the unit anyway or the unit serves no more.
One worker runs the file (ONE_WORKER_FILES in tests/scheduling.py): the timer test and the lock
test share one unit, deployed once (`rollback_unit`).
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from hostlab import ensure_rootfs
from hostlab.nspawn import boot_container
from standin.lab import MODEL_DIR, binds
from validate.conftest import StandinLab, key_file

from ddtree_deploy.cli import main
from ddtree_deploy.hosts.lock import host_lock
from ddtree_deploy.hosts.ssh import SshHost
from ddtree_deploy.rollout.generations import GenerationStore
from ddtree_deploy.service import systemd

pytestmark = pytest.mark.nspawn

REPO = Path(__file__).resolve().parents[2]
COMMAND = str(Path(sys.executable).parent / "ddtree-deploy")  # this checkout's, bound in


@pytest.fixture(scope="module")
def watch_lab(standin_root: tuple[Path, Path]) -> Iterator[StandinLab]:
    """A stand-in container that also holds this checkout and its venv (read-only)."""
    root, source = standin_root
    venv = Path(sys.prefix)
    own = [REPO, venv, Path(sys.base_prefix)]
    shared = [Path(p.read_text().strip()) for p in venv.glob("lib/python*/site-packages/*.pth")
              if p.read_text().strip().startswith("/") and Path(p.read_text().strip()).is_dir()]  # fmt: skip
    wanted = [*(p for p in binds(root, source) if p != root), *own, *shared]
    read_only = [p for p in dict.fromkeys(wanted) if not any(q in p.parents for q in wanted)]
    container = boot_container(ensure_rootfs(), binds_ro=read_only, overlays=[root])
    try:
        lab = StandinLab(container.host, root / "venv")
        from standin.models import model_configs

        with lab.connect() as host:
            for relative, text in model_configs().items():
                host.write_atomic(PurePosixPath(MODEL_DIR) / relative, text)
        yield lab
    finally:
        container.stop()


def _deploy(lab: StandinLab, name: str, tmp: Path, port: int, *extra: str) -> int:
    # The stand-in's tree runs about 1.05-1.3x its chain on two loaded cores: the speed floor
    # (tested in tests/validate) is not what these tests judge, so it cannot fail them.
    watch = [f"watch.command={COMMAND}", "watch.accuracy=1s", "validation.min_speedup=0.5"]
    return main([*lab.overrides(name, tmp, key_file(tmp), port), *watch, "action=deploy", *extra])


def _state(host: SshHost, name: str) -> dict[str, Any]:
    return GenerationStore(host, PurePosixPath(f"/var/lib/ddtree-test/{name}")).store.load()


def _counters(host: SshHost, name: str) -> dict[str, int]:
    counters: dict[str, int] = _state(host, name)["watch"]["counters"]
    return counters


def _dropin(name: str) -> PurePosixPath:
    return PurePosixPath(f"/etc/systemd/system/{name}.service.d/fault.conf")


def _plant(host: SshHost, name: str, fault: str) -> None:
    """Set the stand-in's fault through a drop-in, and restart the unit."""
    host.write_atomic(_dropin(name), f"[Service]\nEnvironment=STANDIN_FAULT={fault}\n")
    systemd.daemon_reload(host)
    # The run's polled gates wait for /health, as they do after a deploy's restart.
    host.run(["systemctl", "restart", "--", f"{name}.service"])


def _clear(host: SshHost, name: str) -> None:
    """Remove the fault's drop-in without a restart: the unit's next start runs without it (a
    fault applies to DDTREE only, so a unit rolled back to linear DFlash is healthy with it)."""
    host.run(["rm", "-f", "--", str(_dropin(name))])
    systemd.daemon_reload(host)


def _stop_timer(host: SshHost, name: str) -> None:
    """Stop the timer and wait out a run it started (stopping a timer leaves its run going)."""
    host.run(["systemctl", "stop", "--", f"ddtree-watch-{name}.timer"])
    deadline = time.monotonic() + 300
    while systemd.unit_state(host, f"ddtree-watch-{name}.service").active_state == "activating":
        assert time.monotonic() < deadline, "the timer's last run did not end in 300 s"
        time.sleep(1)


def _watch_run(host: SshHost, name: str) -> tuple[int, str]:
    """Run the timer's service now (`systemctl start` waits for a oneshot); (exit, journal)."""
    unit = f"ddtree-watch-{name}.service"
    since = host.run(["date", "+%Y-%m-%d %H:%M:%S"]).stdout.strip()
    host.run(["systemctl", "start", "--", unit], check=False, timeout_s=900)
    status = systemd.unit_state(host, unit).exec_main_status
    journal = host.run(
        ["journalctl", "-u", unit, "--since", since, "--no-pager", "-o", "cat"], check=False
    ).stdout
    return status, journal


@pytest.fixture(scope="module")
def rollback_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`watch-rollback`'s deploy folder: a deploy of the same config must name the same paths."""
    return tmp_path_factory.mktemp("watch-rollback")


@pytest.fixture(scope="module")
def rollback_unit(watch_lab: StandinLab, rollback_tmp: Path) -> str:
    """`watch-rollback`: linear DFlash, then DDTREE with a 4 s timer under watch.policy=rollback.

    The watch-only deploy test (first in the file) moves its interval to 5 s; the timer test
    (next) leaves it rolled back to linear DFlash with the timer
    stopped; the lock test runs on whatever it serves, its timer stopped."""
    name, tmp = "watch-rollback", rollback_tmp
    assert _deploy(watch_lab, name, tmp, 31301, "algo=dflash") == 0
    extra = ["watch.interval=4s", "watch.policy=rollback"]
    assert _deploy(watch_lab, name, tmp, 31301, "algo=ddtree", *extra) == 0
    return name


def test_a_deploy_that_changes_only_the_watch_rerenders_its_timer_and_restarts_nothing(
    watch_lab: StandinLab, rollback_unit: str, rollback_tmp: Path
) -> None:
    """The config hash leaves `watch.*` out, so such a deploy finds the host already at its
    config; it used to leave the old timer, interval and policy in place."""
    name = rollback_unit
    with watch_lab.connect() as host:
        pid = systemd.unit_state(host, f"{name}.service").main_pid
    extra = ["algo=ddtree", "watch.interval=5s", "watch.policy=rollback"]
    assert _deploy(watch_lab, name, rollback_tmp, 31301, *extra) == 0
    with watch_lab.connect() as host:
        timer = host.run(["systemctl", "cat", "--", f"ddtree-watch-{name}.timer"]).stdout
        assert "OnUnitActiveSec=5s" in timer
        assert systemd.unit_state(host, f"ddtree-watch-{name}.timer").active_state == "active"
        assert systemd.unit_state(host, f"{name}.service").main_pid == pid  # nothing restarted


def test_timer_fires_on_schedule_and_rolls_back_an_acceptance_collapse(
    watch_lab: StandinLab, rollback_unit: str
) -> None:
    name = rollback_unit
    with watch_lab.connect() as host:
        assert systemd.unit_state(host, f"ddtree-watch-{name}.timer").active_state == "active"
        pid = systemd.unit_state(host, f"{name}.service").main_pid
        deployed = _counters(host, name)["runs"]
        deadline = time.monotonic() + 240
        while _counters(host, name)["runs"] < deployed + 2 and time.monotonic() < deadline:
            time.sleep(1)
        assert _counters(host, name)["runs"] >= deployed + 2, "the timer did not fire twice"
        assert _counters(host, name)["failures"] == 0
        assert systemd.unit_state(host, f"{name}.service").main_pid == pid  # nothing restarted
        journal = host.run(
            ["journalctl", "-u", f"ddtree-watch-{name}.service", "--no-pager"]
        ).stdout
        assert "still passes every gate" in journal

        _stop_timer(host, name)
        _plant(host, name, "acceptance_collapse")
        status, journal = _watch_run(host, name)
        assert status == 10, journal
        assert "Re-validation gate acceptance failed" in journal
        assert "acceptance collapsed" in journal
        state = _state(host, name)
        assert (state["algo"], state["watch"]["counters"]["rollbacks"]) == ("DFLASH", 1)
        assert "which passed the health gates" in journal
        _clear(host, name)


def test_alert_only_reports_a_wrong_token_and_a_changed_fingerprint_revalidates_in_full(
    watch_lab: StandinLab, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name = "watch-alert"
    assert _deploy(watch_lab, name, tmp_path, 31302, "algo=dflash") == 0
    extra = ["watch.interval=1h", "watch.policy=alert"]
    assert _deploy(watch_lab, name, tmp_path, 31302, "algo=ddtree", *extra) == 0
    overrides = watch_lab.overrides(name, tmp_path, key_file(tmp_path), 31302)
    with watch_lab.connect() as host:
        _plant(host, name, "tree_divergence")
        generation = _state(host, name)["generation"]
        status, journal = _watch_run(host, name)
        assert status == 13, journal
        assert "Re-validation gate tree failed" in journal
        assert "emitted a token the target does not choose" in journal
        assert "Nothing was changed (watch.policy=alert)" in journal
        state = _state(host, name)
        assert (state["algo"], state["generation"]) == ("DDTREE", generation)
        assert state["watch"]["counters"]["failures"] == 1
        assert state["watch"]["counters"]["rollbacks"] == 0
        _clear(host, name)  # the full run below restarts the unit (linear, shadow, tree)

        # A changed drafter config: status shows it; the next run re-validates in full.
        config = PurePosixPath(MODEL_DIR) / "draft" / "config.json"
        data = json.loads(host.read_text(config) or "{}")
        host.write_atomic(config, json.dumps({**data, "_revision": "b"}, indent=1))
        capsys.readouterr()
        assert main([*overrides, "action=status"]) == 1
        assert "drafter config.json" in capsys.readouterr().out
        status, journal = _watch_run(host, name)
        assert status == 0, journal
        events = host.run(
            ["sh", "-c", f"cat /var/lib/ddtree-test/{name}/watch/runs/*/events.jsonl"]
        ).stdout
        assert '"event": "watch.full"' in events
        state = _state(host, name)
        assert state["algo"] == "DDTREE"
        assert state["generation"] == generation + 2  # back to linear, then new shadow and tree
        assert main([*overrides, "action=status"]) == 0  # the new fingerprint is the proven one

        # watch.policy=pause: reported, nothing changed, and the timer stops itself.
        _plant(host, name, "tree_divergence")
        timer = f"ddtree-watch-{name}.timer"
        assert systemd.unit_state(host, timer).active_state == "active"
        config = f"/var/lib/ddtree-test/{name}/watch/config.yaml"
        env = shlex.quote(f"/etc/ddtree-deploy/{name}.env")
        run = shlex.join([COMMAND, "--from", config, "action=revalidate", "watch.policy=pause"])
        paused = host.run(["sh", "-c", f"set -a; . {env}; {run}"], check=False, timeout_s=600)
        assert paused.exit_code == 11, paused.stderr
        assert f"{timer} is stopped (watch.policy=pause)" in " ".join(paused.stderr.split())
        assert systemd.unit_state(host, timer).active_state == "inactive"
        assert _state(host, name)["algo"] == "DDTREE"
        _clear(host, name)


def test_a_run_never_starts_beside_a_deploy_or_another_run(
    watch_lab: StandinLab, rollback_unit: str
) -> None:
    name = rollback_unit
    with watch_lab.connect() as host:
        _stop_timer(host, name)  # only this test's runs
        runs = _counters(host, name)["runs"]
        with host_lock(host, PurePosixPath(f"/var/lib/ddtree-test/{name}"), "deploy"):
            status, journal = _watch_run(host, name)
        assert status == 9, journal  # SuccessExitStatus: the unit did not fail
        assert "deploy" in journal
        assert systemd.unit_state(host, f"ddtree-watch-{name}.service").active_state != "failed"
        assert _counters(host, name)["runs"] == runs
        config = f"/var/lib/ddtree-test/{name}/watch/config.yaml"
        # As the timer's service runs it: with the API key from the unit's env file.
        env = shlex.quote(f"/etc/ddtree-deploy/{name}.env")
        run = (
            "set -a; . " + env + "; " + shlex.join([COMMAND, "--from", config, "action=revalidate"])
        )
        both = host.run(["sh", "-c", f"({run}) >/dev/null 2>&1 & a=$!; ({run}) >/dev/null 2>&1; b=$?; wait $a; echo $? $b"], timeout_s=600)  # fmt: skip
        assert sorted(both.stdout.split()) == ["0", "9"]
        assert _counters(host, name)["runs"] == runs + 1
