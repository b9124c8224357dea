"""host_counters.py on this machine's real kernel counters, and the noise table that reads them."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).parent))  # run.py's siblings import each other as scripts
from host_counters import pass_counters, sample
from tables import noise_table, render_table


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def test_a_pass_names_the_busiest_watched_process_and_its_cpu_share() -> None:
    me = psutil.Process()
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        pids = [idle.pid, me.pid, 2**22 + 7]  # the last: no such process
        cpu_before, wall_before = sum(me.cpu_times()[:2]), time.monotonic()
        before = sample(pids)
        assert set(before.processes) == {idle.pid, me.pid}
        _spin(0.4)
        figures = pass_counters(before, sample(pids))
        share = 100 * (sum(me.cpu_times()[:2]) - cpu_before) / (time.monotonic() - wall_before)
    finally:
        idle.kill()
        idle.wait()
    assert figures["hot_process"] == me.name()
    # what this process got of a CPU, however loaded the machine is (ticks round; at most one CPU)
    assert 0 < figures["hot_cpu_pct"] <= 110
    assert abs(figures["hot_cpu_pct"] - share) < 15
    assert figures["hot_preempted_per_s"] >= 0
    assert 0 <= figures["steal_pct"] <= 100
    assert figures["cpus_busy"] > 0.2


def test_a_process_gone_before_the_pass_ends_is_not_the_busiest(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    before = sample([child.pid])
    child.kill()
    child.wait()
    figures = pass_counters(before, sample([child.pid]))
    assert figures["hot_process"] is None and figures["hot_cpu_pct"] is None


def test_samples_out_of_order_are_refused() -> None:
    first = sample([])
    with pytest.raises(ValueError, match="after the first"):
        pass_counters(sample([]), first)


def _passes(rounds: int, steal: list[float], *, host: bool = True) -> list[dict[str, object]]:
    """Three servers' passes at 32 in flight: DFLASH at 500 tok/s, the others 1% apart, each
    pass slowed by 2% per point of its steal (a round's passes take steal[i], steal[i+1]...)."""
    passes: list[dict[str, object]] = []
    i = 0
    for rnd in range(rounds):
        for name, speed in (("dflash", 500.0), ("dflash_control", 505.0), ("ddtree_shadow", 495.0)):
            stolen = steal[i % len(steal)]
            i += 1
            figures = {"steal_pct": stolen, "cpus_busy": 3.0, "hot_cpu_pct": 99.0 - stolen,
                       "hot_preempted_per_s": None}  # fmt: skip
            passes.append({"algo": name, "round": rnd, "concurrency": 32, "gates": {},
                           "tokens_per_s": speed * math.exp(-0.02 * stolen),
                           **({"host": figures} if host else {})})  # fmt: skip
    return passes


def test_the_noise_table_shows_how_much_of_the_spread_a_host_counter_explains() -> None:
    steal = [0.0, 3.0, 1.0, 4.0, 0.5, 2.0, 5.0]
    header, _, row = noise_table(_passes(6, steal))
    assert header.startswith("| in flight | rounds x servers | pass sd, log tok/s |")
    cells = row.strip("| ").split(" | ")
    assert cells[:2] == ["32", "5 x 3"]  # round 0 left out
    assert float(cells[2].rstrip("%")) > 1.0  # the spread steal made
    assert cells[4] == "-1.00 (0.00%)"  # steal explains all of it
    assert cells[5] == "-"  # busy CPUs the same in every pass
    assert cells[6] == "+1.00 (0.00%)"  # the scheduler's share follows steal here
    assert cells[7] == "-"  # not recorded


def test_a_counter_that_varies_by_server_alone_explains_nothing_it_can_show() -> None:
    passes = _passes(4, [0.0, 3.0, 1.0, 4.0])
    for p in passes:  # busy CPUs: 1, 2 or 3 by server, the same every round
        p["host"]["cpus_busy"] = {"dflash": 1.0, "dflash_control": 2.0}.get(p["algo"], 3.0)
    assert noise_table(passes)[2].split(" | ")[5] == "-"


def test_the_noise_table_needs_host_counters_and_three_rounds() -> None:
    assert noise_table(_passes(6, [0.0, 3.0, 1.0], host=False)) == []
    assert noise_table(_passes(3, [0.0, 3.0, 1.0, 4.0])) == []  # rounds 1 and 2 only
    table = render_table({"release": "0.5.11", "steps": [], "cells": [],
                          "overhead": _passes(4, [0.0, 3.0, 1.0, 4.0])})  # fmt: skip
    assert "| in flight | rounds x servers |" in table


def test_the_noise_table_reads_the_counters_the_gpu_lab_recorded() -> None:
    """Run 21's second call (recorded as run.py wrote it on an H100): 11 full rounds of three
    servers at 32 in flight, every counter recorded."""
    recorded = Path(__file__).parent / "recorded" / "run21-0.5.11-h100-call2-overhead.json"
    *_, row = noise_table(json.loads(recorded.read_text())["overhead"])
    cells = row.strip("| ").split(" | ")
    assert cells[:2] == ["32", "11 x 3"]
    assert all(cell != "-" for cell in cells[4:])
