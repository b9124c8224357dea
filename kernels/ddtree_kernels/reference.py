"""Reference semantics of the DDTree ops in plain torch (CPU or GPU, batched, fixed shapes).

This module is the specification the CUDA kernels must match bit for bit (log-probs within fp32
rounding, sampled tokens in distribution). It favours obviousness over speed, but it never copies
data to the host, so it also runs (slowly) on the GPU without synchronising.

Score convention: a node's score is its parent's score plus its own log-prob, added in fp32 in path
order (root score 0). With log-probs <= 0 a child never outscores its parent and a later sibling
never outscores an earlier one, so the best-first pop order is the order of all rank paths by
(score descending, rank tuple ascending), which is what the tests check against brute force.
"""

from __future__ import annotations

import torch

from ddtree_kernels.types import Accept, Commit, TopK, Tree, Walk

_INT64_MAX = torch.iinfo(torch.int64).max


def topk_logprobs(logits: torch.Tensor, k: int) -> TopK:
    """Top-k log-probs of each row of `logits` [..., V] (bf16/fp16/fp32), best first.

    Entries are chosen and ordered by logit (ties to the smaller token id), and
    `logp = logit - logsumexp(row)` in fp32.
    """
    if not 1 <= k <= logits.shape[-1]:
        raise ValueError(f"k={k} must be in [1, vocab={logits.shape[-1]}]")
    x = logits.float()
    values, ids = torch.sort(x, dim=-1, descending=True, stable=True)
    log_z = torch.logsumexp(x, dim=-1, keepdim=True)
    return TopK(values[..., :k] - log_z, ids[..., :k].contiguous())


def custom_mask_numel(prefix_lens_sum: int, batch: int, budget: int) -> int:
    """Elements of the flat custom mask: sum over requests of N * (prefix_len + N)."""
    n = budget + 1
    return n * prefix_lens_sum + batch * n * n


def check_tree_limits(max_depth: int, k: int, budget: int) -> None:
    """Raise ValueError unless the CUDA tree build takes L = `max_depth`, K = `k` and `budget`.

    The reference could build larger trees, but it refuses exactly what the kernel refuses, so a
    configuration that passes on CPU never fails first on a GPU server. The kernel keeps the
    frontier in registers (budget <= 511) and packs each rank path, most significant rank first,
    with its depth into one 64-bit sort key.
    """
    if not 1 <= budget <= 511:
        raise ValueError(f"ddtree: the tree build needs 1 <= budget <= 511; got {budget}")
    if not 1 <= k <= 16:
        raise ValueError(f"ddtree: the tree build needs 1 <= K <= 16; got {k}")
    if not 1 <= max_depth <= 32:
        raise ValueError(f"ddtree: the tree build needs 1 <= L <= 32; got {max_depth}")
    rank_bits = max(1, (k - 1).bit_length())
    if max_depth * rank_bits + max_depth.bit_length() > 64:
        raise ValueError(
            f"ddtree: the tree build cannot key L={max_depth} ranks of K={k} in 64 bits "
            "(K = 16 allows L <= 15)"
        )


def check_tree_inputs(
    logp: torch.Tensor,
    ids: torch.Tensor,
    root_tokens: torch.Tensor,
    prefix_lens: torch.Tensor,
    budget: int,
) -> None:
    """Raise ValueError unless the tree-build inputs are what the CUDA kernel accepts.

    Contiguity is checked here too, although this code would not need it: the CUDA kernel
    refuses a strided view (a column slice of the block ids, say), so the reference refuses it
    as well and a caller that passes one fails on CPU, not first on a GPU server.
    """
    if logp.dim() != 3 or logp.shape != ids.shape:
        raise ValueError(f"logp and ids must both be [B, L, K]; got {logp.shape}, {ids.shape}")
    if logp.dtype != torch.float32 or ids.dtype != torch.int64:
        raise ValueError(f"logp must be float32 and ids int64; got {logp.dtype}, {ids.dtype}")
    batch = logp.shape[0]
    if root_tokens.shape != (batch,) or prefix_lens.shape != (batch,):
        raise ValueError("root_tokens and prefix_lens must be [B]")
    for name, tensor in (("logp", logp), ("ids", ids), ("root_tokens", root_tokens)):
        if not tensor.is_contiguous():
            raise ValueError(f"ddtree: {name} must be contiguous")
    check_tree_limits(logp.shape[1], logp.shape[2], budget)


