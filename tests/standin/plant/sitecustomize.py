"""TEST DOUBLE: plants `planted_bug` in one server: put this folder first on its PYTHONPATH.

Python imports `sitecustomize` from sys.path at start, in the server and in every process it
spawns (the scheduler, where verify runs), so with `DDTREE_LAB_PLANTED_BUG=wrong_child` each of
them wraps the walks of `ddtree_kernels.ops` before SGLang loads, and says so on stderr (the lab
looks for that line: a plant that failed would otherwise pass as "the gate missed it"). Without
the variable it changes nothing. Any other `sitecustomize` on the path (the interpreter's own)
still runs after it.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
MARKER = "ddtree lab: planted bug"  # the start of the line the lab looks for in the server log


def _load(name: str, spec: importlib.machinery.ModuleSpec | None) -> ModuleType:
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {name}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _plant(bug: str) -> None:
    planted = _load(
        "planted_bug",
        importlib.util.spec_from_file_location("planted_bug", HERE.parent / "planted_bug.py"),
    )
    if bug not in planted.BUGS:
        raise ValueError(f"DDTREE_LAB_PLANTED_BUG={bug!r}: known bugs are {planted.BUGS}")
    planted.install()
    print(f"{MARKER} {bug} installed in pid {os.getpid()}", file=sys.stderr, flush=True)


def _chain() -> None:
    """Run the sitecustomize this one shadows, if any."""
    others = [p for p in sys.path if p and Path(p).resolve() != HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is not None:
        _load("sitecustomize", spec)


if os.environ.get("DDTREE_LAB_PLANTED_BUG"):
    _plant(os.environ["DDTREE_LAB_PLANTED_BUG"])
_chain()
