"""Checks of the 0.5.14 to 0.5.18 DDTREE verify paths, run inside the release's staging venv.

Run as `python checks_0514.py NAME|all` with the patched `sglang/` first on PYTHONPATH, then its
parent folder (`worker_v2_checks.py`: the checks every worker-v2 release shares) and `kernels/`
(ddtree_kernels, its pure-torch reference on CPU). Prints one `@@JSON@@` line per check; the
pytest side (test_verify_path_worker_v2.py, test_verify_path_0514.py, test_verify_path_0515.py,
test_verify_path_0516.py to test_verify_path_0518.py) asserts on it. The worker checks return the same
keys as 0.5.23's, so the shared tests hold every release to one promise. 0.5.15's to 0.5.17's sets
are 0.5.14's with the worker hunks rewritten, so one module serves the four: the few places the
workers differ (how the tree proposal takes the batch and the host lengths; 0.5.15's draft runner
server args and in-graph draft sampler; 0.5.16's ParallelState, hybrid detection from the model
config, Mamba commit flag, draft runner builder and pools built by the KV-cache configurator;
0.5.17's config bags, read-only server args and grammar) follow `RELEASE`; 0.5.18's set is
0.5.17's ported, and its worker takes 0.5.17's branches.

Real: the DFlashWorkerV2 methods the 0.5.14 to 0.5.17 patches add or change, called unbound,
DFlash's own greedy head and accept rule (`compute_dflash_correct_drafts_and_bonus`, the torch
version the worker falls back to), the linear-attention backend and SGLang's Triton conv kernel
(interpreted on CPU: TRITON_INTERPRET=1). TEST DOUBLES, because the real objects need a GPU or a scheduler:
`SimpleNamespace` workers standing in for a DFlashWorkerV2 instance (only the attributes each
method reads), `Group` (TP ranks as threads), the TP-group getter, a recording attention
backend and the Mamba slot pool.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import sglang.srt.speculative.dflash_utils as U
import sglang.srt.speculative.dflash_worker_v2 as W
import torch
from checklib import check, conv_over_tree_links, main, same
from ddtree_kernels import ops
from sglang.srt.layers.attention import hybrid_linear_attn_backend as H
from sglang.srt.speculative.dflash_info import DDTreeVerifyInput
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.version import __version__ as RELEASE
from worker_v2_checks import (
    BLOCK,
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

# A set on ddtree_kernels.sglang's Verifier (docs/ddtree-module.md): its worker accepts a
# verify step's tree in `_ddtree_accept` (the release's sampler, then `Step.accept`), and its
# tree-mode commit hands the draft KV the path's rows in block layout (`block_rows`). The fat
# sets keep `_ddtree_accept_block` and their own row slicing.
VERIFIER = hasattr(W.DFlashWorkerV2, "_ddtree_accept")


def _tp_group(group) -> dict:
    """0.5.14's to 0.5.16's workers reach their TP group through get_tp_group()."""
    return {"get_tp_group": lambda: group}


def _exact_host_kwargs(batch) -> dict:
    """`_ddtree_propose_tree`'s host arguments when it may size the mask exactly. 0.5.14: the
    batch (as model_worker_batch) with its committed lengths, no bound on the draft input.
    0.5.15: no host lengths at all (it then sums the device lengths)."""
    if RELEASE == "0.5.14":  # (the bounds' sums: fields of the real DFlashDraftInputV2)
        return {
            "model_worker_batch": batch,
            "draft_input": SimpleNamespace(
                planning_seq_lens_cpu=None, planning_seq_lens_sum=None,
                reserved_seq_lens_cpu=None, reserved_seq_lens_sum=None,
            ),
        }  # fmt: skip
    return {
        "batch": SimpleNamespace(seq_lens_cpu=None),
        "draft_input": SimpleNamespace(reserved_seq_lens_cpu=None, reserved_seq_lens_sum=None),
    }


def _overlap_host_kwargs(prefix: torch.Tensor, block: int) -> dict:
    """Under overlap only an upper bound of the prefix lengths is on the host. 0.5.14: the draft
    input's planning bound (prefix + 2 blocks here). 0.5.15: the batch's committed lengths,
    which lag one step, to which the worker adds one accepted block per request."""
    if RELEASE == "0.5.14":
        return {
            "model_worker_batch": SimpleNamespace(seq_lens_cpu=None),
            "draft_input": SimpleNamespace(
                planning_seq_lens_cpu=prefix + 2 * block,
                planning_seq_lens_sum=int(prefix.sum()) + len(prefix) * 2 * block,
                reserved_seq_lens_cpu=None,
                reserved_seq_lens_sum=None,
            ),
        }
    return {
        "batch": SimpleNamespace(seq_lens_cpu=prefix.clone()),
        "draft_input": SimpleNamespace(reserved_seq_lens_cpu=None, reserved_seq_lens_sum=None),
    }


def _dflash_out_tokens(candidates, accept_len, bonus):
    """DFLASH's out tokens and commit lengths as 0.5.14's worker writes them (its eager accept
    path): the drafts after the root, the bonus scattered at position accept_len."""
    bs, block = candidates.shape
    out = torch.zeros((bs, block), dtype=torch.int64)
    out[:, : block - 1].copy_(candidates[:, 1:])
    out.scatter_(1, accept_len.to(torch.int64)[:, None], bonus.to(torch.int64)[:, None])
    return out, accept_len.to(torch.int32) + 1


def _accept(worker, tree, logits, prefix, sampling_info=None, draft_input=None):
    """The worker's accept over `tree`: 6 outputs (DFLASH's five and the path's nodes)."""
    if VERIFIER:  # the worker's accept of a verify step over `tree`
        step = ddtree_module.Step(
            tree=tree, mode="tree", cache_loc=None, prefix_lens=prefix,
            block_size=int(worker.block_size),
        )  # fmt: skip
        draft_input = greedy_draft_input(draft_input)
        out = W.DFlashWorkerV2._ddtree_accept(worker, step, logits, sampling_info, draft_input)
        return (*out, step.accept_index)
    return W.DFlashWorkerV2._ddtree_accept_block(
        worker, tree=tree, next_token_logits=logits, sampling_info=sampling_info,
        draft_input=draft_input, prefix_lens=prefix, bs=len(prefix),
    )  # fmt: skip