def _best_slot(score: torch.Tensor, path: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Index of each row's best frontier entry: highest score, then smallest rank tuple."""
    score = torch.where(valid, score, torch.tensor(float("-inf"), device=score.device))
    cand = valid & (score == score.max(dim=1, keepdim=True).values)
    for d in range(path.shape[2]):  # lexicographic tie-break; -1 pads make a prefix smaller
        col = torch.where(cand, path[:, :, d], _INT64_MAX)
        cand &= col == col.min(dim=1, keepdim=True).values
    return cand.int().argmax(dim=1)  # first True; 0 for rows with an empty frontier


def _ancestor_mask(parents: torch.Tensor, max_depth: int) -> torch.Tensor:
    """[B, N, N] bool: row i marks i and every ancestor of i (parents are -1 at roots/pads)."""
    batch, n = parents.shape
    mask = torch.zeros(batch, n, n + 1, dtype=torch.bool, device=parents.device)  # col n: dump
    cur = torch.arange(n, device=parents.device).expand(batch, n)
    for _ in range(max_depth + 1):
        mask.scatter_(2, torch.where(cur >= 0, cur, n).unsqueeze(2), True)
        cur = torch.where(cur >= 0, parents.gather(1, cur.clamp(min=0)), -1)
    return mask[:, :, :n].contiguous()


def _links(
    parents: torch.Tensor, ranks: torch.Tensor, real: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """First-child and next-sibling arrays from each node's (parent, rank)."""
    batch, n = parents.shape
    child = real & (parents >= 0)
    table = torch.full((batch, n * k + 1), -1, dtype=torch.int64, device=parents.device)
    slot = torch.where(child, parents.clamp(min=0) * k + ranks, n * k)  # n * k: a dump slot
    table.scatter_(1, slot, torch.arange(n, device=parents.device).expand(batch, n))
    table = table[:, : n * k].view(batch, n, k)
    next_token = table[:, :, 0].contiguous()
    has_next = child & (ranks + 1 < k)
    sib_slot = torch.where(has_next, parents.clamp(min=0) * k + ranks + 1, 0)
    next_sibling = torch.where(has_next, table.view(batch, n * k).gather(1, sib_slot), -1)
    return next_token, next_sibling


def _flat_custom_mask(
    ancestor_mask: torch.Tensor, prefix_lens: torch.Tensor, total: int
) -> torch.Tensor:
    """SGLang's flat custom mask: per request [N, prefix_len + N] (prefix all True), row-major.
    `total` may come from an upper bound of the prefix sum: entries past the last request's rows
    are True (as SGLang's `generate_attn_arg_prefill` pads), and a smaller total keeps the first
    `total` entries."""
    batch, n, _ = ancestor_mask.shape
    width = prefix_lens + n
    ends = torch.cumsum(n * width, dim=0)
    p = torch.arange(total, device=prefix_lens.device)
    req = torch.searchsorted(ends, p, right=True)
    past = req >= batch
    req = req.clamp(max=batch - 1)
    local = p - (ends[req] - n * width[req])
    row, col = (local // width[req]).clamp(max=n - 1), local % width[req]
    tree_col = (col - prefix_lens[req]).clamp(min=0)
    return past | (col < prefix_lens[req]) | ancestor_mask[req, row, tree_col]


def build_tree(
    logp: torch.Tensor,
    ids: torch.Tensor,
    root_tokens: torch.Tensor,
    prefix_lens: torch.Tensor,
    budget: int,
    prefix_lens_sum: int | None = None,
) -> Tree:
    """Best-first DDTree build for a batch: `logp`/`ids` [B, L, K] -> trees of budget + 1 nodes.

    `prefix_lens_sum` (a host int, e.g. SGLang's `seq_lens_sum`, or an upper bound of it: the
    tail is True) sizes the flat custom mask; None skips it (`custom_mask` is then empty).
    """
    check_tree_inputs(logp, ids, root_tokens, prefix_lens, budget)
    batch, max_depth, k = logp.shape
    n = budget + 1
    dev = logp.device
    rows = torch.arange(batch, device=dev)
    prefix_lens = prefix_lens.to(torch.int64)

    # Frontier: slot 0 holds the first entry; each pop may add one child in a fresh slot.
    f_score = torch.full((batch, n), float("-inf"), device=dev)
    f_valid = torch.zeros(batch, n, dtype=torch.bool, device=dev)
    f_depth = torch.zeros(batch, n, dtype=torch.int64, device=dev)
    f_rank = torch.zeros_like(f_depth)
    f_parent = torch.zeros_like(f_depth)
    f_path = torch.full((batch, n, max_depth), -1, dtype=torch.int64, device=dev)
    f_score[:, 0], f_valid[:, 0], f_depth[:, 0], f_path[:, 0, 0] = logp[:, 0, 0], True, 1, 0
    next_free = torch.ones(batch, dtype=torch.int64, device=dev)

    node_score = torch.zeros(batch, n, device=dev)
    parents = torch.full((batch, n), -1, dtype=torch.int64, device=dev)
    depths = torch.zeros_like(parents)
    ranks = torch.zeros_like(parents)
    tokens = torch.zeros_like(parents)
    tokens[:, 0] = root_tokens
    count = torch.ones(batch, dtype=torch.int64, device=dev)

    def put(t: torch.Tensor, idx: torch.Tensor, val: torch.Tensor, when: torch.Tensor) -> None:
        t[rows, idx] = torch.where(when, val, t[rows, idx])

    for _ in range(budget):
        live = f_valid.any(dim=1)
        slot = _best_slot(f_score, f_path, f_valid)
        score, depth = f_score[rows, slot], f_depth[rows, slot]
        rank, parent, path = f_rank[rows, slot], f_parent[rows, slot], f_path[rows, slot]
        lvl = (depth - 1).clamp(min=0)
        i = count
        put(node_score, i, score, live)
        put(parents, i, parent, live)
        put(depths, i, depth, live)
        put(ranks, i, rank, live)
        put(tokens, i, ids[rows, lvl, rank], live)
        count = count + live.long()

        # The next sibling replaces the popped entry.
        has_sib = live & (rank + 1 < k)
        sib_rank = (rank + 1).clamp(max=k - 1)
        put(f_score, slot, node_score[rows, parent] + logp[rows, lvl, sib_rank], has_sib)
        put(f_valid, slot, has_sib, live)
        put(f_rank, slot, sib_rank, has_sib)
        sib_path = path.scatter(1, lvl.unsqueeze(1), sib_rank.unsqueeze(1))
        f_path[rows, slot] = torch.where(has_sib.unsqueeze(1), sib_path, f_path[rows, slot])

        # The first child goes into a fresh slot.
        has_child = live & (depth < max_depth)
        c = next_free.clamp(max=n - 1)
        put(f_score, c, score + logp[rows, depth.clamp(max=max_depth - 1), 0], has_child)
        put(f_valid, c, has_child, has_child)
        put(f_depth, c, depth + 1, has_child)
        put(f_rank, c, torch.zeros_like(rank), has_child)
        put(f_parent, c, i, has_child)
        child_path = path.scatter(
            1, depth.clamp(max=max_depth - 1).unsqueeze(1), torch.zeros_like(depth).unsqueeze(1)
        )
        f_path[rows, c] = torch.where(has_child.unsqueeze(1), child_path, f_path[rows, c])
        next_free = next_free + has_child.long()

    real = torch.arange(n, device=dev) < count.unsqueeze(1)
    ancestor_mask = _ancestor_mask(parents, max_depth)
    next_token, next_sibling = _links(parents, ranks, real, k)
    retrieve_index = torch.where(real, rows.unsqueeze(1) * n + torch.arange(n, device=dev), -1)
    if prefix_lens_sum is None:
        custom_mask = torch.empty(0, dtype=torch.bool, device=dev)
    else:
        total = custom_mask_numel(prefix_lens_sum, batch, budget)
        custom_mask = _flat_custom_mask(ancestor_mask, prefix_lens, total)
    return Tree(
        tokens=tokens,
        parents=parents,
        depths=depths,
        positions=prefix_lens.unsqueeze(1) + depths,
        ancestor_mask=ancestor_mask,
        retrieve_next_token=next_token,
        retrieve_next_sibling=next_sibling,
        retrieve_index=retrieve_index,
        num_nodes=count,
        custom_mask=custom_mask,
    )


def verify_walk(
    tokens: torch.Tensor, parents: torch.Tensor, target_tokens: torch.Tensor, max_depth: int
) -> Walk:
    """Walk each tree from the root while the target's token at the current node is a child's.

    `tokens`, `parents` come from `build_tree`; `target_tokens` [B, N] is the target's token at
    every node (argmax, or a sample from `sample_tokens`). If two children share a token the
    lower node index wins.
    """
    batch, n = tokens.shape
    dev = tokens.device
    rows = torch.arange(batch, device=dev)
    width = max_depth + 1
    accept_index = torch.full((batch, width), -1, dtype=torch.int64, device=dev)
    accept_index[:, 0] = 0
    cur = torch.zeros(batch, dtype=torch.int64, device=dev)
    alive = torch.ones(batch, dtype=torch.bool, device=dev)
    for step in range(1, width):
        want = target_tokens[rows, cur]
        match = alive.unsqueeze(1) & (parents == cur.unsqueeze(1)) & (tokens == want.unsqueeze(1))
        alive = match.any(dim=1)
        nxt = match.int().argmax(dim=1)
        cur = torch.where(alive, nxt, cur)
        accept_index[:, step] = torch.where(alive, nxt, -1)
    accepted = accept_index >= 0
    gathered = target_tokens.gather(1, accept_index.clamp(min=0, max=n - 1))
    return Walk(
        accept_index=accept_index,
        accept_len=accepted.sum(dim=1),
        accept_tokens=torch.where(accepted, gathered, -1),
        bonus=target_tokens[rows, cur],
    )


def as_dtype(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`tensor` in `dtype`: itself where it already is. `Tensor.to` returns the same tensor then
    too, but only after a trip through torch's dispatcher, a few µs of host time in a step that
    is host-bound at batch 1 (issue 22)."""
    return tensor if tensor.dtype == dtype else tensor.to(dtype)


def accept_outputs(
    accept_len: torch.Tensor,
    accept_tokens: torch.Tensor,
    bonus: torch.Tensor,
    prefix_lens: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """DFlash's accept outputs from a walk (`verify_walk`'s, or one laid out as it): (accepted
    drafts int32, commit_lens int32, bonus int64, out_tokens [B, A] int64 with the committed
    tokens first and 0 after, new_seq_lens in prefix_lens' dtype)."""
    commit_lens = accept_len.to(torch.int32)
    out_tokens = as_dtype(accept_tokens, torch.int64).clamp(min=0)
    new_seq_lens = prefix_lens + as_dtype(accept_len, prefix_lens.dtype)
    return commit_lens - 1, commit_lens, as_dtype(bonus, torch.int64), out_tokens, new_seq_lens


def walk_accept(
    tokens: torch.Tensor,
    parents: torch.Tensor,
    target_tokens: torch.Tensor,
    max_depth: int,
    prefix_lens: torch.Tensor,
) -> Accept:
    """`verify_walk` in DFlash's accept outputs, with the path's nodes (`as_accept`)."""
    return as_accept(verify_walk(tokens, parents, target_tokens, max_depth), prefix_lens)


def as_accept(walk: Walk, prefix_lens: torch.Tensor) -> Accept:
    """`walk`'s DFlash accept outputs (`accept_outputs`), with its path's nodes."""
    outputs = accept_outputs(walk.accept_len, walk.accept_tokens, walk.bonus, prefix_lens)
    return Accept(*outputs, walk.accept_index)


def commit_indices(accept_index: torch.Tensor, cache_loc: torch.Tensor, rows: int = 0) -> Commit:
    """The KV moves and the hidden-row order that put the accepted path first in its window.

    `cache_loc` [B, N] holds the KV slot each tree node was written to during verify. The j-th
    accepted node (depth j, position prefix_len + j) moves from slot cache_loc[b, accept_index[j]]
    to cache_loc[b, j]; accept_index[j] >= j, so an ascending in-place copy never overwrites a
    source it still needs. Padding (-1) moves the root's slot onto itself, so the lists keep a
    fixed length and nothing is filtered on the host (no sync).

    `row_order` is for R = `rows` verify rows [B * N (+ trailing padding), ...]: row b * N + j
    takes row b * N + accept_index[b, j]; rows past the path, and the padding, keep their own.
    `rows` 0 (no hidden states to reorder) gives an empty order.
    """
    batch, n = cache_loc.shape
    width = accept_index.shape[1]
    if width > n or accept_index.shape[0] != batch:
        raise ValueError(f"accept_index {tuple(accept_index.shape)} must be [B, A <= N] for "
                         f"cache_loc {tuple(cache_loc.shape)}")  # fmt: skip
    if rows and rows < batch * n:
        raise ValueError(f"rows={rows} must be 0 or at least B * N = {batch * n}")
    accepted = accept_index >= 0
    root = cache_loc[:, :1]
    source = cache_loc.gather(1, accept_index.clamp(min=0))
    kv_target = torch.where(accepted, cache_loc[:, :width], root).reshape(-1)
    kv_source = torch.where(accepted, source, root).reshape(-1)
    row_order = torch.arange(rows, device=cache_loc.device)
    if rows:
        window = row_order[: batch * n].view(batch, n)[:, :width]
        path = torch.arange(batch, device=cache_loc.device).unsqueeze(1) * n + accept_index
        window.copy_(torch.where(accepted, path, window))
    return Commit(kv_target, kv_source, row_order)


def path_rows(accept_index: torch.Tensor, width: int) -> torch.Tensor:
    """A permutation [B * W] of the verify rows: each request's accepted path (`accept_index`
    [B, A], local, root first, -1 padded, A <= W) first, then its other nodes in node order.
    Indexing a window's slots, tokens or hidden rows with it lays the path out as a chain's
    committed prefix and keeps every other row. Defined as one sort of per-node keys: a path
    node's is its position, any other's W + its index."""
    batch, a = accept_index.shape
    if a > width:
        raise ValueError(f"accept_index {tuple(accept_index.shape)} is wider than width={width}")
    dev = accept_index.device
    key = torch.arange(width, 2 * width + 1, device=dev).repeat(batch, 1)  # a spare column W
    on_path = torch.arange(a, device=dev).expand(batch, a)
    key.scatter_(1, torch.where(accept_index >= 0, accept_index, width), on_path)
    first_row = torch.arange(batch, device=dev).unsqueeze(1) * width
    return (torch.argsort(key[:, :width], dim=1) + first_row).reshape(-1)


def sample_tokens(
    logits: torch.Tensor, temperatures: torch.Tensor, uniforms: torch.Tensor
) -> torch.Tensor:
    """One token per row of `logits` [R, V]: argmax where temperature <= 0, else a sample.

    The sample is the inverse CDF of softmax(logits / T) at `uniforms` [R] (in [0, 1)): the first
    token whose cumulative probability exceeds u. Ties in the argmax go to the smaller id.
    """
    x = logits.float()
    greedy = temperatures <= 0
    argmax = (x == x.max(dim=-1, keepdim=True).values).int().argmax(dim=-1)
    t = torch.where(greedy, torch.ones_like(temperatures), temperatures).float()
    cdf = torch.cumsum(torch.softmax(x / t.unsqueeze(1), dim=-1), dim=-1)
    target = (uniforms.float() * cdf[:, -1]).unsqueeze(1)
    drawn = torch.searchsorted(cdf, target, right=True).squeeze(1).clamp(max=x.shape[-1] - 1)
    return torch.where(greedy, argmax, drawn)
