"""Run one action on one host and write its reports: the one runner that a single-host run
(`cli`) and each host of a fleet (`fleet.driver`, which `cli` hands this runner) go through.

A host of a fleet runs quietly (`show=False`): the same report files in its run folder, nothing
on the console, where the fleet's live table is.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ddtree_deploy.config import DeployConfig
from ddtree_deploy.errors import DeployError
from ddtree_deploy.events import emit, sink_installed
from ddtree_deploy.report import console
from ddtree_deploy.report.outcomes import present, write_validation
from ddtree_deploy.rollout import actions
from ddtree_deploy.rollout.outcomes import ActionRun


def run_action(cfg: DeployConfig, run_dir: Path, *, show: bool) -> ActionRun:
    """Run `cfg.action` on `cfg.host`, write its reports into `run_dir` (a failed validation's
    too) and, with `show`, print its outcome (both by the outcome's own renderer,
    `report.outcomes`); the error it raised is returned, not raised."""
    try:
        with _tune_progress(cfg, show):
            outcome = actions.HANDLERS[cfg.action](cfg)
    except DeployError as err:
        run = ActionRun(None, err)
        if run.record is not None:  # the report is written for failures too
            write_validation(run_dir, run.record, show)
        emit("run.failed", error=str(err), kind=type(err).__name__)
        return run
    present(outcome, cfg, run_dir, show)
    return ActionRun(outcome)


@contextmanager
def _tune_progress(cfg: DeployConfig, show: bool) -> Iterator[None]:
    """A progress bar over the candidates while `action=tune` runs."""
    if cfg.action != "tune" or not show:
        yield
        return
    bar = console.TuneProgress()
    with sink_installed(bar):
        try:
            yield
        finally:
            bar.close()
