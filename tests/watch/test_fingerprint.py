"""The fingerprint of what a validation proved, and `action=status`'s drift against it.

On the staging host (host=local): its real SGLang venv (only read) answers the probe; the model
and drafter folders are the test's own, so the test can change them.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from staging import require_staging_venv

from ddtree_deploy.cli import main
from ddtree_deploy.config import compose_config
from ddtree_deploy.config.schema import DeployConfig
from ddtree_deploy.hosts.connection import ShellHost
from ddtree_deploy.hosts.facts import probe_facts
from ddtree_deploy.hosts.local import LocalHost
from ddtree_deploy.patching.manifest import select_patch_set
from ddtree_deploy.rollout.generations import GenerationStore
from ddtree_deploy.rollout.watch_record import record_validated
from ddtree_deploy.watch.fingerprint import drift


def test_drift_names_each_changed_part_with_hashes_shortened() -> None:
    before = {"NVIDIA driver": "550.54", "model config.json": "a" * 64, "kernels": "0.1"}
    after = {"NVIDIA driver": "560.35", "model config.json": "b" * 64, "kernels": "0.1", "x": "1"}
    assert drift(before, after) == [
        "NVIDIA driver changed since the last passed validation: 550.54 -> 560.35",
        "model config.json changed since the last passed validation: aaaaaaaaaaaa -> bbbbbbbbbbbb",
        "x changed since the last passed validation: absent -> 1",
    ]
    assert drift(before, dict(before)) == []


def _generations(cfg: DeployConfig, host: ShellHost) -> GenerationStore:
    return GenerationStore(host, PurePosixPath(cfg.host.state_dir))


def _overrides(tmp_path: Path, venv: Path) -> list[str]:
    for role in ("target", "draft"):
        (tmp_path / role).mkdir(exist_ok=True)
        (tmp_path / role / "config.json").write_text(json.dumps({"role": role}))
    return [
        f"host.sglang_venv={venv}",
        f"host.state_dir={tmp_path / 'state'}",
        f"rollout.runs_dir={tmp_path / 'runs'}",
        f"model.target_path={tmp_path / 'target'}",
        f"model.draft_path={tmp_path / 'draft'}",
    ]


def test_status_shows_no_drift_until_a_fingerprinted_part_changes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    venv = require_staging_venv("0.5.11")  # only read
    overrides = _overrides(tmp_path, venv)
    cfg = compose_config(overrides)
    with LocalHost() as host:
        facts = probe_facts(host, cfg.host.sglang_python)
        recorded = record_validated(cfg, host, facts, _generations(cfg, host))
    sglang_files = {
        f"SGLang file {f.path}" for p in select_patch_set("0.5.11").patches for f in p.files
    }
    assert sglang_files <= set(recorded.parts)
    assert all(recorded.parts[name] for name in sglang_files)  # each file hashed
    assert recorded.parts["SGLang"] == "0.5.11"
    assert recorded.parts["torch"] == f"{facts.torch_version} (CUDA {facts.torch_cuda})"
    assert recorded.parts["drafter path"] == str(tmp_path / "draft")
    assert main([*overrides, "action=status"]) == 0
    capsys.readouterr()

    (tmp_path / "draft" / "config.json").write_text(json.dumps({"role": "another drafter"}))
    state_path = tmp_path / "state" / "state.json"
    state = json.loads(state_path.read_text())
    one_file = sorted(sglang_files)[0]
    state["fingerprint"]["parts"][one_file] = "0" * 64  # as if the file changed since
    state_path.write_text(json.dumps(state))
    assert main([*overrides, "action=status"]) == 1
    assert "drafter config.json" in capsys.readouterr().out
    changed = _status_event(tmp_path)["drift"]
    assert [line.split(" changed since")[0] for line in changed] == [
        one_file,
        "drafter config.json",
    ]
    now = recorded.parts[one_file] or ""
    assert changed[0].endswith(f": 000000000000 -> {now[:12]}")


def _status_event(tmp_path: Path) -> dict[str, Any]:
    """The `status` event of the newest run."""
    newest = max((tmp_path / "runs").iterdir(), key=lambda p: p.stat().st_mtime_ns)
    lines = (newest / "events.jsonl").read_text().splitlines()
    event: dict[str, Any] = next(r for r in map(json.loads, lines) if r["event"] == "status")
    return event


def test_status_reads_no_fingerprint_where_no_validation_recorded_one(tmp_path: Path) -> None:
    venv = require_staging_venv("0.5.11")
    assert main([*_overrides(tmp_path, venv), "action=status"]) == 0
    assert not (tmp_path / "state" / "state.json").exists()
    events = (next((tmp_path / "runs").iterdir()) / "events.jsonl").read_text()
    assert "fingerprint.read" not in events


def test_status_reports_a_fingerprint_it_cannot_read_again_as_drift(tmp_path: Path) -> None:
    venv = require_staging_venv("0.5.11")
    overrides = _overrides(tmp_path, venv)
    cfg = compose_config(overrides)
    with LocalHost() as host:
        record_validated(
            cfg, host, probe_facts(host, cfg.host.sglang_python), _generations(cfg, host)
        )
    gone = [*overrides, f"host.sglang_venv={tmp_path / 'removed-venv'}", "action=status"]
    assert main(gone) == 1
    assert [line.split(":")[0] for line in _status_event(tmp_path)["drift"]] == [
        "the fingerprint could not be read again"
    ]
