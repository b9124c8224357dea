"""Public DDTree ops: CUDA kernels for CUDA tensors when the extension loads, else the reference.

`backend_for(tensor)` says which path a call takes. A CUDA tensor without the extension runs the
(slow, pure-torch) reference with a one-time warning, or raises `ExtensionUnavailableError` when
`DDTREE_KERNELS_REQUIRE_CUDA=1` is set or `require_cuda()` was called. On the CUDA path each op is
one call into the extension, which allocates its outputs on the current stream and never
synchronises with the host, so a whole step (top-k, tree, walk, commit) can be captured in one
CUDA graph.
"""

from __future__ import annotations

import enum
import os
import warnings

import torch

from ddtree_kernels import _extension, reference
from ddtree_kernels.errors import ExtensionUnavailableError
from ddtree_kernels.reference import as_dtype, check_tree_limits, custom_mask_numel
from ddtree_kernels.types import Accept, Commit, TopK, Tree, Walk

__all__ = [
    "Backend",
    "as_dtype",
    "backend_for",
    "build_tree",
    "check_tree_limits",
    "commit_indices",
    "custom_mask_numel",
    "path_rows",
    "require_cuda",
    "sample_tokens",
    "topk_logprobs",
    "verify_walk",
    "walk_accept",
]


class Backend(enum.Enum):
    """Which implementation an op call runs."""

    CUDA = "cuda"
    REFERENCE = "reference"


_state = {"required": os.environ.get("DDTREE_KERNELS_REQUIRE_CUDA") == "1", "warned": False}


def require_cuda() -> None:
    """Make CUDA tensors fail loudly instead of falling back; raise now if the extension is out."""
    _state["required"] = True
    reason = _extension.load_error()
    if reason is not None:
        raise ExtensionUnavailableError(reason)


def backend_for(tensor: torch.Tensor) -> Backend:
    """The path ops take for `tensor`: CUDA kernels, or the torch reference."""
    if not tensor.is_cuda:
        return Backend.REFERENCE
    reason = _extension.load_error()
    if reason is None:
        return Backend.CUDA
    if _state["required"]:
        raise ExtensionUnavailableError(reason)
    if not _state["warned"]:
        warnings.warn(
            f"ddtree_kernels: running the torch reference on CUDA tensors ({reason})",
            RuntimeWarning,
            stacklevel=3,
        )
        _state["warned"] = True
    return Backend.REFERENCE


def topk_logprobs(logits: torch.Tensor, k: int) -> TopK:
    """Top-k log-probs of each row of `logits` [..., V] (bf16/fp16/fp32); see the reference.

    CUDA: one pass over the logits (k <= 16), last dimension contiguous.
    """
    if backend_for(logits) is Backend.REFERENCE:
        return reference.topk_logprobs(logits, k)
    if not 1 <= k <= logits.shape[-1]:
        raise ValueError(f"k={k} must be in [1, vocab={logits.shape[-1]}]")
    return TopK(*torch.ops.ddtree.topk_logprobs(logits, k))


def build_tree(
    logp: torch.Tensor,
    ids: torch.Tensor,
    root_tokens: torch.Tensor,
    prefix_lens: torch.Tensor,
    budget: int,
    prefix_lens_sum: int | None = None,
) -> Tree:
    """Best-first trees from `logp`/`ids` [B, L, K]; outputs padded to N = budget + 1 nodes.

    `root_tokens` [B] int64 is each request's bonus token, `prefix_lens` [B] (int32/int64) the
    tokens already in its KV cache. `prefix_lens_sum` (host int, sum of prefix_lens) sizes the flat
    custom mask; None skips building it. The mask is laid out by the device's `prefix_lens`: a sum
    below theirs (a graph replayed at longer prefixes) truncates it. CUDA limits: K <= 16,
    L <= 32, budget <= 511, and L * ceil(log2 K) + bits(L) <= 64 (K = 16 allows L <= 15).
    """
    # Both paths get the layout the kernel declares: views (a column of the block ids) are
    # copied here, once, rather than refused by one backend and accepted by the other.
    logp, ids = logp.contiguous(), ids.contiguous()
    root_tokens = as_dtype(root_tokens, torch.int64).contiguous()
    prefix_lens = as_dtype(prefix_lens, torch.int64).contiguous()
    if backend_for(logp) is Backend.REFERENCE:
        return reference.build_tree(logp, ids, root_tokens, prefix_lens, budget, prefix_lens_sum)
    reference.check_tree_inputs(logp, ids, root_tokens, prefix_lens, budget)
    batch = logp.shape[0]
    mask_numel = 0 if prefix_lens_sum is None else custom_mask_numel(prefix_lens_sum, batch, budget)
    outputs = torch.ops.ddtree.build_tree(logp, ids, root_tokens, prefix_lens, budget, mask_numel)
    return Tree(*outputs)


