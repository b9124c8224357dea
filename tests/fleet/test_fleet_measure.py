"""Opt-in measurement (DDTREE_FLEET_MEASURE=1): a validated fleet deploy on 1 and on 3 hosts
beside a single-host run, and a no-op re-deploy of each, on stand-in containers.

Not a test of behaviour (test_fleet_hosts.py is): it prints a table of wall times for the
report and asserts only that every run succeeded. Skipped unless asked, so CI does not pay it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from product_hosts import ssh_host_overrides
from validate.conftest import StandinLab

from ddtree_deploy.cli import main
from fleet.test_fleet_hosts import NAMES, fleet_args, labs, last_recap, runs

__all__ = ["labs", "runs"]  # the module fixtures, shared with test_fleet_hosts.py

pytestmark = [
    pytest.mark.nspawn,
    pytest.mark.skipif(
        os.environ.get("DDTREE_FLEET_MEASURE") != "1", reason="set DDTREE_FLEET_MEASURE=1"
    ),
]


def timed(call: Callable[[], int]) -> float:
    began = time.monotonic()
    assert call() == 0
    return time.monotonic() - began


def with_unit(args: list[str], unit: str, port: int) -> list[str]:
    return [
        *(
            a
            for a in args
            if not a.startswith(("service.unit_name=", "service.port=", "host.state_dir="))
        ),
        f"service.unit_name={unit}",
        f"service.port={port}",
        f"host.state_dir=/var/lib/ddtree-test/{unit}",
    ]


def stop(labs: dict[str, StandinLab], unit: str) -> None:
    for lab in labs.values():
        with lab.connect() as host:
            host.run(["systemctl", "stop", f"{unit}.service"], check=False)


def test_measure_fleet_deploy_on_one_and_three_hosts(
    labs: dict[str, StandinLab], runs: Path
) -> None:
    figures: dict[str, float] = {}
    # Warm-up: every container gets its patches and kernels, so the runs below compare alike.
    warm = with_unit([*fleet_args(labs, runs, batch_size=3), "action=deploy"], "warm", 31270)
    timed(lambda: main(warm))
    stop(labs, "warm")

    lab1 = labs["lab1"]
    single = [
        *(a for a in with_unit(fleet_args(labs, runs), "single", 31271) if a != "fleet=lab"),
        *ssh_host_overrides(lab1.host, "lab1"),
        "action=deploy",
    ]
    figures["single host (host=...), validated deploy"] = timed(lambda: main(single))
    figures["single host (host=...), no-op re-deploy"] = timed(lambda: main(single))
    stop(labs, "single")

    one = {"lab1": labs["lab1"]}
    fleet1 = with_unit([*fleet_args(one, runs), "action=deploy"], "fleet1", 31272)
    figures["fleet of 1, validated deploy"] = timed(lambda: main(fleet1))
    figures["fleet of 1, no-op re-deploy"] = timed(lambda: main(fleet1))
    noop1 = last_recap(runs)["hosts"][0]["wall_s"]
    stop(one, "fleet1")

    fleet3 = with_unit([*fleet_args(labs, runs, batch_size=3), "action=deploy"], "fleet3", 31273)
    figures["fleet of 3 at batch_size=3, validated deploy"] = timed(lambda: main(fleet3))
    figures["fleet of 3 at batch_size=3, no-op re-deploy"] = timed(lambda: main(fleet3))
    per_host = {h["host"]: h["wall_s"] for h in last_recap(runs)["hosts"]}
    stop(labs, "fleet3")

    print("\n| run | wall s |\n|---|---|")
    for label, seconds in figures.items():
        print(f"| {label} | {seconds:.1f} |")
    print(
        f"no-op per host (the host's own run inside the fleet): fleet of 1 {noop1:.1f} s, "
        f"fleet of 3 {per_host}"
    )
    assert set(per_host) == set(NAMES)
