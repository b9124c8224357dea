"""The stand-in's helper process, started the way SGLang starts its scheduler and detokenizer.

TEST DOUBLE support. SGLang's server runs its workers as `multiprocessing` children with the
spawn start method; this helper does nothing but wait for the server to exit. It is there so
that a test of the unit sees what a real server's children get from it: their command line and
their environment. It imports nothing heavy (a spawned child imports its target's module).
"""

from __future__ import annotations

import multiprocessing
from multiprocessing.process import BaseProcess


def start_helper() -> BaseProcess:
    """Start the helper; it exits when this process does."""
    process = multiprocessing.get_context("spawn").Process(
        target=_wait_for_parent, name="standin-helper", daemon=True
    )
    process.start()
    return process


def _wait_for_parent() -> None:
    parent = multiprocessing.parent_process()
    if parent is not None:
        parent.join()  # returns when the parent's end of the spawn pipe closes