@check
def shadow_linear_equals_dflash():
    def dflash_accept(candidates, target):
        accept_len, bonus = U.compute_dflash_correct_drafts_and_bonus(
            candidates=candidates, target_predict=target
        )
        return (accept_len, bonus, *_dflash_out_tokens(candidates, accept_len, bonus))

    def tree_accept(worker, tree, candidates, target, prefix, vocab):
        return _accept(worker, tree, argmax_logits(target, vocab), prefix)

    return shadow_linear_results(
        W, lambda block: SimpleNamespace(block_size=block, _ddtree_ops=ops), dflash_accept,
        tree_accept,
    )  # fmt: skip


def _target_runner(hybrid: bool) -> SimpleNamespace:
    """The target runner double `_init_ddtree` reads to tell a hybrid target. 0.5.14 and 0.5.15:
    the runner's `mambaish_config`. 0.5.16's runner has none: the worker asks the release's own
    `configs.hybrid_arch.mambaish_config` of the model config (real HF config classes here)."""
    if RELEASE in ("0.5.14", "0.5.15"):
        return SimpleNamespace(mambaish_config=object() if hybrid else None)
    from sglang.srt.configs import Qwen3NextConfig
    from transformers import Qwen3Config

    hf_config = Qwen3NextConfig() if hybrid else Qwen3Config()
    return SimpleNamespace(
        model_config=SimpleNamespace(
            hf_config=hf_config, is_draft_model=False, linear_attn_registry_result=None
        )
    )


def _init_worker(server_args, *, hybrid=False, block=8, lm_head=None):
    """A DFlashWorkerV2 double after `_init_ddtree` (raises what it raises). Its TP rank is
    `tp_rank` up to 0.5.15, `ps.tp_rank` (the ParallelState) from 0.5.16. The target worker
    holds a dense bf16 LM head unless `lm_head` says otherwise (0.5.18's set refuses a tree on
    a head without a dense weight)."""
    if lm_head is None:
        lm_head = SimpleNamespace(weight=torch.zeros(1, dtype=torch.bfloat16))
    target_model = SimpleNamespace(lm_head=lm_head)
    worker = SimpleNamespace(
        server_args=server_args, block_size=block, tp_rank=1, ps=SimpleNamespace(tp_rank=1),
        model_runner=_target_runner(hybrid),
        _target_worker=SimpleNamespace(model_runner=SimpleNamespace(model=target_model)),
    )  # fmt: skip
    W.DFlashWorkerV2._init_ddtree(worker)
    return worker


def _init(server_args, *, hybrid=False, block=8, lm_head=None):
    try:
        worker = _init_worker(server_args, hybrid=hybrid, block=block, lm_head=lm_head)
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
    return init_results(W, _init)


@check
def worker_propose_tree():
    return propose_tree_results(
        W, tp_group=_tp_group, host_kwargs=_exact_host_kwargs, overlap_kwargs=_overlap_host_kwargs
    )


@check
def worker_accept_tree_greedy():
    tokens, parents, target = branching_case()
    width = tokens.shape[1]
    tree = SimpleNamespace(tokens=tokens, parents=parents)
    worker = SimpleNamespace(block_size=width, _ddtree_ops=ops)
    out = _accept(worker, tree, argmax_logits(target, 100), torch.tensor([40]))
    drafts, commit, bonus, out_tokens, seq, accept_index = out
    return {
        "drafts": drafts.tolist(),
        "commit": commit.tolist(),
        "bonus": bonus.tolist(),
        "out_tokens": out_tokens.tolist(),
        "new_seq_lens": seq.tolist(),
        "accept_index": accept_index.tolist(),
    }


