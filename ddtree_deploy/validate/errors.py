"""Errors of the validation room (one sentence each, like every `DeployError`)."""

from __future__ import annotations

from ddtree_deploy.errors import DeployError, ExitCode


class ValidationError(DeployError):
    """A validation gate failed or could not run; the deployment was not promoted."""

    exit_code = ExitCode.VALIDATION_FAILED


class ServiceUnreachable(ValidationError):
    """The SGLang HTTP port did not answer (refused, reset, timed out)."""


class BadResponse(ValidationError):
    """SGLang answered, but not with the status or JSON shape its API promises."""
