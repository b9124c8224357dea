"""The host's generations state (`HostState`) as `GenerationStore` reads and writes it.

On this machine's own file system (a real `LocalHost`): the store reads `state.json` once, its
writes keep the sections other rooms keep in the same file, and the file reads back as the
record the store holds.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path, PurePosixPath

from state_reads import counting_state_reads

from ddtree_deploy.config import compose_config
from ddtree_deploy.hosts.local import LocalHost
from ddtree_deploy.rollout.generations import (
    GenerationStore,
    HostState,
    InProgress,
    StagedRun,
)

BEFORE = {
    "format": 1,
    "generation": 2,
    "lineage": [1, 2],
    "last_generation": 2,
    "pending_restart": None,
    "in_progress": None,
    "staged_run": None,
    "config_hash": "abc",
    "algo": "DFLASH",
    "summary": "linear DFLASH",
    "unit_sha256": "u",
    "env_sha256": "e",
    "kernels": {"key": "cp311-ref", "digest": "d"},  # the kernels step's
    "watch": {"counters": {"runs": 3}},  # the watch's
}


def test_a_store_reads_the_state_once_and_its_writes_keep_the_other_sections(
    tmp_path: Path,
) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    (state_dir / "state.json").write_text(json.dumps(BEFORE))
    with LocalHost() as host, counting_state_reads(state_dir) as reads:
        store = GenerationStore(host, PurePosixPath(state_dir))
        store.begin_staged("deploy", ["patch", "kernels"])
        store.staged_step_done("patch")
        midway = store.state()
        store.staged_step_done("kernels")
        store.end_staged()
        held = store.state()
    assert reads["state.json"] == 1
    assert midway.staged_run is not None
    assert (midway.staged_run.steps, midway.staged_run.done) == (("patch", "kernels"), ("patch",))
    on_disk = json.loads((state_dir / "state.json").read_text())
    assert on_disk == BEFORE  # the staged run marked and cleared; nothing else touched
    assert HostState.from_dict(on_disk) == held


def test_the_record_round_trips_through_the_file_format() -> None:
    state = dataclasses.replace(
        HostState.from_dict(BEFORE),
        in_progress=InProgress(3, "deploy"),
        staged_run=StagedRun("deploy", ("patch",), (), 1.5),
    )
    assert HostState.from_dict(state.to_dict()) == state
    fresh = HostState().to_dict()  # a host never deployed: no current generation's fields
    assert "config_hash" not in fresh and fresh["lineage"] == []


def test_serves_is_the_one_rule_for_a_host_already_at_its_config() -> None:
    cfg = compose_config(["algo=dflash"])
    committed = HostState(generation=1, lineage=(1,), config_hash=cfg.serving_hash)
    assert committed.serves(cfg)
    assert not dataclasses.replace(committed, in_progress=InProgress(2, "deploy")).serves(cfg)
    assert not HostState().serves(cfg)
    other = compose_config(["algo=ddtree"])
    assert not committed.serves(other)
