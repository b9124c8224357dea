"""Result types shared by the reference and the CUDA path (plain named tuples of tensors)."""

from __future__ import annotations

from typing import NamedTuple

import torch


class TopK(NamedTuple):
    """Top-k of each logits row: `logp` fp32 [..., k], `ids` int64 [..., k], best first."""

    logp: torch.Tensor
    ids: torch.Tensor


class Tree(NamedTuple):
    """A batch of draft trees, each padded to N = budget + 1 nodes (node 0 is the root).

    All index tensors are int64 and hold node indices local to their request, -1 for none.
    Padding nodes (index >= num_nodes) have token 0, parent -1, depth 0, position prefix_len,
    no links, retrieve_index -1 and an ancestor-mask row holding only themselves.
    """

    tokens: torch.Tensor  # [B, N] int64; tokens[:, 0] is the root (bonus) token
    parents: torch.Tensor  # [B, N] int64; -1 at the root and on padding
    depths: torch.Tensor  # [B, N] int64; 0 at the root
    positions: torch.Tensor  # [B, N] int64; prefix_len + depth
    ancestor_mask: torch.Tensor  # [B, N, N] bool; row i marks i and its ancestors
    retrieve_next_token: torch.Tensor  # [B, N] int64; first child (lowest rank)
    retrieve_next_sibling: torch.Tensor  # [B, N] int64; next child of the same parent
    retrieve_index: torch.Tensor  # [B, N] int64; b * N + i for real nodes
    num_nodes: torch.Tensor  # [B] int64; real nodes, root included (<= N)
    custom_mask: torch.Tensor  # flat bool: per request [N, prefix_len + N], concatenated


class Walk(NamedTuple):
    """Outcome of verifying a batch of trees; A = max_depth + 1 slots per request."""

    accept_index: torch.Tensor  # [B, A] int64; accepted node indices, root first, -1 padded
    accept_len: torch.Tensor  # [B] int64; accepted nodes including the root (>= 1)
    accept_tokens: torch.Tensor  # [B, A] int64; tokens committed this step, -1 padded
    bonus: torch.Tensor  # [B] int64; target token at the last accepted node (next root)


class Accept(NamedTuple):
    """A walk in the form DFlash's accept returns it (its five outputs), with the path's nodes:
    what `walk_accept` gives in one kernel where the walk and five conversions took six calls."""

    accepted_drafts: torch.Tensor  # [B] int32; accepted draft tokens (accept_len - 1)
    commit_lens: torch.Tensor  # [B] int32; committed tokens (accept_len)
    bonus: torch.Tensor  # [B] int64; the target's token at the last accepted node
    out_tokens: torch.Tensor  # [B, A] int64; the committed tokens first, 0 after
    new_seq_lens: torch.Tensor  # [B], prefix_lens' dtype; prefix_lens + commit_lens
    accept_index: torch.Tensor  # [B, A] int64; the walk's accepted nodes, root first, -1 padded


class Commit(NamedTuple):
    """What commits the accepted path to the front of each verify window: the KV moves, as
    SGLang's `move_kv_cache(target, source)` takes them, and the hidden rows' new order."""

    kv_target: torch.Tensor  # [B * A] int64: cache_loc[b, j]; the root's slot on padding
    kv_source: torch.Tensor  # [B * A] int64: cache_loc[b, accept_index[b, j]]; likewise
    row_order: torch.Tensor  # [R] int64: the verify row each of R rows takes (a gather order)
