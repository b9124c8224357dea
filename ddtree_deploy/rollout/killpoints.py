"""Named step boundaries of a deploy or rollback, and the test hook that kills the run at one.

Test hook: with `DDTREE_DEPLOY_KILL_AT=<boundary>` in its environment, the process sends itself
SIGKILL when it reaches that boundary (after emitting the `boundary` event), so tests can prove
that the next run finishes or undoes whatever a killed run left. Unset, it only emits the event.
"""

from __future__ import annotations

import os
import signal

from ddtree_deploy.events import emit

KILL_AT_ENV = "DDTREE_DEPLOY_KILL_AT"


def boundary(name: str) -> None:
    """Mark a step boundary; SIGKILL ourselves here when the test hook names it."""
    emit("boundary", name=name)
    if os.environ.get(KILL_AT_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
