"""Errors of the patching room, each a one-sentence `DeployError` with its own exit code.

Two families: `PatchSetError` (exit 5, from `manifest`) when the patch set itself is wrong or does
not fit the release, and `PatchError` (exit 6) when the installed tree on a host cannot be patched
or reverted as it stands. Every error is raised before the first write to the package, except
`TransactionStuck`, which says how a half-finished transaction was left.
"""

from __future__ import annotations

from ddtree_deploy.errors import DeployError, ExitCode
from ddtree_deploy.patching.manifest import PatchSetError


class PatchError(DeployError):
    """The installed package on a host is not in a state this patch set can act on."""

    exit_code = ExitCode.DRIFTED_FILE


class DriftedFile(PatchError):
    """A target file matches neither its pristine nor its patched hash (or the set is mixed)."""


class PackageNotFound(PatchError):
    """The package folder or its wheel RECORD is missing under the given site-packages."""


class PathEscape(PatchError):
    """A target resolves (through a symlink) outside the package folder on the host."""


class TransactionStuck(PatchError):
    """An unfinished transaction can be neither rolled forward nor rolled back."""


class RecordMismatch(PatchSetError):
    """The manifest's pre-image hash disagrees with the installed wheel's RECORD."""


class DiffRejected(PatchSetError):
    """A diff names a path outside the package or a file its manifest entry does not list."""


class HunkFailed(PatchSetError):
    """A hunk's context is not found in the file (fuzz 0), or the result has the wrong hash."""
