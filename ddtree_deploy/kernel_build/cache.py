"""The control machine's wheel cache: one folder per ABI key, holding the wheel and its metadata.

It lives on the control machine (default `~/.cache/ddtree-deploy/kernels/`, or under
`$XDG_CACHE_HOME`) because the key fully determines the wheel: one compile serves every host with
the same torch/CUDA/Python/arch, and the cache outlives a host that is reinstalled. Entries are
written to a temp folder and renamed into place, so a killed run never leaves half an entry.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from ddtree_deploy.kernel_build.key import KernelKey

_META = "meta.json"


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ddtree-deploy" / "kernels"


@dataclass(frozen=True)
class CachedWheel:
    """A wheel in the cache: its file and the sha256 recorded when it was stored."""

    path: Path
    sha256: str


class WheelCache:
    """Wheels by `KernelKey.slug` under `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def get(self, key: KernelKey) -> CachedWheel | None:
        """The cached wheel for `key`, or None (also when the entry was damaged or edited)."""
        folder = self.root / key.slug
        try:
            meta = json.loads((folder / _META).read_text())
            path = folder / meta["wheel"]
            data = path.read_bytes()
        except (OSError, ValueError, KeyError):
            return None
        if meta.get("digest") != key.digest or hashlib.sha256(data).hexdigest() != meta["sha256"]:
            return None
        return CachedWheel(path, meta["sha256"])

    @contextmanager
    def building(self, key: KernelKey) -> Iterator[None]:
        """Hold `key`'s build lock (`flock` on `.<slug>.lock`) for the block: the hosts of one ABI
        that a fleet deploys at once, threads or processes, wait for one build and reuse it."""
        self.root.mkdir(parents=True, exist_ok=True)
        with (self.root / f".{key.slug}.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def put(self, key: KernelKey, wheel_name: str, data: bytes, *, built_on: str) -> CachedWheel:
        """Store a wheel for `key`, replacing any entry there."""
        self.root.mkdir(parents=True, exist_ok=True)
        sha256 = hashlib.sha256(data).hexdigest()
        staging = Path(tempfile.mkdtemp(prefix=f".{key.slug}.", dir=self.root))
        try:
            (staging / wheel_name).write_bytes(data)
            meta = {**key.to_dict(), "wheel": wheel_name, "sha256": sha256, "built_on": built_on}
            (staging / _META).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
            folder = self.root / key.slug
            _replace_folder(staging, folder)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return CachedWheel(folder / wheel_name, sha256)


def _replace_folder(new: Path, folder: Path) -> None:
    """Rename `new` to `folder`, first moving an entry already there aside (never removing it in
    place: a reader sees the old entry whole, the new one, or between the renames a miss), holding
    the cache folder's lock (`flock` on the folder itself) for the two renames: without it, writers
    storing one key at once kept overtaking each other between them, and a busy machine starved
    one of them."""
    lock = os.open(folder.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        aside = Path(tempfile.mkdtemp(prefix=f".{folder.name}.old.", dir=folder.parent))
        try:
            with suppress(FileNotFoundError):  # no entry yet
                folder.rename(aside / "entry")
            new.rename(folder)
        finally:
            shutil.rmtree(aside, ignore_errors=True)
    finally:
        os.close(lock)  # closing the descriptor releases the lock
