"""Checks of the 0.5.23 DDTREE verify path, run inside the SGLang 0.5.23 staging venv.

Run as `python checks_0523.py NAME` with the patched `sglang/` first on PYTHONPATH and
`kernels/` (ddtree_kernels, its pure-torch reference on CPU) importable. Prints one JSON
line `{"ok": ..., ...}`; the pytest side (test_verify_path_0523.py) asserts on it.

Real: every function the 0.5.23 patches add (the dflash_utils helpers, DDTreeVerifyInput,
and the DFlashWorkerV2 methods, called unbound), SpeculativeAlgorithm, SpecInputType,
DFlash's own greedy head, accept rule (`compute_dflash_correct_drafts_and_bonus`, the torch
version) and `_commit_accept`, and SGLang's native KV move. TEST DOUBLES, because the real
objects need a GPU, a scheduler or an initialised runtime context: `Worker` (a namespace
standing in for a DFlashWorkerV2 instance), `Group` (TP ranks as threads), the runtime
context getters (`get_spec`, `get_parallel`) and a recording attention backend.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
from types import SimpleNamespace

import sglang.srt.speculative.dflash_utils as U
import sglang.srt.speculative.dflash_worker_v2 as W
import torch
from ddtree_kernels import ops
from sglang.kernels.ops.speculative.dflash import compute_dflash_correct_drafts_and_bonus
from sglang.srt.mem_cache.memory_pool import move_kv_cache_native
from sglang.srt.speculative.dflash_info import DDTreeVerifyInput, DFlashVerifyInput
from sglang.srt.speculative.spec_info import SpecInputType, SpeculativeAlgorithm

CHECKS = {}


def check(fn):
    CHECKS[fn.__name__] = fn
    return fn


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(torch.equal(a, b))


class Group:
    """`size` TP ranks, one thread each; all_gather_into_tensor concatenates along dim 0."""

    def __init__(self, size: int) -> None:
        self.world_size = size
        self._barrier = threading.Barrier(size)
        self._parts: list = [None] * size
        self._rank = threading.local()

    def all_gather_into_tensor(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        self._parts[self._rank.value] = inp.clone()
        self._barrier.wait()
        out.copy_(torch.cat(self._parts, dim=0).view_as(out))
        self._barrier.wait()

    def run(self, fn):
        """fn(rank) on every rank in its own thread; the per-rank results."""
        results: list = [None] * self.world_size
        errors: list = []

        def body(rank: int) -> None:
            self._rank.value = rank
            try:
                results[rank] = fn(rank)
            except BaseException as e:  # surfaced below
                errors.append(e)
                self._barrier.abort()

        threads = [threading.Thread(target=body, args=(r,)) for r in range(self.world_size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return results


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
        logp, ids = U.ddtree_draft_topk_logprobs(hidden, weight, 6, num_org=500, chunk_size=16)
        ref_logp, ref_ids = plain_topk(hidden, weight, 6)
        out[str(dtype)] = {
            "ids_equal": same(ids, ref_ids),
            "max_abs_diff": float((logp - ref_logp).abs().max()),
            "dtype": str(logp.dtype),
        }
    # Only the first num_org rows of the shard are vocabulary (the rest is padding).
    weight = torch.randn(64, 32, generator=g)
    weight[50:] = 100.0
    _, ids = U.ddtree_draft_topk_logprobs(hidden, weight, 4, num_org=50)
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
        return U.ddtree_draft_topk_logprobs(
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
    m_logp, m_ids = U.ddtree_merge_tp_topk(logp, ids, log_z, 3)
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
    tree = U.ddtree_build_verify_tree(
        logp=logp, ids=ids, root_tokens=roots, prefix_lens=prefix_t,
        budget=width - 1, width=width, prefix_lens_sum=sum(prefix),
    )  # fmt: skip
    ref = ops.build_tree(logp, ids, roots, prefix_t, width - 1, sum(prefix))
    fields_equal = all(same(getattr(tree, f), getattr(ref, f)) for f in ref._fields)
    numel = width * sum(prefix) + bs * width * width
    helper_mask = U.ddtree_flat_tree_mask(ref.ancestor_mask, prefix_t, numel)
    # An upper bound of the prefix sum (overlap scheduling): same layout, True tail.
    upper = U.ddtree_build_verify_tree(
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
    tree = U.ddtree_build_verify_tree(
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
    tree = U.ddtree_chain_tree(torch.tensor([[9, 1, 2, 3]]), torch.tensor([5]))
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
        "num_tokens_per_req": vi.num_tokens_per_req,
        "topk": vi.topk,
        "next_token": vi.retrieve_next_token.tolist(),
        "positions": vi.positions.tolist(),
    }


# ------------------------------------------------------------------ accept and commit


def _branching_case():
    """A hand-made tree (width 6) whose accepted path takes a second child:
    0 -> {1: tok 10, 2: tok 11}; 2 -> {3: tok 20}; 3 -> {4: tok 30, 5: tok 31}."""
    parents = torch.tensor([[-1, 0, 0, 2, 3, 3]])
    tokens = torch.tensor([[99, 10, 11, 20, 30, 31]])
    # Target: at root 11 (-> node 2), at node 2 20 (-> 3), at node 3 31 (-> 5), at 5 bonus 77.
    target = torch.tensor([[11, 0, 20, 31, 0, 77]])
    return tokens, parents, target


@check
def accept_and_commit():
    tokens, parents, target = _branching_case()
    width = tokens.shape[1]
    walk = ops.verify_walk(tokens, parents, target, width - 1)
    prefix = torch.tensor([40])
    drafts, commit_lens, bonus, out_tokens, new_seq_lens = U.ddtree_accept_outputs(
        walk.accept_len, walk.accept_tokens, walk.bonus, prefix
    )
    cache_loc = torch.tensor([[100, 101, 102, 103, 104, 105]])
    commit = ops.commit_indices(walk.accept_index, cache_loc)
    tgt, src = U.ddtree_kv_move_pairs(commit.src, commit.dst)
    # A KV pool whose slot s holds the value s, moved with SGLang's own native move.
    k_buf = [torch.arange(128, dtype=torch.float32).view(128, 1, 1).repeat(1, 2, 3)]
    v_buf = [k_buf[0] * -1]
    move_kv_cache_native(k_buf, v_buf, tgt, src)
    kept = k_buf[0][cache_loc[0], 0, 0].tolist()
    hidden = torch.arange(width + 2, dtype=torch.float32).unsqueeze(1) * 10  # 2 padding rows
    path_hidden = U.ddtree_gather_path_rows(hidden, commit.hidden_rows, width)
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
    local, accept_len, tokens, bonus = U.ddtree_walk_from_sampling(
        predicts, accept_index, num, width
    )
    tokens_b, parents_b, target_b = _branching_case()
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
    last, _ = U.ddtree_mamba_steps(accept_index, commit, None)
    _, tracked = U.ddtree_mamba_steps(accept_index, commit, torch.tensor([2, -1]))
    chain = torch.arange(6).expand(2, 6)
    chain_last, _ = U.ddtree_mamba_steps(chain, commit, None)
    return {
        "last": last.tolist(),
        "tracked": tracked.tolist(),
        "chain_equals_commit_minus_one": same(chain_last, commit.long() - 1),
    }


# ------------------------------------------------------------------ shadow_linear vs DFlash


def _dflash_worker_double(**extra):
    """The DFlashWorkerV2 attributes the unbound methods below read."""
    base = dict(
        _draft_greedy_local_cap=0,
        _draft_greedy_local_max_buf=None,
        _draft_greedy_local_arg_buf=None,
        _draft_greedy_gather_cap=0,
        _draft_greedy_index_cap=0,
        _tp_sync=SimpleNamespace(sync=lambda site, t: None),
        _ddtree_ops=ops,
    )
    base.update(extra)
    return SimpleNamespace(**base)


@check
def shadow_linear_equals_dflash():
    bs, block, hidden_size, vocab = 6, 8, 16, 40
    g = torch.Generator().manual_seed(7)
    weight = torch.randn(vocab, hidden_size, generator=g)
    # Exact ties in the draft head: DFlash's argmax decides, shadow_linear must keep it.
    weight[5] = weight[9]
    lm_head = SimpleNamespace(weight=weight)
    draft_hidden = torch.randn(bs, block, hidden_size, generator=g)
    draft_hidden[0, 1] = weight[5] * 4  # rows 5 and 9 tie at the top
    worker = _dflash_worker_double(block_size=block)
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

    d_len, d_bonus = compute_dflash_correct_drafts_and_bonus(
        candidates=candidates, target_predict=target
    )
    d_out, d_commit = W._commit_accept(candidates, d_len, d_bonus)

    tree = U.ddtree_chain_tree(candidates, prefix)
    t_len, t_commit, t_bonus, t_out, t_seq = W.DFlashWorkerV2._ddtree_accept_block(
        worker, tree=tree, candidates=candidates, next_token_logits=None,
        sampling_info=None, draft_input=None, prefix_lens=prefix, bs=bs,
        target_predict=target.reshape(-1),
    )[:5]  # fmt: skip
    accept_index = W.DFlashWorkerV2._ddtree_accept_block(
        worker, tree=tree, candidates=candidates, next_token_logits=None,
        sampling_info=None, draft_input=None, prefix_lens=prefix, bs=bs,
        target_predict=target.reshape(-1),
    )[5]  # fmt: skip
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
        "commit_is_identity": same(commit.src[commit.src >= 0], commit.dst[commit.dst >= 0]),
        "accept_lens": d_commit.tolist(),
    }


# ------------------------------------------------------------------ worker methods


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


def _spec(**kw):
    base = dict(
        speculative_ddtree_mode="tree",
        speculative_ddtree_budget=7,
        speculative_ddtree_topk=3,
        speculative_ddtree_allow_hybrid_unsafe=False,
    )
    base.update(kw)
    return SimpleNamespace(**base)


def _init(spec, *, hybrid=False, **worker_kw):
    worker = SimpleNamespace(
        selector=None, lilicorr=None, _is_domino=False, block_size=8,
        model_runner=SimpleNamespace(model_config=SimpleNamespace(hybrid=hybrid)),
    )  # fmt: skip
    vars(worker).update(worker_kw)
    with patched(
        W,
        get_spec=lambda: spec,
        get_parallel=lambda: SimpleNamespace(tp_rank=1),
        mambaish_config=lambda cfg: object() if cfg.hybrid else None,
    ):
        try:
            W.DFlashWorkerV2._init_ddtree(worker)
        except Exception as e:  # reported, asserted on by the test
            return {"error": f"{type(e).__name__}: {e}"}
    return {
        "mode": worker._ddtree_mode,
        "budget": worker._ddtree_budget,
        "topk": worker._ddtree_topk,
        "ops_loaded": worker._ddtree_ops is ops,
    }


@check
def worker_init():
    blocked = {}

    def missing_kernels():
        saved = sys.modules.get("ddtree_kernels")
        sys.modules["ddtree_kernels"] = None  # import now raises ImportError
        try:
            return U.load_ddtree_kernels()
        finally:
            sys.modules["ddtree_kernels"] = saved

    with patched(W, load_ddtree_kernels=missing_kernels):
        blocked = _init(_spec())
    return {
        "tree": _init(_spec()),
        "shadow": _init(_spec(speculative_ddtree_mode="shadow_linear")),
        "hybrid_tree": _init(_spec(), hybrid=True),
        "hybrid_tree_allowed": _init(
            _spec(speculative_ddtree_allow_hybrid_unsafe=True), hybrid=True
        ),
        "hybrid_shadow": _init(_spec(speculative_ddtree_mode="shadow_linear"), hybrid=True),
        "selector": _init(_spec(), selector=object()),
        "budget_too_big": _init(_spec(speculative_ddtree_budget=8)),
        "no_kernels": blocked,
        "algorithm_ddtree": bool(SpeculativeAlgorithm.DDTREE.is_ddtree()),
    }


def _attention_setup(mode, *, hybrid, accept_pool=None):
    # The real backend classes, built without __init__ (which needs a GPU model runner): the
    # outer HybridLinearAttnBackend holds no topk of its own; its linear sub-backend does.
    from sglang.srt.layers.attention import hybrid_linear_attn_backend as H

    linear = H.MambaAttnBackendBase.__new__(H.MambaAttnBackendBase)
    linear.topk = 0
    if accept_pool is not None:
        linear.accept_lens_pool = accept_pool
    if hybrid:
        backend = H.HybridLinearAttnBackend.__new__(H.HybridLinearAttnBackend)
        backend.linear_attn_backend = linear
    else:
        backend = SimpleNamespace()  # a dense target's backend: no Mamba commit
    worker = SimpleNamespace(
        _ddtree_mode=mode,
        draft_parallel_layout=None,
        _draft_worker=SimpleNamespace(init_attention_backends=lambda: None),
        model_runner=SimpleNamespace(
            model_config=SimpleNamespace(hybrid=hybrid), attn_backend=backend
        ),
    )
    with patched(
        W,
        draft_pp_context=contextlib.nullcontext,
        draft_tp_context=lambda layout: contextlib.nullcontext(),
        mambaish_config=lambda cfg: object() if cfg.hybrid else None,
    ):
        try:
            W.DFlashWorkerV2.init_attention_backends(worker)
        except Exception as e:
            return {"error": f"{type(e).__name__}: {e}"}
    return {
        "topk": linear.topk,
        "outer_topk": "topk" in vars(backend),
        "mamba_commit": worker._need_mamba_verify_commit,
    }


@check
def worker_attention_and_sampler():
    sampler_worker = SimpleNamespace(_ddtree_mode="tree", _target_tp_rank=1, block_size=8)
    return {
        "tree_hybrid": _attention_setup("tree", hybrid=True),
        "shadow_hybrid": _attention_setup("shadow_linear", hybrid=True),
        "tree_dense": _attention_setup("tree", hybrid=False),
        "dflash_hybrid": _attention_setup(None, hybrid=True),
        "tree_kda_pool": _attention_setup("tree", hybrid=True, accept_pool=object()),
        "tree_sampler": repr(W.DFlashWorkerV2._maybe_build_draft_sampler(sampler_worker)),
    }


@check
def worker_propose_tree():
    bs, block, hidden_size, vocab, tp = 3, 8, 16, 64, 2
    g = torch.Generator().manual_seed(11)
    weight = torch.randn(vocab, hidden_size, generator=g)
    draft_hidden = torch.randn(bs, block, hidden_size, generator=g)
    roots = torch.tensor([1, 2, 3])
    prefix = torch.tensor([4, 9, 2])
    batch = SimpleNamespace(seq_lens_cpu=prefix.clone())
    worker = SimpleNamespace(_ddtree_topk=3, _ddtree_budget=block - 1)
    kwargs = dict(draft_hidden=draft_hidden, root_tokens=roots, prefix_lens=prefix, batch=batch,
                  draft_input=None)  # fmt: skip

    # The definition: full-vocab top-k log-probs, then the kernels' tree with its mask.
    ref_logp, ref_ids = plain_topk(draft_hidden[:, 1:].reshape(-1, hidden_size), weight, 3)
    ref = ops.build_tree(
        ref_logp.view(bs, block - 1, 3), ref_ids.view(bs, block - 1, 3), roots, prefix,
        block - 1, int(prefix.sum()),
    )  # fmt: skip

    single = SimpleNamespace(tp_group=SimpleNamespace(world_size=1))
    with patched(W, get_parallel=lambda: single):
        tree1 = W.DFlashWorkerV2._ddtree_propose_tree(
            worker, lm_head=SimpleNamespace(weight=weight), **kwargs
        )

    group = Group(tp)
    shard = vocab // tp

    def rank(r: int):
        head = SimpleNamespace(
            weight=weight[r * shard : (r + 1) * shard],
            shard_indices=SimpleNamespace(
                num_org_elements=shard, org_vocab_start_index=r * shard, num_added_elements=0
            ),
        )
        return W.DFlashWorkerV2._ddtree_propose_tree(worker, lm_head=head, **kwargs)

    with patched(W, get_parallel=lambda: SimpleNamespace(tp_group=group)):
        trees = group.run(rank)

    # Under overlap only the reserved upper bound of the prefix sum is on the host.
    overlap_batch = SimpleNamespace(seq_lens_cpu=None)
    with patched(W, get_parallel=lambda: single):
        tree_overlap = W.DFlashWorkerV2._ddtree_propose_tree(
            worker, lm_head=SimpleNamespace(weight=weight), **{
                **kwargs, "batch": overlap_batch,
                "draft_input": SimpleNamespace(nxt_kv_lens_sum=int(prefix.sum()) + 3 * 2 * block),
            },
        )  # fmt: skip
    exact = ref.custom_mask.numel()
    added = SimpleNamespace(
        weight=weight,
        shard_indices=SimpleNamespace(
            num_org_elements=vocab, org_vocab_start_index=0, num_added_elements=2
        ),
    )
    with patched(W, get_parallel=lambda: single):
        try:
            W.DFlashWorkerV2._ddtree_propose_tree(worker, lm_head=added, **kwargs)
            added_error = ""
        except RuntimeError as e:
            added_error = str(e)
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


@check
def worker_accept_tree_greedy():
    tokens, parents, target = _branching_case()
    width = tokens.shape[1]
    tree = SimpleNamespace(tokens=tokens, parents=parents)
    worker = _dflash_worker_double(block_size=width)
    synced = []
    worker._tp_sync = SimpleNamespace(sync=lambda site, t: synced.append(site.name))
    # Logits whose argmax is `target`: the path used when the logits are materialised.
    logits = torch.full((width, 100), -5.0)
    logits[torch.arange(width), target[0]] = 5.0
    out = W.DFlashWorkerV2._ddtree_accept_block(
        worker, tree=tree, candidates=tokens, next_token_logits=logits, sampling_info=None,
        draft_input=None, prefix_lens=torch.tensor([40]), bs=1, target_predict=None,
    )  # fmt: skip
    drafts, commit, bonus, out_tokens, seq, accept_index = out
    return {
        "drafts": drafts.tolist(),
        "commit": commit.tolist(),
        "bonus": bonus.tolist(),
        "out_tokens": out_tokens.tolist(),
        "new_seq_lens": seq.tolist(),
        "accept_index": accept_index.tolist(),
        "synced": synced,
    }


@check
def worker_mamba_commit():
    calls = []
    backend = SimpleNamespace(update_mamba_state_after_mtp_verify=lambda **kw: calls.append(kw))
    worker = SimpleNamespace(
        _need_mamba_verify_commit=True,
        target_worker=SimpleNamespace(
            model_runner=SimpleNamespace(attn_backend=backend, model=None)
        ),
    )
    batch = SimpleNamespace(mamba_track_indices=None, req_pool_indices=torch.tensor([4, 5]))
    accept_index = torch.tensor([[0, 2, 3, 5, -1, -1], [0, -1, -1, -1, -1, -1]])
    commit = torch.tensor([4, 1], dtype=torch.int32)
    kwargs = dict(batch=batch, seq_lens_pre_verify=torch.tensor([10, 20]),
                  seq_lens_post_verify=torch.tensor([14, 21]), commit_lens=commit)  # fmt: skip
    W.DFlashWorkerV2._update_target_mamba_state_after_verify(
        worker, **kwargs, accept_index=accept_index
    )
    W.DFlashWorkerV2._update_target_mamba_state_after_verify(worker, **kwargs)
    return {
        "tree_steps": calls[0]["last_correct_step_indices"].tolist(),
        "dflash_steps": calls[1]["last_correct_step_indices"].tolist(),
    }


@check
def capture_mask_predicate():
    return {
        "ddtree_tree": U.ddtree_verify_uses_tree_mask(SpeculativeAlgorithm.DDTREE, _spec()),
        "ddtree_shadow": U.ddtree_verify_uses_tree_mask(
            SpeculativeAlgorithm.DDTREE, _spec(speculative_ddtree_mode="shadow_linear")
        ),
        "dflash": U.ddtree_verify_uses_tree_mask(SpeculativeAlgorithm.DFLASH, _spec()),
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
            U.ddtree_check_hybrid_target(**kw)
            out[name] = ""
        except ValueError as e:
            out[name] = str(e)
    return out


def _result(name: str) -> dict:
    try:
        return {"ok": True, **CHECKS[name]()}
    except Exception as e:  # the test prints this
        import traceback

        return {"ok": False, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}


def run_forked(names: list[str]) -> None:
    """Each check in its own fork of this interpreter (SGLang and torch imported once): one
    `@@JSON@@ {"name": ..., ...}` line per check, even for one whose process dies."""
    import os

    for name in names:
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            sys.stdout.write("@@JSON@@" + json.dumps({"name": name, **_result(name)}) + "\n")
            sys.stdout.flush()
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        if status:
            died = {"name": name, "ok": False, "error": f"the check's process exited {status}"}
            print("@@JSON@@" + json.dumps(died), flush=True)


if __name__ == "__main__":
    run_forked(sorted(CHECKS) if sys.argv[1:] == ["all"] else sys.argv[1:])
