"""DDTree speculative-decoding ops for SGLang: pure-torch reference and CUDA kernels.

Call `ddtree_kernels.ops` (it picks CUDA or the reference per tensor); `reference` is the
specification. `build_info()` says what this install can do.
"""

from __future__ import annotations

import torch

from ddtree_kernels import _extension
from ddtree_kernels.errors import ExtensionUnavailableError
from ddtree_kernels.types import Accept, Commit, TopK, Tree, Walk

__all__ = ["Accept", "Commit", "ExtensionUnavailableError", "TopK", "Tree", "Walk", "build_info"]


def build_info() -> dict[str, object]:
    """Describe this install: whether the CUDA extension was built and loads, and why not."""
    return {
        "cuda_extension_built": _extension.is_built(),
        "cuda_extension_loaded": _extension.is_loaded(),
        "reason": _extension.load_error(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
    }
