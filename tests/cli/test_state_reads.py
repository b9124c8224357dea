"""How often a deploy reads the host's state (`state.json`, `journal.jsonl`) from the host.

A deploy reads the state once at its start and keeps it; it reads again only where the host may
have changed under it. Counted on the staging host (host=local, the README's commands) with a
real SGLang 0.5.11 venv of the test's own (`sglang_venv`), patched and given kernels for real:
every read of the state folder's files goes through `ShellHost.read_bytes`, which is counted.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path, PurePosixPath

import pytest

from ddtree_deploy.cli import main
from ddtree_deploy.hosts.connection import ShellHost

MAX_STATE_READS = 2  # issue 46: the host state is read from the host at most twice in a deploy


def _deploy_counting_reads(
    monkeypatch: pytest.MonkeyPatch, venv: Path, tmp_path: Path
) -> tuple[int, Counter[str]]:
    state_dir = tmp_path / "state"
    reads: Counter[str] = Counter()
    read_bytes = ShellHost.read_bytes

    def counted(self: ShellHost, path: PurePosixPath, *, sudo: bool = False) -> bytes | None:
        if PurePosixPath(path).parent == PurePosixPath(state_dir):
            reads[PurePosixPath(path).name] += 1
        return read_bytes(self, path, sudo=sudo)

    monkeypatch.setattr(ShellHost, "read_bytes", counted)
    code = main(
        [
            "action=deploy",
            f"host.sglang_venv={venv}",
            f"host.state_dir={state_dir}",
            f"rollout.runs_dir={tmp_path / 'runs'}",
        ]
    )
    monkeypatch.undo()
    return code, reads


def test_a_staging_deploy_reads_the_host_state_at_most_twice_also_when_nothing_changes(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    sglang_venv: Path,
    tmp_path: Path,
) -> None:
    code, first = _deploy_counting_reads(monkeypatch, sglang_venv, tmp_path)
    assert code == 0, capsys.readouterr().err
    code, again = _deploy_counting_reads(monkeypatch, sglang_venv, tmp_path)  # nothing to do
    assert code == 0, capsys.readouterr().err
    for reads in (first, again):  # the patch step's check and apply each read its journal
        assert reads["state.json"] <= MAX_STATE_READS, reads
        assert reads["journal.jsonl"] <= MAX_STATE_READS, reads
