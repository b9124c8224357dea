"""Every patched file names only what exists: no undefined or unbound-before-use names.

A hunk ported by fuzz can land on a release that renamed a variable the hunk uses (0.5.11's
`accepted_steps` is `last_correct_step_indices` in 0.5.12's DFlashWorker): `patch` applies it,
the module imports, and the code fails only when that path runs (a hybrid DDTREE target). Ruff's
F821 / F823 see it statically; the pristine files are the baseline, so only what a patch adds
counts.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path, PurePosixPath

import pytest

from ddtree_deploy.hosts.local import LocalHost
from ddtree_deploy.hosts.state import HostStateStore
from ddtree_deploy.patching.engine import apply_patch_set
from patching.trees import REAL_RELEASES, real_patch_set


def _undefined_names(site: Path, files: list[str]) -> set[str]:
    """`file: code message` for each F821/F823 finding (line numbers left out)."""
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed")
    proc = subprocess.run(
        [ruff, "check", "--isolated", "--no-cache", "--select", "F821,F823",
         "--output-format", "concise", *files],
        cwd=site, capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stderr
    found = set()
    for line in proc.stdout.splitlines():
        path, _, rest = line.partition(":")
        if path in files:
            found.add(f"{path}: {rest.split(':', 2)[-1].strip()}")
    return found


@pytest.mark.parametrize("release", REAL_RELEASES)
def test_patches_add_no_undefined_names(
    release: str, make_tree: Callable[[str], Path], host: LocalHost, state: HostStateStore
) -> None:
    patch_set = real_patch_set(release)
    files = sorted({str(f.path) for p in patch_set.patches for f in p.files})
    site = make_tree(release)
    before = _undefined_names(site, files)
    apply_patch_set(host, PurePosixPath(site), patch_set, state)
    assert _undefined_names(site, files) - before == set()


def test_undefined_name_check_sees_a_renamed_variable(tmp_path: Path) -> None:
    """The check finds what it is for: a use of a name the function never binds."""
    (tmp_path / "m.py").write_text("def f(x):\n    y = g(x)\n    return y\n")
    assert _undefined_names(tmp_path, ["m.py"]) == {"m.py: F821 Undefined name `g`"}
