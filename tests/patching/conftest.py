"""Fixtures: real SGLang wheels as site-packages trees, a local host and its state folder.

`pristine_root(release)` unzips a wheel (downloaded once into ~/.cache/ddtree-deploy/wheels)
once per session; `make_tree(release)` gives each test its own site-packages built from it with
hard links. The engine only ever replaces files by rename, so a test's writes never reach the
session copy; a test that edits a file in place must unlink it first (`trees.rewrite`).
"""

from __future__ import annotations

import os
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath

import pytest

from ddtree_deploy.hosts.local import LocalHost
from ddtree_deploy.hosts.state import HostStateStore
from patching.trees import Case, wheel_path


@pytest.fixture(scope="session")
def pristine_root(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """`pristine_root(release)`: the wheel's `sglang/` and dist-info, unzipped once."""
    roots: dict[str, Path] = {}

    def root(release: str) -> Path:
        if release not in roots:
            target = tmp_path_factory.mktemp(f"wheel-{release}")
            with zipfile.ZipFile(wheel_path(release)) as wheel:
                members = [
                    m for m in wheel.namelist()
                    if m.startswith(("sglang/", f"sglang-{release}.dist-info/"))
                ]  # fmt: skip
                wheel.extractall(target, members)
            roots[release] = target
        return roots[release]

    return root


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
