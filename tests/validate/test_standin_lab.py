"""The stand-in's venv cache (tests/standin/lab.py) must follow the checkout that runs the tests."""

from __future__ import annotations

import shutil
from pathlib import Path

from standin.lab import REPO, build_standin_venv


def test_a_standin_root_runs_copies_of_its_own_checkout_and_no_path_inside_it(
    standin_root: tuple[Path, Path], tmp_path: Path
) -> None:
    """CI runs a fresh clone, maybe under /tmp, which the unit's `PrivateTmp=yes` hides."""
    here, source = standin_root
    clone = tmp_path / "clone"
    shutil.copytree(REPO / "patches", clone / "patches")
    shutil.copytree(REPO / "kernels" / "ddtree_kernels", clone / "kernels" / "ddtree_kernels")
    shutil.copytree(REPO / "tests" / "standin", clone / "tests" / "standin")
    (clone / "tests" / "standin" / "marker.py").write_text("CLONE = True\n")
    there = build_standin_venv(source, checkout=clone)
    try:
        assert there != here
        (pth,) = (there / "venv").glob("lib/python*/site-packages/standin.pth")
        lines = pth.read_text().splitlines()
        assert str(there / "src") in lines
        assert not any(line.startswith((f"{REPO}/", f"{clone}/")) for line in lines)
        assert (there / "src" / "standin" / "marker.py").read_text() == "CLONE = True\n"
        assert (there / "src" / "ddtree_kernels" / "reference.py").is_file()
    finally:
        shutil.rmtree(there)
