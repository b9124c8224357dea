"""Dispatch in ddtree_kernels.ops: which path runs, and that it is never silent."""

from __future__ import annotations

import pytest
import torch
from inputs import random_topk

import ddtree_kernels
from ddtree_kernels import _extension, ops, reference


def test_backend_for_cpu_tensor_is_reference() -> None:
    assert ops.backend_for(torch.zeros(1)) is ops.Backend.REFERENCE


def test_build_info_says_whether_the_extension_loads() -> None:
    info = ddtree_kernels.build_info()
    assert info["cuda_extension_loaded"] == (info["reason"] is None)
    if not info["cuda_extension_built"]:
        assert "reference-only" in str(info["reason"])


@pytest.mark.skipif(_extension.is_loaded(), reason="the CUDA extension is loaded here")
def test_require_cuda_raises_when_extension_missing() -> None:
    with pytest.raises(ddtree_kernels.ExtensionUnavailableError, match="DDTREE_KERNELS_BUILD_CUDA"):
        ops.require_cuda()


def test_ops_on_cpu_equal_the_reference() -> None:
    logits = torch.randn(2, 3, 40, generator=torch.Generator().manual_seed(0))
    got_topk, want_topk = ops.topk_logprobs(logits, 4), reference.topk_logprobs(logits, 4)
    assert torch.equal(got_topk.ids, want_topk.ids)
    assert torch.equal(got_topk.logp, want_topk.logp)
    logp, ids = random_topk(2, 3, 2, vocab=40, seed=1)
    roots, prefix = torch.tensor([1, 2]), torch.tensor([3, 4])
    got = ops.build_tree(logp, ids, roots, prefix, 5, 7)
    want = reference.build_tree(logp, ids, roots, prefix, 5, 7)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_ops_build_tree_takes_a_column_of_the_block_ids() -> None:
    """The public op copies a strided `root_tokens` view into the kernel's layout on every path."""
    logp, ids = random_topk(3, 4, 2, vocab=50, seed=5)
    block_ids = torch.arange(3 * 16).view(3, 16)
    prefix = torch.tensor([2, 0, 9], dtype=torch.int32)
    got = ops.build_tree(logp, ids, block_ids[:, 0], prefix, 5, 11)
    want = reference.build_tree(logp, ids, block_ids[:, 0].clone(), prefix.long(), 5, 11)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
