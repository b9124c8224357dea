"""`fleet=... action=status`: each host's generation, algorithm, last verdict, acceptance and drift
in one table (the hosts' statuses as `rollout.status.host_status` builds them)."""

from __future__ import annotations

import pytest

from ddtree_deploy.report import console, render
from ddtree_deploy.rollout.status import HostStatus, _last_verdict


def _status(host: str, **fields: object) -> HostStatus:
    base: dict[str, object] = dict(
        host=host, service_managed=True, generation=3, lineage=(1, 3), algo="DDTREE",
        summary="DDTREE tree, budget 15, topk 4", unit="sglang.service",
        unit_state="active (running)", enabled="enabled", interrupted=None, pending_restart=(),
        patch_set="0.5.11: applied", patch_files=(), kernels="k installed", drift=(),
        locked_by=None,
    )  # fmt: skip
    return HostStatus(**{**base, **fields})  # type: ignore[arg-type]


def test_fleet_status_table_shows_verdict_acceptance_and_drift_per_host(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(console.stdout, "width", 300)
    drifted = "NVIDIA driver changed since the last passed validation: 550.54 -> 560.35"
    rows = [
        ("gpu1", _status("gpu1", last_verdict="passed 2026-12-07 04:00 UTC", acceptance=4.236), "ok", ""),
        ("gpu2", _status("gpu2", generation=5, algo="DFLASH", summary="linear DFLASH",
                         last_verdict="failed 2026-12-07 05:00 UTC", acceptance=1.0,
                         drift=(drifted,), fingerprint_drift=(drifted,)), "drift", ""),
        ("gpu3", None, "unreachable", "Cannot reach gpu3"),
    ]  # fmt: skip
    render.fleet_status_table("lab", rows)
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if "│ host" in line or "┃ host" in line)
    assert [c.strip() for c in header.split("┃")[1:-1]] == [
        "host", "gen", "algorithm", "unit", "patch set", "kernels", "last validation",
        "accept", "drift", "lock",
    ]  # fmt: skip
    cells = {
        row[0]: row
        for line in lines
        if (row := [c.strip() for c in line.split("│")[1:-1]]) and row[0].startswith("gpu")
    }
    assert cells["gpu1"][6:9] == ["passed 2026-12-07 04:00 UTC", "4.24", "none"]
    assert cells["gpu2"][1] == "5"
    assert cells["gpu2"][6:9] == ["failed 2026-12-07 05:00 UTC", "1.00", drifted]
    assert cells["gpu3"][1:3] == ["-", "-"]


def test_last_verdict_reads_the_state_metrics() -> None:
    assert _last_verdict({}) is None
    state = {"watch": {"last": {"passed": False, "timestamp": 1796616000.0}}}
    assert _last_verdict(state) == "failed 2026-12-07 04:00 UTC"
