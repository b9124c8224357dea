"""Patch-set manifests (`patches/sglang/<release>/series.yaml`) and selection by SGLang version.

A manifest names the releases it serves (a PEP 440 specifier), its patches in order with the
sha256 of every target file before and after, and every DFLASH gate site of the release with
its disposition. This module only reads and checks manifests; it never touches a host.

A release whose target files differ from a reviewed release's only where no hunk looks (a .post
release, say) gets a derived set: its `series.yaml` names `base: <folder>` and holds only what
differs, the hashes of its own files and reviews of gate sites the base does not have. The diffs
are the base's (applied with offsets, never fuzz) unless the folder holds a diff of the same name,
and the purposes and gate reviews are the base's, so a reviewer reads each change once.
"""

from __future__ import annotations

import importlib.resources
import re
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path, PurePosixPath
from typing import Any

import yaml
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from ddtree_deploy.errors import DeployError, ExitCode

# The same safe subset of YAML, parsed by libyaml when PyYAML was built with it.
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# The line a set's loader adds: the module API its release was written for.
_MODULE_API = re.compile(r"^\+DDTREE_SGLANG_API = (?P<api>\d+)\b")


class PatchSetError(DeployError):
    """A patch set is missing, malformed, or does not serve the installed release."""

    exit_code = ExitCode.PATCH_SET


class UnsupportedRelease(PatchSetError):
    """No patch set serves the SGLang release a host runs."""


class Disposition(StrEnum):
    """What review decided for one DFLASH gate site."""

    covered = "covered"  # a named patch makes the site serve DDTREE too
    widened = "widened"  # reached through a predicate a patch widened (is_dflash() etc.)
    dflash_only = "dflash-only"  # must stay DFLASH-only; the reason says why


@dataclass(frozen=True)
class PatchedFile:
    """One target file of a patch, with its content hashes before and after the patch."""

    path: PurePosixPath  # relative to site-packages, inside the package
    sha256_before: str
    sha256_after: str


@dataclass(frozen=True)
class Patch:
    """One unified diff of a set."""

    name: str
    purpose: str
    files: tuple[PatchedFile, ...]
    diff_path: Path


@dataclass(frozen=True)
class GateReview:
    """A reviewed DFLASH gate site: matched by file, enclosing function and stripped line."""

    file: PurePosixPath
    function: str
    text: str
    disposition: Disposition
    patch: str | None
    reason: str | None


@dataclass(frozen=True)
class PatchSet:
    """A release's ordered patches and gate reviews."""

    name: str
    release: SpecifierSet
    package: str
    patches: tuple[Patch, ...]
    gates: tuple[GateReview, ...]
    directory: Path
    base: str | None = None  # the set whose diffs and reviews a derived set takes

    def serves(self, version: str) -> bool:
        return Version(version) in self.release

    def is_exact(self) -> bool:
        """True for `==X` sets, which win over ranges serving the same release."""
        return all(spec.operator in ("==", "===") for spec in self.release)

    def module_api(self) -> int | None:
        """The `ddtree_kernels.sglang` API version the set's code calls (the
        `DDTREE_SGLANG_API` its diffs add), or None for a set that carries DDTree's logic
        itself. Read from the diffs, so it cannot disagree with what the set installs."""
        for patch in self.patches:
            for line in patch.diff_path.read_text().splitlines():
                found = _MODULE_API.match(line)
                if found:
                    return int(found["api"])
        return None


def patch_sets_root() -> Path:
    """The `patches/sglang` folder shipped with the package."""
    return Path(str(importlib.resources.files("ddtree_deploy.patchsets"))) / "sglang"


def load_patch_sets(root: Path | None = None) -> list[PatchSet]:
    """Every patch set under `root`, sorted by folder name."""
    base = root or patch_sets_root()
    return [load_patch_set(series.parent) for series in sorted(base.glob("*/series.yaml"))]


def select_patch_set(version: str, root: Path | None = None) -> PatchSet:
    """The patch set serving SGLang `version` (exact specifiers win over ranges)."""
    try:
        Version(version)
    except InvalidVersion as err:
        raise UnsupportedRelease(f"SGLang version {version!r} is not a valid version.") from err
    sets = load_patch_sets(root)
    serving = sorted((s for s in sets if s.serves(version)), key=lambda s: not s.is_exact())
    if not serving:
        supported = ", ".join(str(s.release) for s in sets) or "none"
        raise UnsupportedRelease(
            f"SGLang {version} has no patch set (supported: {supported}); pin a supported "
            f"release in the host's sglang config, or run `ddtree-deploy action=port "
            f"sglang.version={version}` for a candidate set to review."
        )
    return serving[0]


