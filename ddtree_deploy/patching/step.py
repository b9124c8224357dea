"""The deploy pipeline's patch step: the host's SGLang carries the patch set of its release.

Where SGLang lives is asked of the host's SGLang venv itself (a `find_spec`, no import of
SGLang or torch), so the step works on any host the preflight accepted.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import ClassVar

from ddtree_deploy.events import emit
from ddtree_deploy.hosts.connection import ShellHost
from ddtree_deploy.hosts.state import HostStateStore
from ddtree_deploy.patching.engine import (
    PatchOutcome,
    PatchPlan,
    SetState,
    apply_patch_set,
    plan_patch,
    revert_patch_set,
    site_packages_for,
)
from ddtree_deploy.patching.errors import PackageNotFound
from ddtree_deploy.patching.manifest import PatchSet, select_patch_set
from ddtree_deploy.steps import StepPlan, StepResult

_LOCATE = "import importlib.util as u; s = u.find_spec('{package}'); print(s.origin if s else '')"


def locate_site_packages(host: ShellHost, python: PurePosixPath, package: str) -> PurePosixPath:
    """site-packages of `package` as `python` resolves it; `PackageNotFound` when absent."""
    result = host.run([str(python), "-c", _LOCATE.format(package=package)], check=False)
    origin = result.stdout.strip()
    if not result.ok or not origin:
        raise PackageNotFound(
            f"{package} is not importable by {python} on {host.name}; install the pinned "
            "release into that venv, then run again."
        )
    return site_packages_for(PurePosixPath(origin).parent)


@dataclass(frozen=True)
class PatchStep:
    """Apply the SGLang patch set of the installed release (every file or none).

    With `reverting`, the same step restores RECORD-identical files instead (rollback with
    `rollback.revert_patches=true`).
    """

    name: ClassVar[str] = "patch"
    restarts_service: ClassVar[bool] = True  # SGLang reads its sources only at start
    patch_set: PatchSet
    python: PurePosixPath  # the SGLang venv's interpreter
    state_dir: PurePosixPath
    reverting: bool = False

    @classmethod
    def for_release(
        cls,
        version: str,
        python: PurePosixPath,
        state_dir: PurePosixPath,
        *,
        reverting: bool = False,
    ) -> PatchStep:
        return cls(select_patch_set(version), python, state_dir, reverting)

    def plan(self, host: ShellHost) -> PatchPlan:
        """Every target file's state on the host (what `check` sums up); read-only."""
        return plan_patch(host, self._site(host), self.patch_set, self._store(host), sudo=True)

    def check(self, host: ShellHost) -> StepPlan:
        plan = self.plan(host)
        wanted = SetState.pristine if self.reverting else SetState.applied
        if plan.state is wanted and plan.unfinished is None:
            return StepPlan.ok(f"patch set {self.patch_set.name} is {wanted.value}")
        verb = "restore pristine" if self.reverting else "patch"
        return StepPlan.would_change(
            f"patch set {self.patch_set.name} is {plan.state.value}: {verb} {len(plan.files)} files"
        )

    def apply(self, host: ShellHost) -> StepResult:
        change = revert_patch_set if self.reverting else apply_patch_set
        outcome = change(host, self._site(host), self.patch_set, self._store(host), sudo=True)
        return _result(outcome, "restored" if self.reverting else "patched")

    def _site(self, host: ShellHost) -> PurePosixPath:
        return locate_site_packages(host, self.python, self.patch_set.package)

    def _store(self, host: ShellHost) -> HostStateStore:
        return HostStateStore(host, self.state_dir)


def _result(outcome: PatchOutcome, verb: str) -> StepResult:
    emit(
        f"patch.{outcome.operation.value}",
        patch_set=outcome.plan.patch_set,
        changed=[str(change.path) for change in outcome.changed],
    )
    if not outcome.changed:
        return StepResult.ok(f"patch set {outcome.plan.patch_set}: nothing to do")
    return StepResult.changed(
        f"{verb} {len(outcome.changed)} files of patch set {outcome.plan.patch_set}"
    )
