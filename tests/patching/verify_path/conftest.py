"""Fixtures for the verify-path checks of every release with a set, run on CPU.

A test module (or its `release` fixture) names the release; `check(name)` gives the JSON one
check printed. Every check of a release runs once per session, in one interpreter of that
release's staging venv with a fork per check (checklib.py): `v<release>/checks_<release>.py`
(or the module's `checks_script`: 0.5.11-0.5.13 share v0511/checks.py; 0.5.15 to 0.5.17 run
0.5.14's, 0.5.19 to 0.5.22 0.5.23's: `SHARED_CHECKS`), with a patched copy of
the wheel's `sglang/` (the whole series applied by GNU patch at fuzz 0) first on PYTHONPATH,
then this folder (checklib.py; `worker_v2_checks.py`, the checks the worker-v2 releases share)
and `kernels/` (ddtree_kernels, pure-torch reference). Without the staging venv the tests skip,
or fail when DDTREE_REQUIRE_STAGING=1.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from staging import require_staging_venv

HERE = Path(__file__).parent
REPO = HERE.parents[2]
KERNELS = REPO / "kernels"

MARK = "@@JSON@@"  # checklib.MARK: the line prefix of one check's result
_ROOTS: dict[str, Path] = {}
_RESULTS: dict[str, dict[str, dict]] = {}


# Releases whose checks another release's script runs (it follows sglang.version there).
SHARED_CHECKS = {
    "0.5.15": "0.5.14",
    "0.5.16": "0.5.14",
    "0.5.17": "0.5.14",
    "0.5.18": "0.5.14",
    "0.5.19": "0.5.23",
    "0.5.20": "0.5.23",
    "0.5.21": "0.5.23",
    "0.5.22": "0.5.23",
}


def _checks_script(release: str) -> Path:
    tag = SHARED_CHECKS.get(release, release).replace(".", "")  # 0.5.14 -> 0514
    return HERE / f"v{tag}" / f"checks_{tag}.py"


def _patched_copy(pristine: Path, release: str, root: Path) -> Path:
    """The wheel's sglang/ with the release's whole series applied by `patch -p1 --fuzz=0`."""
    series_dir = REPO / "patches" / "sglang" / release
    shutil.copytree(pristine / "sglang", root / "sglang")
    series = yaml.safe_load((series_dir / "series.yaml").read_text())
    for entry in series["patches"]:
        proc = subprocess.run(
            ["patch", "-p1", "--fuzz=0", "--forward", "--batch", "-i", str(series_dir / entry["name"])],
            cwd=root, capture_output=True, text=True,
        )  # fmt: skip
        assert proc.returncode == 0, f"{entry['name']}: {proc.stdout}{proc.stderr}"
        assert "fuzz" not in proc.stdout and "offset" not in proc.stdout, proc.stdout
    return root


def _run_checks(python: str, root: Path, script: Path) -> dict[str, dict]:
    """Every check of `script` in one interpreter (a fork each), by name."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join(map(str, (root, HERE, KERNELS)))
    env["CUDA_VISIBLE_DEVICES"] = ""
    env["TRITON_INTERPRET"] = "1"  # SGLang's Triton kernels on CPU tensors (0.5.14's GDN conv)
    proc = subprocess.run(
        [python, str(script), "all"], capture_output=True, text=True, env=env, timeout=1200
    )
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            data = json.loads(line[len(MARK) :])
            results[data.pop("name")] = data
    assert results, f"no result (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
    return results


@pytest.fixture(scope="module")
def staging_python(release: str) -> str:
    return str(require_staging_venv(release) / "bin" / "python")


@pytest.fixture(scope="module")
def patched_root(
    release: str,
    pristine_root: Callable[[str], Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    """The patched copy of `release`, made once per session."""
    if release not in _ROOTS:
        root = tmp_path_factory.mktemp(f"sglang-{release}-patched")
        _ROOTS[release] = _patched_copy(pristine_root(release), release, root)
    return _ROOTS[release]


@pytest.fixture(scope="module")
def checks_script(release: str) -> Path:
    """The release's check script; a test module whose releases share one overrides this."""
    return _checks_script(release)


@pytest.fixture(scope="module")
def check(
    release: str, staging_python: str, patched_root: Path, checks_script: Path
) -> Callable[[str], dict]:
    """`check(name)`: what that check returned, once every check of the release has run."""

    def one(name: str) -> dict:
        if release not in _RESULTS:
            _RESULTS[release] = _run_checks(staging_python, patched_root, checks_script)
        results = _RESULTS[release]
        assert name in results, f"{name} reported nothing"
        result = results[name]
        assert result["ok"], result.get("trace", result)
        return {k: v for k, v in result.items() if k != "ok"}

    return one
