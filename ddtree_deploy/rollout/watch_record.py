"""What a passed validation leaves for the watch: the fingerprint of what it proved.

`action=deploy` (once its gates promote a generation), `action=validate` and the re-validation
timer call `record_validated`; `action=status` calls `fingerprint_drift`. Both run under the
caller's connection and, for writers, the host's lock.
"""

from __future__ import annotations

import time
from pathlib import PurePosixPath

from ddtree_deploy.config.schema import DeployConfig
from ddtree_deploy.events import emit
from ddtree_deploy.hosts.connection import ShellHost
from ddtree_deploy.hosts.facts import HostFacts
from ddtree_deploy.rollout.generations import GenerationStore
from ddtree_deploy.rollout.preflight import sglang_python
from ddtree_deploy.watch.fingerprint import RecordedFingerprint, drift, read_fingerprint


def record_validated(cfg: DeployConfig, host: ShellHost, facts: HostFacts) -> RecordedFingerprint:
    """Store the host's fingerprint now as the one its current generation's validation proved."""
    parts = read_fingerprint(cfg, host, facts, sglang_python(cfg))
    generations = GenerationStore(host, PurePosixPath(cfg.host.state_dir))
    state = generations.state()
    generation = state["generation"]
    recorded = RecordedFingerprint(parts, generation, round(time.time(), 3))
    state["fingerprint"] = recorded.to_dict()
    generations.journal("fingerprint.recorded", generation=generation)
    generations.store.save(state)
    emit("fingerprint.recorded", generation=generation)
    return recorded


def fingerprint_drift(cfg: DeployConfig, host: ShellHost, facts: HostFacts) -> list[str]:
    """How the host differs from the fingerprint its last passed validation recorded; nothing
    (and no remote read) when none was recorded."""
    state = GenerationStore(host, PurePosixPath(cfg.host.state_dir)).state()
    recorded = RecordedFingerprint.from_state(state)
    if recorded is None:
        return []
    now = read_fingerprint(cfg, host, facts, sglang_python(cfg))
    return drift(recorded.parts, now)
