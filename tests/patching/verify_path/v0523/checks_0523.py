"""Checks of the 0.5.19 to 0.5.23 DDTREE verify paths, run in the release's staging venv.

Run as `python checks_0523.py NAME` with the patched `sglang/` first on PYTHONPATH and
`kernels/` (ddtree_kernels, its pure-torch reference on CPU) importable. Prints one JSON
line `{"ok": ..., ...}`; the pytest side (test_verify_path_0523.py) asserts on it. 0.5.22's set
is 0.5.23's ported back, 0.5.21's is 0.5.22's, 0.5.20's is 0.5.21's and 0.5.19's is 0.5.20's, so
one module serves all five: the few places the workers differ (the draft placement and how the worker enters the draft's
TP scope, where DFlash's greedy accept rule lives, which rank logs, how a PD prefill server is
told) follow `RELEASE`.

The checks every worker-v2 release shares come from `worker_v2_checks.py` (this file's parent
folder, on PYTHONPATH). Real here: the DFlashWorkerV2 methods the 0.5.19 to 0.5.23 patches
add, called unbound, DFlash's own greedy head, accept rule
(`compute_dflash_correct_drafts_and_bonus`, the torch version) and `_commit_accept`. TEST
DOUBLES, because the real objects need a GPU, a scheduler or an initialised runtime context:
`Worker` (a namespace standing in for a DFlashWorkerV2 instance), `Group` (TP ranks as
threads), the runtime context getters (`get_spec`, `get_parallel`) and a recording attention
backend.
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
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.version import __version__ as RELEASE
from worker_v2_checks import (
    BLOCK,
    BUDGET,
    WIDTH,
    D,
    api_refusal_results,
    argmax_logits,
    branching_case,
    ddtree_attrs,
    ddtree_module,
    ddtree_spec,
    greedy_draft_input,
    init_results,
    mamba_commit,
    patched,
    propose_tree_results,
    settings_of,
    shadow_linear_results,
    wide_accept_results,
    wide_init_results,
    wide_propose_results,
)

# A set on ddtree_kernels.sglang's Verifier (docs/ddtree-module.md): its worker accepts a verify
# step's tree in `_ddtree_accept` (the release's sampler or its TP-synced argmax, then the
# step's accept) and its tree-mode commit hands the draft KV the path's rows in block layout
# (`block_rows`, through `Step.commit`). The fat sets keep `_ddtree_accept_block` and their
# own `ddtree_block_rows`.
VERIFIER = hasattr(W.DFlashWorkerV2, "_ddtree_accept")

# 0.5.20 to 0.5.22 keep the worker's verify logits gathered and DFlash's greedy accept rule in
# dflash_utils (0.5.23: a deferred argmax, the rule in sglang.kernels).
GATHERED = RELEASE in ("0.5.19", "0.5.20", "0.5.21", "0.5.22")
if GATHERED:
    compute_dflash_correct_drafts_and_bonus = U.compute_dflash_correct_drafts_and_bonus
else:
    from sglang.kernels.ops.speculative.dflash import compute_dflash_correct_drafts_and_bonus

# Where the worker keeps its draft placement, what `draft_tp_context` takes: 0.5.22 a flag (dp
# attention), 0.5.23 a layout; 0.5.21 enters it through its own `self.draft_tp_context` (the
# module's context under dp attention, else an empty one) with the draft runner's TP group, and
# 0.5.20 the same way with the group alone (no placement flag, no `owns_attention`); 0.5.19's
# draft runner shares the target's TP group and its worker keeps no draft placement at all. A
# worker double holds only its release's attributes, so a patched method that reads another
# release's fails here.
PLACEMENT = {
    "0.5.19": {},
    "0.5.20": {
        "draft_tp_context": lambda group: contextlib.nullcontext(),
        "draft_model_runner": SimpleNamespace(tp_group=None),
    },
    "0.5.21": {
        "draft_owns_attention": False,
        "draft_tp_context": lambda group, *, owns_attention: contextlib.nullcontext(),
        "draft_model_runner": SimpleNamespace(tp_group=None),
    },
    "0.5.22": {"draft_owns_attention": False},
}.get(RELEASE, {"draft_parallel_layout": None})
# The module-level scopes the worker's setup enters, patched to empty ones: 0.5.20 has no
# draft_pp_context (and its draft_tp_context takes the group), 0.5.19's worker module neither.
SETUP_SCOPES = {
    "0.5.19": {},
    "0.5.20": {"draft_tp_context": lambda group: contextlib.nullcontext()},
}.get(
    RELEASE,
    {
        "draft_pp_context": contextlib.nullcontext,
        "draft_tp_context": lambda layout: contextlib.nullcontext(),
    },
)
# Where the worker reads the rank its startup messages log on: 0.5.21 its target model runner,
# 0.5.19 and 0.5.20 the `ps` its __init__ takes.
TARGET_RANK = {
    "0.5.19": {"ps": SimpleNamespace(tp_rank=1)},
    "0.5.20": {"ps": SimpleNamespace(tp_rank=1)},
    "0.5.21": {"model_runner": SimpleNamespace(tp_rank=1)},
}.get(RELEASE, {"_target_tp_rank": 1})
# How the Mamba pool learns it serves a PD prefill server: 0.5.19 to 0.5.21 ask get_disagg().
PD_PREFILL = (
    {"get_disagg": lambda: SimpleNamespace(disaggregation_mode="null")}
    if RELEASE in ("0.5.19", "0.5.20", "0.5.21")
    else {"_pd_prefill_skips_mamba_spec_state": lambda: False}
)

# Where `_init_ddtree` reads the rank it logs on, as (worker attributes, worker-module names):
# 0.5.19's worker module has no get_parallel (the rank is on the `ps` its __init__ takes), so
# a check that patched one in would hide a read of it.
INIT_RANK = (
    ({"ps": SimpleNamespace(tp_rank=1)}, {})
    if RELEASE == "0.5.19"
    else ({}, {"get_parallel": lambda: SimpleNamespace(tp_rank=1)})
)

# What the worker's setup asks get_parallel() (0.5.19's worker module has none).
SETUP_PARALLEL = (
    {}
    if RELEASE == "0.5.19"
    else {
        "get_parallel": lambda: SimpleNamespace(
            attn_dp_enabled=False, enable_dp_attention=False, tp_rank=0
        )
    }
)

# How the Mamba pool learns whether the extra buffer is on: 0.5.19 asks the module-level
# mamba_extra_buffer_enabled() and mamba_extra_buffer_lazy_enabled() (which read the memory
# namespace), later releases get_exec().
EXTRA_BUFFER = (
    {
        "mamba_extra_buffer_enabled": lambda: False,
        "mamba_extra_buffer_lazy_enabled": lambda: False,
    }
    if RELEASE == "0.5.19"
    else {}
)


def _accept(worker, tree, prefix, sampling_info=None, draft_input=None, **verify):
    """The worker's accept over `tree` (`verify`: `_greedy_verify`'s or the logits): DFLASH's
    five outputs and the path's nodes, through a verify step on a set on the Verifier."""
    if VERIFIER:
        step = ddtree_module.Step(
            tree=tree, mode="tree", cache_loc=None, prefix_lens=prefix,
            block_size=int(worker.block_size),
        )  # fmt: skip
        # By keyword, as 0.5.22 and 0.5.23 call it in _accept_block's place (0.5.19 to 0.5.21
        # take the same names); 0.5.23's verify may add its `target_predict`.
        draft_input = greedy_draft_input(draft_input)
        out = W.DFlashWorkerV2._ddtree_accept(
            worker, step, sampling_info=sampling_info, draft_input=draft_input, **verify
        )
        return (*out, step.accept_index)
    return W.DFlashWorkerV2._ddtree_accept_block(
        worker, tree=tree, candidates=tree.tokens, sampling_info=sampling_info,
        draft_input=draft_input, prefix_lens=prefix, bs=len(prefix), **verify,
    )  # fmt: skip


