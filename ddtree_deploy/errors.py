"""The one error tree of ddtree-deploy.

Every expected failure is a `DeployError`: its `str` is the one sentence the user reads (what is
wrong, where, what to do), `hint` is an optional second line, and `exit_code` tells scripts which
family failed. Only `cli` catches these; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class DeployError(Exception):
    """An expected failure with a user-facing sentence."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class ConfigError(DeployError):
    """The composed configuration is malformed or inconsistent."""

    exit_code = 2


class HostError(DeployError):
    """A host could not be reached or a command on it failed."""

    exit_code = 3


class UnreachableHost(HostError):
    """The host did not answer (DNS, refused, timeout, authentication)."""


class CommandFailed(HostError):
    """A command on a host exited non-zero where success was required."""


class PreflightRefused(DeployError):
    """The host does not match its configuration; nothing was touched."""

    exit_code = 4
