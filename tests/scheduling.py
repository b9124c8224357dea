"""How pytest-xdist shares the suite out among its workers (scripts/test runs `pytest -n 3`).

xdist's load-scope scheduler hands out units of work; here a unit is

- a whole file of ONE_WORKER_FILES: its tests share one unit or container and run in file order
  (xdist's own `xdist_group` mark cannot do this under pytest 9.2, which ignores the node id it
  rewrites);
- every test of one SGLang release (a release of REAL_RELEASES among its parameters): they
  share work a worker does once per session and release (the release's verify-path check run,
  its patched copy, the RECORD check of its unzipped wheel), which each worker that ran one of
  them would otherwise repeat;
- any other test alone.

Units go out longest first: the files in ONE_WORKER_FILES order, then the release units, then
the single tests in collection order (xdist's own order, by test count, would send the release
units first and the long files last). A worker still running a file is given another kind of
unit while there is one, so two long files never queue on one worker.
"""

from __future__ import annotations

from collections import OrderedDict

import pytest
from patching.trees import REAL_RELEASES
from xdist.scheduler import LoadScopeScheduling
from xdist.workermanage import WorkerController

# Longest first (measured on a loaded 2-core machine, 2026-12-07; docs/setup-and-tests.md).
ONE_WORKER_FILES = (
    # the fault tests share one unit, rolled back to linear DFlash after each (about 15 min)
    "tests/validate/test_validated_deploy.py",
    # the sweeps share one unit, each starting from what the previous left (about 15 min)
    "tests/validate/test_tune.py",
    # one container (its module fixture) for the timer tests, not one per worker
    "tests/watch/test_watch_lab.py",
    # one unit per fleet host, the rollouts in file order (about 7 min)
    "tests/fleet/test_fleet_hosts.py",
    # one test: two deploys, two routine and one full re-validation (minutes); sent last in
    # collection order, it would keep one worker busy after the others are done
    "tests/watch/test_watch_baseline_lab.py",
    # one test: a clone, its venv and a validated deploy from it (minutes)
    "tests/validate/test_checkout_under_tmp.py",
    # its module fixture builds the wheel in the checkout's build/: two workers raced there
    "tests/cli/test_packaging.py",
)
_RELEASES = frozenset(REAL_RELEASES)


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its file, its release (`release 0.5.14`), or itself."""
    path, _, rest = nodeid.partition("::")
    if path in ONE_WORKER_FILES:
        return path
    params = rest.partition("[")[2].rstrip("]")
    release = next((p for p in params.split("-") if p in _RELEASES), None)
    return f"release {release}" if release else nodeid


def rank(unit: str) -> int:
    """Where a unit goes in the queue: the files in their order, then releases, then the rest."""
    if unit in ONE_WORKER_FILES:
        return ONE_WORKER_FILES.index(unit)
    return len(ONE_WORKER_FILES) + (0 if unit.startswith("release ") else 1)


def next_unit(queue: list[str], running_a_file: bool) -> str:
    """The unit a worker gets next: the queue's first, or for a worker that still runs a file,
    the first that is not a file (when there is one)."""
    if running_a_file:
        other = next((unit for unit in queue if unit not in ONE_WORKER_FILES), None)
        if other is not None:
            return other
    return queue[0]


class FileAndReleaseScheduling(LoadScopeScheduling):
    """xdist's load-scope scheduler with this suite's units (`unit_of`) and order (`rank`)."""

    def __init__(self, config: pytest.Config, log: object = None) -> None:
        super().__init__(config, log)
        self._ordered = False

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)

    def _assign_work_unit(self, node: WorkerController) -> None:
        if not self._ordered:  # the queue is built in collection order (loadscopereorder off)
            ordered = sorted(self.workqueue.items(), key=lambda item: rank(item[0]))
            self.workqueue = OrderedDict(ordered)
            self._ordered = True
        running_a_file = any(
            unit in ONE_WORKER_FILES and not all(tests.values())
            for unit, tests in self.assigned_work[node].items()
        )
        chosen = next_unit(list(self.workqueue), running_a_file)
        self.workqueue.move_to_end(chosen, last=False)
        super()._assign_work_unit(node)


def make_scheduler(config: pytest.Config, log: object) -> LoadScopeScheduling:
    """The scheduler for `pytest_xdist_make_scheduler`; the queue keeps collection order so
    that `rank` alone decides it."""
    config.option.loadscopereorder = False
    return FileAndReleaseScheduling(config, log)
