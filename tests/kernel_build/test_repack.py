"""Re-packing a kernels wheel with the checkout's Python: a real reference-only wheel from pip."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path, PurePosixPath

import pytest

from ddtree_deploy.hosts.local import LocalHost
from ddtree_deploy.kernel_build.errors import KernelBuildError
from ddtree_deploy.kernel_build.repack import with_python
from ddtree_deploy.patching.audit import installed_module_api


@pytest.fixture
def built_wheel(kernels_source: Path, tmp_path: Path) -> bytes:
    """The reference-only wheel pip builds from a copy of kernels/ (no torch needed)."""
    out = tmp_path / "wheel"
    pip = [sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps"]
    subprocess.run(
        [*pip, "--no-index", "-w", str(out), str(kernels_source)],
        env={**os.environ, "DDTREE_KERNELS_BUILD_CUDA": "0"},
        check=True,
        capture_output=True,
    )
    (wheel,) = out.glob("*.whl")
    return wheel.read_bytes()


def _files(wheel: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(wheel)) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def _record_is_true(files: dict[str, bytes]) -> bool:
    (record,) = (name for name in files if name.endswith(".dist-info/RECORD"))
    rows = {row[0]: row[1:] for row in csv.reader(io.StringIO(files[record].decode()))}
    if rows.pop(record) != ["", ""] or set(rows) != set(files) - {record}:
        return False
    for name, (hash_field, size) in rows.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(files[name]).digest()).rstrip(b"=")
        if hash_field != f"sha256={digest.decode()}" or int(size) != len(files[name]):
            return False
    return True


def test_the_repacked_wheel_carries_the_current_python_and_keeps_the_rest(
    built_wheel: bytes, kernels_source: Path
) -> None:
    module = kernels_source / "ddtree_kernels" / "sglang.py"
    module.write_text(module.read_text() + "\n# changed after the build\n")
    (kernels_source / "ddtree_kernels" / "types.py").unlink()
    (kernels_source / "ddtree_kernels" / "added.py").write_text("ADDED = True\n")

    repacked = with_python(built_wheel, kernels_source)
    before, after = _files(built_wheel), _files(repacked)
    assert after["ddtree_kernels/sglang.py"] == module.read_bytes()
    assert after["ddtree_kernels/added.py"] == b"ADDED = True\n"
    assert "ddtree_kernels/types.py" not in after
    assert _record_is_true(before) and _record_is_true(after)
    metadata = [n for n in before if ".dist-info/" in n and not n.endswith("RECORD")]
    assert metadata and all(after[n] == before[n] for n in metadata)
    assert list(after)[-1].endswith(".dist-info/RECORD")
    assert with_python(built_wheel, kernels_source) == repacked  # one wheel sha256 per input


def test_audit_reads_the_module_version_of_the_repacked_python(
    built_wheel: bytes, kernels_source: Path, tmp_path: Path
) -> None:
    """The module's API version that `action=audit` shows comes from the Python that was
    re-packed, not from the one the cached wheel was built with."""
    module = kernels_source / "ddtree_kernels" / "sglang.py"
    text, found = re.subn(r"\nAPI_VERSION = \d+\n", "\nAPI_VERSION = 41\n", module.read_text())
    assert found == 1, "the module's API line moved: update this test"
    module.write_text(text)
    wheel = tmp_path / "ddtree_kernels-0.1.0-py3-none-any.whl"
    wheel.write_bytes(with_python(built_wheel, kernels_source))
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
         "--target", str(site), str(wheel)],
        check=True, capture_output=True,
    )  # fmt: skip
    assert installed_module_api(LocalHost(), PurePosixPath(site)) == 41


def test_bytes_that_are_no_wheel_are_refused_in_one_sentence(kernels_source: Path) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("ddtree_kernels/__init__.py", "")
    with pytest.raises(KernelBuildError, match=r"holds 0 \.dist-info/RECORD files, not one"):
        with_python(buffer.getvalue(), kernels_source)
