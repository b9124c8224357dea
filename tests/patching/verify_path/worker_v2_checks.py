"""The DDTREE verify-path checks the worker-v2 releases share (0.5.14 to 0.5.17, 0.5.21 to 0.5.23).

Imported by each release's `checks_<release>.py`, run inside that release's staging venv with
the patched `sglang/` first on PYTHONPATH, then this folder and `kernels/` (ddtree_kernels, its
pure-torch reference on CPU). The registry, the fork per check and the TP-group double come
from checklib.py.

Real: the dflash_utils helpers the patch sets add, DDTreeVerifyInput, SpeculativeAlgorithm,
SpecInputType and SGLang's native KV move. TEST DOUBLES, because the real objects need several
GPUs: `Group` (TP ranks as threads).
"""

from __future__ import annotations

import contextlib
import sys
from types import SimpleNamespace

import sglang.srt.speculative.dflash_utils as U
import sglang.srt.speculative.spec_info as SI
import torch
from checklib import Group, check, same
from ddtree_kernels import ops
from ddtree_kernels import sglang as ddtree_module
from sglang.srt.mem_cache.memory_pool import move_kv_cache_native
from sglang.srt.speculative.dflash_info import DDTreeVerifyInput, DFlashVerifyInput
from sglang.srt.speculative.spec_info import SpecInputType, SpeculativeAlgorithm


class _Helpers:
    """The set's DDTREE helpers by the names the fat sets define in dflash_utils (`ddtree_X`); a
    set on ddtree_kernels.sglang calls the module's X (docs/ddtree-module.md, "What each set
    keeps"), and its dflash_utils keeps only what DFLASH code calls
    (`ddtree_verify_uses_tree_mask`, `ddtree_draft_block_size`; 0.5.17 and 0.5.18 also their draft
    runner's server args and spec-bag scope and their request validation)."""

    def __getattr__(self, name: str):
        if hasattr(U, name):
            return getattr(U, name)
        return getattr(ddtree_module, name.removeprefix("ddtree_"))


D = _Helpers()


def plain_topk(hidden: torch.Tensor, weight: torch.Tensor, k: int):
    """The plain-torch definition: full-vocab log-softmax of the head's logits, top k."""
    logits = torch.matmul(hidden.to(weight.dtype), weight.T).float()
    logp = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    # Ties (frequent in bf16) go to the smaller token id: a stable descending sort.
    values, ids = torch.sort(logp, dim=-1, descending=True, stable=True)
    return values[:, :k], ids[:, :k]


def sglang_mask(ancestor: torch.Tensor, prefix_lens: list[int]) -> torch.Tensor:
    """SGLang's verify mask layout written out per request, as DFlash's 0.5.11
    prepare_for_verify loop does: [N, prefix + N] bool, prefix columns True, row-major."""
    blocks = []
    for b, p in enumerate(prefix_lens):
        n = ancestor.shape[1]
        blocks.append(torch.cat([torch.ones(n, p, dtype=torch.bool), ancestor[b]], 1).reshape(-1))
    return torch.cat(blocks)


