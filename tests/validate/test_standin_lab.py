"""The stand-in's venv cache (tests/standin/lab.py) must follow the checkout that runs the tests."""

from __future__ import annotations

import shutil
from pathlib import Path

from standin.lab import REPO, build_standin_venv


def test_a_standin_root_built_for_one_checkout_is_not_reused_by_another(
    standin_root: tuple[Path, Path], tmp_path: Path
) -> None:
    """CI runs a fresh clone on a machine whose cache holds a root built for another clone."""
    here, source = standin_root
    clone = tmp_path / "clone"
    for part in ("kernels", "tests"):
        (clone / part).mkdir(parents=True)
    shutil.copytree(REPO / "patches", clone / "patches")
    there = build_standin_venv(source, checkout=clone)
    try:
        assert there != here
        (pth,) = (there / "venv").glob("lib/python*/site-packages/standin.pth")
        lines = pth.read_text().splitlines()
        assert str(clone / "kernels") in lines and str(clone / "tests") in lines
        assert not any(line.startswith(str(REPO) + "/") for line in lines)
    finally:
        shutil.rmtree(there)