@check
def worker_mamba_commit():
    calls = []
    backend = SimpleNamespace(update_mamba_state_after_mtp_verify=lambda **kw: calls.append(kw))
    worker = SimpleNamespace(
        target_worker=SimpleNamespace(
            model_runner=SimpleNamespace(attn_backend=backend, model=None)
        ),
        _ddtree=ddtree_module.Verifier(None, 6),  # a set on the module: its per-step helpers
        _need_mamba_verify_commit=True,  # 0.5.16: set in init_attention_backends
    )
    batch = SimpleNamespace(  # 0.5.17 also hands the backend the request pool indices
        mamba_track_indices=None, seq_lens=torch.tensor([14, 21]), req_pool_indices=torch.arange(2)
    )
    accept_index = torch.tensor([[0, 2, 3, 5, -1, -1], [0, -1, -1, -1, -1, -1]])
    commit = torch.tensor([4, 1], dtype=torch.int32)
    kwargs = dict(batch=batch, seq_lens_pre_verify=torch.tensor([10, 20]), commit_lens=commit)
    mamba_commit(W, worker, accept_index, **kwargs)
    W.DFlashWorkerV2._update_target_mamba_state_after_verify(worker, **kwargs)
    return {
        "tree_steps": calls[0]["last_correct_step_indices"].tolist(),
        "dflash_steps": calls[1]["last_correct_step_indices"].tolist(),
    }


@check
def wide_worker_init():
    return wide_init_results(_init_worker)


@check
def wide_propose_tree():
    return wide_propose_results(W, tp_group=_tp_group, host_kwargs=_exact_host_kwargs)


@check
def wide_accept_and_commit():
    def draft_rows(rows, bs):
        # The worker feeds the draft KV each verify window's first block_size rows: a set on
        # the Verifier through Step.commit's `block_rows`, the fat sets by slicing the view.
        if VERIFIER:
            return ddtree_module.block_rows(rows, bs, WIDTH, BLOCK)
        return rows.view(bs, WIDTH, -1)[:, :BLOCK]

    return wide_accept_results(
        W, SimpleNamespace(block_size=BLOCK, _ddtree_ops=ops), _accept, draft_rows
    )


