"""The xdist units and their order (tests/scheduling.py), on xdist's real load-scope scheduler.

The workers are TEST DOUBLES (`FakeWorker`): real ones are processes that run tests; here a test
takes a set number of ticks, so which worker ran what is deterministic.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from scheduling import ONE_WORKER_FILES, make_scheduler, next_unit, unit_of

VALIDATED, TUNE, WATCH, FLEET = ONE_WORKER_FILES[:4]


def test_every_file_the_order_names_exists() -> None:
    """A renamed file would silently lose its place (and its tests their shared worker)."""
    root = Path(__file__).resolve().parents[1]
    assert [path for path in ONE_WORKER_FILES if not (root / path).is_file()] == []


def test_a_test_belongs_to_its_file_its_release_or_itself() -> None:
    assert unit_of(f"{TUNE}::test_tune_promotes_the_best") == TUNE
    assert unit_of("tests/patching/test_audit.py::test_audit[0.5.14]") == "release 0.5.14"
    assert unit_of("tests/x.py::test_y[0.5.11-budget3]") == "release 0.5.11"
    assert unit_of("tests/x.py::test_y[local-ddtree-0.5.17]") == "release 0.5.17"
    # the first known release: 0.5.15.post2 is no release of the suite, 0.5.15.post1 is
    assert unit_of("tests/x.py::test_p[0.5.15.post2-0.5.15.post1-newest]") == "release 0.5.15.post1"
    assert unit_of("tests/x.py::test_z[bound]") == "tests/x.py::test_z[bound]"
    assert unit_of("tests/x.py::test_z") == "tests/x.py::test_z"


def test_a_worker_that_runs_a_file_gets_another_kind_of_unit_while_one_waits() -> None:
    queue = [FLEET, "release 0.5.11", "tests/x.py::test_z"]
    assert next_unit(queue, running_a_file=False) == FLEET
    assert next_unit(queue, running_a_file=True) == "release 0.5.11"
    assert next_unit([FLEET], running_a_file=True) == FLEET


class FakeWorker:
    """TEST DOUBLE for xdist's WorkerController: queues the test indices it is sent and notes
    each batch beside what it still had queued."""

    def __init__(self, name: str, collection: list[str]) -> None:
        self.name = name
        self.gateway = SimpleNamespace(id=name)
        self.collection = collection
        self.queue: list[int] = []
        self.sent: list[tuple[list[str], list[str]]] = []  # (still queued, the new batch)
        self.shutting_down = False

    def send_runtest_some(self, indices: list[int]) -> None:
        ids = self.collection.__getitem__
        self.sent.append(([ids(i) for i in self.queue], [ids(i) for i in indices]))
        self.queue.extend(indices)

    def shutdown(self) -> None:
        self.shutting_down = True


def _run(
    collection: list[str], ticks: dict[str, int], workers: int = 3
) -> tuple[dict[str, list[str]], list[FakeWorker]]:
    """Schedule `collection` on `workers` fake workers, each test taking `ticks[its id]` (1 by
    default): which tests each worker ran, in order, and the workers."""
    config = SimpleNamespace(
        getvalue=lambda name: [f"{workers}*popen"], option=SimpleNamespace(loadscopereorder=True)
    )
    scheduler = make_scheduler(config, None)  # type: ignore[arg-type]
    nodes = [FakeWorker(f"gw{i}", collection) for i in range(workers)]
    for node in nodes:
        scheduler.add_node(node)
        scheduler.add_node_collection(node, collection)
    scheduler.schedule()
    ran: dict[str, list[str]] = {node.name: [] for node in nodes}
    busy_until = {node.name: 0 for node in nodes}
    while any(node.queue for node in nodes):
        node = min((n for n in nodes if n.queue), key=lambda n: busy_until[n.name])
        index = node.queue.pop(0)
        busy_until[node.name] += ticks.get(collection[index], 1)
        ran[node.name].append(collection[index])
        scheduler.mark_test_complete(node, index)
    return ran, nodes


def _file(test: str) -> str | None:
    path = test.split("::")[0]
    return path if path in ONE_WORKER_FILES else None


def test_the_long_files_start_first_on_separate_workers_and_a_release_stays_on_one() -> None:
    files = [f"{path}::test_{n}" for path in (FLEET, WATCH, TUNE, VALIDATED) for n in range(3)]
    releases = [f"tests/{f}.py::test_{t}[0.5.{r}]" for f in "ab" for r in (11, 14) for t in "xy"]
    singles = [f"tests/c.py::test_{n}" for n in range(30)]
    # collection order as pytest gives it: files, release tests and single tests interleaved
    collection = [*singles[:5], *releases[:4], *files[:6], *singles[5:], *releases[4:], *files[6:]]
    ran, workers = _run(collection, {test: 10 for test in files})

    assert [tests[0].split("::")[0] for tests in ran.values()] == [VALIDATED, TUNE, WATCH]
    for path in (VALIDATED, TUNE, WATCH, FLEET):  # each file whole, in order, on one worker
        (mine,) = [[t for t in tests if _file(t) == path] for tests in ran.values() if any(
            _file(t) == path for t in tests)]  # fmt: skip
        assert mine == [t for t in files if _file(t) == path]
    for worker in workers:  # no file queued behind another file's unfinished tests
        for queued, batch in worker.sent:
            new = {_file(t) for t in batch} - {None}
            assert not new or not {_file(t) for t in queued} - {None} - new, (queued, batch)
    owners = {unit_of(t): name for name, tests in ran.items() for t in tests if "[" in t}
    for release in ("release 0.5.11", "release 0.5.14"):
        on = {name for name, tests in ran.items() for t in tests if unit_of(t) == release}
        assert on == {owners[release]}
    assert sorted(t for tests in ran.values() for t in tests) == sorted(collection)
