"""The control machine's wheel cache under writers running at once (two deploys of one ABI)."""

from __future__ import annotations

import multiprocessing
import threading
import time
from pathlib import Path

import pytest
from kernel_build.test_key import BASE as KEY

from ddtree_deploy.kernel_build.cache import WheelCache

WHEEL = "ddtree_kernels-0.1.0-cp312-cp312-linux_x86_64.whl"


def _store_many(root: str, writer: int, count: int) -> None:
    cache = WheelCache(Path(root))
    for i in range(count):
        cache.put(KEY, WHEEL, f"writer {writer} build {i}".encode() * 512, built_on="lab")


def test_writers_storing_one_key_at_once_all_succeed_and_leave_one_whole_entry(
    tmp_path: Path,
) -> None:
    context = multiprocessing.get_context("spawn")
    writers = [context.Process(target=_store_many, args=(str(tmp_path), w, 40)) for w in range(3)]
    for process in writers:
        process.start()
    for process in writers:
        process.join(timeout=120)
    assert [p.exitcode for p in writers] == [0, 0, 0]
    cached = WheelCache(tmp_path).get(KEY)
    assert cached is not None and cached.path.read_bytes().startswith(b"writer ")
    assert [p.name for p in tmp_path.iterdir()] == [KEY.slug]  # no temp folder left behind


def test_a_store_overtaken_by_another_writer_at_every_step_still_lands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a busy machine did to CI's run of the test above: each time this writer had moved the
    old entry aside, another writer stored the key before this one's next rename."""
    cache = WheelCache(tmp_path)
    cache.put(KEY, WHEEL, b"first" * 512, built_on="lab")
    entry = tmp_path / KEY.slug
    rivals: list[threading.Thread] = []
    failures: list[BaseException] = []
    rename = Path.rename

    def rival_store() -> None:
        try:
            cache.put(KEY, WHEEL, b"rival" * 512, built_on="rival")
        except BaseException as err:  # reported by the assertion below
            failures.append(err)

    def overtaken_rename(self: Path, target: Path) -> Path:
        moved = rename(self, target)
        if threading.current_thread() is threading.main_thread() and self == entry:
            rival = threading.Thread(target=rival_store)
            rivals.append(rival)
            rival.start()
            rival.join(timeout=0.5)  # the rival runs now, unless it must wait for this store
        return moved

    monkeypatch.setattr(Path, "rename", overtaken_rename)
    stored = cache.put(KEY, WHEEL, b"mine" * 512, built_on="lab")
    for rival in rivals:
        rival.join(timeout=30)
    monkeypatch.undo()

    assert stored.path.parent == entry and failures == []
    cached = WheelCache(tmp_path).get(KEY)
    assert cached is not None and cached.path.read_bytes() in (b"mine" * 512, b"rival" * 512)
    assert [p.name for p in tmp_path.iterdir()] == [KEY.slug]


def test_hosts_of_one_abi_deployed_at_once_build_the_wheel_once(tmp_path: Path) -> None:
    """What the kernels step does per host of a fleet's batch: under the key's build lock, take
    the cached wheel or build and store it; the second host waits and takes the first's."""
    cache = WheelCache(tmp_path)
    built: list[int] = []
    start = threading.Barrier(3)

    def deploy(host: int) -> None:
        start.wait(timeout=10)
        with cache.building(KEY):
            if cache.get(KEY) is None:
                time.sleep(0.3)  # the build: long enough for the others to ask meanwhile
                built.append(host)
                cache.put(KEY, WHEEL, b"wheel" * 512, built_on=f"host{host}")

    threads = [threading.Thread(target=deploy, args=(h,)) for h in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(built) == 1
    assert WheelCache(tmp_path).get(KEY) is not None
