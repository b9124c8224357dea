"""Fixtures: real SGLang wheels as site-packages trees, a local host and its state folder.

`pristine_root(release)` unzips a wheel (downloaded once into ~/.cache/ddtree-deploy/wheels)
once per machine into ~/.cache/ddtree-deploy/trees; `make_tree(release)` gives each test its own site-packages built from it with
hard links. The engine only ever replaces files by rename, so a test's writes never reach the
session copy; a test that edits a file in place must unlink it first (`trees.rewrite`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath

import pytest

from ddtree_deploy.hosts.local import LocalHost
from ddtree_deploy.hosts.state import HostStateStore
from ddtree_deploy.patching.record import parse_record
from patching.trees import WHEEL_CACHE, Case, wheel_path

TREE_CACHE = WHEEL_CACHE.parent / "trees"


@pytest.fixture(scope="session")
def pristine_root() -> Callable[[str], Path]:
    """`pristine_root(release)`: the wheel's `sglang/` and dist-info, unzipped once per machine.

    The tree is cached beside the wheel and checked against its RECORD at the start of every
    session (a stray write by a test would otherwise leak into later runs); a tree that fails
    the check is unzipped again.
    """
    roots: dict[str, Path] = {}

    def root(release: str) -> Path:
        if release not in roots:
            roots[release] = _unzipped(release)
        return roots[release]

    return root


def _kept(release: str) -> tuple[str, str]:
    """The wheel's folders the cached tree holds (0.5.11 to 0.5.17 also ship `tools/`)."""
    return "sglang/", f"sglang-{release}.dist-info/"


def _unzipped(release: str) -> Path:
    """The cached tree, made race-free: concurrent sessions each unzip aside, one rename wins."""
    target = TREE_CACHE / f"sglang-{release}"
    if target.is_dir() and _matches_record(target, release):
        return target
    TREE_CACHE.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".sglang-{release}-", dir=TREE_CACHE))
    with zipfile.ZipFile(wheel_path(release)) as wheel:
        members = [m for m in wheel.namelist() if m.startswith(_kept(release))]
        wheel.extractall(staging, members)
    if target.is_dir():  # damaged: move it aside (a session may still be reading it)
        target.rename(staging.with_name(f".damaged-{staging.name}"))
    try:
        staging.rename(target)
    except OSError:  # another session renamed its copy in first
        shutil.rmtree(staging)
    return target


def _matches_record(site: Path, release: str) -> bool:
    record = site / f"sglang-{release}.dist-info" / "RECORD"
    if not record.is_file():
        return False
    for path, digest in parse_record(record.read_text()).items():
        if not str(path).startswith(_kept(release)):
            continue  # not unzipped: a sound tree would fail the check, and every session
            # would unzip it again while another worker copies from it
        file = site / path
        if not file.is_file() or hashlib.sha256(file.read_bytes()).hexdigest() != digest:
            return False
    return True


@pytest.fixture
def make_tree(pristine_root: Callable[[str], Path], tmp_path: Path) -> Callable[[str], Path]:
    """`make_tree(release)`: this test's own site-packages holding the pristine wheel files."""

    made: list[Path] = []

    def make(release: str) -> Path:
        site = tmp_path / f"site-{release}-{len(made)}"
        made.append(site)
        shutil.copytree(pristine_root(release), site, copy_function=os.link)
        return site

    return make


@pytest.fixture
def host() -> LocalHost:
    return LocalHost("test-local")


@pytest.fixture
def state(host: LocalHost, tmp_path: Path) -> HostStateStore:
    return HostStateStore(host, PurePosixPath(tmp_path / "state"), sudo=False)


@pytest.fixture
def case_tree(make_tree: Callable[[str], Path], tmp_path: Path) -> Callable[[Case], Path]:
    """The site-packages a case starts from: its own `before/` or the real wheel's files."""

    def make(case: Case) -> Path:
        if case.before_dir is None:
            return make_tree(case.release)
        site = tmp_path / f"site-{case.name}"
        shutil.copytree(case.before_dir, site)
        return site

    return make
