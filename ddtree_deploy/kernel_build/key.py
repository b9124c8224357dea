"""The ABI key of a kernels wheel; which `kernels/` files its compile reads, which ride along.

A wheel built for one key works on every host with the same key and on no other: the key holds
the torch version, torch's CUDA version, the C++11 ABI flag, the CPython tag, the CUDA arch list
(empty for the reference-only build) and a hash of the files the build reads (`build_files`).

The build reads only the C++/CUDA sources (`csrc/`, which also register `torch.ops.ddtree.*`, in
`ops.cpp`) and the packaging files (`setup.py` lists the sources and compile flags and decides
whether there is an extension at all; `pyproject.toml` names the package, its version and its
modules). The package's Python (`ddtree_kernels/*.py`, the launcher `ddtree_launch.py`) is
copied into the wheel as it is, so it stays out of the key: a change to it alone, such as
`ddtree_kernels/sglang.py`, reuses the cached wheel, and `repack.with_python` puts the current
Python into it before it is installed (`python_sha256` tells an install whether it has it).
Build leftovers inside `kernels/` (`build/`, an in-place `_C*.so`, `__pycache__`) and its tests
are not part of the wheel, so they are neither hashed nor shipped.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
from dataclasses import asdict, dataclass
from fnmatch import fnmatchcase
from pathlib import Path

# What setuptools and the compiler read (wheel paths, `fnmatch` style: `*` crosses folders).
_BUILD_PATTERNS = (
    "pyproject.toml",
    "setup.py",
    "setup.cfg",
    "MANIFEST.in",
    "csrc/*.cu",
    "csrc/*.cuh",
    "csrc/*.cpp",
    "csrc/*.h",
    "csrc/*.hpp",
)
# What the wheel carries byte for byte at the same path: replaceable without a compile.
_PYTHON_PATTERNS = ("ddtree_launch.py", "ddtree_kernels/*.py", "ddtree_kernels/py.typed")

# Fixed, and after 1980: the wheel's zip stores file times and cannot hold earlier ones.
_TAR_MTIME = 1_600_000_000

_ARCH = re.compile(r"sm_(\d+)(\d)([a-z]?)")


@dataclass(frozen=True)
class KernelKey:
    """Everything a kernels wheel's binary compatibility depends on."""

    torch_version: str  # "2.11.0+cu130", as torch.__version__ reports it
    torch_cuda: str | None  # "13.0"; None for a CPU build of torch
    cxx11_abi: bool
    python_tag: str  # "cp312"
    arch_list: str  # TORCH_CUDA_ARCH_LIST, "9.0"; "" = reference-only build (no extension)
    build_sha256: str  # of `build_files`: the package's Python is not in it

    @property
    def variant(self) -> str:
        """`cuda` when the wheel carries the compiled extension, else `reference`."""
        return "cuda" if self.arch_list else "reference"

    @property
    def digest(self) -> str:
        """sha256 over every field: equal digests mean interchangeable wheels."""
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()

    @property
    def slug(self) -> str:
        """Readable and unique: `cp312-torch2.11.0-cu130-sm90-<digest[:12]>` (a folder name)."""
        torch = self.torch_version.split("+", 1)[0]
        cuda = "cu" + self.torch_cuda.replace(".", "") if self.torch_cuda else "cpu"
        arch = "sm" + self.arch_list.replace(".", "").replace(";", "_") if self.arch_list else "ref"
        return f"{self.python_tag}-torch{torch}-{cuda}-{arch}-{self.digest[:12]}"

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "slug": self.slug, "digest": self.digest}


def cuda_arch_list(arch: str) -> str:
    """TORCH_CUDA_ARCH_LIST for a `gpu.arch` value: "sm_90" -> "9.0", "sm_120" -> "12.0"."""
    if not arch:
        return ""
    match = _ARCH.fullmatch(arch)
    if match is None:
        raise ValueError(f"{arch!r} is not a CUDA arch name like sm_90 or sm_120")
    major, minor, suffix = match.groups()
    return f"{major}.{minor}{suffix}"


def python_tag(python_version: str) -> str:
    """The CPython wheel tag of "3.12.3": "cp312"."""
    major, minor = python_version.split(".")[:2]
    return f"cp{major}{minor}"


def is_python_file(relative: str) -> bool:
    """Whether a path of the wheel (or of `kernels/`) is plain Python the wheel only carries."""
    return any(fnmatchcase(relative, pattern) for pattern in _PYTHON_PATTERNS)


def _matching(root: Path, patterns: tuple[str, ...]) -> list[Path]:
    found = (p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    rel = {p: p.relative_to(root).as_posix() for p in found}
    return sorted(p for p, r in rel.items() if any(fnmatchcase(r, pat) for pat in patterns))


def build_files(root: Path) -> list[Path]:
    """The files of `root` (a kernels/ tree) that the compile and the packaging read, sorted."""
    return _matching(root, _BUILD_PATTERNS)


def python_files(root: Path) -> list[Path]:
    """The package's plain Python files of `root`, sorted: what `repack` puts into a wheel."""
    return _matching(root, _PYTHON_PATTERNS)


def source_files(root: Path) -> list[Path]:
    """Every file the build needs (setuptools packages the Python too), sorted."""
    return sorted({*build_files(root), *python_files(root)})


def _sha256(root: Path, files: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in files:
        rel = path.relative_to(root).as_posix().encode()
        data = path.read_bytes()
        digest.update(len(rel).to_bytes(8, "big") + rel + len(data).to_bytes(8, "big") + data)
    return digest.hexdigest()


def build_sha256(root: Path) -> str:
    """Hash of the build's inputs (relative paths and bytes, in order): the key's source part."""
    return _sha256(root, build_files(root))


def python_sha256(root: Path) -> str:
    """Hash of the package's Python: equal hashes mean an install already carries this Python."""
    return _sha256(root, python_files(root))


def source_tarball(root: Path) -> bytes:
    """`source_files` as an uncompressed tar; byte-identical for identical sources."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in source_files(root):
            info = tarfile.TarInfo(path.relative_to(root).as_posix())
            data = path.read_bytes()
            info.size, info.mode, info.mtime = len(data), 0o644, _TAR_MTIME
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()
