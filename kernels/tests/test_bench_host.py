"""benchmarks/bench_host.py on CPU: its DFLASH stand-in keeps DFlash's greedy rule, and the
script runs each server's step end to end (the reference ops; timings mean nothing here)."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch


def test_the_dflash_stand_in_accepts_the_agreeing_prefix_and_the_next_target_token(
    bench: ModuleType,
) -> None:
    chain = torch.tensor([[9, 1, 2, 3], [9, 5, 6, 7], [9, 1, 2, 3]])
    # Row 0 agrees twice then differs; row 1 not at all; row 2 to the end.
    target = torch.tensor([[1, 2, 8, 4], [4, 6, 7, 0], [1, 2, 3, 5]])
    accepted, bonus = bench.dflash_accept(chain, target)
    assert accepted.tolist() == [2, 0, 3]
    assert bonus.tolist() == [8, 4, 5]


def test_the_script_runs_every_server_step_at_each_batch(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--device", "cpu", "--reps", "2", "--hidden", "16", "--vocab", "64", "--batches", "1,2"]
    assert bench.main(argv) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 1 |")
            or line.startswith("| 2 |")]  # fmt: skip
    assert [row.split(" | ")[1] for row in rows] == ["dflash", "shadow_linear", "tree"] * 2
    assert all(row.split(" | ")[3] == "+0.0" for row in rows if "dflash" in row)
    ops = {row.split(" | ")[1]: int(row.split(" | ")[4]) for row in rows[:3]}
    assert 0 < ops["dflash"] < ops["shadow_linear"] < ops["tree"]  # the reference's counts here


def test_dispatched_ops_counts_one_step_after_its_first(bench: ModuleType) -> None:
    calls = []

    def step() -> None:
        if not calls:  # the first step builds a constant: not counted
            torch.arange(4)
        calls.append(torch.ones(2) + torch.ones(2))  # three dispatched ops

    assert bench.dispatched_ops(step) == 3
