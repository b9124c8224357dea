"""How often a deploy reads the host's state (`state.json`, `journal.jsonl`) from the host.

A deploy reads the state once at its start and keeps it current with its own writes (issue 46:
at most twice in a deploy; 9 reads before, 6 when nothing changed). Counted on the staging host
(host=local, the README's commands) with a real SGLang 0.5.11 venv of the test's own
(`sglang_venv`), patched and given kernels for real. A systemd host's validated deploy is
counted in tests/validate/test_validated_deploy.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from state_reads import counting_state_reads

from ddtree_deploy.cli import main

MAX_STATE_READS = 2


def test_a_staging_deploy_reads_the_host_state_at_most_twice_also_when_nothing_changes(
    capsys: pytest.CaptureFixture[str], sglang_venv: Path, tmp_path: Path
) -> None:
    state_dir = tmp_path / "state"
    args = [
        "action=deploy",
        f"host.sglang_venv={sglang_venv}",
        f"host.state_dir={state_dir}",
        f"rollout.runs_dir={tmp_path / 'runs'}",
    ]
    for _ in ("changes the host", "finds nothing to do"):
        with counting_state_reads(state_dir) as reads:
            assert main(args) == 0, capsys.readouterr().err
        assert reads["state.json"] <= MAX_STATE_READS, reads
        # The patch step's check and apply each look for an unfinished patch transaction.
        assert reads["journal.jsonl"] <= MAX_STATE_READS, reads
