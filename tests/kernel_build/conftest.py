"""Real parts for the kernels builder: the staging SGLang venv's torch, a throwaway venv, sources.

The staging venv (`ddtree-deploy host=local action=prepare`) is shared and never modified here:
each test gets its own venv whose `.pth` file makes the staging venv's site-packages and its shared
layer's (torch, pip, setuptools) visible, and installs ddtree-kernels into that throwaway venv only.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path, PurePosixPath

import pytest
from staging import require_staging_venv, staging_site_dirs, staging_venv

from ddtree_deploy.kernel_build.key import source_files
from ddtree_deploy.kernel_build.step import KernelsStep, default_source_dir

STAGING_VENV = staging_venv("0.5.11")


@pytest.fixture(scope="session")
def staging_site_packages() -> list[Path]:
    """site-packages of the staging venv and its shared layer; torch must import (else skip)."""
    venv = require_staging_venv("0.5.11")
    probe = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import torch"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        pytest.skip(f"torch does not import in {STAGING_VENV}: {probe.stderr.strip()[-200:]}")
    return staging_site_dirs(venv)


@pytest.fixture
def kernel_venv(tmp_path: Path, staging_site_packages: list[Path]) -> Path:
    """A fresh venv that sees the staging venv's packages through a .pth file; its python."""
    venv = tmp_path / "venv"
    base = STAGING_VENV / "bin" / "python"
    subprocess.run([str(base), "-m", "venv", "--without-pip", str(venv)], check=True)
    (site,) = venv.glob("lib/python*/site-packages")
    (site / "staging-venv.pth").write_text("".join(f"{d}\n" for d in staging_site_packages))
    return venv / "bin" / "python"


@pytest.fixture
def kernels_source(tmp_path: Path) -> Path:
    """A copy of the wheel's files of kernels/ (what a test edits stays in tmp_path)."""
    root = default_source_dir()
    copy = tmp_path / "kernels"
    for path in source_files(root):
        target = copy / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    return copy


@pytest.fixture
def reference_step(kernel_venv: Path, kernels_source: Path, tmp_path: Path) -> KernelsStep:
    """A staging (no GPU) step into the throwaway venv, with its own state dir and cache."""
    return KernelsStep(
        host_name="local",
        python=PurePosixPath(kernel_venv),
        state_dir=PurePosixPath(tmp_path / "state"),
        arch="",
        staging=True,
        source_dir=kernels_source,
        cache_dir=tmp_path / "cache",
    )
