"""The timer's files: the stored configuration reads back to the deploy's, turned to run on the
host; the units pass `systemd-analyze verify`, their ExecStart quoted for systemd."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path

import pytest

from ddtree_deploy.config import compose_config
from ddtree_deploy.config.schema import GateAccess, Transport
from ddtree_deploy.config.stored import load_stored_config
from ddtree_deploy.errors import ConfigError
from ddtree_deploy.watch.timer import render_watch


def test_stored_config_reads_back_as_the_deploy_turned_to_run_on_the_host(tmp_path: Path) -> None:
    cfg = compose_config(
        ["host=ct200", "algo=ddtree", "service.api_key_file=/etc/key", "watch.policy=alert"]
    )
    files = render_watch(cfg)
    assert "/etc/key" not in files.config_text  # the key is named, never carried
    stored = tmp_path / "config.yaml"
    stored.write_text(files.config_text)
    back = load_stored_config(stored, ["validation.repeats=3"])
    assert back.host.transport is Transport.local and back.host.address is None
    assert back.validation.access is GateAccess.direct
    assert (back.service.api_key_env, back.service.api_key_file) == ("SGLANG_API_KEY", None)
    assert back.action == "revalidate" and back.validation.repeats == 3
    assert back.rollout.runs_dir == "/var/lib/ddtree-deploy/watch/runs"
    unchanged = dataclasses.replace(
        back, host=cfg.host, service=cfg.service, validation=cfg.validation, rollout=cfg.rollout,
        action=cfg.action,
    )  # fmt: skip
    assert dataclasses.replace(unchanged, validation=cfg.validation) == cfg


def test_a_stored_config_that_does_not_fit_is_one_sentence(tmp_path: Path) -> None:
    stored = tmp_path / "config.yaml"
    stored.write_text("algo: {budget: many}\n")
    with pytest.raises(ConfigError, match=r"does not fit this ddtree-deploy at algo.budget \("):
        load_stored_config(stored)
    with pytest.raises(ConfigError, match="cannot be read"):
        load_stored_config(tmp_path / "gone.yaml")


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_units_verify_and_execstart_survives_spaces_and_specifiers(tmp_path: Path) -> None:
    tool = tmp_path / "dd tools 100%" / "ddtree-deploy"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    cfg = compose_config(
        ["host=ct200", f"watch.command={tool}", "watch.interval=90s", "service.unit_name=sg"]
    )
    files = render_watch(cfg)
    assert "OnUnitActiveSec=90s" in files.timer_text
    units = tmp_path / "units"
    units.mkdir()
    (units / files.service_path.name).write_text(files.service_text)
    (units / files.timer_path.name).write_text(files.timer_text)
    done = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(units / files.timer_path.name),
         str(units / files.service_path.name)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    findings = [
        line for line in (done.stdout + done.stderr).splitlines()
        if files.service_path.name in line or files.timer_path.name in line
    ]  # fmt: skip
    assert findings == []


def test_a_watch_command_the_timer_cannot_run_is_refused_in_one_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ddtree_deploy.cli import main

    assert main(["watch.command=ddtree-deploy", f"rollout.runs_dir={tmp_path}"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: watch.command='ddtree-deploy' must be an absolute path without quotes, "
        "backslashes or $ (the timer's ExecStart= runs it); give where ddtree-deploy is "
        "installed on the host, or set watch.enabled=false."
    )
    # Off, it is never run, so never judged.
    assert main(["watch.command=x", "watch.enabled=false", f"rollout.runs_dir={tmp_path}",
                 "action=render"]) != 2  # fmt: skip


def test_the_timer_service_waits_out_a_full_revalidations_three_restarts() -> None:
    """It allowed two model loads while a full re-validation makes three (linear DFlash,
    shadow-linear, tree): slow starts ate the half hour kept for the gates, and systemd could
    kill a passing run."""
    cfg = compose_config(["host=ct200", "service.start_timeout_s=900"])
    timeout = next(
        line
        for line in render_watch(cfg).service_text.splitlines()
        if line.startswith("TimeoutStartSec=")
    )
    assert int(timeout.removeprefix("TimeoutStartSec=")) >= 3 * 900 + 1800  # + the gates' time