def verify_walk(
    tokens: torch.Tensor, parents: torch.Tensor, target_tokens: torch.Tensor, max_depth: int
) -> Walk:
    """Accepted path per request from the target's token at every node; see the reference.

    `tokens`, `parents` [B, N] from `build_tree`; `target_tokens` [B, N] int64; `max_depth` = L.
    """
    if backend_for(tokens) is Backend.REFERENCE:
        return reference.verify_walk(tokens, parents, target_tokens, max_depth)
    return Walk(*torch.ops.ddtree.verify_walk(
        tokens.contiguous(), parents.contiguous(), target_tokens.contiguous(), max_depth + 1
    ))  # fmt: skip


def walk_accept(
    tokens: torch.Tensor,
    parents: torch.Tensor,
    target_tokens: torch.Tensor,
    max_depth: int,
    prefix_lens: torch.Tensor,
) -> Accept:
    """`verify_walk` with DFlash's accept outputs written by the same kernel; see the reference.

    `prefix_lens` [B] int32/int64: the tokens in each request's KV cache before this step;
    `new_seq_lens` comes back in its dtype.
    """
    if backend_for(tokens) is Backend.REFERENCE:
        return reference.walk_accept(tokens, parents, target_tokens, max_depth, prefix_lens)
    return Accept(*torch.ops.ddtree.walk_accept(
        tokens.contiguous(), parents.contiguous(), target_tokens.contiguous(),
        prefix_lens.contiguous(), max_depth + 1,
    ))  # fmt: skip


def commit_indices(accept_index: torch.Tensor, cache_loc: torch.Tensor, rows: int = 0) -> Commit:
    """The KV moves and hidden-row order that commit the accepted path; see the reference.

    `cache_loc` [B, N] int64: the KV slot each tree node was written to during verify; `rows`:
    how many verify rows (B * N and any trailing padding) `row_order` orders, 0 for none.
    """
    if backend_for(accept_index) is Backend.REFERENCE:
        return reference.commit_indices(accept_index, cache_loc, rows)
    return Commit(*torch.ops.ddtree.commit_indices(
        accept_index.contiguous(), as_dtype(cache_loc, torch.int64).contiguous(), rows
    ))  # fmt: skip


def path_rows(accept_index: torch.Tensor, width: int) -> torch.Tensor:
    """The verify rows [B * W] with each accepted path first, then the other nodes in node
    order; see the reference. CUDA: one kernel where the sort took eight calls."""
    if backend_for(accept_index) is Backend.REFERENCE:
        return reference.path_rows(accept_index, width)
    return torch.ops.ddtree.path_rows(accept_index.contiguous(), width)


def sample_tokens(
    logits: torch.Tensor, temperatures: torch.Tensor, uniforms: torch.Tensor
) -> torch.Tensor:
    """One target token per row of `logits` [R, V]: argmax at T <= 0, else an inverse-CDF draw.

    `temperatures` and `uniforms` are fp32 [R] (expand a per-request temperature to its rows).
    Feed the result, viewed as [B, N], to `verify_walk`.
    """
    if backend_for(logits) is Backend.REFERENCE:
        return reference.sample_tokens(logits, temperatures, uniforms)
    return torch.ops.ddtree.sample_tokens(
        logits, temperatures.float().contiguous(), uniforms.float().contiguous()
    )
