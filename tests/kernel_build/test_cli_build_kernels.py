"""`action=build-kernels` and the kernels line of `action=plan`, through the real CLI entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddtree_deploy.cli import main
from ddtree_deploy.config import compose_config
from ddtree_deploy.rollout.actions import plan_action


def _events(runs: Path) -> list[str]:
    names = []
    for run in sorted(runs.iterdir()):
        lines = (run / "events.jsonl").read_text().splitlines()
        names.append(" ".join(json.loads(line)["event"] for line in lines))
    return names


def test_build_kernels_action_builds_then_plan_says_ok(
    kernel_venv: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # a cold control cache
    overrides = [
        "host=local",
        f"host.sglang_venv={kernel_venv.parent.parent}",
        f"host.state_dir={tmp_path / 'state'}",
        f"rollout.runs_dir={tmp_path / 'runs'}",
    ]
    before = {s.name: s for s in plan_action(compose_config(overrides)).steps}["kernels"]
    assert before.status == "would_change"
    assert main([*overrides, "action=build-kernels"]) == 0
    assert main([*overrides, "action=build-kernels"]) == 0
    first, second = _events(tmp_path / "runs")
    assert "kernels.cache kernels.build kernels.built" in first
    assert "kernels.built" not in second and "kernels.unchanged" in second
    after = {s.name: s for s in plan_action(compose_config(overrides)).steps}["kernels"]
    assert after.status == "ok"
    assert after.detail.endswith("already installed")
