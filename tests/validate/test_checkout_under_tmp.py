"""The validated-deploy tests pass from a fresh clone under /tmp, as a contributor or a CI makes one.

The units those tests deploy keep the production unit's `PrivateTmp=yes`, which hides the
host's /tmp from the service (and a container has its own /tmp): a stand-in that ran from the
checkout failed to start with `No module named standin` when the checkout lived under /tmp.

The test clones this checkout's HEAD (committed work only) into a folder under /tmp, gives the
clone a venv of its own (the clone's ddtree-deploy installed editable, its `kernels/` on a
`.pth` line, everything else borrowed from this venv's site-packages on another), and runs
`tests/validate/test_validated_deploy.py` there in a pytest process of its own, with a container
and a stand-in root of its own (removed afterwards). It runs the test in `SUBSET`, which starts
the unit through every phase (baseline, shadow, tree); the file's other tests differ in the
injected fault or the kill point, neither of which depends on where the checkout lives.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from standin.lab import REPO, standin_root_for

# nspawn_hosts: skips (or fails in CI) where containers cannot boot, and builds the rootfs.
pytestmark = [pytest.mark.nspawn, pytest.mark.clone, pytest.mark.usefixtures("nspawn_hosts")]
SUBSET = "promoted_tree"


@pytest.fixture
def clone() -> Iterator[Path]:
    """A clone of HEAD under /tmp with its own venv, removed afterwards."""
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="ddtree-clone-") as tmp:
        checkout = Path(tmp) / "ddtree-deploy"
        head = _git("rev-parse", "HEAD", cwd=REPO)
        _git("clone", "--quiet", "--no-checkout", str(REPO), str(checkout), cwd=REPO)
        _git("checkout", "--quiet", "--detach", head, cwd=checkout)
        venv = checkout / ".venv"
        base = Path(os.path.realpath(sys.executable))  # the Python this venv was made from
        subprocess.run([base, "-m", "venv", "--without-pip", venv], check=True)
        (site,) = venv.glob("lib/python*/site-packages")
        (site / "clone.pth").write_text(
            f"{checkout / 'kernels'}\n{sysconfig.get_path('purelib')}\n"
        )
        # --ignore-installed: pip sees this venv's ddtree-deploy through clone.pth and must not
        # uninstall it from here.
        subprocess.run(
            [venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-deps", "--ignore-installed",
             "--no-build-isolation", "-e", checkout],
            check=True, capture_output=True, timeout=300,
        )  # fmt: skip
        yield checkout


def _git(*args: str, cwd: Path) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_validated_deploy_tests_pass_from_a_clone_under_tmp(
    standin_root: tuple[Path, Path], clone: Path
) -> None:
    source = standin_root[1]
    python = clone / ".venv" / "bin" / "python"
    where = subprocess.run(
        [python, "-c", "import ddtree_deploy, ddtree_kernels; print(ddtree_deploy.__file__, ddtree_kernels.__file__)"],
        cwd=clone.parent, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert all(path.startswith(f"{clone}/") for path in where.stdout.split()), where.stdout
    try:
        done = subprocess.run(
            [python, "-m", "pytest", "tests/validate/test_validated_deploy.py", "-k", SUBSET, "-q",
             "-p", "no:cacheprovider", f"--basetemp={clone.parent / 'pytest'}"],
            cwd=clone, env={**os.environ, "DDTREE_TEST_SGLANG_VENV": str(source)},
            capture_output=True, text=True, timeout=1200, check=False,
        )  # fmt: skip
    finally:
        shutil.rmtree(standin_root_for(source, checkout=clone), ignore_errors=True)
    summary = done.stdout.strip().splitlines()[-1]
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert re.fullmatch(r"1 passed, 8 deselected in .*", summary), summary  # nothing skipped
