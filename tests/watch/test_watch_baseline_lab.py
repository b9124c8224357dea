"""The re-validation keeps its linear baseline fresh, and keeps `watch.keep_runs` run folders.

On the systemd container that runs the stand-in as its SGLang unit (TEST DOUBLE: real SGLang
cannot serve on a CPU, see tests/standin/server.py), deployed through the real gates from this
machine over SSH; `action=revalidate` runs from here too (the timer's own run on the host is
tests/watch/test_watch_lab.py's), so its run folders are this machine's.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from validate.conftest import StandinLab, key_file

from ddtree_deploy.cli import main
from ddtree_deploy.hosts.ssh import SshHost
from ddtree_deploy.rollout.generations import GenerationStore
from ddtree_deploy.service import systemd

pytestmark = pytest.mark.nspawn

NAME = "watch-baseline"
STATE = PurePosixPath(f"/var/lib/ddtree-test/{NAME}")


def _baseline(host: SshHost) -> tuple[PurePosixPath, dict[str, Any]]:
    """The (one) stored linear-DFlash baseline: its file and what it holds."""
    found = host.run(["sh", "-c", f"ls {STATE}/generations/*/baseline-*.json"]).stdout
    (path,) = [PurePosixPath(line) for line in found.splitlines()]
    data: dict[str, Any] = json.loads(host.read_text(path) or "{}")
    return path, data


def _baseline_time(host: SshHost) -> float:
    """When the stored linear-DFlash baseline was measured."""
    measured_at: float = _baseline(host)[1]["measured_at"]
    return measured_at


def _last_run(runs: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The newest revalidate run's report and events."""
    folder = max(runs.glob("*-revalidate*"))
    events = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]
    return json.loads((folder / "report.json").read_text()), events


def test_a_baseline_older_than_its_max_age_is_measured_again_before_speed_is_judged(
    standin_lab: StandinLab, tmp_path: Path
) -> None:
    overrides = [
        *standin_lab.overrides(NAME, tmp_path, key_file(tmp_path), 31311),
        "watch.enabled=false",
        "watch.keep_runs=1",
        # What is judged here is which baseline the run uses, not the speedup; on a loaded
        # machine the stand-in's CPU time can shrink its tree's margin below the 1.05 default.
        "validation.min_speedup=0.5",
    ]
    assert main([*overrides, "action=deploy", "algo=dflash"]) == 0
    assert main([*overrides, "action=deploy", "algo=ddtree"]) == 0
    with standin_lab.connect() as host:
        generation = GenerationStore(host, STATE).state().generation
        deployed = _baseline_time(host)
        pid = systemd.unit_state(host, f"{NAME}.service").main_pid

    # Younger than watch.baseline_max_age_h: routine, judged against the stored baseline.
    assert main([*overrides, "action=revalidate"]) == 0
    report, events = _last_run(tmp_path)
    baseline = report["phases"][0]
    assert (baseline["name"], baseline["algo"]) == ("baseline", "linear DFlash (stored)")
    assert baseline["gates"][0]["figures"]["measured_at"] == deployed
    assert not [e for e in events if e["event"] == "watch.full"]
    with standin_lab.connect() as host:
        assert GenerationStore(host, STATE).state().generation == generation
        assert systemd.unit_state(host, f"{NAME}.service").main_pid == pid  # not restarted
        # A baseline stored before its time was kept: its generation's creation stands in.
        path, data = _baseline(host)
        del data["measured_at"]
        host.write_atomic(path, json.dumps(data) + "\n", mode=0o600)
        meta = GenerationStore(host, STATE).meta(int(path.parent.name))
        assert meta is not None
    assert main([*overrides, "action=revalidate"]) == 0
    report, events = _last_run(tmp_path)
    assert report["phases"][0]["gates"][0]["figures"]["measured_at"] == meta.created
    assert not [e for e in events if e["event"] == "watch.full"]

    # Older: the run goes back to linear DFlash, measures it again, then shadow and tree.
    assert main([*overrides, "action=revalidate", "watch.baseline_max_age_h=0.0001"]) == 0
    report, events = _last_run(tmp_path)
    assert any("over watch.baseline_max_age_h=0.0001" in note for note in report["notes"])
    (full,) = [e for e in events if e["event"] == "watch.full"]
    assert full["changed"] == [] and "re-validating in full" in full["stale_baseline"]
    assert [p["name"] for p in report["phases"]][:3] == ["baseline", "shadow_linear", "tree"]
    assert report["phases"][0]["algo"] != "linear DFlash (stored)"  # measured, not reused
    with standin_lab.connect() as host:
        state = GenerationStore(host, STATE).state()
        assert (state.algo, state.generation) == ("DDTREE", generation + 2)
        measured = _baseline_time(host)
        assert measured > deployed
        text = host.read_text(STATE / "metrics.prom", sudo=True) or ""
    values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert values["ddtree_baseline_timestamp_seconds"] == measured
    assert values["ddtree_validation_passed"] == 1

    # watch.keep_runs=1: only the last re-validation's folder is left; the deploys' stay.
    assert len(list(tmp_path.glob("*-revalidate*"))) == 1
    assert len(list(tmp_path.glob("*-deploy*"))) == 2
