"""The ABI key: stable for equal inputs, different when any one input changes."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from ddtree_deploy.kernel_build.key import (
    KernelKey,
    cuda_arch_list,
    python_tag,
    source_files,
    source_sha256,
    source_tarball,
)

BASE = KernelKey(
    torch_version="2.11.0+cu130",
    torch_cuda="13.0",
    cxx11_abi=True,
    python_tag="cp312",
    arch_list="9.0",
    source_sha256="ab" * 32,
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
        ("source_sha256", "ac" + "ab" * 31),
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


def test_source_hash_changes_with_one_source_byte(kernels_source: Path) -> None:
    before = source_sha256(kernels_source)
    assert source_sha256(kernels_source) == before
    cu = sorted(kernels_source.glob("csrc/*.cu"))[0]
    cu.write_bytes(cu.read_bytes() + b" ")
    assert source_sha256(kernels_source) != before


def test_source_hash_ignores_build_leftovers_and_tests(kernels_source: Path) -> None:
    before = source_sha256(kernels_source)
    (kernels_source / "build" / "temp").mkdir(parents=True)
    (kernels_source / "build" / "temp" / "ops.o").write_bytes(b"\0")
    (kernels_source / "ddtree_kernels" / "_C.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\0")
    (kernels_source / "ddtree_kernels" / "__pycache__").mkdir()
    (kernels_source / "ddtree_kernels" / "__pycache__" / "x.py").write_text("")
    (kernels_source / "tests").mkdir()
    (kernels_source / "tests" / "test_x.py").write_text("")
    assert source_sha256(kernels_source) == before
    names = {p.relative_to(kernels_source).as_posix() for p in source_files(kernels_source)}
    assert {"setup.py", "pyproject.toml", "ddtree_launch.py", "ddtree_kernels/__init__.py"} <= names
    assert not any(n.startswith(("build/", "tests/")) or n.endswith(".so") for n in names)


def test_source_tarball_is_byte_identical_for_identical_sources(kernels_source: Path) -> None:
    assert source_tarball(kernels_source) == source_tarball(kernels_source)
