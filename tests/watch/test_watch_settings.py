"""The watch's numeric settings are range-checked, and the timer's old run folders are pruned."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddtree_deploy.cli import _prune_watch_runs
from ddtree_deploy.config import compose_config
from ddtree_deploy.errors import ConfigError


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "watch.baseline_max_age_h=0",
            "watch.baseline_max_age_h=0.0 is out of range: give a number above 0 (hours; null "
            "keeps the deploy's baseline for good).",
        ),
        (
            "watch.keep_runs=0",
            "watch.keep_runs=0 is out of range: give a number at least 1 (run folders).",
        ),
    ],
)
def test_watch_settings_out_of_range_are_one_sentence(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        compose_config([override])
    assert str(caught.value) == message
    assert caught.value.exit_code == 2


def test_the_baseline_max_age_can_be_switched_off() -> None:
    assert compose_config(["watch.baseline_max_age_h=null"]).watch.baseline_max_age_h is None
    assert compose_config([]).watch.baseline_max_age_h == 168


def test_pruning_keeps_the_newest_revalidate_folders_of_the_host_and_nothing_else(
    tmp_path: Path,
) -> None:
    names = [
        "20261207-070000-gpu7-revalidate",
        "20261207-080000-gpu7-revalidate",
        "20261207-080000-gpu7-revalidate-2",
        "20261207-080000-gpu7-revalidate-10",  # after -2, though it sorts before it as text
        "20261207-090000-gpu7-revalidate",  # this run
        "20261207-090500-gpu7-revalidate",  # a run started beside it: newer, never removed
        "20261207-060000-gpu7-deploy",
        "20261207-060000-gpu7-x-revalidate",  # another host, whose name ends like this one's
        "20261207-060000-gpu-revalidate",
        "notes-gpu7-revalidate",
    ]
    for name in names:
        (tmp_path / name).mkdir()
        (tmp_path / name / "events.jsonl").write_text("{}\n")
    _prune_watch_runs(tmp_path / "20261207-090000-gpu7-revalidate", "gpu7", keep=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [
            "20261207-080000-gpu7-revalidate-2",  # kept: with -10 and this run, three
            "20261207-080000-gpu7-revalidate-10",
            "20261207-090000-gpu7-revalidate",
            "20261207-090500-gpu7-revalidate",
            "20261207-060000-gpu7-deploy",
            "20261207-060000-gpu7-x-revalidate",
            "20261207-060000-gpu-revalidate",
            "notes-gpu7-revalidate",
        ]
    )
    _prune_watch_runs(tmp_path / "20261207-090000-gpu7-revalidate", "gpu7", keep=1)
    left = sorted(
        p.name
        for p in tmp_path.iterdir()
        if p.name.startswith("2026") and "gpu7-revalidate" in p.name
    )
    assert left == ["20261207-090000-gpu7-revalidate", "20261207-090500-gpu7-revalidate"]