def _greedy_verify(target, vocab) -> dict:
    """How the verify's greedy choice reaches the worker's accept: 0.5.23 may hand over the
    argmax its deferred logits gather took (`target_predict`); 0.5.20 to 0.5.22 have no deferred
    gather and always pass the verify logits, so their accept takes no `target_predict`."""
    if GATHERED:
        return {"next_token_logits": argmax_logits(target, vocab)}
    return {"next_token_logits": None, "target_predict": target.reshape(-1)}


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
    def dflash_accept(candidates, target):
        accept_len, bonus = compute_dflash_correct_drafts_and_bonus(
            candidates=candidates, target_predict=target
        )
        return (accept_len, bonus, *W._commit_accept(candidates, accept_len, bonus))

    def tree_accept(worker, tree, candidates, target, prefix, vocab):
        return _accept(worker, tree, prefix, **_greedy_verify(target, vocab))

    return shadow_linear_results(
        W, lambda block: _dflash_worker_double(block_size=block), dflash_accept, tree_accept
    )


def _init_worker(spec, *, hybrid=False, block=8, **worker_kw):
    """A DFlashWorkerV2 double after `_init_ddtree` (raises what it raises)."""
    worker = SimpleNamespace(
        selector=None, lilicorr=None, _is_domino=False, block_size=block,
        model_runner=SimpleNamespace(model_config=SimpleNamespace(hybrid=hybrid)),
        **INIT_RANK[0],
    )  # fmt: skip
    vars(worker).update(worker_kw)
    with patched(
        W,
        get_spec=lambda: spec,
        mambaish_config=lambda cfg: object() if cfg.hybrid else None,
        **INIT_RANK[1],
    ):
        W.DFlashWorkerV2._init_ddtree(worker)
    return worker


