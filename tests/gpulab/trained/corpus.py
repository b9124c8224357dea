"""The training text: the running Python's standard library source, split by file.

It is real code that exists on the GPU machine with no network, and code is what DFlash drafts
best (research doc, section 2). The split is by file and by a hash of the file's relative path,
so it is the same on every machine and run, and no held-out prompt shares a file with training.
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

SKIPPED_DIRS = frozenset({"test", "tests", "idlelib", "site-packages", "dist-packages"})
HELD_OUT_PERCENT = 8


class CorpusError(RuntimeError):
    """Raised when the machine's standard library holds too little source to train on."""


@dataclass(frozen=True)
class Doc:
    """One source file: its path relative to the stdlib root, and its text."""

    name: str
    text: str


@dataclass(frozen=True)
class Corpus:
    """Training and held-out documents, each list in a fixed (hash) order."""

    root: Path
    train: tuple[Doc, ...]
    held_out: tuple[Doc, ...]

    @property
    def train_bytes(self) -> int:
        return sum(len(doc.text.encode()) for doc in self.train)


def _rank(name: str) -> int:
    """A stable pseudo-random number for a relative path (hashlib, not the salted `hash`)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big")


def is_held_out(name: str) -> bool:
    """Whether the file `name` (relative path) belongs to the held-out split."""
    return _rank(name) % 100 < HELD_OUT_PERCENT


def stdlib_root() -> Path:
    """The running Python's standard library folder."""
    return Path(sysconfig.get_paths()["stdlib"])


def source_files(root: Path) -> list[str]:
    """Relative paths of the `.py` files under root outside the skipped folders, sorted."""
    names = []
    for path in root.rglob("*.py"):
        relative = path.relative_to(root)
        if SKIPPED_DIRS.isdisjoint(relative.parts[:-1]):
            names.append(relative.as_posix())
    return sorted(names)


def load_corpus(
    root: Path | None = None, min_bytes: int = 5_000_000, max_train_bytes: int | None = None
) -> Corpus:
    """Read and split the source under root (default: the stdlib).

    Documents are ordered by hash rank, so `max_train_bytes` keeps a deterministic, unbiased
    subset. Raises CorpusError when fewer than `min_bytes` of source are found.
    """
    root = root or stdlib_root()
    train: list[Doc] = []
    held_out: list[Doc] = []
    total = kept = 0
    for name in sorted(source_files(root), key=_rank):
        text = (root / name).read_text(encoding="utf-8", errors="replace")
        size = len(text.encode())
        total += size
        if not text.strip():
            continue
        if is_held_out(name):
            held_out.append(Doc(name, text))
        elif max_train_bytes is None or kept < max_train_bytes:
            train.append(Doc(name, text))
            kept += size
    if total < min_bytes:
        raise CorpusError(
            f"Only {total:,} bytes of Python source under {root} (at least {min_bytes:,} are "
            "needed); run with a Python whose standard library source is installed."
        )
    return Corpus(root, tuple(train), tuple(held_out))