def load_patch_set(directory: Path) -> PatchSet:
    """Parse and check one `series.yaml`; raises `PatchSetError` naming the file on any flaw."""
    series = directory / "series.yaml"
    try:
        # libyaml's safe loader when PyYAML has it: the sets' YAML (every set's hashes, read
        # for each `select_patch_set`) took 1.6 s a call with the pure-Python one, 0.05 s with it.
        raw = yaml.load(series.read_text(), Loader=_SAFE_LOADER)
        if "base" not in raw:
            return _build(directory, raw)
        base = _read_base(directory, str(raw["base"]))
        return _derive(directory, raw, base)
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError, InvalidSpecifier) as err:
        raise PatchSetError(f"{series} is not a valid patch-set manifest: {err}.") from err


def _read_base(directory: Path, name: str) -> PatchSet:
    """The sibling set a derived set names; one level only, so a chain of bases cannot form."""
    folder = directory.parent / name
    if PurePosixPath(name).name != name or folder == directory:
        raise ValueError(f"base {name!r} must name another set's folder beside this one")
    if not (folder / "series.yaml").is_file():
        raise ValueError(f"base {name!r} has no series.yaml beside this set")
    base = load_patch_set(folder)
    if base.base is not None:
        raise ValueError(f"base {name!r} is itself derived from {base.base!r}; name that set")
    return base


def _derive(directory: Path, raw: dict[str, Any], base: PatchSet) -> PatchSet:
    """`base`'s patches with this release's hashes (same patches, same files, same order), its
    own diff where the folder has one, and the base's gate reviews followed by its own (a
    review of the same site replaces the base's)."""
    package = str(raw.get("package", base.package))
    if package != base.package:
        raise ValueError(f"package {package!r} differs from base {base.name!r}'s {base.package!r}")
    entries = list(raw["patches"])
    if [str(e["name"]) for e in entries] != [p.name for p in base.patches]:
        raise ValueError(f"patches must name base {base.name!r}'s patches in its order")
    patches = []
    for entry, inherited in zip(entries, base.patches, strict=True):
        own = _build_patch(directory, package, {"purpose": inherited.purpose, **entry})
        if [f.path for f in own.files] != [f.path for f in inherited.files]:
            raise ValueError(f"{own.name} must list base {base.name!r}'s target files in order")
        diff_path = own.diff_path if own.diff_path.is_file() else inherited.diff_path
        patches.append(replace(own, diff_path=diff_path))
    own_gates = tuple(_build_gate(entry) for entry in raw.get("gates") or [])
    return PatchSet(
        name=directory.name,
        release=SpecifierSet(str(raw["release"])),
        package=package,
        patches=tuple(patches),
        gates=base.gates + own_gates,
        directory=directory,
        base=base.name,
    )


def _build(directory: Path, raw: dict[str, Any]) -> PatchSet:
    package = str(raw["package"])
    patches = tuple(_build_patch(directory, package, entry) for entry in raw["patches"])
    gates = tuple(_build_gate(entry) for entry in raw.get("gates") or [])
    return PatchSet(
        name=directory.name,
        release=SpecifierSet(str(raw["release"])),
        package=package,
        patches=patches,
        gates=gates,
        directory=directory,
    )


def _build_patch(directory: Path, package: str, entry: dict[str, Any]) -> Patch:
    files = tuple(
        PatchedFile(
            path=_inside_package(package, str(item["path"])),
            sha256_before=str(item["sha256_before"]),
            sha256_after=str(item["sha256_after"]),
        )
        for item in entry["files"]
    )
    return Patch(
        name=str(entry["name"]),
        purpose=str(entry["purpose"]),
        files=files,
        diff_path=directory / str(entry["name"]),
    )


def _build_gate(entry: dict[str, Any]) -> GateReview:
    if entry["disposition"] == "unreviewed":  # left by action=port for a person to decide
        raise ValueError(
            f"gate {entry['file']}:{entry['function']} is unreviewed; review it (covered, "
            "widened or dflash-only) before this set can serve a release"
        )
    disposition = Disposition(str(entry["disposition"]))
    patch = entry.get("patch")
    reason = entry.get("reason")
    if disposition is Disposition.covered and not patch:
        raise ValueError(f"gate {entry['file']}:{entry['function']} is covered but names no patch")
    if disposition is not Disposition.covered and not reason:
        raise ValueError(f"gate {entry['file']}:{entry['function']} needs a reason")
    return GateReview(
        file=PurePosixPath(str(entry["file"])),
        function=str(entry["function"]),
        text=str(entry["text"]),
        disposition=disposition,
        patch=str(patch) if patch else None,
        reason=str(reason) if reason else None,
    )


def _inside_package(package: str, path: str) -> PurePosixPath:
    """Refuse any path that could leave the target package (absolute, `..`, other packages)."""
    candidate = PurePosixPath(path)
    if candidate.is_absolute() or ".." in candidate.parts or candidate.parts[:1] != (package,):
        raise ValueError(f"patch target {path!r} lies outside the {package} package")
    return candidate
