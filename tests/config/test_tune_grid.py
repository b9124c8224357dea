"""`action=tune`'s grid is checked at compose time: one sentence, exit 2, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddtree_deploy.cli import main
from ddtree_deploy.config import compose_config
from ddtree_deploy.errors import ConfigError
from ddtree_deploy.rollout.tune import candidates


@pytest.mark.parametrize(
    ("override", "sentence"),
    [
        (
            "tune.budgets=[4,64]",
            "tune.budgets=[4, 64] has 64 out of range: SGLang 0.5.11's patch set verifies "
            "between 1 and 63 tree nodes (sglang.ddtree_max_budget; the verify width becomes "
            "budget + 1).",
        ),
        (  # a release that declares no wider verify keeps the block limit
            "sglang.ddtree_max_budget=null",
            "tune.budgets=[4, 31] has 31 out of range: SGLang 0.5.11's patch set verifies "
            "between 1 and block_size - 1 = 15 tree nodes (the verify width stays the block size).",
        ),
        ("tune.budgets=[0,8]", "tune.budgets[0]=0 is out of range: give a number at least 1."),
        ("tune.topks=[2,9]", "tune.topks=[2, 9] has 9 out of range"),
        ("tune.concurrency=[]", "tune.concurrency is empty"),
        (
            "tune.concurrency=[1,0]",
            "tune.concurrency[1]=0 is out of range: give a number at least 1.",
        ),
        ("algo=dflash", "action=tune sweeps DDTREE tree candidates"),
    ],
)
def test_tune_refuses_a_bad_grid_with_one_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], override: str, sentence: str
) -> None:
    budgets = "tune.budgets=[4,31]" if override.startswith("sglang.") else "tune.budgets=[4,8]"
    rc = main(["action=tune", budgets, override, f"rollout.runs_dir={tmp_path}"])
    assert rc == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    assert sentence in lines[0]
    assert "Traceback" not in err


def test_tune_refuses_a_topk_the_tree_kernel_cannot_take() -> None:
    with pytest.raises(ConfigError, match=r"tune.topks=\[8, 17\] has 17 out of range.* at most 16"):
        compose_config(["action=tune", "tune.budgets=[63]", "tune.topks=[8,17]"])


def test_tune_grid_rule_applies_to_action_tune_only() -> None:
    compose_config(["action=plan", "tune.budgets=[99]"])  # other actions ignore the grid


def test_tune_default_grid_skips_topk_above_budget() -> None:
    cfg = compose_config(["action=tune", "tune.budgets=[2,8]", "tune.topks=[2,4]"])
    assert [c.slug for c in candidates(cfg)] == ["b2k2", "b8k2", "b8k4"]


def test_tune_takes_wide_budgets_where_the_release_verifies_them() -> None:
    cfg = compose_config(["action=tune", "tune.budgets=[15,31,63]", "tune.topks=[8]"])
    assert [c.slug for c in candidates(cfg)] == ["b15k8", "b31k8", "b63k8"]
