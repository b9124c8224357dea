"""A patch set's diffs, checked and grouped per target file, and applied to bytes in memory.

`load_targets` parses every `.patch` of a set with `unidiff` (`-p1` paths, like `patch -p1`),
refuses any diff path outside the package or not listed under its patch's `files:`, and chains
the patches touching one file: the pristine hash is the first patch's pre-image, the applied
hash the last one's post-image, and each patch must start where the previous one ended.
`patch_file` / `unpatch_file` turn pristine bytes into applied bytes and back, checking every
intermediate hash. Nothing here touches a host.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import PurePosixPath

from unidiff.errors import UnidiffParseError
from unidiff.patch import PatchedFile as DiffFile
from unidiff.patch import PatchSet as DiffSet

from ddtree_deploy.patching.errors import DiffRejected, HunkFailed
from ddtree_deploy.patching.hunks import HunkMismatch, HunkOffset, apply_hunks
from ddtree_deploy.patching.manifest import Patch, PatchSet, PatchSetError


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class FileStep:
    """One patch's diff of one file, with the file's hashes before and after it."""

    patch: str
    before: str
    after: str
    diff: DiffFile


@dataclass(frozen=True)
class FileTarget:
    """A file the set changes: its pristine and applied hashes and the diffs between them."""

    path: PurePosixPath  # relative to site-packages
    pristine: str
    applied: str
    steps: tuple[FileStep, ...]

    @property
    def patches(self) -> tuple[str, ...]:
        return tuple(step.patch for step in self.steps)


def load_targets(patch_set: PatchSet) -> tuple[FileTarget, ...]:
    """Every target file of the set, in order of first appearance in the series."""
    steps: dict[PurePosixPath, list[FileStep]] = {}
    for patch in patch_set.patches:
        for path, step in _patch_steps(patch_set, patch):
            chain = steps.setdefault(path, [])
            if chain and chain[-1].after != step.before:
                raise PatchSetError(
                    f"{patch.name} expects {path} at sha256 {step.before[:12]}…, but "
                    f"{chain[-1].patch} leaves it at {chain[-1].after[:12]}…; fix series.yaml "
                    f"in {patch_set.directory}."
                )
            chain.append(step)
    return tuple(
        FileTarget(path, chain[0].before, chain[-1].after, tuple(chain))
        for path, chain in steps.items()
    )


def _patch_steps(patch_set: PatchSet, patch: Patch) -> list[tuple[PurePosixPath, FileStep]]:
    listed = {item.path: item for item in patch.files}
    diffs = _parse_diff(patch_set, patch)
    missing = sorted(str(path) for path in listed.keys() - diffs.keys())
    if missing:
        raise DiffRejected(
            f"{patch.name} lists {', '.join(missing)} under files: but its diff does not touch "
            f"them; fix series.yaml in {patch_set.directory}."
        )
    return [
        (path, FileStep(patch.name, listed[path].sha256_before, listed[path].sha256_after, diff))
        for path, diff in diffs.items()
    ]


def _parse_diff(patch_set: PatchSet, patch: Patch) -> dict[PurePosixPath, DiffFile]:
    """The diff's files by `-p1` path, each checked against the package and the manifest."""
    try:
        parsed = DiffSet(patch.diff_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, UnidiffParseError) as err:
        raise PatchSetError(f"Cannot read the diff {patch.diff_path}: {err}.") from err
    listed = {item.path for item in patch.files}
    by_path: dict[PurePosixPath, DiffFile] = {}
    for diff in parsed:
        source = _strip_one(diff.source_file)
        target = _strip_one(diff.target_file)
        for path in (source, target):
            if path is None or not _inside(patch_set.package, path):
                raise DiffRejected(
                    f"{patch.name} in {patch_set.directory} has a diff header "
                    f"{diff.source_file} -> {diff.target_file} outside the {patch_set.package} "
                    "package (only in-place edits of package files are allowed); fix the diff."
                )
        if source != target or target not in listed or target in by_path:
            raise DiffRejected(
                f"{patch.name} in {patch_set.directory} edits {diff.target_file}, which is "
                "renamed, repeated, or not listed under its files: in series.yaml; fix the diff "
                "or the manifest."
            )
        by_path[target] = diff
    return by_path


def _strip_one(header_path: str) -> PurePosixPath | None:
    """Strip the first component (`patch -p1`); None for /dev/null or a one-part path."""
    parts = PurePosixPath(header_path).parts
    if header_path == "/dev/null" or len(parts) < 2 or parts[0] == "/":
        return None
    return PurePosixPath(*parts[1:])


def _inside(package: str, path: PurePosixPath) -> bool:
    return not path.is_absolute() and ".." not in path.parts and path.parts[:1] == (package,)


def patch_file(target: FileTarget, pristine: bytes) -> tuple[bytes, tuple[HunkOffset, ...]]:
    """The applied bytes of `target` from its pristine bytes, with each hunk's offset.

    Every patch's output is checked against its post-image hash, so a wrong result raises
    `HunkFailed` instead of reaching a host.
    """
    return _run_steps(target, pristine, reverse=False)


def unpatch_file(target: FileTarget, applied: bytes) -> bytes:
    """The pristine bytes of `target` from its applied bytes (the diffs in reverse)."""
    return _run_steps(target, applied, reverse=True)[0]


def _run_steps(
    target: FileTarget, data: bytes, *, reverse: bool
) -> tuple[bytes, tuple[HunkOffset, ...]]:
    offsets: list[HunkOffset] = []
    for step in reversed(target.steps) if reverse else target.steps:
        expected = step.before if reverse else step.after
        text = data.decode("utf-8", errors="surrogateescape")
        try:
            result, hunks = apply_hunks(text, step.diff, patch=step.patch, reverse=reverse)
        except HunkMismatch as err:
            raise HunkFailed(
                f"{step.patch}: hunk #{err.index} (line {err.line}) does not apply to "
                f"{target.path} with fuzz 0; the patch does not fit this release."
            ) from err
        data = result.encode("utf-8", errors="surrogateescape")
        if sha256_hex(data) != expected:
            raise HunkFailed(
                f"{step.patch} applied to {target.path} gives sha256 {sha256_hex(data)[:12]}…, "
                f"not the manifest's {expected[:12]}…; regenerate the hashes in series.yaml."
            )
        offsets += hunks
    return data, tuple(offsets)
