"""The built wheel carries everything the installed command reads: conf, templates, patches,
the kernels' source. Checked by running the tool from the wheel alone, outside the checkout."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from ddtree_deploy.patching.manifest import load_patch_sets

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import json
from ddtree_deploy.config import compose_config
from ddtree_deploy.kernel_build.step import default_source_dir
from ddtree_deploy.patching.manifest import load_patch_sets
from ddtree_deploy.service.render import render_service
import ddtree_deploy
import ddtree_deploy.cli  # every package the command imports, the fleet's among them
cfg = compose_config(["host=ct200", "algo=ddtree_shadow"])
fleet = compose_config(["fleet=ct", "action=status"]).fleet
print(json.dumps({
    "module": ddtree_deploy.__file__,
    "patch_sets": sorted(s.name for s in load_patch_sets()),
    "kernels_setup": (default_source_dir() / "setup.py").is_file(),
    "kernels_launcher": (default_source_dir() / "ddtree_launch.py").is_file(),
    "unit_mentions_ddtree": "DDTREE" in render_service(cfg, None).unit_text,
    "fleet_ct": list(fleet.hosts) if fleet else None,
}))
"""


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """(the wheel, what the build backend printed)."""
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-v",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(REPO),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    (built,) = out.glob("ddtree_deploy-*.whl")
    return built, done.stdout + done.stderr


@pytest.fixture(scope="module")
def wheel(build: tuple[Path, str]) -> Path:
    return build[0]


def test_wheel_build_has_no_packaging_warning(build: tuple[Path, str]) -> None:
    """Every data folder is declared, so setuptools has nothing to say about the layout."""
    log = build[1]
    assert "running bdist_wheel" in log  # the backend's own output is there to be read
    assert "is absent from the `packages` configuration" not in log
    assert "SetuptoolsDeprecationWarning" not in log and "SetuptoolsWarning" not in log


def test_wheel_holds_every_data_file_of_the_checkout(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {
        *(
            f"ddtree_deploy/conf/{p.relative_to(REPO / 'conf')}"
            for p in (REPO / "conf").rglob("*.yaml")
        ),
        *(f"ddtree_deploy/templates/{p.name}" for p in (REPO / "templates").glob("*.j2")),
        *(
            f"ddtree_deploy/patchsets/{p.relative_to(REPO / 'patches')}"
            for p in (REPO / "patches").rglob("*")
            if p.suffix in (".patch", ".yaml")
        ),
        *(
            f"ddtree_deploy/kernel_source/{p.relative_to(REPO / 'kernels')}"
            for p in (REPO / "kernels/csrc").iterdir()
        ),
    }
    assert expected <= names, sorted(expected - names)


def test_installed_wheel_runs_outside_the_checkout(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=tmp_path,
        env={"PYTHONPATH": str(target), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["module"].startswith(str(target))
    assert found["patch_sets"] == sorted(s.name for s in load_patch_sets())  # the checkout's
    assert found["kernels_setup"] and found["unit_mentions_ddtree"]
    assert found["kernels_launcher"]  # the unit's launcher (API key) ships with the kernels
    assert found["fleet_ct"] == ["ct129", "ct200"]
