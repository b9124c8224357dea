"""Checks of the 0.5.23 DDTREE verify path, run inside the SGLang 0.5.23 staging venv.

Run as `python checks_0523.py NAME` with the patched `sglang/` first on PYTHONPATH and
`kernels/` (ddtree_kernels, its pure-torch reference on CPU) importable. Prints one JSON
line `{"ok": ..., ...}`; the pytest side (test_verify_path_0523.py) asserts on it.

The checks every worker-v2 release shares come from `worker_v2_checks.py` (this file's parent
folder, on PYTHONPATH). Real here: the DFlashWorkerV2 methods the 0.5.23 patches add, called
unbound, DFlash's own greedy head, accept rule (`compute_dflash_correct_drafts_and_bonus`, the
torch version) and `_commit_accept`. TEST DOUBLES, because the real objects need a GPU, a
scheduler or an initialised runtime context: `Worker` (a namespace standing in for a
DFlashWorkerV2 instance), `Group` (TP ranks as threads), the runtime context getters
(`get_spec`, `get_parallel`) and a recording attention backend.
"""

from __future__ import annotations

import contextlib
import sys
from types import SimpleNamespace

import sglang.srt.speculative.dflash_utils as U
import sglang.srt.speculative.dflash_worker_v2 as W
import torch
from checklib import check, main, same
from ddtree_kernels import ops
from sglang.kernels.ops.speculative.dflash import compute_dflash_correct_drafts_and_bonus
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from worker_v2_checks import branching_case, ddtree_spec, patched, propose_tree_results

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
        blocked = _init(ddtree_spec())
    return {
        "tree": _init(ddtree_spec()),
        "shadow": _init(ddtree_spec(speculative_ddtree_mode="shadow_linear")),
        "hybrid_tree": _init(ddtree_spec(), hybrid=True),
        "hybrid_tree_allowed": _init(
            ddtree_spec(speculative_ddtree_allow_hybrid_unsafe=True), hybrid=True
        ),
        "hybrid_shadow": _init(ddtree_spec(speculative_ddtree_mode="shadow_linear"), hybrid=True),
        "selector": _init(ddtree_spec(), selector=object()),
        "budget_too_big": _init(ddtree_spec(speculative_ddtree_budget=8)),
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
    # 0.5.23: the TP group from get_parallel().tp_group; the batch as batch, and under overlap
    # only the reserved upper bound of the prefix sum (nxt_kv_lens_sum) on the draft input.
    return propose_tree_results(
        W,
        tp_group=lambda group: {"get_parallel": lambda: SimpleNamespace(tp_group=group)},
        host_kwargs=lambda batch: {"batch": batch, "draft_input": None},
        overlap_kwargs=lambda prefix, block: {
            "batch": SimpleNamespace(seq_lens_cpu=None),
            "draft_input": SimpleNamespace(nxt_kv_lens_sum=int(prefix.sum()) + 3 * 2 * block),
        },
    )


@check
def worker_accept_tree_greedy():
    tokens, parents, target = branching_case()
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


if __name__ == "__main__":
    main(sys.argv[1:])
