"""TEST DOUBLE for the CUDA extension on a machine without a GPU: `torch.ops.ddtree`'s five ops
done by the torch reference on CPU tensors, after the checks the extension makes of its inputs
and output buffers (dtype, shape, contiguity: `check_out` in csrc/common.cuh), so the Python
wrappers' CUDA path in `ops.py` runs, and is counted, on CPU. It says nothing of the kernels
themselves (test_cuda_ops.py compares those on the GPU).

Each op counts as one dispatched call, as on the GPU, where it is one custom op; what the
reference does inside is not counted (`Dispatched.paused`).
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ddtree_kernels import ops, reference


class Dispatched(TorchDispatchMode):
    """The calls a step sends through torch's dispatcher, by name; a double's op is one."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []
        self.paused = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if not self.paused:
            self.calls.append(str(func))
        return func(*args, **(kwargs or {}))


def _check_out(t: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    """The extension's `check_out`, which it applies to inputs and outputs alike."""
    assert t.dtype == dtype, f"extension refuses dtype {t.dtype}, wants {dtype}"
    assert tuple(t.shape) == shape, f"extension refuses shape {tuple(t.shape)}, wants {shape}"
    assert t.is_contiguous(), "extension refuses a non-contiguous tensor"


def _rows(logits: torch.Tensor) -> None:
    assert logits.dim() == 2, "extension refuses logits that are not [R, V]"
    assert logits.stride(1) == 1, "extension refuses logits whose rows are not contiguous"


def _fill(outs: tuple[torch.Tensor, ...], values: tuple[torch.Tensor, ...]) -> None:
    for out, value in zip(outs, values, strict=True):
        out.copy_(value)


def _topk_logprobs(logits: torch.Tensor, k: int, logp: torch.Tensor, ids: torch.Tensor) -> None:
    _rows(logits)
    _check_out(logp, torch.float32, (logits.shape[0], k))
    _check_out(ids, torch.int64, (logits.shape[0], k))
    _fill((logp, ids), tuple(reference.topk_logprobs(logits, k)))


def _build_tree(logp: torch.Tensor, ids: torch.Tensor, root_tokens: torch.Tensor,
                prefix_lens: torch.Tensor, budget: int, *outs: torch.Tensor) -> None:  # fmt: skip
    assert logp.dim() == 3, "extension refuses logp that is not [B, L, K]"
    _check_out(logp, torch.float32, tuple(logp.shape))
    _check_out(ids, torch.int64, tuple(logp.shape))
    batch, n = logp.shape[0], budget + 1
    for t in (root_tokens, prefix_lens):
        _check_out(t, torch.int64, (batch,))
    *links, ancestor, next_token, next_sibling, retrieve, num_nodes, custom_mask = outs
    for t in (*links, next_token, next_sibling, retrieve):
        _check_out(t, torch.int64, (batch, n))
    _check_out(ancestor, torch.bool, (batch, n, n))
    _check_out(num_nodes, torch.int64, (batch,))
    _check_out(custom_mask, torch.bool, (custom_mask.numel(),))  # flat
    with_mask = custom_mask.numel() > 0  # sized by the caller from the host prefix sum
    tree = reference.build_tree(logp, ids, root_tokens, prefix_lens, budget,
                                int(prefix_lens.sum()) if with_mask else None)  # fmt: skip
    _fill(outs if with_mask else outs[:-1], tuple(tree) if with_mask else tuple(tree)[:-1])


def _verify_walk(tokens: torch.Tensor, parents: torch.Tensor, target: torch.Tensor,
                 *outs: torch.Tensor) -> None:  # fmt: skip
    batch, n = tokens.shape
    for t in (tokens, parents, target):
        _check_out(t, torch.int64, (batch, n))
    accept_index, accept_len, accept_tokens, bonus = outs
    width = accept_index.shape[1]
    for t in (accept_index, accept_tokens):
        _check_out(t, torch.int64, (batch, width))
    for t in (accept_len, bonus):
        _check_out(t, torch.int64, (batch,))
    _fill(outs, tuple(reference.verify_walk(tokens, parents, target, width - 1)))


def _commit_indices(
    accept_index: torch.Tensor, cache_loc: torch.Tensor, *outs: torch.Tensor
) -> None:
    _check_out(accept_index, torch.int64, tuple(accept_index.shape))
    _check_out(cache_loc, torch.int64, tuple(cache_loc.shape))
    for out in outs:
        _check_out(out, torch.int64, tuple(accept_index.shape))
    _fill(outs, tuple(reference.commit_indices(accept_index, cache_loc)))


def _sample_tokens(logits: torch.Tensor, temperatures: torch.Tensor, uniforms: torch.Tensor,
                   out: torch.Tensor) -> None:  # fmt: skip
    _rows(logits)
    for t in (temperatures, uniforms):
        _check_out(t, torch.float32, (logits.shape[0],))
    _check_out(out, torch.int64, (logits.shape[0],))
    out.copy_(reference.sample_tokens(logits, temperatures, uniforms))


OPS: dict[str, Callable[..., None]] = {
    "topk_logprobs": _topk_logprobs,
    "build_tree": _build_tree,
    "verify_walk": _verify_walk,
    "commit_indices": _commit_indices,
    "sample_tokens": _sample_tokens,
}


def install(monkeypatch: pytest.MonkeyPatch) -> Dispatched:
    """Route `ops`' CUDA path for every tensor through the double (undone with `monkeypatch`);
    the returned counter, entered around some work, lists what it dispatches."""
    counter = Dispatched()

    def counted(name: str, op: Callable[..., None]) -> Callable[..., None]:
        def call(*args: Any, **kwargs: Any) -> None:  # noqa: ANN401
            if not counter.paused:
                counter.calls.append(f"ddtree.{name}")
            counter.paused += 1
            try:
                op(*args, **kwargs)
            finally:
                counter.paused -= 1

        return call

    monkeypatch.setattr(ops, "backend_for", lambda tensor: ops.Backend.CUDA)
    monkeypatch.setattr(torch.ops, "ddtree", SimpleNamespace(
        **{name: counted(name, op) for name, op in OPS.items()}))  # fmt: skip
    return counter
