"""Failures of the kernels step (each a `DeployError`: one sentence, exit code 7)."""

from __future__ import annotations

from ddtree_deploy.errors import DeployError, ExitCode


class KernelBuildError(DeployError):
    """The kernels wheel could not be built, installed or verified; the venv kept what it had."""

    exit_code = ExitCode.BUILD_OR_START


class KernelSourceMissing(KernelBuildError):
    """The `kernels/` source tree is not where the builder looks for it."""


class KernelBuildFailed(KernelBuildError):
    """`pip wheel` failed on the host; the message names the compiler's first error."""


class KernelSmokeFailed(KernelBuildError):
    """The built kernels do not match the reference (or do not import) on the host."""
