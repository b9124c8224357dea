"""The ABI key: stable for equal inputs, different when any one input the compile reads changes,
and blind to the package Python, which travels without a compile."""

from __future__ import annotations

import dataclasses
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from ddtree_deploy.hosts.facts import HostFacts
from ddtree_deploy.kernel_build.key import (
    KernelKey,
    build_sha256,
    cuda_arch_list,
    python_files,
    python_sha256,
    python_tag,
    source_files,
    source_tarball,
)
from ddtree_deploy.kernel_build.step import KernelsStep

BASE = KernelKey(
    torch_version="2.11.0+cu130",
    torch_cuda="13.0",
    cxx11_abi=True,
    python_tag="cp312",
    arch_list="9.0",
    build_sha256="ab" * 32,
)


def test_key_is_stable_for_equal_inputs() -> None:
    again = dataclasses.replace(BASE)
    assert again.digest == BASE.digest
    assert again.slug == BASE.slug
    assert BASE.slug.startswith("cp312-torch2.11.0-cu130-sm90-")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("torch_version", "2.11.1+cu130"),
        ("torch_cuda", "12.8"),
        ("cxx11_abi", False),
        ("python_tag", "cp311"),
        ("arch_list", "12.0"),
        ("arch_list", ""),
        ("build_sha256", "ac" + "ab" * 31),
    ],
)
def test_key_changes_when_one_component_changes(field: str, value: Any) -> None:
    other = dataclasses.replace(BASE, **{field: value})
    assert other.digest != BASE.digest
    assert other.slug != BASE.slug


def test_key_variant_follows_the_arch_list() -> None:
    assert BASE.variant == "cuda"
    reference = dataclasses.replace(BASE, arch_list="")
    assert reference.variant == "reference"
    assert "-ref-" in reference.slug


@pytest.mark.parametrize(
    ("arch", "expected"), [("sm_90", "9.0"), ("sm_120", "12.0"), ("sm_90a", "9.0a"), ("", "")]
)
def test_cuda_arch_list_from_gpu_arch(arch: str, expected: str) -> None:
    assert cuda_arch_list(arch) == expected


def test_cuda_arch_list_rejects_a_bad_name() -> None:
    with pytest.raises(ValueError, match="is not a CUDA arch name"):
        cuda_arch_list("hopper")


def test_python_tag_from_version() -> None:
    assert python_tag("3.12.3") == "cp312"


FACTS = HostFacts(
    host="lab",
    python_path="/venv/bin/python",
    python_version="3.12.3",
    torch_version="2.11.0+cu130",
    torch_cuda="13.0",
    cxx11_abi=True,
)


def _key(source: Path, arch: str = "sm_90") -> KernelKey:
    """The key the kernels step computes for `source` on a host with FACTS."""
    step = KernelsStep(
        host_name="lab",
        python=PurePosixPath("/venv/bin/python"),
        state_dir=PurePosixPath("/var/lib/ddtree"),
        arch=arch,
        staging=False,
        source_dir=source,
    )
    return step.key(FACTS)


def test_a_python_only_change_to_the_sglang_module_keeps_the_wheel_key(
    kernels_source: Path,
) -> None:
    key, python = _key(kernels_source), python_sha256(kernels_source)
    module = kernels_source / "ddtree_kernels" / "sglang.py"
    module.write_text(module.read_text() + "\n# a Python-only change\n")
    assert _key(kernels_source) == key
    assert python_sha256(kernels_source) != python  # what tells the host to take the new Python
    (kernels_source / "ddtree_launch.py").write_text("# the launcher changed too\n")
    (kernels_source / "ddtree_kernels" / "new_module.py").write_text("X = 1\n")
    assert _key(kernels_source) == key
    assert module in python_files(kernels_source)


@pytest.mark.parametrize(
    "relative", ["csrc/tree.cu", "csrc/common.cuh", "csrc/ops.cpp", "csrc/ops.h", "setup.py",
                 "pyproject.toml"],
)  # fmt: skip
def test_a_change_to_what_the_compile_reads_changes_the_wheel_key(
    kernels_source: Path, relative: str
) -> None:
    key, python = _key(kernels_source), python_sha256(kernels_source)
    path = kernels_source / relative
    path.write_bytes(path.read_bytes() + b"\n")
    assert _key(kernels_source) != key
    assert python_sha256(kernels_source) == python


def test_a_build_setting_changes_the_wheel_key(kernels_source: Path) -> None:
    assert _key(kernels_source, "sm_90") != _key(kernels_source, "sm_120")
    assert _key(kernels_source).build_sha256 == build_sha256(kernels_source)


def test_source_hash_ignores_build_leftovers_and_tests(kernels_source: Path) -> None:
    before = (build_sha256(kernels_source), python_sha256(kernels_source))
    (kernels_source / "build" / "temp").mkdir(parents=True)
    (kernels_source / "build" / "temp" / "ops.o").write_bytes(b"\0")
    (kernels_source / "ddtree_kernels" / "_C.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\0")
    (kernels_source / "ddtree_kernels" / "__pycache__").mkdir()
    (kernels_source / "ddtree_kernels" / "__pycache__" / "x.py").write_text("")
    (kernels_source / "tests").mkdir()
    (kernels_source / "tests" / "test_x.py").write_text("")
    (kernels_source / "build" / "lib" / "ddtree_kernels").mkdir(parents=True)
    (kernels_source / "build" / "lib" / "ddtree_kernels" / "sglang.py").write_text("")
    assert (build_sha256(kernels_source), python_sha256(kernels_source)) == before
    names = {p.relative_to(kernels_source).as_posix() for p in source_files(kernels_source)}
    assert {"setup.py", "pyproject.toml", "ddtree_launch.py", "ddtree_kernels/__init__.py"} <= names
    assert not any(n.startswith(("build/", "tests/")) or n.endswith(".so") for n in names)


def test_source_tarball_is_byte_identical_for_identical_sources(kernels_source: Path) -> None:
    assert source_tarball(kernels_source) == source_tarball(kernels_source)