def draft_logits(bs: int, depth: int, vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(bs, depth, vocab, generator=g) * 3
    return logits, g


# ------------------------------------------------------------------ draft log-probs


@check
def topk_single_rank():
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(37, 32, generator=g)
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        weight = torch.randn(500, 32, generator=g).to(dtype)
        logp, ids = D.ddtree_draft_topk_logprobs(hidden, weight, 6, num_org=500, chunk_size=16)
        ref_logp, ref_ids = plain_topk(hidden, weight, 6)
        out[str(dtype)] = {
            "ids_equal": same(ids, ref_ids),
            "max_abs_diff": float((logp - ref_logp).abs().max()),
            "dtype": str(logp.dtype),
        }
    # Only the first num_org rows of the shard are vocabulary (the rest is padding).
    weight = torch.randn(64, 32, generator=g)
    weight[50:] = 100.0
    _, ids = D.ddtree_draft_topk_logprobs(hidden, weight, 4, num_org=50)
    out["padding_ignored"] = bool((ids < 50).all())
    return out


@check
def topk_tensor_parallel():
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(21, 24, generator=g)
    vocab, tp, k = 600, 4, 8
    weight = torch.randn(vocab, 24, generator=g)
    shard = vocab // tp
    group = Group(tp)

    def rank(r: int):
        return D.ddtree_draft_topk_logprobs(
            hidden,
            weight[r * shard : (r + 1) * shard],
            k,
            num_org=shard,
            org_vocab_start=r * shard,
            tp_group=group,
            chunk_size=8,
        )

    results = group.run(rank)
    ref_logp, ref_ids = plain_topk(hidden, weight, k)
    return {
        "ranks_agree": all(same(r[1], results[0][1]) for r in results),
        "ids_equal": same(results[0][1], ref_ids),
        "max_abs_diff": float((results[0][0] - ref_logp).abs().max()),
    }


@check
def merge_ties_to_smaller_id():
    # Two ranks hold the same logit for ids 7 (rank 1) and 3 (rank 0): the smaller id wins.
    logp = torch.tensor([[[-1.0, -2.0]], [[-1.0, -3.0]]])
    ids = torch.tensor([[[3, 4]], [[7, 9]]])
    log_z = torch.zeros(2, 1)
    m_logp, m_ids = D.ddtree_merge_tp_topk(logp, ids, log_z, 3)
    want_z = torch.logsumexp(torch.zeros(2), 0)
    return {
        "ids": m_ids.tolist(),
        "logp_ok": bool(torch.allclose(m_logp, torch.tensor([[-1.0, -1.0, -2.0]]) - want_z)),
    }


# ------------------------------------------------------------------ tree and verify input


def _tree_inputs(bs: int, depth: int, k: int, seed: int):
    logits, g = draft_logits(bs, depth, 50, seed)
    top = ops.topk_logprobs(logits, k)
    roots = torch.randint(0, 50, (bs,), generator=g)
    return top.logp, top.ids, roots


@check
def tree_full_width():
    width, bs, k = 8, 3, 3
    logp, ids, roots = _tree_inputs(bs, width - 1, k, 3)
    prefix = [5, 0, 11]
    prefix_t = torch.tensor(prefix)
    tree = D.ddtree_build_verify_tree(
        logp=logp, ids=ids, root_tokens=roots, prefix_lens=prefix_t,
        budget=width - 1, width=width, prefix_lens_sum=sum(prefix),
    )  # fmt: skip
    ref = ops.build_tree(logp, ids, roots, prefix_t, width - 1, sum(prefix))
    fields_equal = all(same(getattr(tree, f), getattr(ref, f)) for f in ref._fields)
    numel = width * sum(prefix) + bs * width * width
    helper_mask = D.ddtree_flat_tree_mask(ref.ancestor_mask, prefix_t, numel)
    # An upper bound of the prefix sum (overlap scheduling): same layout, True tail.
    upper = D.ddtree_build_verify_tree(
        logp=logp, ids=ids, root_tokens=roots, prefix_lens=prefix_t, budget=width - 1,
        width=width, prefix_lens_sum=sum(prefix) + 9, prefix_lens_sum_exact=False,
    )  # fmt: skip
    return {
        "fields_equal_kernels": fields_equal,
        "mask_is_sglang_layout": same(tree.custom_mask, sglang_mask(ref.ancestor_mask, prefix)),
        "helper_mask_equal_kernels": same(helper_mask, ref.custom_mask),
        "upper_bound_prefix_equal": same(upper.custom_mask[:numel], ref.custom_mask),
        "upper_bound_tail_true": bool(upper.custom_mask[numel:].all()),
        "upper_bound_tail_len": int(upper.custom_mask.numel() - numel),
        "positions_prefix_plus_depth": same(tree.positions, prefix_t[:, None] + tree.depths),
        "branching": bool((tree.retrieve_next_sibling >= 0).any()),
    }


@check
def tree_padded_to_width():
    width, budget, bs, k = 8, 4, 2, 2
    logp, ids, roots = _tree_inputs(bs, width - 1, k, 4)
    prefix = [3, 6]
    prefix_t = torch.tensor(prefix)
    tree = D.ddtree_build_verify_tree(
        logp=logp, ids=ids, root_tokens=roots, prefix_lens=prefix_t,
        budget=budget, width=width, prefix_lens_sum=sum(prefix),
    )  # fmt: skip
    ref = ops.build_tree(logp, ids, roots, prefix_t, budget)
    n = budget + 1
    head_equal = all(
        same(getattr(tree, f)[:, :n], getattr(ref, f))
        for f in ("tokens", "parents", "depths", "positions",
                  "retrieve_next_token", "retrieve_next_sibling")
    )  # fmt: skip
    pad = slice(n, width)
    eye = torch.eye(width - n, dtype=torch.bool).expand(bs, -1, -1)
    return {
        "shape": list(tree.tokens.shape),
        "head_equal_kernels": head_equal,
        "ancestor_head_equal": same(tree.ancestor_mask[:, :n, :n], ref.ancestor_mask),
        "pad_tokens_zero": bool((tree.tokens[:, pad] == 0).all()),
        "pad_parents_none": bool((tree.parents[:, pad] == -1).all()),
        "pad_links_none": bool((tree.retrieve_next_token[:, pad] == -1).all()),
        "pad_positions_prefix": same(
            tree.positions[:, pad], prefix_t[:, None].expand(bs, width - n)
        ),
        "pad_rows_only_self": same(tree.ancestor_mask[:, pad, pad], eye)
        and not bool(tree.ancestor_mask[:, pad, :n].any()),
        "retrieve_index": tree.retrieve_index.tolist(),
        "mask_is_sglang_layout": same(tree.custom_mask, sglang_mask(tree.ancestor_mask, prefix)),
    }


@check
def verify_input_type():
    width = 4
    tree = D.ddtree_chain_tree(torch.tensor([[9, 1, 2, 3]]), torch.tensor([5]))
    vi = DDTreeVerifyInput(
        draft_token=tree.tokens.reshape(-1),
        positions=tree.positions.reshape(-1),
        draft_token_num=width,
        custom_mask=None,
        retrieve_index=tree.retrieve_index,
        retrieve_next_token=tree.retrieve_next_token,
        retrieve_next_sibling=tree.retrieve_next_sibling,
        tree_parents=tree.parents,
    )
    return {
        "is_dflash_verify_input": isinstance(vi, DFlashVerifyInput),
        "spec_input_type_dflash_verify": vi.spec_input_type == SpecInputType.DFLASH_VERIFY,
        "is_verify_input": bool(vi.is_verify_input()),
        # 0.5.16 renamed num_tokens_per_batch to num_tokens_per_req.
        "num_tokens": getattr(vi, "num_tokens_per_req", getattr(vi, "num_tokens_per_batch", None)),
        "topk": vi.topk,
        "next_token": vi.retrieve_next_token.tolist(),
        "positions": vi.positions.tolist(),
    }


# ------------------------------------------------------------------ accept and commit


def branching_case():
    """A hand-made tree (width 6) whose accepted path takes a second child:
    0 -> {1: tok 10, 2: tok 11}; 2 -> {3: tok 20}; 3 -> {4: tok 30, 5: tok 31}."""
    parents = torch.tensor([[-1, 0, 0, 2, 3, 3]])
    tokens = torch.tensor([[99, 10, 11, 20, 30, 31]])
    # Target: at root 11 (-> node 2), at node 2 20 (-> 3), at node 3 31 (-> 5), at 5 bonus 77.
    target = torch.tensor([[11, 0, 20, 31, 0, 77]])
    return tokens, parents, target


@check
def accept_and_commit():
    tokens, parents, target = branching_case()
    width = tokens.shape[1]
    walk = ops.verify_walk(tokens, parents, target, width - 1)
    prefix = torch.tensor([40])
    drafts, commit_lens, bonus, out_tokens, new_seq_lens = D.ddtree_accept_outputs(
        walk.accept_len, walk.accept_tokens, walk.bonus, prefix
    )
    cache_loc = torch.tensor([[100, 101, 102, 103, 104, 105]])
    # A KV pool whose slot s holds the value s, moved with SGLang's own native move.
    k_buf = [torch.arange(128, dtype=torch.float32).view(128, 1, 1).repeat(1, 2, 3)]
    v_buf = [k_buf[0] * -1]
    hidden = torch.arange(width + 2, dtype=torch.float32).unsqueeze(1) * 10  # 2 padding rows
    path_hidden = D.ddtree_commit_path(
        accept_index=walk.accept_index, cache_loc=cache_loc, hidden_states=hidden, width=width,
        move_kv_cache=lambda tgt, src: move_kv_cache_native(k_buf, v_buf, tgt, src),
    )  # fmt: skip
    kept = k_buf[0][cache_loc[0], 0, 0].tolist()
    return {
        "accept_index": walk.accept_index.tolist(),
        "drafts": drafts.tolist(),
        "commit_lens": commit_lens.tolist(),
        "commit_dtype": str(commit_lens.dtype),
        "bonus": bonus.tolist(),
        "out_tokens": out_tokens.tolist(),
        "new_seq_lens": new_seq_lens.tolist(),
        "kv_after_move": kept,
        "v_matches_k": bool(torch.equal(v_buf[0], -k_buf[0])),
        "hidden_after": path_hidden[:, 0].tolist(),
    }


@check
def sampling_walk_outputs():
    # What tree_speculative_sampling_target_only leaves for the _branching_case path
    # (2 requests of width 6, global node indices, -1 padded, 3 accepted drafts for
    # request 0, none for request 1).
    width = 6
    predicts = torch.zeros(12, dtype=torch.int32)
    predicts[[0, 2, 3, 5]] = torch.tensor([11, 20, 31, 77], dtype=torch.int32)
    predicts[6] = 55
    accept_index = torch.full((2, width), -1, dtype=torch.int32)
    accept_index[0, :4] = torch.tensor([0, 2, 3, 5], dtype=torch.int32)
    accept_index[1, 0] = 6
    num = torch.tensor([3, 0], dtype=torch.int32)
    local, accept_len, tokens, bonus = D.ddtree_walk_from_sampling(
        predicts, accept_index, num, width
    )
    tokens_b, parents_b, target_b = branching_case()
    walk = ops.verify_walk(tokens_b, parents_b, target_b, width - 1)
    return {
        "local": local.tolist(),
        "accept_len": accept_len.tolist(),
        "tokens": tokens.tolist(),
        "bonus": bonus.tolist(),
        "row0_equals_walk": same(local[:1], walk.accept_index)
        and same(tokens[:1], walk.accept_tokens),
    }


@check
def mamba_steps():
    accept_index = torch.tensor([[0, 2, 3, 5, -1, -1], [0, -1, -1, -1, -1, -1]])
    commit = torch.tensor([4, 1], dtype=torch.int32)
    last, _ = D.ddtree_mamba_steps(accept_index, commit, None)
    _, tracked = D.ddtree_mamba_steps(accept_index, commit, torch.tensor([2, -1]))
    chain = torch.arange(6).expand(2, 6)
    chain_last, _ = D.ddtree_mamba_steps(chain, commit, None)
    return {
        "last": last.tolist(),
        "tracked": tracked.tolist(),
        "chain_equals_commit_minus_one": same(chain_last, commit.long() - 1),
    }


# ------------------------------------------------------------------ worker doubles


@contextlib.contextmanager
def patched(module, **names):
    old = {n: getattr(module, n) for n in names}
    for n, v in names.items():
        setattr(module, n, v)
    try:
        yield
    finally:
        for n, v in old.items():
            setattr(module, n, v)


def init_results(W, init) -> dict:
    """The worker's DDTREE init through `init(spec, hybrid=...)` (each release builds its own
    worker double): each mode, on a hybrid target with and without the opt-in, a budget past
    the width, and with ddtree_kernels missing."""

    def missing_kernels():
        saved = sys.modules.get("ddtree_kernels")
        sys.modules["ddtree_kernels"] = None  # import now raises ImportError
        try:
            return getattr(U_LOADER, LOADER)()
        finally:
            sys.modules["ddtree_kernels"] = saved

    # The loader the worker calls first: dflash_utils' `load_ddtree_kernels` in the fat sets,
    # spec_info's `load_ddtree` (ddtree_kernels.sglang at the set's API) in a set on the module.
    LOADER = "load_ddtree_kernels" if hasattr(W, "load_ddtree_kernels") else "load_ddtree"
    U_LOADER = U if hasattr(U, LOADER) else SI
    with patched(W, **{LOADER: missing_kernels}):
        blocked = init(ddtree_spec())
    return {
        "tree": init(ddtree_spec()),
        "shadow": init(ddtree_spec(speculative_ddtree_mode="shadow_linear")),
        "hybrid_tree": init(ddtree_spec(), hybrid=True),
        "hybrid_tree_allowed": init(
            ddtree_spec(speculative_ddtree_allow_hybrid_unsafe=True), hybrid=True
        ),
        "hybrid_shadow": init(ddtree_spec(speculative_ddtree_mode="shadow_linear"), hybrid=True),
        "budget_too_big": init(ddtree_spec(speculative_ddtree_budget=8)),
        "no_kernels": blocked,
        "algorithm_ddtree": bool(SpeculativeAlgorithm.DDTREE.is_ddtree()),
    }


def shadow_linear_results(W, worker_of, dflash_accept, tree_accept) -> dict:
    """shadow_linear against DFLASH on module W's worker, on one draft with exact argmax ties:
    the chain tree is DFlash's candidates with a causal mask and consecutive positions, and its
    accept gives DFLASH's accept lengths, bonus, committed tokens and sequence lengths, with an
    identity KV commit. The releases differ in the worker double (`worker_of(block)`), in
    DFLASH's accept (`dflash_accept(candidates, target)` -> accept_len, bonus, out, commit_lens)
    and in how DDTREE's accept is called (`tree_accept(worker, tree, candidates, target,
    prefix, vocab)` -> accept_len, commit_lens, bonus, out, new_seq_lens, accept_index)."""
    bs, block, hidden_size, vocab = 6, 8, 16, 40
    g = torch.Generator().manual_seed(7)
    weight = torch.randn(vocab, hidden_size, generator=g)
    # Exact ties in the draft head: DFlash's argmax decides, shadow_linear must keep it.
    weight[5] = weight[9]
    lm_head = SimpleNamespace(weight=weight)
    draft_hidden = torch.randn(bs, block, hidden_size, generator=g)
    draft_hidden[0, 1] = weight[5] * 4  # rows 5 and 9 tie at the top
    worker = worker_of(block)
    dflash_next = W.DFlashWorkerV2._greedy_sample_from_vocab_parallel_head(
        worker, hidden_states=draft_hidden[:, 1:].reshape(-1, hidden_size), lm_head=lm_head
    ).view(bs, block - 1)
    roots = torch.randint(0, vocab, (bs,), generator=g)
    candidates = torch.cat([roots[:, None], dflash_next], dim=1)
    # Target argmax: matches the chain for a per-request number of steps, then differs.
    target = torch.randint(0, vocab, (bs, block), generator=g)
    agree = [0, 1, 3, 7, 2, 5]
    for b, a in enumerate(agree):
        target[b, :a] = candidates[b, 1 : a + 1]
        if a < block - 1:
            target[b, a] = (candidates[b, a + 1] + 1) % vocab
    prefix = torch.tensor([3, 10, 0, 7, 2, 30])

    d_len, d_bonus, d_out, d_commit = dflash_accept(candidates, target)

    tree = D.ddtree_chain_tree(candidates, prefix)
    t_len, t_commit, t_bonus, t_out, t_seq, accept_index = tree_accept(
        worker, tree, candidates, target, prefix, vocab
    )
    cache_loc = torch.arange(bs * block).view(bs, block) + 200
    commit = ops.commit_indices(accept_index, cache_loc)
    committed_equal = all(
        t_out[b, : int(d_commit[b])].tolist() == d_out[b, : int(d_commit[b])].tolist()
        for b in range(bs)
    )
    return {
        "tie_row_token": int(dflash_next[0, 0]),
        "draft_chain_is_dflash": same(tree.tokens, candidates),
        "causal_chain": same(
            tree.ancestor_mask,
            torch.tril(torch.ones(block, block, dtype=torch.bool)).expand(bs, -1, -1),
        ),
        "positions_consecutive": same(tree.positions, prefix[:, None] + torch.arange(block)),
        "accept_len_equal": same(t_len, d_len.to(t_len.dtype)),
        "commit_lens_equal": same(t_commit, d_commit),
        "bonus_equal": same(t_bonus, d_bonus.to(torch.int64)),
        "committed_tokens_equal": committed_equal,
        "new_seq_lens_equal": same(t_seq, prefix + d_commit.to(prefix.dtype)),
        "commit_is_identity": same(commit.kv_source, commit.kv_target),
        "accept_lens": d_commit.tolist(),
    }


def propose_tree_results(W, tp_group, host_kwargs, overlap_kwargs) -> dict:
    """`DFlashWorkerV2._ddtree_propose_tree` of module `W` against the definition (full-vocab
    top-k log-probs, then the kernels' tree and mask): at TP 1 and 2 (simulated ranks), under
    overlap (only an upper bound of the prefix lengths on the host: a longer mask whose exact
    prefix is the same) and with an added vocabulary (refused). The releases differ in how the
    worker reaches its TP group (`tp_group(group)`: the names to patch on W) and in the host-side
    arguments (`host_kwargs(batch)`, `overlap_kwargs(prefix, block)`)."""
    bs, block, hidden_size, vocab, tp = 3, 8, 16, 64, 2
    g = torch.Generator().manual_seed(11)
    weight = torch.randn(vocab, hidden_size, generator=g)
    draft_hidden = torch.randn(bs, block, hidden_size, generator=g)
    roots = torch.tensor([1, 2, 3])
    prefix = torch.tensor([4, 9, 2])
    worker = worker_double(topk=3, budget=block - 1, width=block, block=block)
    kwargs = dict(draft_hidden=draft_hidden, root_tokens=roots, prefix_lens=prefix,
                  **host_kwargs(SimpleNamespace(seq_lens_cpu=prefix.clone())))  # fmt: skip
    propose = W.DFlashWorkerV2._ddtree_propose_tree

    ref_logp, ref_ids = plain_topk(draft_hidden[:, 1:].reshape(-1, hidden_size), weight, 3)
    ref = ops.build_tree(
        ref_logp.view(bs, block - 1, 3), ref_ids.view(bs, block - 1, 3), roots, prefix,
        block - 1, int(prefix.sum()),
    )  # fmt: skip

    single = SimpleNamespace(world_size=1)
    with patched(W, **tp_group(single)):
        tree1 = propose(worker, lm_head=SimpleNamespace(weight=weight), **kwargs)
        tree_overlap = propose(
            worker, lm_head=SimpleNamespace(weight=weight),
            **{**kwargs, **overlap_kwargs(prefix, block)},
        )  # fmt: skip
        added = SimpleNamespace(
            weight=weight,
            shard_indices=SimpleNamespace(
                num_org_elements=vocab, org_vocab_start_index=0, num_added_elements=2
            ),
        )
        try:
            propose(worker, lm_head=added, **kwargs)
            added_error = ""
        except RuntimeError as e:
            added_error = str(e)

    group = Group(tp)
    shard = vocab // tp

    def rank(r: int):
        head = SimpleNamespace(
            weight=weight[r * shard : (r + 1) * shard],
            shard_indices=SimpleNamespace(
                num_org_elements=shard, org_vocab_start_index=r * shard, num_added_elements=0
            ),
        )
        return propose(worker, lm_head=head, **kwargs)

    with patched(W, **tp_group(group)):
        trees = group.run(rank)
    exact = ref.custom_mask.numel()
    return {
        "tp1_tokens_equal": same(tree1.tokens, ref.tokens),
        "tp1_mask_equal": same(tree1.custom_mask, ref.custom_mask),
        "tp1_positions_equal": same(tree1.positions, ref.positions),
        "tp_ranks_agree": all(same(t.tokens, trees[0].tokens) for t in trees),
        "tp_tokens_equal": same(trees[0].tokens, ref.tokens),
        "overlap_mask_prefix_equal": same(tree_overlap.custom_mask[:exact], ref.custom_mask),
        "overlap_mask_longer": tree_overlap.custom_mask.numel() > exact,
        "added_vocab_error": added_error,
    }


def worker_double(*, topk: int, budget: int, width: int, block: int) -> SimpleNamespace:
    """A tree-mode DFlashWorkerV2 after `_init_ddtree`, as far as the tree proposal reads it: the
    settings as the fat sets keep them (`_ddtree_topk`, ...) and as a set on
    ddtree_kernels.sglang's `Verifier` keeps them (`_ddtree`, docs/ddtree-module.md)."""
    settings = ddtree_module.Settings(mode="tree", budget=budget, topk=topk, width=width)
    return SimpleNamespace(
        _ddtree_topk=topk, _ddtree_budget=budget, _ddtree_width=width,
        _ddtree=ddtree_module.Verifier(settings, block),
    )  # fmt: skip


def ddtree_attrs(mode):
    """A worker double's DDTREE attribute in `mode` (None: DFLASH): its Verifier, whose
    settings hold the mode."""
    settings = ddtree_module.Settings(mode=mode, budget=7, topk=2, width=8) if mode else None
    return {"_ddtree": ddtree_module.Verifier(settings, 8) if settings else None}


def greedy_draft_input(draft_input):
    """A greedy step's draft input: the release's, or (TEST DOUBLE) one holding no top-k, which
    a set on API 2's rules reads and only its sampler uses."""
    return draft_input or SimpleNamespace(max_top_k=None, uniform_top_k_value=None)


def mamba_commit(W, worker, accept_index, **kwargs):
    """The worker's Mamba commit of a tree step whose path is `accept_index` (the step hands
    its rule over)."""
    step = ddtree_module.Step(tree=None, mode="tree", cache_loc=None, prefix_lens=None,
                              block_size=6, accept_index=accept_index)  # fmt: skip
    return W.DFlashWorkerV2._update_target_mamba_state_after_verify(
        worker, **kwargs, ddtree_step=step
    )


def settings_of(worker) -> SimpleNamespace:
    """The (mode, budget, topk, width) a worker double holds after `_init_ddtree`: its
    `Verifier`'s settings (a set on ddtree_kernels.sglang's Verifier) or the fat sets' fields."""
    verifier = getattr(worker, "_ddtree", None)
    if verifier is not None:
        return verifier.settings
    return SimpleNamespace(
        mode=worker._ddtree_mode, budget=worker._ddtree_budget, topk=worker._ddtree_topk,
        width=worker._ddtree_width,
    )  # fmt: skip


def ddtree_spec(**kw):
    base = dict(
        speculative_num_draft_tokens=8,  # the verify width
        speculative_ddtree_mode="tree",
        speculative_ddtree_budget=7,
        speculative_ddtree_topk=3,
        speculative_ddtree_allow_hybrid_unsafe=False,
    )
    base.update(kw)
    return SimpleNamespace(**base)


# ------------------------------------------------------------------ the wider tree verify

# The widest tree the worker-v2 sets verify: budget 63 over the drafter's 16-token block (15 draft
# positions), a verify width of 64.
BLOCK, BUDGET, WIDTH = 16, 63, 64


def error_of(fn) -> str:
    """What `fn()` raised, as 'Type: message' ('' when it returned)."""
    try:
        fn()
    except Exception as e:  # reported, asserted on by the test
        return f"{type(e).__name__}: {e}"
    return ""


def wide_init_results(init_worker) -> dict:
    """A budget-63 tree: `_init_ddtree` (through `init_worker(spec, block=)`, the release's
    worker double after it) verifies 64 tokens with the drafter's 16-token block, and refuses a
    budget past the verify width and a top-k the tree kernel refuses; `ddtree_draft_block_size`
    gives the drafter its block in tree mode and the width otherwise."""
    wide = ddtree_spec(
        speculative_num_draft_tokens=WIDTH, speculative_dflash_block_size=BLOCK,
        speculative_ddtree_budget=BUDGET, speculative_ddtree_topk=8,
    )  # fmt: skip
    worker = init_worker(wide, block=BLOCK)
    over_width = ddtree_spec(speculative_num_draft_tokens=BLOCK, speculative_ddtree_budget=BUDGET)
    topk_17 = ddtree_spec(
        speculative_num_draft_tokens=WIDTH, speculative_ddtree_budget=BUDGET,
        speculative_ddtree_topk=17,
    )  # fmt: skip
    shadow = ddtree_spec(
        speculative_ddtree_mode="shadow_linear", speculative_num_draft_tokens=BLOCK
    )
    return {
        "tree": {
            "width": settings_of(worker).width,
            "budget": settings_of(worker).budget,
            "block": worker.block_size,
        },
        "budget_over_width": error_of(lambda: init_worker(over_width, block=BLOCK)),
        "topk_over_kernel": error_of(lambda: init_worker(topk_17, block=BLOCK)),
        # What __init__ gives the drafter (and its runner): DDTREE tree, DFLASH, shadow_linear.
        "draft_block": [
            D.ddtree_draft_block_size(SpeculativeAlgorithm.DDTREE, wide),
            D.ddtree_draft_block_size(
                SpeculativeAlgorithm.DFLASH, SimpleNamespace(speculative_num_draft_tokens=8)
            ),
            D.ddtree_draft_block_size(SpeculativeAlgorithm.DDTREE, shadow),
        ],
    }


def wide_propose_results(W, tp_group, host_kwargs) -> dict:
    """`_ddtree_propose_tree` of module `W` on a 16-token draft block builds the 64-node tree and
    its mask, equal to the kernels' tree over the full-vocab top-k (`tp_group`, `host_kwargs`:
    as for propose_tree_results)."""
    bs, hidden_size, vocab = 3, 16, 64
    g = torch.Generator().manual_seed(13)
    weight = torch.randn(vocab, hidden_size, generator=g)
    draft_hidden = torch.randn(bs, BLOCK, hidden_size, generator=g)
    roots, prefix = torch.tensor([1, 2, 3]), torch.tensor([4, 9, 2])
    worker = worker_double(topk=8, budget=BUDGET, width=WIDTH, block=BLOCK)
    with patched(W, **tp_group(SimpleNamespace(world_size=1))):
        tree = W.DFlashWorkerV2._ddtree_propose_tree(
            worker, draft_hidden=draft_hidden, lm_head=SimpleNamespace(weight=weight),
            root_tokens=roots, prefix_lens=prefix,
            **host_kwargs(SimpleNamespace(seq_lens_cpu=prefix.clone())),
        )  # fmt: skip
    logp, ids = plain_topk(draft_hidden[:, 1:].reshape(-1, hidden_size), weight, 8)
    ref = ops.build_tree(
        logp.view(bs, BLOCK - 1, 8), ids.view(bs, BLOCK - 1, 8), roots, prefix, BUDGET,
        int(prefix.sum()),
    )  # fmt: skip
    return {
        "shape": list(tree.tokens.shape),
        "fields_equal_kernels": all(same(getattr(tree, f), getattr(ref, f)) for f in ref._fields),
        "mask_numel": int(tree.custom_mask.numel()),
        "max_depth": int(tree.depths.max()),
    }


def _first_child_target(tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
    """Target tokens that accept every node's first child (0 at a leaf): a deep path."""
    nodes = torch.arange(tokens.shape[1])
    children = parents[:, None, :] == nodes[None, :, None]  # [bs, parent, node]
    first = children.int().argmax(dim=-1)
    return torch.where(children.any(dim=-1), tokens.gather(1, first), 0)


def argmax_logits(target: torch.Tensor, vocab: int) -> torch.Tensor:
    """Verify logits [bs * W, vocab] whose argmax is `target` [bs, W]."""
    logits = torch.full((target.numel(), vocab), -5.0)
    logits[torch.arange(target.numel()), target.reshape(-1)] = 5.0
    return logits


def wide_accept_results(W, worker, accept, draft_rows) -> dict:
    """The worker's accept over a 64-node tree, greedy and sampled (through a double of the
    release's tree sampler that reports a 64-wide path): the kernels' walk, outputs in the
    drafter's 16-token layout; the window's 64 KV slots, then the path's KV and hidden rows moved
    to its first slots, and the rows the draft KV is fed (`draft_rows(rows, bs)`: the release's
    block layout of the verify rows). `accept(worker, tree, logits, prefix, sampling_info,
    draft_input)` calls the release's `_ddtree_accept_block` on `worker` (a double with
    block_size 16)."""
    bs, vocab = 2, 50
    prefix = torch.tensor([5, 11])
    logits = torch.randn(bs, BLOCK - 1, vocab, generator=torch.Generator().manual_seed(17)) * 3
    top = ops.topk_logprobs(logits, 8)
    tree = D.ddtree_build_verify_tree(
        logp=top.logp, ids=top.ids, root_tokens=torch.tensor([7, 8]), prefix_lens=prefix,
        budget=BUDGET, width=WIDTH, prefix_lens_sum=int(prefix.sum()),
    )  # fmt: skip
    target = _first_child_target(tree.tokens, tree.parents)
    walk = ops.verify_walk(tree.tokens, tree.parents, target, BLOCK - 1)
    greedy = accept(worker, tree, argmax_logits(target, vocab), prefix, None, None)

    rows = torch.arange(bs)[:, None] * WIDTH

    def sampler(*, candidates, tree_retrieve, **_):
        # TEST DOUBLE for the tree rejection sampler (a CUDA kernel): the walk's path as the
        # kernel reports it, global node indices [bs, verify width], -1 padded.
        accept_index = torch.full((bs, candidates.shape[1]), -1, dtype=torch.int32)
        path = walk.accept_index[:, :BLOCK]
        accept_index[:, :BLOCK] = torch.where(path >= 0, path + rows, -1).int()
        return walk.accept_len - 1, None, accept_index, target.reshape(-1).int()

    with patched(
        W, is_dflash_sampling_verify_available=lambda: True,
        compute_dflash_sampling_correct_drafts_and_bonus=sampler,
    ):  # fmt: skip
        sampled = accept(
            worker, tree, argmax_logits(target, vocab), prefix,
            SimpleNamespace(is_all_greedy=False),
            SimpleNamespace(max_top_k=None, uniform_top_k_value=None),
        )  # fmt: skip
    _, commit_lens, _, out_tokens, _, accept_index = greedy

    req_to_token = torch.arange(3 * 100).view(3, 100) + 1000
    pool_rows = torch.tensor([2, 0])
    loc = D.ddtree_window_cache_loc(req_to_token, pool_rows, prefix, WIDTH)
    k_buf = [torch.arange(1400, dtype=torch.float32).view(1400, 1, 1)]
    v_buf = [-k_buf[0]]
    hidden = torch.arange(bs * WIDTH, dtype=torch.float32).unsqueeze(1)
    path_hidden = D.ddtree_commit_path(
        accept_index=accept_index, cache_loc=loc, hidden_states=hidden, width=WIDTH,
        move_kv_cache=lambda tgt, src: move_kv_cache_native(k_buf, v_buf, tgt, src),
    )  # fmt: skip
    fed = draft_rows(path_hidden, bs).view(bs, BLOCK)
    kv_ok = hidden_ok = True
    for b in range(bs):
        nodes = accept_index[b, : int(commit_lens[b])]
        kv_ok &= k_buf[0][loc[b, : len(nodes)], 0, 0].tolist() == loc[b, nodes].float().tolist()
        hidden_ok &= fed[b, : len(nodes)].tolist() == (nodes + b * WIDTH).float().tolist()
    return {
        "walk_equal_kernels": same(accept_index, walk.accept_index)
        and same(commit_lens, walk.accept_len.int()),
        "out_width": list(out_tokens.shape),
        "path_depth": (commit_lens - 1).tolist(),
        "sampled_equal_greedy": all(same(a, b) for a, b in zip(sampled, greedy, strict=True)),
        "window_slots": same(
            loc,
            torch.stack(
                [req_to_token[r, p : p + WIDTH] for r, p in zip(pool_rows, prefix, strict=True)]
            ),
        ),
        "kv_path_first": kv_ok,
        "hidden_path_first": hidden_ok,
    }


# Patched in both releases' series; each release's own further targets import in its checks.
PATCHED_MODULES = (
    "sglang.srt.arg_groups.speculative_hook",
    "sglang.srt.model_executor.runner.decode_cuda_graph_runner",
    "sglang.srt.speculative.dflash_info",
    "sglang.srt.speculative.dflash_utils",
    "sglang.srt.speculative.dflash_worker_v2",
    "sglang.srt.speculative.spec_info",
    "sglang.srt.speculative.spec_registry",
    "sglang.srt.speculative.spec_utils",
)


@check
def patched_modules_import():
    import importlib

    return {"files": {name: importlib.import_module(name).__file__ for name in PATCHED_MODULES}}


@check
def capture_mask_predicate():
    return {
        "ddtree_tree": D.ddtree_verify_uses_tree_mask(SpeculativeAlgorithm.DDTREE, ddtree_spec()),
        "ddtree_shadow": D.ddtree_verify_uses_tree_mask(
            SpeculativeAlgorithm.DDTREE, ddtree_spec(speculative_ddtree_mode="shadow_linear")
        ),
        "dflash": D.ddtree_verify_uses_tree_mask(SpeculativeAlgorithm.DFLASH, ddtree_spec()),
    }


@check
def hybrid_refusal():
    out = {}
    for name, kw in {
        "tree_hybrid": dict(mode="tree", is_hybrid=True, allow_hybrid_unsafe=False),
        "tree_hybrid_allowed": dict(mode="tree", is_hybrid=True, allow_hybrid_unsafe=True),
        "shadow_hybrid": dict(mode="shadow_linear", is_hybrid=True, allow_hybrid_unsafe=False),
        "tree_dense": dict(mode="tree", is_hybrid=False, allow_hybrid_unsafe=False),
    }.items():
        try:
            D.ddtree_check_hybrid_target(**kw)
            out[name] = ""
        except ValueError as e:
            out[name] = str(e)
    return out


# ------------------------------------------------------------------ the module's API


def api_refusal_results(init) -> dict:
    """A set on ddtree_kernels.sglang (docs/ddtree-module.md, "The API version"): its DDTREE
    logic is the module's, at the API its spec_info.py names (DDTREE_SGLANG_API). `load_ddtree`
    (real, in spec_info.py, which
    server-argument handling and the worker's `_init_ddtree` (real, through `init(spec)`: the
    release's worker double, as for worker_init) call first) refuses at start, in one sentence,
    a module of another API version (the module's frozen `require`) or none; DFLASH's modules
    import, and its predicates answer, with no ddtree_kernels at all. TEST DOUBLES: the worker
    and the installed module's version (patched)."""
    import importlib

    import ddtree_kernels.sglang as module

    def refusal(fn) -> str:
        try:
            fn()
        except RuntimeError as e:
            return str(e)
        return ""

    wanted = SI.DDTREE_SGLANG_API
    out = {"wanted": wanted, "module": module.API_VERSION, "loads": SI.load_ddtree() is module}
    with patched(module, API_VERSION=wanted + 1):
        out["newer"] = refusal(SI.load_ddtree)
        out["worker_newer"] = init(ddtree_spec())
    import ddtree_kernels

    # An older ddtree_kernels, without the module.
    sys.modules["ddtree_kernels.sglang"] = None
    del ddtree_kernels.sglang
    try:
        out["missing"] = refusal(SI.load_ddtree)
    finally:
        sys.modules["ddtree_kernels.sglang"] = ddtree_kernels.sglang = module
    # DFLASH without any ddtree_kernels: fresh imports of the patched modules.
    for name in [n for n in sys.modules if n.startswith("ddtree_kernels")]:
        sys.modules[name] = None
    for name in (
        "sglang.srt.speculative.spec_info",
        "sglang.srt.speculative.dflash_utils",
        "sglang.srt.speculative.dflash_worker_v2",
    ):
        del sys.modules[name]
    fresh = importlib.import_module("sglang.srt.speculative.dflash_utils")
    importlib.import_module("sglang.srt.speculative.dflash_worker_v2")
    fresh_spec_info = importlib.import_module("sglang.srt.speculative.spec_info")
    out["dflash_without_kernels"] = {
        "imports": True,
        "tree_mask": fresh.ddtree_verify_uses_tree_mask(SpeculativeAlgorithm.DFLASH, ddtree_spec()),
        "block": fresh.ddtree_draft_block_size(
            SpeculativeAlgorithm.DFLASH, SimpleNamespace(speculative_num_draft_tokens=16)
        ),
        "ddtree_loader": refusal(fresh_spec_info.load_ddtree),
    }
    return out


# ------------------------------------------------------------------ scoring requests


def _request(max_new_tokens: int, logprob: bool = True) -> SimpleNamespace:
    """TEST DOUBLE: a Req with the fields the DFlash validations read."""
    params = SimpleNamespace(
        max_new_tokens=max_new_tokens, json_schema=None, regex=None, ebnf=None,
        structural_tag=None,
    )  # fmt: skip
    return SimpleNamespace(
        return_logprob=logprob, return_hidden_states=False, return_routed_experts=False,
        return_indexer_topk=False, sampling_params=params,
    )  # fmt: skip


class _PastTheGuard(Exception):
    """The worker reached its first step after any log-prob guard."""


def _worker_entry(forward_mode, *reqs) -> str:
    """What DFlashWorkerV2.forward_batch_generation (real) does with a batch of `reqs` up to
    its sampling check: "passed", or the guard's refusal. TEST DOUBLES: the worker (its
    sampling check stops the call) and the batch (the fields a guard reads)."""
    import sglang.srt.speculative.dflash_worker_v2 as W

    def stop(batch):
        raise _PastTheGuard

    worker = SimpleNamespace(_validate_phase1_sampling_support=stop)
    batch = SimpleNamespace(
        return_logprob=any(r.return_logprob for r in reqs), forward_mode=forward_mode,
        is_extend_in_batch=False, reqs=list(reqs),
    )  # fmt: skip
    try:
        W.DFlashWorkerV2.forward_batch_generation(worker, batch)
    except _PastTheGuard:
        return "passed"
    except ValueError as e:
        return str(e)
    return "returned"


@check
def scoring_requests():
    """The tree gate's prompt-scoring request (return_logprob with max_new_tokens 0: the
    target's log-probs of its own prompt and continuation, from its prefill) against a log-prob
    request that generates: the scheduler's gate and validation (`validate_dflash_request`,
    real) for DFLASH and DDTREE, and the worker's entry for a prefill and a decode batch (under
    overlap a scoring request rides one decode step after finishing at its prefill). TEST
    DOUBLES: the requests, the spec bag (0.5.17 on), the worker and the batches."""
    import sglang.srt.runtime_context as ctx
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    def validation(algorithm: str, req) -> str:
        spec = SimpleNamespace(speculative_algorithm=algorithm)
        scope = (
            patched(ctx, get_spec=lambda: spec)
            if hasattr(ctx, "get_spec")
            else contextlib.nullcontext()
        )
        with scope:
            return U.validate_dflash_request(req, True) or "admitted"

    def gate(algorithm: str) -> bool:
        algo = SpeculativeAlgorithm[algorithm]
        return bool(getattr(algo, "is_dflash_family", algo.is_dflash)())

    extend, decode = ForwardMode.EXTEND, ForwardMode.DECODE
    scoring, generating, plain = _request(0), _request(16), _request(16, logprob=False)
    return {
        "scheduler_gate": {a: gate(a) for a in ("DFLASH", "DDTREE")},
        "validation": {
            a: {"scoring": validation(a, scoring), "generating": validation(a, generating)}
            for a in ("DFLASH", "DDTREE")
        },
        "worker": {
            "prefill_scoring": _worker_entry(extend, scoring, plain),
            "prefill_generating": _worker_entry(extend, generating),
            "decode_scoring": _worker_entry(decode, scoring, plain),
            "decode_generating": _worker_entry(decode, scoring, generating),
        },
    }