def _init(spec, *, hybrid=False, **worker_kw):
    try:
        worker = _init_worker(spec, hybrid=hybrid, **worker_kw)
    except Exception as e:  # reported, asserted on by the test
        return {"error": f"{type(e).__name__}: {e}"}
    settings = settings_of(worker)
    return {
        "mode": worker._ddtree.settings.mode,
        "budget": settings.budget,
        "topk": settings.topk,
        # The ops at hand: the fat sets keep them, a set on the module keeps its Verifier
        # (ddtree_kernels.sglang, which imports them).
        "ops_loaded": getattr(worker, "_ddtree_ops", None) is ops
        or isinstance(getattr(worker, "_ddtree", None), ddtree_module.Verifier),
    }


@check
def worker_init():
    return {**init_results(W, _init), "selector": _init(ddtree_spec(), selector=object())}


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
        **PLACEMENT,
        **ddtree_attrs(mode),
        _draft_worker=SimpleNamespace(init_attention_backends=lambda: None),
        model_runner=SimpleNamespace(
            model_config=SimpleNamespace(hybrid=hybrid), attn_backend=backend, spec_algorithm=None
        ),
    )
    with patched(
        W, **SETUP_SCOPES, ddtree_draft_spec_scope=lambda *_: contextlib.nullcontext(),
        get_spec=lambda: None,
        mambaish_config=lambda cfg: object() if cfg.hybrid else None,
    ):  # fmt: skip
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
    sampler_worker = SimpleNamespace(**ddtree_attrs("tree"), block_size=8, **TARGET_RANK)
    return {
        "tree_hybrid": _attention_setup("tree", hybrid=True),
        "shadow_hybrid": _attention_setup("shadow_linear", hybrid=True),
        "tree_dense": _attention_setup("tree", hybrid=False),
        "dflash_hybrid": _attention_setup(None, hybrid=True),
        "tree_kda_pool": _attention_setup("tree", hybrid=True, accept_pool=object()),
        "tree_sampler": repr(W.DFlashWorkerV2._maybe_build_draft_sampler(sampler_worker)),
    }


