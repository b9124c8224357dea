"""The one error tree of ddtree-deploy.

Every expected failure is a `DeployError`: its `str` is the one sentence the user reads (what is
wrong, where, what to do), `hint` is an optional second line, and `exit_code` tells scripts which
family failed. Only `cli` catches these; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Every exit code of ddtree-deploy, the one place they are numbered (the README's "Exit
    codes" and docs/troubleshooting.md say what to do about each)."""

    OK = 0
    FAILED = 1  # an expected failure of no family below
    DRIFT = 1  # action=status found drift
    CONFIG = 2
    HOST = 3  # unreachable, or a command on it failed
    PREFLIGHT_REFUSED = 4
    PATCH_SET = 5  # no reviewed patch set for the release, or a bad one
    DRIFTED_FILE = 6  # an SGLang file that matches neither side, or a unit that fails lint
    BUILD_OR_START = 7  # the kernels did not build or pass their smoke test; the unit did not start
    NOTHING_TO_ROLL_BACK = 8
    HOST_BUSY = 9
    VALIDATION_FAILED = 10  # a gate failed (and the host was rolled back)
    VALIDATION_PAUSED = 11
    NO_WINNER = 12  # action=tune: no candidate passed
    WATCH_ALERT = 13  # a re-validation failed under watch.policy=alert
    INTERRUPTED = 130  # Ctrl-C


class DeployError(Exception):
    """An expected failure with a user-facing sentence."""

    exit_code: int = ExitCode.FAILED

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class ConfigError(DeployError):
    """The composed configuration is malformed or inconsistent."""

    exit_code = ExitCode.CONFIG


class HostError(DeployError):
    """A host could not be reached or a command on it failed."""

    exit_code = ExitCode.HOST


class UnreachableHost(HostError):
    """The host did not answer (DNS, refused, timeout, authentication)."""


class CommandFailed(HostError):
    """A command on a host exited non-zero where success was required."""


class PreflightRefused(DeployError):
    """The host does not match its configuration; nothing was touched."""

    exit_code = ExitCode.PREFLIGHT_REFUSED
