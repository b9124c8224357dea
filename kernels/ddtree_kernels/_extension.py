"""Loading the compiled `ddtree_kernels._C` extension (which registers `torch.ops.ddtree.*`)."""

from __future__ import annotations

import functools
import importlib
import importlib.util

import torch


@functools.cache
def load_error() -> str | None:
    """Import the extension once; return why it cannot be used, or None when it can."""
    if importlib.util.find_spec("ddtree_kernels._C") is None:
        return "the package was installed without the CUDA extension (reference-only build)"
    try:
        importlib.import_module("ddtree_kernels._C")
    except ImportError as err:
        return f"importing ddtree_kernels._C failed: {err}"
    if not hasattr(torch.ops.ddtree, "topk_logprobs"):
        return "ddtree_kernels._C imported but registered no torch.ops.ddtree ops"
    return None


def is_built() -> bool:
    """Whether this install contains the compiled extension at all."""
    return importlib.util.find_spec("ddtree_kernels._C") is not None


def is_loaded() -> bool:
    """Whether `torch.ops.ddtree.*` CUDA kernels are registered and callable."""
    return load_error() is None
