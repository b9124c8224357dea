"""The staging venv is built from the real SGLang wheel on PyPI, once, and swapped in whole."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from ddtree_deploy.errors import CommandFailed
from ddtree_deploy.events import sink_installed
from ddtree_deploy.hosts.local import LocalHost
from ddtree_deploy.hosts.staging import MARKER, prepare_staging_venv, staging_marker


def _installed_sglang(venv: Path) -> str:
    return subprocess.run(
        [venv / "bin" / "python", "-c", "import importlib.metadata as m; print(m.version('sglang'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()


def test_prepare_builds_once_then_changes_nothing(tmp_path: Path) -> None:
    venv = tmp_path / "sglang-venv"
    events: list[dict[str, Any]] = []
    with sink_installed(events.append):
        first = prepare_staging_venv(LocalHost(), PurePosixPath(venv), base_python="python3.11", sglang_version="0.5.11", requirements=[])
    assert first.changed
    # The CLI prints an event's `message` as a progress line: one for the build, the result after it.
    assert [e["message"] for e in events if "message" in e] == [
        "building the staging venv with python3.11: sglang==0.5.11 from its PyPI wheel and 0 CPU requirements"
    ]
    assert _installed_sglang(venv) == "0.5.11"
    assert json.loads((venv / MARKER).read_text()) == staging_marker("0.5.11", [])
    stamp = (venv / MARKER).stat().st_mtime_ns
    second = prepare_staging_venv(LocalHost(), PurePosixPath(venv), base_python="python3.11", sglang_version="0.5.11", requirements=[])
    assert not second.changed
    assert (venv / MARKER).stat().st_mtime_ns == stamp


def test_prepare_failure_keeps_previous_venv(tmp_path: Path) -> None:
    venv = tmp_path / "sglang-venv"
    prepare_staging_venv(LocalHost(), PurePosixPath(venv), base_python="python3.11", sglang_version="0.5.11", requirements=[])
    with pytest.raises(CommandFailed):
        prepare_staging_venv(LocalHost(), PurePosixPath(venv), base_python="python3.11", sglang_version="0.5.11", requirements=["no-such-package-ddtree-xyz==9.9"])
    assert _installed_sglang(venv) == "0.5.11"
    assert json.loads((venv / MARKER).read_text()) == staging_marker("0.5.11", [])


def test_prepare_failure_leaves_no_build_folder(tmp_path: Path) -> None:
    venv = tmp_path / "sglang-venv"
    with pytest.raises(CommandFailed):
        prepare_staging_venv(LocalHost(), PurePosixPath(venv), base_python="python3.11", sglang_version="0.0.0", requirements=[])
    assert list(tmp_path.iterdir()) == []
