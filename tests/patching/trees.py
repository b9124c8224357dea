"""Helpers for the patching tests: wheels, tree snapshots, case directories, real patch sets."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from staging import sglang_option

from ddtree_deploy.errors import CommandFailed
from ddtree_deploy.patching.manifest import (
    PatchSet,
    UnsupportedRelease,
    load_patch_set,
    patch_sets_root,
    select_patch_set,
)
from ddtree_deploy.patching.wheels import WHEEL_CACHE, fetch_wheel

CASES_DIR = Path(__file__).parent / "cases"
# 0.5.12.post1 and 0.5.13.post1 have no folder of their own: the 0.5.12 and 0.5.13 sets serve
# them (their targets are byte-identical). 0.5.15.post1 changes two of the 0.5.15 set's targets
# (server_args.py, spec_info.py), so its set is derived from 0.5.15's (its own hashes only).
REAL_RELEASES = (
    "0.5.11",
    "0.5.12",
    "0.5.12.post1",
    "0.5.13",
    "0.5.13.post1",
    "0.5.14",
    "0.5.15",
    "0.5.15.post1",
    "0.5.16",
    "0.5.17",
    "0.5.18",
    "0.5.19",
    "0.5.20",
    "0.5.21",
    "0.5.22",
    "0.5.23",
)
# The conf/sglang options: one a release, a .post release staged through its base's.
RELEASE_OPTIONS = tuple(dict.fromkeys(sglang_option(r) for r in REAL_RELEASES))


def wheel_path(release: str) -> Path:
    """The cached wheel of `sglang==release`, downloading it once; skip without a network."""
    try:
        return fetch_wheel(release, cache=WHEEL_CACHE)
    except CommandFailed as err:
        pytest.skip(str(err))


def rewrite(path: Path, data: bytes) -> None:
    """Change a file in a hard-linked tree without touching the session's copy."""
    path.unlink()
    path.write_bytes(data)


def own_copy(site: Path, relative: str) -> None:
    """Give one file of a hard-linked tree its own inode, for tools that write in place."""
    path = site / relative
    rewrite(path, path.read_bytes())


def tree_bytes(site: Path) -> dict[str, bytes]:
    """Every file under `site` with its bytes, for before/after comparisons."""
    return {
        str(p.relative_to(site)): p.read_bytes() for p in sorted(site.rglob("*")) if p.is_file()
    }


def shipped_sets_root(base: Path, release: str) -> Path:
    """A sets root under `base` holding the shipped set of `release` alone, to port from."""
    shutil.copytree(patch_sets_root() / release, base / "sets" / release)
    return base / "sets"


def series_of(directory: Path) -> dict[str, Any]:
    """A patch set folder's series.yaml, as written."""
    loaded: dict[str, Any] = yaml.safe_load((directory / "series.yaml").read_text())
    return loaded


def real_patch_set(release: str) -> PatchSet:
    """The shipped patch set for `release` (its own folder, else the set whose range serves it);
    skip until one has landed."""
    directory = patch_sets_root() / release
    if (directory / "series.yaml").is_file():
        return load_patch_set(directory)
    try:
        return select_patch_set(release)
    except UnsupportedRelease:
        pytest.skip(f"no shipped patch set serves SGLang {release} yet")


@dataclass(frozen=True)
class Case:
    """One `tests/patching/cases/<name>/` directory: tree before, series, expected result."""

    name: str
    directory: Path
    release: str
    expect: str  # "applied" or "error"
    error: str | None
    message: str | None  # a phrase the error's sentence must hold
    offsets: dict[str, list[int]]

    @property
    def series_dir(self) -> Path:
        return self.directory / "series"

    @property
    def before_dir(self) -> Path | None:
        before = self.directory / "before"
        return before if before.is_dir() else None

    @property
    def expected_dir(self) -> Path | None:
        expected = self.directory / "expected"
        return expected if expected.is_dir() else None


def load_case(directory: Path) -> Case:
    raw: dict[str, Any] = yaml.safe_load((directory / "case.yaml").read_text())
    return Case(
        name=directory.name,
        directory=directory,
        release=str(raw["release"]),
        expect=str(raw["expect"]),
        error=raw.get("error"),
        message=raw.get("message"),
        offsets={str(k): list(v) for k, v in (raw.get("offsets") or {}).items()},
    )


ALL_CASES = [load_case(d) for d in sorted(CASES_DIR.iterdir()) if (d / "case.yaml").is_file()]