@check
def hybrid_tree_links():
    """Patch 0007: the real linear-attention backend hands a DDTREE tree's links to the real
    Triton conv kernel (TRITON_INTERPRET=1), which then convolves each node over its ancestors."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    try:  # 0.5.16 moved SGLang's Triton kernels to sglang.kernels.ops
        from sglang.kernels.ops.mamba.causal_conv1d_triton import causal_conv1d_update
    except ImportError:
        from sglang.srt.layers.attention.mamba.causal_conv1d_triton import causal_conv1d_update

    class FakeMambaPool:  # TEST DOUBLE: HybridReqToTokenPool maps requests to Mamba slots
        def get_mamba_indices(self, req_pool_indices):
            return req_pool_indices.to(torch.int32)

        def translate_mamba_indices(self, mamba_indices):  # 0.5.15: identity (not unified)
            return mamba_indices

    def backend(algorithm, mode="tree", eagle_topk=None):
        args = SimpleNamespace(
            speculative_algorithm=algorithm,
            speculative_ddtree_mode=mode,
            speculative_eagle_topk=eagle_topk,
            enable_unified_memory=False,  # 0.5.15 reads it
        )
        runner = SimpleNamespace(
            device="cpu", server_args=args, req_to_token_pool=FakeMambaPool(),
            is_draft_worker=False, token_to_kv_pool=None,
        )  # fmt: skip
        return H.MambaAttnBackendBase(runner)

    width, bs = 6, 3
    prefix = torch.tensor([4, 0, 7])
    logits = torch.randn(bs, width - 1, 50, generator=torch.Generator().manual_seed(5)) * 3
    top = ops.topk_logprobs(logits, 3)
    # Budget 4: 5 nodes in a width of 6, one padding node per request.
    tree = D.ddtree_build_verify_tree(
        logp=top.logp, ids=top.ids, root_tokens=torch.tensor([11, 12, 13]), prefix_lens=prefix,
        budget=4, width=width, prefix_lens_sum=int(prefix.sum()),
    )  # fmt: skip
    vi = DDTreeVerifyInput(
        draft_token=tree.tokens.reshape(-1), positions=tree.positions.reshape(-1),
        draft_token_num=width, custom_mask=tree.custom_mask,
        retrieve_index=tree.retrieve_index, retrieve_next_token=tree.retrieve_next_token,
        retrieve_next_sibling=tree.retrieve_next_sibling, tree_parents=tree.parents,
    )  # fmt: skip
    verify = SimpleNamespace(
        batch_size=bs, forward_mode=ForwardMode.TARGET_VERIFY,
        input_ids=torch.zeros(bs * width, dtype=torch.int64), spec_info=vi,
        req_pool_indices=torch.arange(bs), mamba_track_mask=None,
        mamba_track_indices=None, _original_batch_size=None,  # 0.5.15 reads these
    )  # fmt: skip
    tree_backend = backend("DDTREE")
    eager = tree_backend._forward_metadata(verify)
    tree_backend.init_cuda_graph_state(max_bs=bs, max_num_tokens=bs * width)
    replay = tree_backend._replay_metadata(
        bs, torch.arange(bs), ForwardMode.TARGET_VERIFY, vi, torch.tensor([9, 9, 9])
    )

    return {
        "topk": {
            "ddtree_tree": tree_backend.topk,
            "ddtree_tree_enum": backend(SpeculativeAlgorithm.DDTREE).topk,
            "ddtree_shadow": backend("DDTREE", mode="shadow_linear").topk,
            "dflash": backend("DFLASH", eagle_topk=1).topk,
            "eagle_topk4": backend("EAGLE", eagle_topk=4).topk,
        },
        "eager_links": same(eager.retrieve_next_token, vi.retrieve_next_token)
        and same(eager.retrieve_next_sibling, vi.retrieve_next_sibling),
        "graph_links": same(replay.retrieve_next_token, vi.retrieve_next_token.int())
        and same(replay.retrieve_next_sibling, vi.retrieve_next_sibling.int()),
        "shadow_links": backend("DDTREE", mode="shadow_linear")
        ._forward_metadata(verify)
        .retrieve_next_token
        is None,
        **conv_over_tree_links(causal_conv1d_update, eager, tree.parents, 5),
    }


def _mixin_pool_topks(pool_args) -> dict[str, int]:
    """0.5.14 and 0.5.15: the eagle top-k `ModelRunnerKVCacheMixin._init_pools` hands the hybrid
    request pool. TEST DOUBLES: the runner (the attributes `_init_pools` reads first) and the
    pool class, which records its arguments and stops the build (a real pool allocates on CUDA)."""
    from sglang.srt.model_executor import model_runner_kv_cache_mixin as mixin

    class Built(Exception):
        pass

    def recorder(**kwargs):
        raise Built(kwargs)

    runner = SimpleNamespace(
        server_args=pool_args, max_running_requests=4, req_to_token_pool=None,
        mambaish_config=SimpleNamespace(mamba2_cache_params=SimpleNamespace(layers=[0, 1])),
        model_config=SimpleNamespace(context_len=256), device="cpu", start_layer=0,
        end_layer=2,
    )  # fmt: skip
    with patched(mixin, HybridReqToTokenPool=recorder):
        try:
            mixin.ModelRunnerKVCacheMixin._init_pools(runner)
        except Built as built:
            return {"hybrid": built.args[0]["speculative_eagle_topk"]}
    raise AssertionError("_init_pools built no hybrid request pool")


def _config_bags(args) -> dict:
    """0.5.17 reads resolved config from its namespace bags (get_spec() and the others), not the
    server args: TEST DOUBLES of the bags a module reads, holding `args`' values. 0.5.18 also
    reads its disaggregation bag and runtime_context's predicates over the bags (the Mamba extra
    buffer, the largest draft-token count), doubled here too; a caller keeps those its module
    imports."""
    if not hasattr(W, "get_spec"):  # up to 0.5.16
        return {}
    mamba = SimpleNamespace(
        enable_linear_replayssm_spec=False, enable_linear_replayssm=args.enable_linear_replayssm,
        linear_replayssm_cache_len=args.linear_replayssm_cache_len,
    )  # fmt: skip
    bags = {
        "get_spec": args,
        "get_exec": SimpleNamespace(
            features=SimpleNamespace(enable_memory_saver=args.enable_memory_saver), mamba=mamba
        ),
        "get_schedule": SimpleNamespace(
            max_mamba_cache_size=args.max_mamba_cache_size,
            disable_overlap_schedule=args.disable_overlap_schedule,
        ),
        "get_memory": SimpleNamespace(enable_page_major_kv_layout=False),
        "get_disagg": SimpleNamespace(disaggregation_mode=args.disaggregation_mode),
    }
    doubles = {name: (lambda bag=bag: bag) for name, bag in bags.items()}
    return {
        **doubles,
        "mamba_extra_buffer_enabled": args.enable_mamba_extra_buffer,
        "mamba_extra_buffer_lazy_enabled": args.enable_mamba_extra_buffer_lazy,
        "max_speculative_num_draft_tokens": lambda: args.max_speculative_num_draft_tokens,
    }


def _configurator_pool_topks(pool_args) -> dict[str, int]:
    """0.5.16 and 0.5.17: the eagle top-k the KV-cache configurator hands the hybrid request pool
    and the disaggregated decode side's hybrid pool (`KVCacheConfigurator._build_hybrid_req_pool`,
    `_build_hybrid_mamba_decode_req_pool`, both real; 0.5.17 reads the top-k from the spec bag).
    TEST DOUBLES: the configurator (the attributes the methods read), 0.5.17's config bags and the
    pool classes, which keep their arguments (a real pool allocates on CUDA)."""
    from sglang.srt.disaggregation import decode
    from sglang.srt.mem_cache import kv_cache_configurator as K

    server_args = pool_args
    if hasattr(W, "get_spec"):  # 0.5.17 upper-cases the server args' algorithm, a name there
        name = getattr(pool_args.speculative_algorithm, "name", pool_args.speculative_algorithm)
        server_args = SimpleNamespace(**{**vars(pool_args), "speculative_algorithm": name})
    # 0.5.18 upper-cases the spec bag's, so its bag holds the name too (0.5.17's may not).
    bag_args = pool_args if RELEASE in ("0.5.16", "0.5.17") else server_args
    bags = {name: bag for name, bag in _config_bags(bag_args).items() if hasattr(K, name)}
    configurator = SimpleNamespace(
        server_args=server_args, hybrid_gdn_config=object(), device="cpu",
        model_config=SimpleNamespace(context_len=256, hf_config=None),
        mambaish_config=SimpleNamespace(mamba2_cache_params=SimpleNamespace(layers=[0, 1])),
        layer_info=SimpleNamespace(start_layer=0, end_layer=2),
    )  # fmt: skip
    build = K.KVCacheConfigurator
    with patched(K, HybridReqToTokenPool=SimpleNamespace, **bags):
        hybrid = build._build_hybrid_req_pool(
            configurator, max_num_reqs=4, extra_max_context_len=20
        )
    with (
        patched(decode, HybridMambaDecodeReqToTokenPool=SimpleNamespace),
        patched(K, **bags),
    ):
        disagg = build._build_hybrid_mamba_decode_req_pool(
            configurator, max_num_reqs=4, extra_max_context_len=20, pre_alloc_size=0
        )
    return {"hybrid": hybrid.speculative_eagle_topk, "decode": disagg.speculative_eagle_topk}


@check
def hybrid_conv_window_layout():
    """Patch 0007: the Mamba pools the patched runner builds for a DDTREE tree-mode hybrid
    target keep one conv window per verify node on CUDA. 0.5.14 to 0.5.16 deduplicate the conv
    windows of a chain (topk <= 1) into one sliding window, but only on CUDA, so the CPU pool (and
    hybrid_tree_links above) never saw that layout; the GPU lab did, as a divergence.

    Real: the release's pool construction (0.5.14/0.5.15: the model runner's KV-cache mixin;
    0.5.16: the KV-cache configurator) and its own layout rule `conv_window_dedup_enabled`,
    asked as on CUDA (not NPU, not CPU; from 0.5.16 also: not KDA)."""
    from sglang.srt.mem_cache import memory_pool

    def dedup_on_cuda(topk):
        if RELEASE in ("0.5.14", "0.5.15"):
            return memory_pool.conv_window_dedup_enabled(False, False, topk)
        return memory_pool.conv_window_dedup_enabled(False, False, topk, False)

    pool_topks = _mixin_pool_topks if RELEASE in ("0.5.14", "0.5.15") else _configurator_pool_topks

    def pool_topk(algorithm, mode, eagle_topk=1):
        args = SimpleNamespace(
            speculative_algorithm=algorithm, speculative_ddtree_mode=mode,
            speculative_eagle_topk=eagle_topk, max_speculative_num_draft_tokens=16,
            page_size=1, disaggregation_mode="null", enable_memory_saver=False,
            enable_mamba_extra_buffer=lambda: False, enable_mamba_extra_buffer_lazy=lambda: False,
            disable_overlap_schedule=False, max_mamba_cache_size=None,
            # 0.5.15 and 0.5.16 read these (unified pool, ReplaySSM, page-major layout: opt-in).
            enable_unified_memory=False, enable_linear_replayssm=False,
            linear_replayssm_cache_len=16, enable_page_major_kv_layout=False,
            enable_gdn_replayssm_spec=False,
        )  # fmt: skip
        topks = pool_topks(args)
        topk = topks["hybrid"]
        # Every pool a release builds for the target takes the same top-k.
        assert set(topks.values()) == {topk}, topks
        return {"topk": topk, "dedup_on_cuda": dedup_on_cuda(topk)}

    return {
        "ddtree_tree": pool_topk("DDTREE", "tree"),
        "ddtree_tree_enum": pool_topk(SpeculativeAlgorithm.DDTREE, "tree"),
        "ddtree_shadow": pool_topk("DDTREE", "shadow_linear"),
        "dflash": pool_topk("DFLASH", "tree"),
    }


def _resolved_server_args(**fields):
    """TEST DOUBLE of a resolved ServerArgs: the real class (its cached reservation property and,
    from 0.5.16, its guard against assignments after resolution: 0.5.17 raises on every one),
    built without __post_init__, holding only the fields the checks read."""
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs.__new__(ServerArgs)
    args.__dict__.update(
        {"speculative_adaptive": False, "speculative_draft_attention_backend": "flashinfer",
         "speculative_dflash_block_size": None, **fields, "_declarations_materialized": True}
    )  # fmt: skip
    return args


def draft_runner_server_args():
    """0.5.15 builds the draft runner from the target's own server args (0.5.14 deep-copied
    them). `ddtree_draft_server_args` hands the runner the same object, except in tree mode
    wider than the block: then a copy whose speculative_num_draft_tokens is the drafter's block
    and whose cached reservation (`max_speculative_num_draft_tokens`) is computed afresh, the
    target's left as it was. Real: ServerArgs' own cached property (`_resolved_server_args`)."""
    from sglang.srt.server_args import ServerArgs

    resolved = _resolved_server_args
    wide = resolved(
        speculative_num_draft_tokens=WIDTH, speculative_dflash_block_size=BLOCK,
        speculative_ddtree_mode="tree",
    )  # fmt: skip
    target_cached = wide.max_speculative_num_draft_tokens  # as the target's runner caches it
    draft = U.ddtree_draft_server_args(SpeculativeAlgorithm.DDTREE, wide)
    same_object = {
        name: U.ddtree_draft_server_args(algorithm, args) is args
        for name, algorithm, args in (
            ("dflash", SpeculativeAlgorithm.DFLASH, resolved(speculative_num_draft_tokens=BLOCK)),
            ("shadow", SpeculativeAlgorithm.DDTREE, resolved(
                speculative_num_draft_tokens=BLOCK, speculative_ddtree_mode="shadow_linear")),
            ("tree_at_block", SpeculativeAlgorithm.DDTREE, resolved(
                speculative_num_draft_tokens=BLOCK, speculative_dflash_block_size=BLOCK,
                speculative_ddtree_mode="tree")),
        )
    }  # fmt: skip
    return {
        "wide_draft": [draft.speculative_num_draft_tokens, draft.max_speculative_num_draft_tokens],
        "wide_target": [
            target_cached,
            wide.speculative_num_draft_tokens,
            wide.max_speculative_num_draft_tokens,
        ],
        "wide_is_copy": draft is not wide and type(draft) is ServerArgs,
        # 0.5.17 logs every override on the object: the copy's must not land on the target.
        "target_log_untouched": not any(
            wide.__dict__.get(log) for log in ("_resolved_overrides", "_runtime_mutations")
        ),
        "copy_keeps_backend": draft.speculative_draft_attention_backend == "flashinfer",
        "same_object": same_object,
    }


def draft_sampler_off_in_tree_mode():
    """0.5.15 folds DFLASH's greedy draft head into the draft CUDA graph (an argmax). Tree mode
    drafts top-k log-probs from the hidden states instead, so `_maybe_build_draft_sampler`
    builds none for it; shadow_linear and DFLASH keep it (shadow_linear is DFlash's own chain).
    TEST DOUBLE: the worker (the attributes the method reads) and the TP-group getter."""
    weight = torch.randn(32, 8)
    graph_config = SimpleNamespace(decode=SimpleNamespace(bs=[1, 4]))
    # 0.5.17 reads the graph config from its exec bag.
    exec_bag = (
        {"get_exec": lambda: SimpleNamespace(graph=SimpleNamespace(cuda_graph_config=graph_config))}
        if hasattr(W, "get_exec")
        else {}
    )

    def build(mode):
        worker = SimpleNamespace(
            **ddtree_attrs(mode), tp_rank=1, ps=SimpleNamespace(tp_rank=1), block_size=BLOCK,
            _target_worker=SimpleNamespace(
                model_runner=SimpleNamespace(model=SimpleNamespace(
                    lm_head=SimpleNamespace(weight=weight)))
            ),
            server_args=SimpleNamespace(cuda_graph_config=graph_config),
        )  # fmt: skip
        with patched(W, get_tp_group=lambda: SimpleNamespace(world_size=1), **exec_bag):
            sampler = W.DFlashWorkerV2._maybe_build_draft_sampler(worker)
        return type(sampler).__name__

    return {"tree": build("tree"), "shadow": build("shadow_linear"), "dflash": build(None)}


def draft_runner_built_at_the_block():
    """0.5.16 builds the draft runner through `build_draft_tp_worker` (which deep-copies the
    server args it is given and builds the TpModelWorker). The patched `__init__` hands it
    `ddtree_draft_server_args`' result: in tree mode wider than the block a copy at the drafter's
    block, else the target's own object. Real: `DFlashWorkerV2.__init__` up to that call. TEST
    DOUBLES: the worker itself (a namespace: the class is abstract), the target worker, the
    ParallelState (a dataclass, which `replace` needs) and `build_draft_tp_worker`, which records
    its arguments and stops the build (a real one loads the draft model)."""
    from dataclasses import dataclass

    @dataclass
    class State:  # TEST DOUBLE of ParallelState: the fields the worker reads
        tp_rank: int = 1
        pp_rank: int = 2

    class Built(Exception):
        pass

    def recorder(**kwargs):
        raise Built(kwargs)

    def bare_worker():
        """The worker before `__init__`: a namespace, or (0.5.17, whose `__init__` starts with
        `super().__init__()`) an instance of a subclass with the abstract methods stubbed."""
        if RELEASE in ("0.5.14", "0.5.15", "0.5.16"):
            return SimpleNamespace()
        abstract = W.DFlashWorkerV2.__abstractmethods__
        cls = type("BareWorker", (W.DFlashWorkerV2,), dict.fromkeys(abstract))
        return cls.__new__(cls)

    def built(algorithm, **fields):
        args = _resolved_server_args(page_size=1, speculative_draft_window_size=None, **fields)
        target = SimpleNamespace(
            model_runner=SimpleNamespace(
                spec_algorithm=algorithm, model_config=SimpleNamespace(context_len=256)
            ),
            device="cpu",
        )
        kwargs: dict = {}
        # 0.5.18's worker reads its page size from the schedule bag.
        schedule = (
            {"get_schedule": lambda: SimpleNamespace(page_size=1)}
            if hasattr(W, "get_schedule")
            else {}
        )
        with patched(W, build_draft_tp_worker=recorder, **schedule):
            try:
                W.DFlashWorkerV2.__init__(bare_worker(), args, 0, State(), 0, target)
            except Built as done:
                kwargs = done.args[0]
        draft = kwargs["server_args"]
        return {
            "draft_tokens": draft.speculative_num_draft_tokens,
            "target_tokens": args.speculative_num_draft_tokens,
            "same_object": draft is args,
            "pp_rank": kwargs["ps"].pp_rank,
            "algo_label": kwargs["algo_label"],
        }

    return {
        "wide_tree": built(
            SpeculativeAlgorithm.DDTREE, speculative_num_draft_tokens=WIDTH,
            speculative_dflash_block_size=BLOCK, speculative_ddtree_mode="tree",
        ),
        "shadow": built(
            SpeculativeAlgorithm.DDTREE, speculative_num_draft_tokens=BLOCK,
            speculative_ddtree_mode="shadow_linear",
        ),
        "dflash": built(SpeculativeAlgorithm.DFLASH, speculative_num_draft_tokens=BLOCK),
    }  # fmt: skip


def draft_runner_set_up_at_the_block():
    """0.5.17's runners size their attention metadata and CUDA graphs from the spec bag
    (get_spec()), and the draft runner sets them up after its build, outside the copy the build
    publishes: the patched `init_attention_backends` and `init_cuda_graphs` run the draft
    worker's inside a spec-bag override holding the drafter's block (tree mode wider than the
    block), and the target's bag is as it was afterwards. Real: both worker methods, 0.5.17's
    own config bag (`_ConfigBag` and its scoped override) and `ddtree_draft_spec_scope`. TEST
    DOUBLES: the worker (the attributes the methods read), the draft worker, which records the
    width the bag holds when each set-up runs, and the exec bag (graph capture off)."""
    from sglang.srt.model_executor.cuda_graph_config import Backend
    from sglang.srt.runtime_context import _ConfigBag

    def widths(algorithm, width, mode="tree"):
        spec = _ConfigBag("spec")
        for name, value in (
            ("speculative_algorithm", algorithm.name),
            ("speculative_num_draft_tokens", width),
            ("speculative_dflash_block_size", BLOCK),
            ("speculative_ddtree_mode", mode),
        ):
            spec._set(name, value)
        seen = []
        draft = SimpleNamespace(
            init_attention_backends=lambda: seen.append(spec.speculative_num_draft_tokens),
            init_cuda_graphs=lambda **_: seen.append(spec.speculative_num_draft_tokens),
        )
        runner = _target_runner(hybrid=False)
        runner.spec_algorithm, runner.attn_backend = algorithm, object()
        worker = SimpleNamespace(_draft_worker=draft, model_runner=runner)
        worker._draft_spec_scope = lambda: W.DFlashWorkerV2._draft_spec_scope(worker)
        graph = SimpleNamespace(
            cuda_graph_config=SimpleNamespace(decode=SimpleNamespace(backend=Backend.DISABLED))
        )
        with patched(W, get_spec=lambda: spec, get_exec=lambda: SimpleNamespace(graph=graph)):
            W.DFlashWorkerV2.init_attention_backends(worker)
            W.DFlashWorkerV2.init_cuda_graphs(worker)
        return {"draft": seen, "target_after": spec.speculative_num_draft_tokens}

    return {
        "wide_tree": widths(SpeculativeAlgorithm.DDTREE, WIDTH),
        "shadow": widths(SpeculativeAlgorithm.DDTREE, BLOCK, mode="shadow_linear"),
        "dflash": widths(SpeculativeAlgorithm.DFLASH, BLOCK),
    }


def requests_refused_for_ddtree():
    """0.5.17 serves grammar-constrained requests with DFLASH (it masks and advances the grammar
    over its verify chain); DDTREE's scheduler validation (`validate_dflash_request`, real)
    refuses them, as every DFlash request was refused up to 0.5.16 (0.5.18's DFLASH also serves
    log-prob requests, read from its chain's verify rows; DDTREE's validation refuses them, and
    its worker a tree on a target LM head without a dense weight). The DDTree worker refuses
    at start 0.5.17's SGLANG_SIMULATE_ACC_LEN, which forces DFLASH's chain acceptance, and
    `_handle_ddtree_args` an NPU device, where 0.5.17's DFLASH runs and the DDTree kernels do not.
    TEST DOUBLES: the request (the fields the validation reads), the spec bag, the worker and the
    server args."""
    import sglang.srt.runtime_context as ctx

    def refusal(algorithm, grammar, logprob=False, experts=False):
        params = SimpleNamespace(
            json_schema='{"type": "object"}' if grammar else None, regex=None, ebnf=None,
            structural_tag=None, max_new_tokens=16,
        )  # fmt: skip
        req = SimpleNamespace(
            return_logprob=logprob, return_hidden_states=False, sampling_params=params,
            return_routed_experts=experts, return_indexer_topk=False,
        )  # fmt: skip
        spec = SimpleNamespace(speculative_algorithm=algorithm)
        with patched(ctx, get_spec=lambda: spec):
            return U.validate_dflash_request(req, False)

    from sglang.srt.server_args import ServerArgs

    # The NPU refusal of `_handle_ddtree_args` (real), on an unresolved ServerArgs double.
    npu_args = ServerArgs.__new__(ServerArgs)
    npu_args.__dict__.update(
        device="npu", speculative_num_draft_tokens=BLOCK, speculative_ddtree_mode="tree",
        speculative_ddtree_budget=None, speculative_ddtree_topk=None,
        enable_linear_replayssm_spec=False,
    )  # fmt: skip
    try:
        ServerArgs._handle_ddtree_args(npu_args)
        npu = "accepted"
    except ValueError as e:
        npu = str(e)
    with patched(W, SIMULATE_ACC_LEN=2.0):
        simulated = _init(ddtree_spec())
    return {
        "npu": npu,
        "ddtree_grammar": refusal("DDTREE", True),
        "ddtree_plain": refusal("DDTREE", False),
        "dflash_grammar": refusal("DFLASH", True),
        "ddtree_logprob": refusal("DDTREE", False, logprob=True),
        "dflash_logprob": refusal("DFLASH", False, logprob=True),
        "ddtree_routed_experts": refusal("DDTREE", False, experts=True),
        "dflash_routed_experts": refusal("DFLASH", False, experts=True),
        # A GGUF head: no dense weight (0.5.18's DFLASH runs it through the layer's kernel).
        "tree_on_gguf_head": _init(ddtree_spec(), lm_head=SimpleNamespace()),
        "shadow_on_gguf_head": _init(
            ddtree_spec(speculative_ddtree_mode="shadow_linear"), lm_head=SimpleNamespace()
        ),
        "simulated_acceptance": simulated,
        "plain_init": _init(ddtree_spec()),
    }


@check
def decode_after_scoring_request():
    """Under overlap a scoring request, finished at its prefill, rides one decode step with the
    batch's return_logprob set; DFlash's verify (0.5.14 to 0.5.17) and DDTREE's (0.5.18)
    compute no log-probs for it, so the result processor (`_normalize_decode_outputs`, real)
    takes that step without them and still reads a step's own. TEST DOUBLES: the processor
    (its spec-v2 token resolution), the batch, the result and the logits output."""
    from sglang.srt.managers.scheduler_components.batch_result_processor import (
        SchedulerBatchResultProcessor,
    )

    def normalized(logprobs):
        processor = SimpleNamespace(_resolve_spec_v2_tokens=lambda result, batch: [[5, 6]])
        batch = SimpleNamespace(spec_algorithm=SpeculativeAlgorithm.DDTREE, return_logprob=True)
        out = SimpleNamespace(
            next_token_logprobs=logprobs, next_token_top_logprobs_val=None,
            next_token_token_ids_logprobs_val=None,
        )  # fmt: skip
        try:
            ids, got = SchedulerBatchResultProcessor._normalize_decode_outputs(
                processor, batch=batch, result=None, logits_output=out, next_token_ids=None
            )
        except AttributeError as e:
            return {"error": str(e)}
        return {"ids": ids, "logprobs": got}

    return {
        "without_logprobs": normalized(None),
        "with_logprobs": normalized(torch.tensor([-0.5, -1.5])),
    }


def ddtree_api_refusal():
    """A set on ddtree_kernels.sglang (0.5.14, 0.5.15): `api_refusal_results` with this
    release's worker double."""
    return api_refusal_results(_init)


if VERIFIER:  # the sets on ddtree_kernels.sglang's Verifier (test_thin_sets.py)
    check(ddtree_api_refusal)
if RELEASE != "0.5.14":  # what 0.5.15's to 0.5.17's workers have (test_verify_path_0515.py)
    check(draft_runner_server_args)
    check(draft_sampler_off_in_tree_mode)
if RELEASE not in ("0.5.14", "0.5.15"):  # 0.5.16's and 0.5.17's (test_verify_path_0516.py)
    check(draft_runner_built_at_the_block)
if RELEASE not in (
    "0.5.14",
    "0.5.15",
    "0.5.16",
):  # 0.5.17's and 0.5.18's (test_verify_path_0517.py,
    # test_verify_path_0518.py)
    check(draft_runner_set_up_at_the_block)
    check(requests_refused_for_ddtree)


if __name__ == "__main__":
    main(sys.argv[1:])