def _tp_group(group) -> dict:
    """0.5.20's to 0.5.23's tree proposals reach their TP group through get_parallel().tp_group
    (0.5.20's own greedy head asks get_tp_group(), which the draft TP scope patches alike);
    0.5.19's through get_tp_group(), the target's group its draft runner shares."""
    if RELEASE == "0.5.19":
        return {"get_tp_group": lambda: group}
    return {"get_parallel": lambda: SimpleNamespace(tp_group=group)}


def _host_kwargs(batch) -> dict:
    """0.5.20 to 0.5.23 pass the batch as batch; the host prefix lengths are on it."""
    return {"batch": batch, "draft_input": None}


@check
def worker_propose_tree():
    # Under overlap only the reserved upper bound of the prefix sum (nxt_kv_lens_sum) is on the
    # draft input.
    return propose_tree_results(
        W,
        tp_group=_tp_group,
        host_kwargs=_host_kwargs,
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
    out = _accept(worker, tree, torch.tensor([40]), next_token_logits=logits)
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
def worker_accept_tree_sampled():
    """The sampled accept broadcasts the tree sampler's accepted drafts, accept_index and
    predicts from TP rank 0, in that order, then walks them (the greedy accept's outputs)."""
    tokens, parents, target = branching_case()
    width = tokens.shape[1]
    tree = SimpleNamespace(
        tokens=tokens, parents=parents, retrieve_index=None, retrieve_next_token=None,
        retrieve_next_sibling=None,
    )  # fmt: skip
    worker = _dflash_worker_double(block_size=width)
    walk = ops.verify_walk(tokens, parents, target, width - 1)
    drawn = (walk.accept_len - 1, walk.accept_index.int(), target.reshape(-1).int())

    def sampler(**_):  # TEST DOUBLE for the tree rejection sampler (a CUDA kernel)
        return drawn[0], None, drawn[1], drawn[2]

    synced = []
    worker._tp_sync = SimpleNamespace(sync=lambda site, t: synced.append((site.name, t)))
    logits = argmax_logits(target, 100)
    with patched(
        W, is_dflash_sampling_verify_available=lambda: True,
        compute_dflash_sampling_correct_drafts_and_bonus=sampler,
    ):  # fmt: skip
        sampled = _accept(
            worker, tree, torch.tensor([40]), SimpleNamespace(is_all_greedy=False),
            SimpleNamespace(max_top_k=None, uniform_top_k_value=None), next_token_logits=logits,
        )  # fmt: skip
    worker._tp_sync = SimpleNamespace(sync=lambda site, t: None)
    greedy = _accept(worker, tree, torch.tensor([40]), next_token_logits=logits)
    return {
        "synced": [site for site, _ in synced],
        "synced_outputs": all(t is d for (_, t), d in zip(synced, drawn, strict=True)),
        "equal_greedy": all(same(a, b) for a, b in zip(sampled, greedy, strict=True)),
    }


@check
def wide_worker_init():
    return wide_init_results(_init_worker)


@check
def wide_propose_tree():
    return wide_propose_results(W, tp_group=_tp_group, host_kwargs=_host_kwargs)


@check
def wide_accept_and_commit():
    def accept(worker, tree, logits, prefix, sampling_info, draft_input):
        return _accept(worker, tree, prefix, sampling_info, draft_input, next_token_logits=logits)

    # 0.5.19's to 0.5.23's workers put the verify rows in the drafter's block layout
    # (ddtree_block_rows; 0.5.19's Step.commit, the module's block_rows) before the draft-KV
    # append, the logprobs and the sampling mask read them.
    return wide_accept_results(
        W, _dflash_worker_double(block_size=BLOCK), accept,
        lambda rows, bs: D.ddtree_block_rows(rows, bs, WIDTH, BLOCK),
    )  # fmt: skip


@check
def wide_draft_runner_width():
    """0.5.20's to 0.5.23's runners size themselves from the spec bag (get_spec()) when they
    are built and set up, so the worker sets up its draft runner inside `ddtree_draft_spec_scope`: in
    DDTREE tree mode the draft runner's backends and CUDA graphs see the drafter's 16-token block
    while the target keeps the 64-token verify width; shadow_linear and DFLASH see their one
    width, untouched.

    Real: the spec bag (a published test config, `override_server_args`), the worker's
    `init_attention_backends` and `init_cuda_graphs`, and `ModelRunner.decode_num_tokens_per_req`,
    the width DecodeCudaGraphRunner captures at (`captured_req_width`). TEST DOUBLES: the worker
    and its draft worker (which records what it sees), the parallel and graph-config getters
    (no CUDA graphs on CPU) and the draft model runner (the two attributes the width reads)."""
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.runtime_context import get_context, get_spec

    def widths(algorithm, **fields):
        algo = SpeculativeAlgorithm.from_string(algorithm)
        draft_runner = SimpleNamespace(spec_algorithm=algo, is_draft_worker=True)
        seen = []

        def record(**_):
            seen.append([
                get_spec().speculative_num_draft_tokens,
                ModelRunner.decode_num_tokens_per_req(draft_runner),
            ])  # fmt: skip

        worker = SimpleNamespace(
            **PLACEMENT, **ddtree_attrs(None), selector=None,
            model_runner=SimpleNamespace(
                spec_algorithm=algo, model_config=SimpleNamespace(hybrid=False),
                attn_backend=SimpleNamespace(),
            ),
            _draft_worker=SimpleNamespace(init_attention_backends=record, init_cuda_graphs=record),
        )  # fmt: skip
        graphs_off = SimpleNamespace(
            graph=SimpleNamespace(
                cuda_graph_config=SimpleNamespace(
                    decode=SimpleNamespace(backend=W.Backend.DISABLED)
                )
            )
        )
        with (
            get_context().override_server_args(speculative_algorithm=algorithm, **fields),
            patched(
                W, **SETUP_SCOPES, **SETUP_PARALLEL,
                get_exec=lambda: graphs_off,
                mambaish_config=lambda cfg: None,
            ),
        ):  # fmt: skip
            W.DFlashWorkerV2.init_attention_backends(worker)
            W.DFlashWorkerV2.init_cuda_graphs(worker)
            target = get_spec().speculative_num_draft_tokens
        return {"backends": seen[0], "graphs": seen[1], "target": target}

    wide = dict(speculative_num_draft_tokens=WIDTH, speculative_dflash_block_size=BLOCK,
                speculative_ddtree_budget=BUDGET)  # fmt: skip
    rows = torch.arange(2 * BLOCK).unsqueeze(1)
    return {
        "tree": widths("DDTREE", speculative_ddtree_mode="tree", **wide),
        "shadow": widths(
            "DDTREE", speculative_ddtree_mode="shadow_linear", speculative_num_draft_tokens=BLOCK
        ),
        "dflash": widths("DFLASH", speculative_num_draft_tokens=BLOCK),
        # At the block width the verify rows already are the block layout, the same tensor.
        "block_rows_untouched": D.ddtree_block_rows(rows, 2, BLOCK, BLOCK) is rows,
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
        _ddtree=ddtree_module.Verifier(None, 6),  # a set on the module: its per-step helpers
    )
    batch = SimpleNamespace(mamba_track_indices=None, req_pool_indices=torch.tensor([4, 5]))
    accept_index = torch.tensor([[0, 2, 3, 5, -1, -1], [0, -1, -1, -1, -1, -1]])
    commit = torch.tensor([4, 1], dtype=torch.int32)
    kwargs = dict(batch=batch, seq_lens_pre_verify=torch.tensor([10, 20]), commit_lens=commit)
    if RELEASE != "0.5.19":  # 0.5.20 adds the post-verify lengths to the signature
        kwargs["seq_lens_post_verify"] = torch.tensor([14, 21])
    mamba_commit(W, worker, accept_index, **kwargs)
    W.DFlashWorkerV2._update_target_mamba_state_after_verify(worker, **kwargs)
    return {
        "tree_steps": calls[0]["last_correct_step_indices"].tolist(),
        "dflash_steps": calls[1]["last_correct_step_indices"].tolist(),
    }


@check
def hybrid_conv_window_layout():
    """Patch 0006: the Mamba request pool `KVCacheConfigurator._build_hybrid_req_pool` builds
    for a DDTREE tree-mode hybrid target keeps one conv window per verify node on CUDA. 0.5.20
    to 0.5.23 deduplicate a chain's conv windows (topk <= 1) into one sliding window on CUDA
    only, so a CPU pool never shows that layout (0.5.14's did on the GPU lab, as a divergence).

    Real: `_build_hybrid_req_pool` and the release's layout rule `conv_window_dedup_enabled`,
    asked as on CUDA for a GDN (not KDA) model. TEST DOUBLES: the configurator (the attributes
    the method reads), the runtime-context getters and the pool class, which records its
    arguments (a real pool allocates on CUDA)."""
    from sglang.srt.mem_cache import kv_cache_configurator as K
    from sglang.srt.mem_cache import memory_pool

    features = SimpleNamespace(
        mamba=SimpleNamespace(
            enable_linear_replayssm_spec=False, enable_mamba_extra_buffer=False,
            enable_mamba_extra_buffer_lazy=False, enable_linear_replayssm=False,
            linear_replayssm_cache_len=16,
        ),
        features=SimpleNamespace(enable_memory_saver=False),
    )  # fmt: skip
    configurator = SimpleNamespace(
        hybrid_kda_config=None, hybrid_gdn_config=object(), device="cpu",
        model_config=SimpleNamespace(context_len=256),
        mambaish_config=SimpleNamespace(mamba2_cache_params=SimpleNamespace(layers=[0, 1])),
        layer_info=SimpleNamespace(start_layer=0, end_layer=2),
        _get_mamba_layer_ids_for_req_pool=lambda: [0, 1], _get_ple_req_pool_kwargs=lambda: {},
    )  # fmt: skip

    def pool_topk(algorithm, mode):
        spec = SimpleNamespace(
            speculative_algorithm=algorithm, speculative_ddtree_mode=mode,
            speculative_eagle_topk=1,
        )  # fmt: skip
        with patched(
            K, get_spec=lambda: spec, get_exec=lambda: features,
            get_schedule=lambda: SimpleNamespace(max_mamba_cache_size=None,
                                                 disable_overlap_schedule=False),
            get_memory=lambda: SimpleNamespace(enable_page_major_kv_layout=False),
            max_speculative_num_draft_tokens=lambda: 16,
            HybridReqToTokenPool=SimpleNamespace, **PD_PREFILL, **EXTRA_BUFFER,
        ):  # fmt: skip
            pool = K.KVCacheConfigurator._build_hybrid_req_pool(
                configurator, max_num_reqs=4, extra_max_context_len=20
            )
        topk = pool.speculative_eagle_topk
        return {"topk": topk,
                "dedup_on_cuda": memory_pool.conv_window_dedup_enabled(False, False, topk, False)}  # fmt: skip

    return {
        "ddtree_tree": pool_topk("DDTREE", "tree"),
        "ddtree_shadow": pool_topk("DDTREE", "shadow_linear"),
        "dflash": pool_topk("DFLASH", "tree"),
    }


def ddtree_api_refusal():
    """A set on ddtree_kernels.sglang (0.5.19): `api_refusal_results` with this release's
    worker double."""
    return api_refusal_results(_init)


if VERIFIER:  # the sets on ddtree_kernels.sglang's Verifier (../test_thin_sets.py)
    check(ddtree_api_refusal)


if __name__ == "__main__":
    main(sys.argv[1:])
