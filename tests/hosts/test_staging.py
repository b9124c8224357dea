"""The staging venvs: the real SGLang wheel from PyPI on a shared layer, each built once, swapped in whole.

The requirements here are tiny wheels this file writes (`fake_torch` stands in for what the shared
layer carries, `fake_pin` for a package a release pins differently), and pip installs offline
from the project's wheel cache, where the real 0.5.11 / 0.5.12 wheels from PyPI are downloaded
once (`fetch_wheel`), so a prepare takes seconds.
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import zipfile
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from ddtree_deploy.errors import CommandFailed, ConfigError
from ddtree_deploy.events import sink_installed
from ddtree_deploy.hosts.local import LocalHost
from ddtree_deploy.hosts.staging import (
    MARKER,
    SHARED_PTH,
    prepare_staging_venv,
    shared_layer_path,
    staging_marker,
)
from ddtree_deploy.patching.wheels import WHEEL_CACHE, fetch_wheel


@pytest.fixture(autouse=True)
def offline_pip(monkeypatch: pytest.MonkeyPatch) -> None:
    """pip (run by the prepare, which passes the environment on) finds sglang in the wheel cache."""
    for release in ("0.5.11", "0.5.12"):
        fetch_wheel(release)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(WHEEL_CACHE))
    monkeypatch.setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1")


def _python(venv: Path, code: str) -> str:
    return subprocess.run(
        [venv / "bin" / "python", "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()


def _installed(venv: Path, dist: str) -> str:
    return _python(venv, f"import importlib.metadata as m; print(m.version({dist!r}))")


def _site(venv: Path) -> Path:
    (site,) = venv.glob("lib/python*/site-packages")
    return site


def _wheel(folder: Path, name: str, version: str) -> str:
    """A pure-Python wheel of `name` whose module records its version; its path, as a requirement."""
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"VERSION = {version!r}\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = (
            base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        )
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return str(wheel)


def _prepare(venv: Path, release: str, requirements: list[str], shared: list[str]) -> Any:
    return prepare_staging_venv(
        LocalHost(),
        PurePosixPath(venv),
        base_python="python3.11",
        sglang_version=release,
        requirements=requirements,
        shared_requirements=shared,
    )


def test_two_releases_share_one_layer_built_once(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    shared = [_wheel(wheels, "fake_torch", "1.0"), _wheel(wheels, "fake_pin", "1.0")]
    pin = _wheel(wheels, "fake_pin", "2.0")
    root = tmp_path / "staging"
    events: list[dict[str, Any]] = []
    with sink_installed(events.append):
        first = _prepare(root / "sglang-0.5.11", "0.5.11", [pin], shared)
        layer = Path(str(first.shared))
        stamp = (layer / MARKER).stat().st_mtime_ns
        second = _prepare(root / "sglang-0.5.12", "0.5.12", [], shared)
    assert first.changed and first.shared_changed
    assert second.changed and not second.shared_changed
    assert second.shared == first.shared
    assert sorted(p.name for p in root.iterdir()) == sorted(
        [layer.name, "sglang-0.5.11", "sglang-0.5.12"]
    )
    assert (layer / MARKER).stat().st_mtime_ns == stamp  # the second prepare did not touch it
    # One progress line per build: the layer once, then each release's venv.
    assert [e["message"] for e in events if "message" in e] == [
        f"building the shared staging layer {layer.name} with python3.11: 2 CPU requirements for every release",
        f"building the staging venv with python3.11: sglang==0.5.11 from its PyPI wheel and 1 release pins on {layer.name}",
        f"building the staging venv with python3.11: sglang==0.5.12 from its PyPI wheel and 0 release pins on {layer.name}",
    ]
    for venv, release in ((root / "sglang-0.5.11", "0.5.11"), (root / "sglang-0.5.12", "0.5.12")):
        site = _site(venv)
        # The release venv holds sglang itself (its RECORD beside it) but not the shared packages...
        assert (site / "sglang" / "srt" / "server_args.py").is_file()
        assert list(site.glob("sglang-*.dist-info/RECORD"))
        assert not (site / "fake_torch").exists() and not (site / "pip").exists()
        assert _installed(venv, "sglang") == release
        # ...which it imports from the layer, after its own site-packages.
        assert (site / SHARED_PTH).read_text() == f"{_site(layer)}\n"
        assert _python(venv, "import fake_torch; print(fake_torch.__file__)").startswith(str(layer))
    # The release pin shadows the shared copy, and installing it left the layer as it was.
    assert _python(root / "sglang-0.5.11", "import fake_pin; print(fake_pin.VERSION)") == "2.0"
    assert _installed(root / "sglang-0.5.11", "fake_pin") == "2.0"
    assert _python(root / "sglang-0.5.12", "import fake_pin; print(fake_pin.VERSION)") == "1.0"
    assert _installed(layer, "fake_pin") == "1.0"
    # A second run changes nothing: both markers stay as they were.
    venv_stamp = (root / "sglang-0.5.11" / MARKER).stat().st_mtime_ns
    again = _prepare(root / "sglang-0.5.11", "0.5.11", [pin], shared)
    assert not again.changed and not again.shared_changed
    assert (root / "sglang-0.5.11" / MARKER).stat().st_mtime_ns == venv_stamp
    assert (layer / MARKER).stat().st_mtime_ns == stamp


def test_full_venv_of_the_old_layout_is_rebuilt(tmp_path: Path) -> None:
    venv = tmp_path / "sglang-0.5.11"
    # What the one-venv layout left: everything in the venv, a marker that names no layer.
    subprocess.run(["python3.11", "-m", "venv", "--without-pip", venv], check=True)
    (_site(venv) / "fake_torch").mkdir()
    old = {"sglang": "0.5.11", "requirements": hashlib.sha256(b"").hexdigest()[:16]}
    (venv / MARKER).write_text(json.dumps(old, sort_keys=True) + "\n")
    result = _prepare(venv, "0.5.11", [], [])
    assert result.changed
    assert not (_site(venv) / "fake_torch").exists()
    assert (_site(venv) / SHARED_PTH).is_file()
    assert json.loads((venv / MARKER).read_text()) == staging_marker("0.5.11", [], result.shared)


def test_changed_shared_list_builds_a_new_layer_and_rebuilds_the_venv(tmp_path: Path) -> None:
    venv = tmp_path / "sglang-0.5.11"
    first = _prepare(venv, "0.5.11", [], [])
    second = _prepare(venv, "0.5.11", [], [_wheel(tmp_path / "wheels", "fake_torch", "1.0")])
    assert second.changed and second.shared_changed and second.shared != first.shared
    assert _python(venv, "import fake_torch; print(fake_torch.VERSION)") == "1.0"


def test_prepare_failure_keeps_previous_venv(tmp_path: Path) -> None:
    venv = tmp_path / "sglang-venv"
    first = _prepare(venv, "0.5.11", [], [])
    with pytest.raises(CommandFailed):
        _prepare(venv, "0.5.11", ["no-such-package-ddtree-xyz==9.9"], [])
    assert _installed(venv, "sglang") == "0.5.11"
    assert json.loads((venv / MARKER).read_text()) == staging_marker("0.5.11", [], first.shared)


def test_prepare_failure_leaves_no_build_folder(tmp_path: Path) -> None:
    venv = tmp_path / "sglang-venv"
    with pytest.raises(CommandFailed):
        _prepare(venv, "0.0.0", [], [])
    # The (empty) layer was finished before the release failed; nothing half-built is left.
    assert [p.name for p in tmp_path.iterdir()] == [
        shared_layer_path(PurePosixPath(venv), "python3.11", []).name
    ]


def test_failed_shared_layer_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(CommandFailed):
        _prepare(tmp_path / "sglang-venv", "0.5.11", [], ["no-such-package-ddtree-xyz==9.9"])
    assert list(tmp_path.iterdir()) == []


def test_venv_path_that_prefixes_the_layer_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="prefix"):
        _prepare(tmp_path / "s", "0.5.11", [], [])
    assert list(tmp_path.iterdir()) == []
