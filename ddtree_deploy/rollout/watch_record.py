"""What each validation leaves for the watch: the fingerprint of what a passed one proved, and
the Prometheus metrics of every one.

`action=deploy` (once its gates ran), `action=validate` and `action=revalidate` call
`record_validated` after a pass and `note_validation` after every run; `action=status` calls
`fingerprint_drift` and `metrics_text`. Each takes the action's `GenerationStore`, whose copy of
`state.json` holds the sections kept here (`fingerprint`, `watch`); writers run under the host's
lock.
"""

from __future__ import annotations

import time
from pathlib import PurePosixPath

from ddtree_deploy.config.schema import Algo, DeployConfig
from ddtree_deploy.errors import HostError
from ddtree_deploy.events import emit
from ddtree_deploy.hosts.connection import ShellHost
from ddtree_deploy.hosts.facts import HostFacts
from ddtree_deploy.rollout.generations import GenerationStore
from ddtree_deploy.validate.record import ValidationRecord
from ddtree_deploy.watch.fingerprint import RecordedFingerprint, drift, read_fingerprint
from ddtree_deploy.watch.metrics import exposition, families, fold

METRICS_FILE = "metrics.prom"  # in host.state_dir: what `status output=prometheus` reads


def record_validated(
    cfg: DeployConfig, host: ShellHost, facts: HostFacts, generations: GenerationStore
) -> RecordedFingerprint:
    """Store the host's fingerprint now as the one its current generation's validation proved."""
    parts = read_fingerprint(cfg, host, facts, cfg.host.sglang_python)
    generation = generations.state().generation
    recorded = RecordedFingerprint(parts, generation, round(time.time(), 3))
    generations.journal("fingerprint.recorded", generation=generation)
    generations.store.update({"fingerprint": recorded.to_dict()})
    emit("fingerprint.recorded", generation=generation)
    return recorded


def fingerprint_drift(
    cfg: DeployConfig, host: ShellHost, facts: HostFacts, generations: GenerationStore
) -> list[str]:
    """How the host differs from the fingerprint its last passed validation recorded; nothing
    (and no remote read) when none was recorded, one line when it cannot be read now."""
    recorded = RecordedFingerprint.from_state(generations.store.load())
    if recorded is None:
        return []
    try:
        now = read_fingerprint(cfg, host, facts, cfg.host.sglang_python)
    except HostError as err:  # a venv gone is drift too; status reports it, not fails
        return [f"the fingerprint could not be read again: {err}"]
    return drift(recorded.parts, now)


def note_validation(
    cfg: DeployConfig,
    host: ShellHost,
    record: ValidationRecord,
    generations: GenerationStore,
    *,
    failed: bool,
    drift_parts: int = 0,
) -> str:
    """Fold one validation into the state's metrics and write them out; returns the text.

    Written to `host.state_dir/metrics.prom` and, with `watch.textfile_dir`, to
    `ddtree_<host>.prom` there: each through a temp file renamed over it (the collector reads
    only `*.prom` files, so it never sees half a file)."""
    tree = (
        {"budget": cfg.algo.budget, "topk": cfg.algo.topk}
        if cfg.algo.name is Algo.DDTREE and generations.state().algo == Algo.DDTREE.value
        else None
    )
    watch = fold(
        generations.store.load().get("watch"),
        record.to_dict(),
        failed=failed,
        rolled_back=record.rolled_back_to is not None,
        drift=drift_parts,
        tree=tree,
    )
    generations.store.update({"watch": watch})
    text = exposition(cfg.host.name, families(generations.store.load()))
    host.write_atomic(generations.store.root / METRICS_FILE, text, mode=0o644, sudo=True)
    if cfg.watch.textfile_dir:
        target = PurePosixPath(cfg.watch.textfile_dir) / f"ddtree_{cfg.host.name}.prom"
        host.write_atomic(target, text, mode=0o644, sudo=True)
    emit("watch.metrics", failed=failed, counters=watch["counters"])
    return text


def metrics_text(cfg: DeployConfig, generations: GenerationStore, drift_parts: int) -> str:
    """The host's metrics as its state holds them, with the drift just measured."""
    return exposition(cfg.host.name, families(generations.store.load(), drift=drift_parts))
