"""Build script: the CUDA extension is built only when CUDA is asked for or available.

`pip install --no-build-isolation ./kernels` on a machine without CUDA gives a reference-only
install (`ddtree_kernels.build_info()` says so). Set DDTREE_KERNELS_BUILD_CUDA=1 to require the
extension (the build fails loudly if it cannot be built) or =0 to skip it.
"""

from __future__ import annotations

import os
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).parent
SOURCES = ["csrc/ops.cpp", "csrc/topk.cu", "csrc/tree.cu", "csrc/walk.cu", "csrc/sample.cu"]


def _want_cuda() -> bool:
    """Explicit env choice first; otherwise build when torch sees a CUDA toolkit and device."""
    flag = os.environ.get("DDTREE_KERNELS_BUILD_CUDA")
    if flag is not None:
        return flag == "1"
    try:
        import torch
        from torch.utils.cpp_extension import CUDA_HOME
    except ImportError:
        return False
    return torch.cuda.is_available() and CUDA_HOME is not None


def _extensions() -> tuple[list[object], dict[str, object]]:
    if not _want_cuda():
        return [], {}
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    ext = CUDAExtension(
        name="ddtree_kernels._C",
        sources=SOURCES,
        extra_compile_args={
            "cxx": ["-O3"],
            "nvcc": ["-O3", "--expt-relaxed-constexpr", "-lineinfo"],
        },
        py_limited_api=False,
    )
    return [ext], {"build_ext": BuildExtension.with_options(use_ninja=True)}


ext_modules, cmdclass = _extensions()
setup(ext_modules=ext_modules, cmdclass=cmdclass)
