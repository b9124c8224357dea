"""DDTree's logic inside SGLang that no SGLang release's internals shape, in one place.

The patch sets under `patches/sglang/<release>/` add DDTree to each SGLang release. What they
add splits in two: hooks into that release's classes (its worker, verify input, server
arguments, KV pools), which differ from release to release, and the logic those hooks call,
which does not. This module is the second part. It ships with the kernels (`action=build-kernels`
installs both into the SGLang venv), so every release's set imports it instead of carrying its
own copy, and it is tested once, here, against the kernels' reference (`tests/test_sglang.py`).

What a patched SGLang may rely on is this module's public names at `API_VERSION`. A patched
SGLang asks for its version at start (`load_ddtree` in its `spec_info.py` calls `require`, whose
name and meaning never change) and refuses, in one sentence, a module of another version.
Change a public name's signature or meaning, and the number goes up, with the sets that call it.

Nothing here imports SGLang: the hooks hand in what their release calls things (a TP group with
`world_size` and `all_gather_into_tensor`, a KV pool's move function, server arguments with the
`speculative_ddtree_*` fields). Nothing here is reached on the DFLASH path: DFLASH must run on a
host whose kernels are missing, so predicates DFLASH code calls (the custom-mask predicate of the
graph runner, the drafter's block size) stay in the sets.

Layout of the verify (the terms used below): a request verifies W = the verify width tokens (the
DFlash block size B, or budget + 1 for a wider tree), node 0 the root (last step's bonus token);
an accepted path holds at most B nodes (the drafter's B - 1 positions plus the root).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, NamedTuple, Protocol

import torch
import torch.nn.functional as F

from ddtree_kernels import ops
from ddtree_kernels.reference import accept_outputs
from ddtree_kernels.types import Tree, Walk

API_VERSION = 2

# What a set may call (API 2): `require`, the rules its DFLASH-shared hooks ask (behind the
# release's own `is_ddtree()` check, so DFLASH never loads this module), the server-argument
# resolution, and one worker's `Verifier` with its `Step`s. Everything else is the module's own.
__all__ = [
    "API_VERSION",
    "HYBRID_REFUSAL",
    "MAX_TREE_BUDGET",
    "TREE_MASK_BACKENDS",
    "Settings",
    "Step",
    "TPGroup",
    "TreeArgs",
    "Verifier",
    "WindowAccept",
    "check_attention_backends",
    "default_attention_backend",
    "draft_block_size",
    "recurrent_topk",
    "require",
    "resolve_server_args",
    "resolve_settings",
    "resolve_tree_args",
    "tree_mode",
]


def require(api: int) -> ModuleType:
    """This module, if `api` (the API a release's set was written for) is `API_VERSION`; else a
    one-sentence startup refusal. A set's loader calls it first, so its name, signature and
    meaning never change, whatever API_VERSION becomes."""
    if api != API_VERSION:
        raise RuntimeError(
            "--speculative-algorithm DDTREE in this SGLang was written for "
            f"ddtree_kernels.sglang API {api}, but the installed ddtree_kernels provides "
            f"API {API_VERSION}; install the matching kernels (ddtree-deploy "
            "action=build-kernels), or use --speculative-algorithm DFLASH."
        )
    return sys.modules[__name__]


HYBRID_REFUSAL = (
    "DDTREE tree mode on a hybrid target (Mamba/GDN layers) can leak recurrent state between "
    "sibling tree nodes. Use --speculative-ddtree-mode shadow_linear on this model, or pass "
    "--speculative-ddtree-allow-hybrid-unsafe to run the tree anyway."
)


class TPGroup(Protocol):
    """What the draft top-k needs of SGLang's TP group (a `GroupCoordinator`)."""

    world_size: int

    def all_gather_into_tensor(self, output: torch.Tensor, input: torch.Tensor) -> None: ...


# ------------------------------------------------------------------ start-up


@dataclass(frozen=True)
class Settings:
    """The DDTREE settings a worker runs with, checked at start."""

    mode: str  # "tree" or "shadow_linear"
    budget: int  # non-root tree nodes
    topk: int  # children kept per node
    width: int  # the target's verify width W (budget + 1 <= W)


def check_hybrid_target(*, mode: str, is_hybrid: bool, allow_hybrid_unsafe: bool) -> None:
    """Refuse tree mode on a recurrent (Mamba/GDN) target unless explicitly allowed: sibling
    nodes share one recurrent state unless the recurrent kernels follow parents."""
    if mode == "tree" and is_hybrid and not allow_hybrid_unsafe:
        raise ValueError(HYBRID_REFUSAL)


def resolve_settings(
    server_args: Any,  # noqa: ANN401 (SGLang's ServerArgs or spec bag, read by field name)
    *,
    block_size: int,
    is_hybrid: bool,
    on_cuda: bool,
) -> Settings:
    """The worker's DDTREE settings from the resolved server arguments, refusing at start what
    would fail later: tree mode on a hybrid target (unless allowed), a budget past the verify
    width (`speculative_num_draft_tokens`), a tree the CUDA build refuses, and, in tree mode on
    CUDA, a missing CUDA extension (which would silently run the slow reference)."""
    mode = str(server_args.speculative_ddtree_mode)
    check_hybrid_target(
        mode=mode,
        is_hybrid=is_hybrid,
        allow_hybrid_unsafe=bool(server_args.speculative_ddtree_allow_hybrid_unsafe),
    )
    budget = int(server_args.speculative_ddtree_budget)
    topk = int(server_args.speculative_ddtree_topk)
    width = int(server_args.speculative_num_draft_tokens)
    if budget + 1 > width:
        raise ValueError(
            f"DDTREE budget {budget} does not fit the verify width {width} (budget + 1 <= width)."
        )
    ops.check_tree_limits(block_size - 1, topk, budget)
    if mode == "tree" and on_cuda:
        ops.require_cuda()
    return Settings(mode=mode, budget=budget, topk=topk, width=width)


# ------------------------------------------------------------------ server arguments

# The widest tree the sets verify: budget 63, a verify width of 64 (what the sets were checked at).
MAX_TREE_BUDGET = 63
# The attention backends that honour a custom tree mask in TARGET_VERIFY, eagerly and in CUDA
# graphs. FA3 reads one only when speculative_eagle_topk > 1 (DFLASH forces 1); TRT-LLM has none.
TREE_MASK_BACKENDS = ("flashinfer", "triton")


@dataclass(frozen=True)
class TreeArgs:
    """The resolved DDTREE server arguments a set writes back its release's way."""

    budget: int
    topk: int
    width: int | None  # tree mode: the verify width max(B, budget + 1); None keeps B
    warning: str | None  # shadow_linear's override of a budget/topk it was given


def resolve_tree_args(
    *, mode: str, budget: int | None, topk: int | None, block_size: int
) -> TreeArgs:
    """Validate and resolve the `--speculative-ddtree-*` knobs once the DFlash block size B is
    known, so every release refuses the same values in the same sentences.

    Tree mode verifies W = max(B, budget + 1) tokens per request, 1 <= budget <= 63 (B - 1 if
    larger); W becomes the target's verify width while B stays the drafter's, and W never drops
    below B, so the drafter's block always fits the request's KV reservation. shadow_linear
    verifies DFLASH's chain: width B, topk 1, budget B - 1 (other values overridden with a
    warning), so its tokens and acceptance equal DFLASH's. Defaults: budget B - 1, topk
    min(8, budget). allow_hybrid_unsafe is the worker's to enforce: it sees the layers.
    """
    if block_size < 2:
        raise ValueError(f"DDTREE needs a DFlash block size of at least 2, got {block_size}.")
    if mode not in ("tree", "shadow_linear"):
        raise ValueError(
            f"--speculative-ddtree-mode must be 'tree' or 'shadow_linear', got {mode!r}."
        )
    shadow = mode == "shadow_linear"
    if shadow:
        max_budget = block_size - 1
        limit = (
            f"it must be between 1 and block_size - 1 = {max_budget} "
            "(shadow_linear verifies the DFlash block of the draft model)"
        )
    else:
        max_budget = max(block_size - 1, MAX_TREE_BUDGET)
        limit = (
            f"it must be between 1 and {max_budget} (tree mode verifies at most "
            f"{max_budget + 1} tokens per request)"
        )
    if budget is not None:
        budget = int(budget)
        if budget > max_budget:
            raise ValueError(
                f"--speculative-ddtree-budget {budget} exceeds the verify width: {limit}."
            )
        if budget < 1:
            raise ValueError(f"--speculative-ddtree-budget {budget} is below the minimum: {limit}.")
    if topk is not None:
        topk = int(topk)
        topk_max = block_size - 1 if budget is None else budget
        if not 1 <= topk <= topk_max:
            raise ValueError(
                f"--speculative-ddtree-topk {topk} is out of range: it must be "
                f"between 1 and the tree budget {topk_max}."
            )
    warning = None
    if shadow:
        if budget not in (None, max_budget) or topk not in (None, 1):
            warning = (
                "DDTREE shadow_linear verifies the DFlash chain: overriding "
                f"budget={budget}, topk={topk} to budget={max_budget}, topk=1."
            )
        budget, topk = max_budget, 1
    if budget is None:
        budget = block_size - 1
    if topk is None:
        topk = min(8, budget)
    width = None if shadow else max(block_size, budget + 1)
    return TreeArgs(budget=budget, topk=topk, width=width, warning=warning)


def resolve_server_args(
    server_args: Any,  # noqa: ANN401 (SGLang's ServerArgs, read and written by field name)
    *,
    warn: Callable[[str], None],
    write: Callable[[Any, str, Any], None] = setattr,
    attention_backends: Callable[[], Any] | None = None,
) -> TreeArgs:
    """A set's `_handle_ddtree_args` (the DFlash block size B is
    `speculative_num_draft_tokens` there): `resolve_tree_args` on the `speculative_ddtree_*`
    knobs, written back by the release's `write(server_args, name, value)`: budget and topk,
    and in tree mode B to `speculative_dflash_block_size` (the drafter's) and the verify width to
    `speculative_num_draft_tokens`; shadow_linear's override warning goes to `warn`. Given the
    release's `attention_backends` getter, `check_attention_backends` follows."""
    block_size = int(server_args.speculative_num_draft_tokens)
    resolved = resolve_tree_args(
        mode=server_args.speculative_ddtree_mode,
        budget=server_args.speculative_ddtree_budget,
        topk=server_args.speculative_ddtree_topk,
        block_size=block_size,
    )
    if resolved.warning:
        warn(resolved.warning)
    write(server_args, "speculative_ddtree_budget", resolved.budget)
    write(server_args, "speculative_ddtree_topk", resolved.topk)
    if resolved.width is not None:
        write(server_args, "speculative_dflash_block_size", block_size)
        write(server_args, "speculative_num_draft_tokens", resolved.width)
    if attention_backends is not None:
        check_attention_backends(
            attention_backends, mode=server_args.speculative_ddtree_mode, device=server_args.device
        )
    return resolved


def check_attention_backends(
    attention_backends: Callable[[], Any], *, mode: str, device: str
) -> None:
    """Refuse DDTREE tree mode on CUDA (where the DDTree kernels run) with an attention backend
    that would ignore the tree mask: it would verify the tree as a chain and emit wrong tokens.
    `attention_backends()` (the release's getter) is asked only then."""
    if mode != "tree" or device != "cuda":
        return
    unsupported = sorted({b for b in attention_backends() if b not in TREE_MASK_BACKENDS})
    if unsupported:
        raise ValueError(
            "DDTREE tree mode cannot verify with attention backend "
            f"{', '.join(map(str, unsupported))}: a tree needs a backend that "
            "honours a custom tree mask, which only flashinfer and triton do "
            "(--attention-backend flashinfer or triton); or use "
            "--speculative-ddtree-mode shadow_linear."
        )


# ------------------------------------------------------------------ rules DFLASH's hooks ask
# A set's hooks in code DFLASH shares (its graph runner, its draft runner's setup, its recurrent
# pools, its default attention backend) first ask the release's `is_ddtree()` (or compare the
# algorithm's name), and only then one of these: DFLASH never loads the module.


def tree_mode(args: Any) -> bool:  # noqa: ANN401 (server arguments or spec bag, read by name)
    """Whether DDTREE verifies a draft tree under a tree mask ("tree"), rather than DFLASH's
    own chain through the DDTree path (shadow_linear: DFLASH's width, mask and kernels)."""
    return str(getattr(args, "speculative_ddtree_mode", "tree")) == "tree"


def draft_block_size(args: Any) -> int:  # noqa: ANN401 (as tree_mode)
    """The drafter's block size B. Tree mode widens the target's verify width
    (`speculative_num_draft_tokens`) to fit the tree and keeps B in
    `speculative_dflash_block_size` (`resolve_server_args` writes both); otherwise they are
    one number."""
    if tree_mode(args):
        return int(args.speculative_dflash_block_size)
    return int(args.speculative_num_draft_tokens)


def _tree_recurrent_topk(topk: int | None) -> int:
    """A release's recurrent (Mamba/GDN) kernels follow a tree's first-child/next-sibling links,
    and keep one conv window per node, only on their top-k > 1 path (an EAGLE tree's), while
    DFLASH keeps `speculative_eagle_topk` at 1: a tree runs them at top-k 2 or more."""
    return max(int(topk or 0), 2)


def recurrent_topk(args: Any, topk: int | None) -> int | None:  # noqa: ANN401 (as tree_mode)
    """The top-k a release's recurrent layers and pools are set up with: `topk` (the release's
    `speculative_eagle_topk`), raised for a tree (`_tree_recurrent_topk`); shadow_linear's chain
    keeps it."""
    return _tree_recurrent_topk(topk) if tree_mode(args) else topk


def default_attention_backend(args: Any, *, flashinfer_available: bool) -> str | None:  # noqa: ANN401
    """The attention backend a tree verifies with when none was named: one that honours a
    custom tree mask (`TREE_MASK_BACKENDS`; the FA3 and TRT-LLM defaults do not), flashinfer
    where it is installed. None (the release's own default) for shadow_linear."""
    if not tree_mode(args):
        return None
    return "flashinfer" if flashinfer_available else "triton"


# ------------------------------------------------------------------ draft log-probs


def merge_tp_topk(
    logp: torch.Tensor, ids: torch.Tensor, log_z: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Global top-k log-probs from the per-rank ones of a vocab-parallel head.

    `logp`/`ids` [tp, n, k]: each rank's top-k, log-probs over its own shard with global token
    ids; `log_z` [tp, n]: each shard's log-sum-exp. The full-vocabulary logZ is the logsumexp of
    the shards'; candidates go back to the logit scale and are ordered by value, ties to the
    smaller id (the kernels' rule).
    """
    tp, n, kk = logp.shape
    values = (logp + log_z.unsqueeze(-1)).permute(1, 0, 2).reshape(n, tp * kk)
    cand_ids = ids.permute(1, 0, 2).reshape(n, tp * kk)
    by_id = cand_ids.argsort(dim=1)
    values, cand_ids = values.gather(1, by_id), cand_ids.gather(1, by_id)
    order = values.argsort(dim=1, descending=True, stable=True)[:, :k]
    global_log_z = torch.logsumexp(log_z, dim=0).unsqueeze(1)
    return values.gather(1, order) - global_log_z, cand_ids.gather(1, order)


def _gather_tp_topk(
    tp_group: TPGroup, logp: torch.Tensor, ids: torch.Tensor, log_z: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's top-k `logp`/`ids` [rows, k] and shard `log_z` [rows], all-gathered from
    every rank of `tp_group` and merged (`merge_tp_topk`) into the global top-k."""
    tp, (rows, k), device = int(tp_group.world_size), logp.shape, logp.device
    g_logp = torch.empty((tp * rows, k), dtype=torch.float32, device=device)
    g_ids = torch.empty((tp * rows, k), dtype=torch.int64, device=device)
    g_log_z = torch.empty((tp * rows,), dtype=torch.float32, device=device)
    tp_group.all_gather_into_tensor(g_logp, logp.contiguous())
    tp_group.all_gather_into_tensor(g_ids, ids.contiguous())
    tp_group.all_gather_into_tensor(g_log_z, log_z.contiguous())
    return merge_tp_topk(
        g_logp.view(tp, rows, k), g_ids.view(tp, rows, k), g_log_z.view(tp, rows), k
    )


def draft_topk_logprobs(
    hidden_states: torch.Tensor,
    weight: torch.Tensor,
    k: int,
    *,
    num_org: int,
    org_vocab_start: int = 0,
    tp_group: TPGroup | None = None,
    chunk_size: int = 1024,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k draft log-probs [n, k] fp32 and token ids [n, k] int64 through an LM head shard
    `weight[:num_org]` (rows past it are padding), normalised over the full vocabulary.

    Chunked like DFlash's greedy head (no full logits tensor outlives a chunk). With a TP group
    (the merge hook) each rank's top-k and shard logZ are all-gathered and merged.
    """
    n = int(hidden_states.shape[0])
    device = hidden_states.device
    tp = 1 if tp_group is None else int(tp_group.world_size)
    if k > num_org:
        raise ValueError(f"DDTREE top-k {k} exceeds the lm_head shard ({num_org}).")
    if tp == 1 and 0 < n <= chunk_size:  # a decode step's draft: no output buffers to fill
        head = weight if num_org == weight.shape[0] else weight[:num_org]
        top = ops.topk_logprobs(torch.matmul(ops.as_dtype(hidden_states, weight.dtype), head.T), k)
        return top.logp, top.ids + org_vocab_start if org_vocab_start else top.ids
    logp_out = torch.empty((n, k), dtype=torch.float32, device=device)
    ids_out = torch.empty((n, k), dtype=torch.int64, device=device)
    for start in range(0, n, int(chunk_size)):
        end = min(n, start + int(chunk_size))
        hs = hidden_states[start:end].to(weight.dtype)
        logits = torch.matmul(hs, weight[:num_org].T)
        local = ops.topk_logprobs(logits, k)
        local_ids = local.ids + org_vocab_start
        if tp_group is None or tp == 1:
            logp_out[start:end], ids_out[start:end] = local.logp, local_ids
            continue
        # The fused op normalises over this shard only; its logZ is needed to merge.
        log_z = torch.logsumexp(logits.float(), dim=-1)
        logp_out[start:end], ids_out[start:end] = _gather_tp_topk(
            tp_group, local.logp, local_ids, log_z
        )
    return logp_out, ids_out


def lm_head_topk_logprobs(
    hidden_states: torch.Tensor,
    lm_head: Any,  # noqa: ANN401 (SGLang's ParallelLMHead, or any module with a dense weight)
    k: int,
    tp_group: TPGroup | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`draft_topk_logprobs` through SGLang's LM head: a `ParallelLMHead` (its `weight` and
    `shard_indices`: the vocabulary shard of this rank) or a plain module with a dense `weight`
    (the whole vocabulary). `tp_group` is used only for a sharded head over more than one rank.
    Added (LoRA) vocabulary is refused: its rows are not in the shard's weight."""
    weight = lm_head.weight
    shard = getattr(lm_head, "shard_indices", None)
    if shard is not None and int(shard.num_added_elements) != 0:
        raise RuntimeError("DDTREE tree mode does not support added vocabulary.")
    sharded = shard is not None and tp_group is not None and int(tp_group.world_size) > 1
    return draft_topk_logprobs(
        hidden_states,
        weight,
        k,
        num_org=int(shard.num_org_elements) if shard is not None else int(weight.shape[0]),
        org_vocab_start=int(shard.org_vocab_start_index) if shard is not None else 0,
        tp_group=tp_group if sharded else None,
    )


# ------------------------------------------------------------------ tree and verify input


def flat_tree_mask(
    ancestor_mask: torch.Tensor, prefix_lens: torch.Tensor, mask_numel: int
) -> torch.Tensor:
    """SGLang's flat verify mask: per request a bool [W, prefix + W] block (prefix columns
    True, tree columns = `ancestor_mask`), row-major, concatenated. `mask_numel` may exceed the
    exact size (an upper bound of the prefix sum); the tail stays True, as SGLang's
    `generate_attn_arg_prefill` pads it."""
    _, w, _ = ancestor_mask.shape
    prefix = prefix_lens.to(torch.int64).repeat_interleave(w)  # per row [bs * w]
    row_len = prefix + w
    row_start = torch.cumsum(row_len, dim=0) - row_len
    cols = (row_start + prefix).unsqueeze(1) + torch.arange(w, device=ancestor_mask.device)
    mask = torch.ones(mask_numel, dtype=torch.bool, device=ancestor_mask.device)
    mask[cols.reshape(-1)] = ancestor_mask.reshape(-1)
    return mask


def pad_tree(tree: Tree, width: int) -> Tree:
    """Pad a kernels `Tree` of N = budget + 1 nodes to the verify width W >= N with the kernels'
    padding nodes (token 0, no parent or links, position = prefix, an ancestor row of only
    itself); `retrieve_index` is re-based to b * W + i."""
    bs, n = tree.tokens.shape
    extra = width - n
    if extra < 0:
        raise ValueError(f"DDTREE tree of {n} nodes exceeds the verify width {width}.")
    if extra == 0:
        return tree
    device = tree.tokens.device

    def pad(t: torch.Tensor, value: int) -> torch.Tensor:
        return F.pad(t, (0, extra), value=value)

    prefix = tree.positions[:, :1] - tree.depths[:, :1]
    ancestor = torch.zeros((bs, width, width), dtype=torch.bool, device=device)
    ancestor[:, :n, :n] = tree.ancestor_mask
    tail = torch.arange(n, width, device=device)
    ancestor[:, tail, tail] = True
    node = torch.arange(width, device=device)
    rows = torch.arange(bs, device=device).unsqueeze(1)
    real = pad(tree.retrieve_index, -1) >= 0
    return tree._replace(
        tokens=pad(tree.tokens, 0),
        parents=pad(tree.parents, -1),
        depths=pad(tree.depths, 0),
        positions=torch.cat([tree.positions, prefix.expand(bs, extra)], dim=1),
        ancestor_mask=ancestor,
        retrieve_next_token=pad(tree.retrieve_next_token, -1),
        retrieve_next_sibling=pad(tree.retrieve_next_sibling, -1),
        retrieve_index=torch.where(real, rows * width + node, -1),
    )


def build_verify_tree(
    *,
    logp: torch.Tensor,
    ids: torch.Tensor,
    root_tokens: torch.Tensor,
    prefix_lens: torch.Tensor,
    budget: int,
    width: int,
    prefix_lens_sum: int,
    prefix_lens_sum_exact: bool = True,
) -> Tree:
    """The verify tree at width W with its flat custom mask, sized from `prefix_lens_sum`: the
    host's sum, or under overlap scheduling an upper bound of it, whose tail past the rows is
    True. The rows are laid out by the device's `prefix_lens` either way, so
    `prefix_lens_sum_exact` (which of the two it is) changes nothing; API 1 keeps it.

    The kernels build the mask themselves when the tree fills the width (one call, where the
    mask built here took about ten); a smaller tree is padded and its mask built at W.
    """
    if budget + 1 == width:
        return ops.build_tree(logp, ids, root_tokens, prefix_lens, budget, prefix_lens_sum)
    tree = pad_tree(ops.build_tree(logp, ids, root_tokens, prefix_lens, budget), width)
    bs = int(root_tokens.shape[0])
    numel = width * int(prefix_lens_sum) + bs * width * width
    return tree._replace(custom_mask=flat_tree_mask(tree.ancestor_mask, prefix_lens, numel))


def propose_tree(
    *,
    draft_hidden: torch.Tensor,
    lm_head: Any,  # noqa: ANN401 (as lm_head_topk_logprobs)
    topk: int,
    budget: int,
    width: int,
    root_tokens: torch.Tensor,
    prefix_lens: torch.Tensor,
    prefix_lens_sum: int,
    prefix_lens_sum_exact: bool,
    tp_group: TPGroup | None,
    added_vocab: bool = False,
) -> Tree:
    """Tree mode's draft: top-k log-probs of the drafter's hidden states [bs, B, H] (row 0 is
    the root's, not drafted) over the full vocabulary through the target's `lm_head`, then the
    best-first tree at the verify width with its mask (`build_verify_tree`). The release's hook
    picks `prefix_lens_sum` (a host number, no device sync) and the TP group; `added_vocab`
    (worker v1) reads the head through `vocab_parallel_topk_logprobs`, added rows included."""
    bs, block, hidden_size = draft_hidden.shape
    topk_logprobs = vocab_parallel_topk_logprobs if added_vocab else lm_head_topk_logprobs
    logp, ids = topk_logprobs(
        draft_hidden[:, 1:, :].reshape(-1, hidden_size), lm_head, topk, tp_group
    )
    return build_verify_tree(
        logp=logp.view(bs, block - 1, -1),
        ids=ids.view(bs, block - 1, -1),
        root_tokens=root_tokens,
        prefix_lens=prefix_lens,
        budget=budget,
        width=width,
        prefix_lens_sum=prefix_lens_sum,
        prefix_lens_sum_exact=prefix_lens_sum_exact,
    )


# Per-shape constants of the step, built for the largest batch seen and shared between steps:
# key -> (capacity, tensors), and (key, bs) -> the first bs rows of each, views made once, so a
# step at any batch size dispatches nothing for them (a slice is a dispatched call, and batch 1
# after a larger batch is the common case). A view keeps its storage alive after a rebuild, as a
# step still queued on the GPU may read it. Nothing may write into them.
_ROW_CONSTANTS: dict[tuple[Any, ...], tuple[int, tuple[torch.Tensor, ...]]] = {}
_ROW_VIEWS: dict[tuple[tuple[Any, ...], int], tuple[torch.Tensor, ...]] = {}


def _first_rows(
    key: tuple[Any, ...], bs: int, build: Callable[[int], tuple[torch.Tensor, ...]]
) -> tuple[torch.Tensor, ...]:
    """The first `bs` rows of `build(capacity)`'s tensors for `key`, rebuilt only when a larger
    batch comes (to twice the old capacity, so a growing batch rebuilds a few times at most)."""
    views = _ROW_VIEWS.get((key, bs))
    if views is not None:
        return views
    capacity, tensors = _ROW_CONSTANTS.get(key, (0, ()))
    if capacity < bs:
        capacity = max(bs, 2 * capacity)
        tensors = build(capacity)
        _ROW_CONSTANTS[key] = (capacity, tensors)
    views = tensors if capacity == bs else tuple(t[:bs] for t in tensors)
    _ROW_VIEWS[(key, bs)] = views
    return views


def _chain_links(bs: int, width: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """What of a chain tree of `width` nodes its tokens and prefix do not change: (parents,
    depths, ancestor mask, next token, next sibling, retrieve index, node count) per request,
    and the empty custom mask."""

    def build(capacity: int) -> tuple[torch.Tensor, ...]:
        node = torch.arange(width, device=device)
        rows = torch.arange(capacity, device=device).unsqueeze(1)

        def per_request(t: torch.Tensor) -> torch.Tensor:
            return t.expand(capacity, *t.shape).contiguous()

        causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
        return (
            per_request(node - 1),
            per_request(node),
            per_request(causal),
            per_request(torch.where(node + 1 < width, node + 1, -1)),
            torch.full((capacity, width), -1, dtype=torch.int64, device=device),
            rows * width + node,
            torch.full((capacity,), width, dtype=torch.int64, device=device),
            torch.empty(0, dtype=torch.bool, device=device),  # no custom mask (sliced, still empty)
        )

    return _first_rows(("chain", width, device), bs, build)


def chain_tree(draft_tokens: torch.Tensor, prefix_lens: torch.Tensor) -> Tree:
    """shadow_linear: DFlash's own draft chain [bs, B] (root first) as a DDTree, the tree the
    kernels build from it at top-k 1 and budget B - 1 (no custom mask), so the walk and commit
    run the tree code on DFlash's tokens. Only its tokens and positions are new each step; the
    rest is `_chain_links`' (two launches a step where the kernels' build took a dozen)."""
    bs, width = draft_tokens.shape
    device = draft_tokens.device
    parents, depths, ancestor, next_token, next_sibling, retrieve, num_nodes, no_mask = (
        _chain_links(int(bs), int(width), device)
    )
    return Tree(
        tokens=ops.as_dtype(draft_tokens, torch.int64),
        parents=parents,
        depths=depths,
        positions=ops.as_dtype(prefix_lens, torch.int64).unsqueeze(1) + depths,
        ancestor_mask=ancestor,
        retrieve_next_token=next_token,
        retrieve_next_sibling=next_sibling,
        retrieve_index=retrieve,
        num_nodes=num_nodes,
        custom_mask=no_mask,
    )


def verify_input_fields(tree: Tree, *, tree_mask: bool) -> dict[str, torch.Tensor | None]:
    """The tree's part of a `DDTreeVerifyInput` (a DFlashVerifyInput with retrieve arrays):
    positions prefix + depth, the flat ancestor mask as `custom_mask` when `tree_mask` (tree
    mode; shadow_linear keeps DFLASH's causal verify, mask None), and the links and parents."""
    return {
        "positions": tree.positions.reshape(-1),
        "custom_mask": tree.custom_mask if tree_mask else None,
        "retrieve_index": tree.retrieve_index,
        "retrieve_next_token": tree.retrieve_next_token,
        "retrieve_next_sibling": tree.retrieve_next_sibling,
        "tree_parents": tree.parents,
    }


def window_cache_loc(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    width: int,
) -> torch.Tensor:
    """KV slots [bs, width] int64 of each request's verify window, `req_to_token[req, prefix :
    prefix + width]`: a tree wider than the draft block verifies in the window's first `width`
    slots (the block took the first B)."""
    cols = prefix_lens.to(torch.int64).unsqueeze(1) + torch.arange(width, device=prefix_lens.device)
    return req_to_token[req_pool_indices.to(torch.int64).unsqueeze(1), cols].to(torch.int64)


# ------------------------------------------------------------------ accept


def walk_from_sampling(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    width: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Walk outputs (local accept_index [bs, A], accept_len with the root, accepted tokens,
    bonus) from the outputs of SGLang's tree rejection sampler
    (`tree_speculative_sampling_target_only`: predicts [bs * W], global accept_index -1 padded,
    accepted drafts per request)."""
    bs = accept_index.shape[0]
    global_index = accept_index.to(torch.int64)
    base = torch.arange(bs, device=global_index.device).unsqueeze(1) * width
    valid = global_index >= 0
    local = torch.where(valid, global_index - base, -1)
    tokens = torch.where(valid, predicts.to(torch.int64)[global_index.clamp(min=0)], -1)
    accept_len = accept_token_num.to(torch.int64) + 1
    bonus = tokens.gather(1, (accept_len - 1).unsqueeze(1)).squeeze(1)
    return local, accept_len, tokens, bonus


# What a release's tree rejection sampler hook returns: (accepted drafts [bs], global
# accept_index [bs, >= path] -1 padded, predicts [bs * W]).
SampledWalk = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def accept_tree(
    *,
    tree: Tree,
    next_token_logits: torch.Tensor,
    path_len: int,
    prefix_lens: torch.Tensor,
    sample: Callable[[], SampledWalk] | None = None,
) -> tuple[torch.Tensor, ...]:
    """Accept over the tree: DFLASH's (accepted drafts, commit_lens, bonus, out_tokens,
    new_seq_lens) plus the accepted node indices [bs, path_len] (local, root first, -1 padded).

    Greedy (`sample` None): the kernels' walk over the target's argmax at every node. Sampled:
    `sample()` runs the release's tree rejection sampler (its signature is the release's) and
    its outputs are laid out as the walk's. A path holds at most `path_len` = B nodes.
    """
    bs, width = tree.tokens.shape
    if sample is None:  # one kernel: the walk over the argmax and the outputs
        target = torch.argmax(next_token_logits, dim=-1).view(bs, width)  # int64
        return tuple(ops.walk_accept(tree.tokens, tree.parents, target, path_len - 1, prefix_lens))
    correct_len, accept_index, predicts = sample()
    nodes, accept_len, accept_tokens, bonus = walk_from_sampling(
        predicts, accept_index[:, :path_len], correct_len, width
    )
    return (*accept_outputs(accept_len, accept_tokens, bonus, prefix_lens), nodes)


# ------------------------------------------------------------------ commit


def block_rows(x: torch.Tensor, bs: int, width: int, block: int) -> torch.Tensor:
    """Verify rows [bs * W (+ padding), ...] in the drafter's block layout [bs * B, ...]: each
    window's first B rows, which hold the accepted path once `commit_path` put it there.
    At W == B the rows are already that layout and come back as they are."""
    if width == block:
        return x
    rest = x.shape[1:]
    return x[: bs * width].view(bs, width, *rest)[:, :block].reshape(bs * block, *rest)


def commit_path(
    *,
    accept_index: torch.Tensor,
    cache_loc: torch.Tensor,
    move_kv_cache: Callable[[torch.Tensor, torch.Tensor], None],
    hidden_states: torch.Tensor | None,
    width: int,
) -> torch.Tensor | None:
    """Move the accepted path to the front of each verify window, so a release's chain-layout
    code (committed KV, draft-KV append) sees it as DFLASH's committed prefix: its KV through the
    release's `move_kv_cache(target_slots, source_slots)` (a copy, not an index remap: after
    verify the scheduler may hand a finished request's req_to_token row on) and its hidden rows
    [bs * W (+ padding), ...] (returned; None stays None). `cache_loc` [bs, W]: the slot each
    node was verified in. One kernel gives both (`ops.commit_indices`)."""
    rows = 0 if hidden_states is None else int(hidden_states.shape[0])
    order = _move_path_kv(accept_index, cache_loc, move_kv_cache, rows, width)
    return None if hidden_states is None else hidden_states[order]


def _move_path_kv(
    accept_index: torch.Tensor,
    cache_loc: torch.Tensor,
    move_kv_cache: Callable[[torch.Tensor, torch.Tensor], None],
    rows: int,
    width: int,
) -> torch.Tensor:
    """`commit_path`'s KV move; returns the order of `rows` verify rows with the path first
    (`Step` keeps it, so the logit rows reuse it)."""
    if cache_loc.shape[1] != width:
        raise ValueError(f"cache_loc {tuple(cache_loc.shape)} must be [bs, width={width}]")
    commit = ops.commit_indices(accept_index, cache_loc, rows)
    move_kv_cache(commit.kv_target, commit.kv_source)
    return commit.row_order


def mamba_steps(
    accept_index: torch.Tensor,
    commit_lens: torch.Tensor,
    steps_to_track: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Tree-node step indices for the recurrent-state commit: the node at path position
    `commit_lens - 1`, and for tracking the node at path position `steps_to_track` (-1 kept).
    Not the path's last node: a release may commit fewer tokens than were accepted (0.5.11 to
    0.5.13 stop at a request's max_new_tokens)."""
    last = accept_index.gather(1, (commit_lens.to(torch.int64) - 1).unsqueeze(1)).squeeze(1)
    if steps_to_track is None:
        return last, None
    node = accept_index.gather(1, steps_to_track.clamp(min=0).unsqueeze(1)).squeeze(1)
    return last, node.masked_fill(steps_to_track < 0, -1)


# ------------------------------------------------------------------ the worker-v1 pieces
# The worker-v1 releases (0.5.11 to 0.5.13) accept through a verify input's hook (their
# DFlashVerifyInput.verify), draw the target's token at every node themselves and serve a head
# with added vocabulary: `Verifier.propose(added_vocab=True)` and `Step.accept_window` use these.


def vocab_parallel_topk_logprobs(
    hidden_states: torch.Tensor,
    lm_head: Any,  # noqa: ANN401 (SGLang's ParallelLMHead: `weight`, `shard_indices`)
    k: int,
    tp_group: TPGroup,
    *,
    chunk_size: int = 256,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k draft log-probs [n, k] fp32 and ids [n, k] int64 through SGLang's `ParallelLMHead`,
    its added (LoRA) vocabulary included: the shard's columns are its base rows, then its added
    rows (past the base padding), so ascending columns are ascending ids and ties still go to
    the smaller id. `lm_head_topk_logprobs` refuses such a head; the worker-v1 sets served it.

    With TP each rank's top-k and shard logZ are merged (`merge_tp_topk`); a shard smaller than
    k pads with candidates that never win. Chunks of `chunk_size` rows, the worker-v1 sets' own
    (the chunk's row count can change a GPU matmul's reduction order, so it is kept).
    """
    n = int(hidden_states.shape[0])
    device = hidden_states.device
    if n == 0:
        return (
            torch.empty((0, k), dtype=torch.float32, device=device),
            torch.empty((0, k), dtype=torch.int64, device=device),
        )
    tp = int(tp_group.world_size)
    shard = lm_head.shard_indices
    weight = lm_head.weight  # [local vocab, padded, hidden]
    num_org = int(shard.num_org_elements)
    num_org_padded = int(shard.num_org_elements_padded)
    num_added = int(shard.num_added_elements)
    org_start = int(shard.org_vocab_start_index)
    # A column's global id: its base row's plus the shard's start, or for added (LoRA) rows
    # their own ids, which only a table holds (built only for a head that has them).
    added_ids = None
    if num_added > 0:
        added_ids = torch.cat(
            [
                torch.arange(num_org, device=device) + org_start,
                torch.arange(num_added, device=device) + int(shard.added_vocab_start_index),
            ]
        )
    local_k = min(k, num_org + num_added)
    if tp == 1 and local_k < k:
        raise ValueError(f"DDTREE topk {k} exceeds the vocabulary ({local_k}).")

    def chunk_topk(hs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        hs = hs.to(weight.dtype)
        logits = torch.matmul(hs, weight[:num_org].T)
        if added_ids is not None:
            added = weight[num_org_padded : num_org_padded + num_added]
            logits = torch.cat([logits, torch.matmul(hs, added.T)], dim=1)
        top = ops.topk_logprobs(logits, local_k)
        if added_ids is not None:
            return logits, top.logp, added_ids[top.ids]
        return logits, top.logp, top.ids + org_start if org_start else top.ids

    if tp == 1 and n <= chunk_size:  # a decode step's draft: no output buffers to fill
        _, logp, ids = chunk_topk(hidden_states)
        return logp, ids
    logp_out = torch.empty((n, k), dtype=torch.float32, device=device)
    ids_out = torch.empty((n, k), dtype=torch.int64, device=device)
    for start in range(0, n, int(chunk_size)):
        end = min(n, start + int(chunk_size))
        logits, logp, top_ids = chunk_topk(hidden_states[start:end])
        if tp == 1:
            logp_out[start:end], ids_out[start:end] = logp, top_ids
            continue
        rows = end - start
        log_z = torch.logsumexp(logits.float(), dim=-1)
        if local_k < k:  # a shard smaller than k: entries that never win
            logp = torch.cat([logp, logp.new_full((rows, k - local_k), float("-inf"))], 1)
            never = top_ids.new_full((rows, k - local_k), torch.iinfo(torch.int64).max)
            top_ids = torch.cat([top_ids, never], 1)
        logp_out[start:end], ids_out[start:end] = _gather_tp_topk(tp_group, logp, top_ids, log_z)
    return logp_out, ids_out


def sample_target_tokens(
    next_token_logits: torch.Tensor,
    width: int,
    *,
    temperatures: torch.Tensor,
    top_ks: torch.Tensor,
    top_ps: torch.Tensor | None,
    uniforms: torch.Tensor | None = None,
) -> torch.Tensor:
    """One target draw per verify node [bs * W] from the target's own filtered distribution:
    per-request `temperatures`, then `top_ks`, then `top_ps` (None: no top-p), as SGLang's
    sampled verify builds it. Walking the tree with these draws (`walk_tree`) is lossless: each
    emitted token is a target sample given its prefix. `uniforms` [bs * W] (default: torch.rand)
    drive the kernels' inverse-CDF draw."""
    rows, vocab = next_token_logits.shape
    device = next_token_logits.device
    scaled = next_token_logits.float() / torch.repeat_interleave(
        temperatures.view(-1), width
    ).unsqueeze(1)
    ks = torch.repeat_interleave(top_ks.view(-1), width).to(torch.int64).clamp(min=1, max=vocab)
    k_max = int(ks.max().item())  # one host sync, as SGLang's sparse top-k path has
    values, index = torch.topk(scaled, k=k_max, dim=-1)  # sorted, best first
    ranks = torch.arange(k_max, device=device).unsqueeze(0)
    values = values.masked_fill(ranks >= ks.unsqueeze(1), float("-inf"))
    if top_ps is not None:
        ps = torch.repeat_interleave(top_ps.view(-1), width)
        probs = torch.softmax(values, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs
        values = values.masked_fill(mass_before > ps.unsqueeze(1), float("-inf"))
    if uniforms is None:
        uniforms = torch.rand((rows,), dtype=torch.float32, device=device)
    ones = torch.ones((rows,), dtype=torch.float32, device=device)
    pick = ops.sample_tokens(values, ones, uniforms)
    return index.gather(1, pick.unsqueeze(1)).squeeze(1)


def walk_tree(
    tokens: torch.Tensor, parents: torch.Tensor, target_tokens: torch.Tensor, path_len: int
) -> Walk:
    """The kernels' walk [bs, path_len] over the target's token at every node (`target_tokens`
    [bs, W]: its argmax, or `sample_target_tokens`), for a hook that picks those tokens itself;
    `accept_tree` is the same walk over the argmax in DFLASH's accept outputs."""
    return ops.verify_walk(tokens, parents, ops.as_dtype(target_tokens, torch.int64), path_len - 1)


def path_rows(accept_index: torch.Tensor, width: int) -> torch.Tensor:
    """A permutation [bs * W] of the verify rows: each request's accepted path (`accept_index`
    [bs, A], local, root first, -1 padded) first, then its other nodes in node order. Indexing a
    window's slots, tokens or hidden rows with it lays the path out as DFLASH's committed
    prefix, and keeps every other row (each is freed or dropped once, as DFLASH's would be)."""
    return ops.path_rows(accept_index, width)


# ------------------------------------------------------------------ the worker's verify step


def tree_retrieve(tree: Tree) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The tree's (retrieve_index, retrieve_next_token, retrieve_next_sibling) [bs, W]: what the
    sets' `tree_retrieve` argument of their release's sampled-verify function takes."""
    return tree.retrieve_index, tree.retrieve_next_token, tree.retrieve_next_sibling


def tree_sampler(
    sampler: Callable[..., tuple[torch.Tensor, ...]],
    tree: Tree,
    **kwargs: Any,  # noqa: ANN401 (the release's own sampler arguments)
) -> Callable[[], SampledWalk]:
    """`accept_tree`'s `sample` from a release's DFlash sampled-verify function as every set
    extends it: called with `candidates` = the tree's tokens, `tree_retrieve` = its links and
    `kwargs` (the release's own arguments), it returns (accepted drafts, bonus, global
    accept_index, predicts); the same exact rejection-sampling kernel then walks the tree."""

    def sample() -> SampledWalk:
        correct_len, _, accept_index, predicts = sampler(
            candidates=tree.tokens, tree_retrieve=tree_retrieve(tree), **kwargs
        )
        return correct_len, accept_index, predicts

    return sample


def host_prefix_sum(
    prefix_lens: torch.Tensor,
    *bounds: tuple[Any, Any],
    exact_lens: torch.Tensor | None = None,
) -> tuple[int, bool]:
    """(sum, exact): the host prefix-length sum a tree mask is sized by, without a device sync
    where the host has one. `bounds` are (host lengths, their sum) upper bounds in the release's
    order of preference (under overlap only a planning or reserved bound is on the host, the one
    the verify plans its attention with); the first whose lengths are set wins. Else
    `exact_lens` (the batch's host lengths), else `prefix_lens` summed on the device."""
    for lens, total in bounds:
        if lens is not None:
            return int(total), False
    if exact_lens is not None:
        return int(exact_lens.sum()), True
    return int(prefix_lens.sum().item()), True


class WindowAccept(NamedTuple):
    """`Step.accept_window`'s outputs: what DFLASH's verify continues with."""

    candidates: torch.Tensor  # [bs, W] the window's tokens, the path first
    accepted: torch.Tensor  # [bs] accepted drafts (the path's nodes after the root)
    bonus: torch.Tensor  # [bs] the target's token after the path
    out_cache_loc: torch.Tensor  # [bs * W] the slots, the path's first where they were reordered
    hidden_states: torch.Tensor | None  # the verify's hidden rows, the path's first


@dataclass
class Step:
    """One verify step of DDTREE: the tree verified (shadow_linear: DFLASH's chain as a tree),
    the KV slots [bs, W] its nodes are verified in (None for worker v1, whose verify input
    reserves them and hands them to `accept_window`), and, once accepted, the path's nodes in
    tree mode. A chain's path is its own first nodes, which is what the release's chain code (its
    commit, its recurrent-state commit) already assumes, so a chain keeps none: a set that asks
    `accept_index` for its Mamba commit runs DFLASH's own there, with no steps of ours."""

    tree: Tree
    mode: str
    cache_loc: torch.Tensor | None
    prefix_lens: torch.Tensor
    block_size: int
    accept_index: torch.Tensor | None = None
    # `commit`'s verify-row order, reused by `commit_rows` (one kernel less on log-prob steps)
    _row_order: torch.Tensor | None = field(default=None, init=False, repr=False)

    @property
    def width(self) -> int:
        return int(self.tree.tokens.shape[1])

    @property
    def links(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The tree's (first child, next sibling) [bs, W], as a release's grammar walks it."""
        return self.tree.retrieve_next_token, self.tree.retrieve_next_sibling

    def verify_input(self, cls: Callable[..., Any], **kwargs: Any) -> Any:  # noqa: ANN401
        """The release's `DDTreeVerifyInput` (`cls`) of the tree: `kwargs` (the release's own
        fields) plus the verify width and the tree's fields (`verify_input_fields`: positions
        prefix + depth, the ancestor mask in tree mode only, the links and parents)."""
        fields = verify_input_fields(self.tree, tree_mask=self.mode == "tree")
        return cls(draft_token_num=self.width, **kwargs, **fields)

    def accept(
        self, next_token_logits: torch.Tensor, sample: Callable[[], SampledWalk] | None = None
    ) -> tuple[torch.Tensor, ...]:
        """DFLASH's five accept outputs over the tree (`accept_tree`, paths of at most B nodes;
        `sample`: `tree_sampler`'s, None for greedy); a tree's path nodes are kept for `commit`."""
        *outputs, nodes = accept_tree(
            tree=self.tree,
            next_token_logits=next_token_logits,
            path_len=self.block_size,
            prefix_lens=self.prefix_lens,
            sample=sample,
        )
        self._keep_path(nodes)
        return tuple(outputs)

    def accept_target(self, target_tokens: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """`accept`'s greedy walk over the target's token at every node [bs, W] that the release
        picked itself (added for 0.5.19+, whose SpecTpSync broadcasts the argmax from TP rank 0
        first, so every rank walks rank 0's choice); `accept` on that argmax, outputs alike."""
        *outputs, nodes = ops.walk_accept(
            self.tree.tokens, self.tree.parents, ops.as_dtype(target_tokens, torch.int64),
            self.block_size - 1, self.prefix_lens,
        )  # fmt: skip
        self._keep_path(nodes)
        return tuple(outputs)

    def accept_with(
        self,
        next_token_logits: torch.Tensor,
        sampling_info: Any,  # noqa: ANN401 (the release's SamplingBatchInfo, or None)
        *,
        sampler: Callable[..., tuple[torch.Tensor, ...]] | None,
        target_predict: torch.Tensor | None = None,
        sync_sample: Callable[[torch.Tensor], None] | None = None,
        sync_greedy: Callable[[torch.Tensor], None] | None = None,
        **sampler_kwargs: Any,  # noqa: ANN401 (the release's own sampler arguments)
    ) -> tuple[torch.Tensor, ...]:
        """A worker-v2 release's accept, DFLASH's five outputs: sampled through the release's
        sampled-verify function `sampler` (None where the release cannot sample) when
        `sampling_info` samples and the verify gather took no argmax (`target_predict`, 0.5.23's
        deferred gather), with `sampling_info` and `sampler_kwargs`; otherwise greedy, by the
        kernels' walk over `target_predict` or the logits' argmax. `sync_sample`/`sync_greedy`
        (the release's TP sync, 0.5.19+) broadcast each decision from TP rank 0 before the walk:
        the sampler's accepted drafts, accept_index and predicts; the greedy argmax [bs, W]."""
        greedy = sampling_info is None or sampling_info.is_all_greedy
        if sampler is not None and target_predict is None and not greedy:

            def synced(**kwargs: Any) -> tuple[torch.Tensor, ...]:  # noqa: ANN401
                out = sampler(**kwargs)
                if sync_sample is not None:
                    for t in (out[0], out[2], out[3]):  # accepted, accept_index, predicts
                        sync_sample(t)
                return out

            sample = self.sampler(synced, sampling_info=sampling_info, **sampler_kwargs)
            return self.accept(next_token_logits, sample)
        if target_predict is None and sync_greedy is None:
            return self.accept(next_token_logits)  # one kernel: the argmax walk
        if target_predict is None:
            target_predict = torch.argmax(next_token_logits, dim=-1)
        target_predict = target_predict.view(-1, self.width)
        if sync_greedy is not None:
            sync_greedy(target_predict)
        return self.accept_target(target_predict)

    def accept_window(
        self,
        next_token_logits: torch.Tensor,
        sampling_info: Any,  # noqa: ANN401 (the release's SamplingBatchInfo, or None)
        *,
        page_size: int,
        out_cache_loc: torch.Tensor,
        move_kv_cache: Callable[[torch.Tensor, torch.Tensor], None],
        hidden_states: torch.Tensor | None,
    ) -> WindowAccept | None:
        """A worker-v1 release's accept (0.5.11 to 0.5.13, whose DFlashVerifyInput.verify accepts
        and commits the window itself): the walk over the target's token at every node (its
        argmax, or a draw from its filtered distribution, `sample_target_tokens`), then the path
        laid out as DFLASH's commit expects, so row j <= accepted drafts of each window (slot,
        KV, hidden row, candidate) is the path's j-th node. Page size 1 reorders the slots
        (`out_cache_loc` [bs * W]); pages keep them and copy the path's KV to the front
        (`move_kv_cache`). None: shadow_linear sampled, which is DFLASH's own sampled chain
        verify (same kernel, same draws: exact equality with DFLASH)."""
        sampled = sampling_info is not None and not sampling_info.is_all_greedy
        if self.mode != "tree" and sampled:
            return None
        bs, width = self.tree.tokens.shape
        if sampled:
            top_p = getattr(sampling_info, "need_top_p_sampling", False)
            target = sample_target_tokens(
                next_token_logits,
                width,
                temperatures=sampling_info.temperatures,
                top_ks=sampling_info.top_ks,
                top_ps=sampling_info.top_ps if top_p else None,
            )
        else:
            target = torch.argmax(next_token_logits, dim=-1)
        walk = walk_tree(self.tree.tokens, self.tree.parents, target.view(bs, width), width)
        self._keep_path(walk.accept_index)
        if self.accept_index is None:  # a chain: its path is its own first nodes
            return WindowAccept(
                self.tree.tokens, walk.accept_len - 1, walk.bonus, out_cache_loc, hidden_states
            )
        rows = path_rows(walk.accept_index, width)
        if page_size == 1:  # free-standing slots: reorder them, the KV stays where it is
            out_cache_loc = out_cache_loc[rows]
        else:  # pages need the window's slots in place: copy the path's KV to the front
            cache_loc = ops.as_dtype(out_cache_loc.view(bs, width), torch.int64)
            _move_path_kv(walk.accept_index, cache_loc, move_kv_cache, 0, width)
        if hidden_states is not None:
            hidden_states = hidden_states[rows]
        candidates = self.tree.tokens.reshape(-1)[rows].view(bs, width)
        return WindowAccept(
            candidates, walk.accept_len - 1, walk.bonus, out_cache_loc, hidden_states
        )

    def kv_plan(
        self,
        block_plan: Any,  # noqa: ANN401 (the release's plan of the block's slots)
        plan: Callable[..., Any],
        **kwargs: Any,  # noqa: ANN401 (the release's own plan arguments)
    ) -> Any:  # noqa: ANN401
        """The target verify's KV plan (0.5.22 on: `kv_loc_plan`): a tree wider than the block
        verifies in its own window (`window_cache_loc`), so the release's `plan` is asked for it
        (written at `cache_loc`, read `width` wide, plus `kwargs`); otherwise the block's
        `block_plan` stands."""
        if self.width <= self.block_size:
            return block_plan
        assert self.cache_loc is not None, "a worker-v2 step holds its slots"
        return plan(write_virtual=self.cache_loc.reshape(-1), read_extent=self.width, **kwargs)

    def mamba_steps(
        self,
        commit_lens: torch.Tensor,
        accepted_steps: torch.Tensor,
        steps_to_track: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The recurrent-state commit's (accepted step, step to track): a tree's are nodes
        along its accepted path (`mamba_steps`); a chain keeps the release's own."""
        if self.accept_index is None:
            return accepted_steps, steps_to_track
        return mamba_steps(self.accept_index, commit_lens, steps_to_track)

    def _keep_path(self, nodes: torch.Tensor) -> None:
        """The accepted path's nodes [bs, A] in tree mode; a chain keeps none (see the class)."""
        self.accept_index = nodes if self.mode == "tree" else None
        self._row_order = None

    def sampler(
        self,
        release_sampler: Callable[..., tuple[torch.Tensor, ...]],
        **kwargs: Any,  # noqa: ANN401 (the release's own sampler arguments)
    ) -> Callable[[], SampledWalk]:
        """`tree_sampler` of this step's tree: `accept`'s `sample` through the release's
        sampled-verify function as the sets extend it."""
        return tree_sampler(release_sampler, self.tree, **kwargs)

    def commit(
        self,
        move_kv_cache: Callable[[torch.Tensor, torch.Tensor], None],
        hidden_states: torch.Tensor | None,
    ) -> torch.Tensor | None:
        """Tree mode: the accepted path's KV moved to the window front (`commit_path`) and its
        hidden rows in the drafter's block layout [bs * B, ...] (`block_rows`), so the release's
        chain-layout code (committed KV, draft-KV append) sees DFLASH's committed prefix. A
        chain (shadow_linear) is already in window order: nothing moves."""
        if self.mode != "tree":
            return hidden_states
        assert self.accept_index is not None, "commit before accept"
        assert self.cache_loc is not None, "a worker-v2 step holds its slots"
        rows = 0 if hidden_states is None else int(hidden_states.shape[0])
        self._row_order = _move_path_kv(
            self.accept_index, self.cache_loc, move_kv_cache, rows, self.width
        )
        if hidden_states is None:
            return None
        return self._block_layout(hidden_states)

    def commit_rows(self, x: torch.Tensor) -> torch.Tensor:
        """Another node-indexed verify tensor [bs * W (+ padding), ...] in the layout `commit`
        gives the hidden rows (added for 0.5.19+, whose log-probs read the verify logits): the
        path first, the drafter's block layout. A chain's rows are already in that order."""
        if self.mode != "tree":
            return x
        return self._block_layout(x)

    def _block_layout(self, x: torch.Tensor) -> torch.Tensor:
        """Verify rows `x` with the path first, in the drafter's block layout: through the
        order `commit` computed when `x` has as many rows, else one computed for `x`."""
        assert self.accept_index is not None, "commit before accept"
        order = self._row_order
        if order is None or order.shape[0] != x.shape[0]:
            assert self.cache_loc is not None, "a worker-v2 step holds its slots"
            order = ops.commit_indices(self.accept_index, self.cache_loc, int(x.shape[0])).row_order
        bs = int(self.tree.tokens.shape[0])
        return block_rows(x[order], bs, self.width, self.block_size)


class Verifier:
    """One worker's DDTREE: its settings (checked at start) and block size B, and the pieces of
    its verify step, so a release's worker keeps only the calls at its own hook points."""

    # The module's per-step helper a worker reaches through its Verifier (it holds no module);
    # the recurrent-state steps are its Step's (`Step.mamba_steps`).
    host_prefix_sum = staticmethod(host_prefix_sum)

    def __init__(self, settings: Settings, block_size: int) -> None:
        self.settings = settings
        self.block_size = int(block_size)

    @property
    def tree(self) -> bool:
        """Tree mode (a draft tree under a tree mask); False for shadow_linear's chain."""
        return self.settings.mode == "tree"

    def set_up_linear_attention(self, linear_backend: Any) -> None:  # noqa: ANN401
        """Tree mode on a hybrid target (allowed by the flag), before any CUDA graph is captured:
        the release's linear-attention backend runs its recurrent kernels along the tree's links
        (`_tree_recurrent_topk`). Refused, in one sentence, where it has no top-k (no tree path)
        or keeps a fused-accept state (KDA's, chain layout only). A chain needs nothing."""
        if not self.tree:
            return
        if not hasattr(linear_backend, "topk"):
            raise ValueError(
                "DDTREE tree mode on this hybrid target has no linear-attention "
                "tree path; use --speculative-ddtree-mode shadow_linear."
            )
        if getattr(linear_backend, "accept_lens_pool", None) is not None:
            raise ValueError(
                "DDTREE tree mode cannot commit the KDA fused-accept state "
                "(chain layout only); use --speculative-ddtree-mode shadow_linear."
            )
        linear_backend.topk = _tree_recurrent_topk(linear_backend.topk)

    @classmethod
    def start(
        cls,
        server_args: Any,  # noqa: ANN401 (as resolve_settings)
        *,
        block_size: int,
        is_hybrid: bool,
        on_cuda: bool,
        log: Callable[..., None] | None = None,
    ) -> Verifier:
        """`resolve_settings`' refusals at start, then the settings line (`log`: the release's
        logger on the first TP rank; the GPU lab greps `verify_width=`)."""
        settings = resolve_settings(
            server_args, block_size=block_size, is_hybrid=is_hybrid, on_cuda=on_cuda
        )
        if log is not None:
            log(
                "DDTREE mode=%s budget=%d topk=%d block_size=%d verify_width=%d",
                settings.mode,
                settings.budget,
                settings.topk,
                int(block_size),
                settings.width,
            )
        return cls(settings, block_size)

    def propose(
        self,
        *,
        draft_hidden: torch.Tensor,
        lm_head: Any,  # noqa: ANN401 (as lm_head_topk_logprobs)
        root_tokens: torch.Tensor,
        prefix_lens: torch.Tensor,
        host_sum: tuple[int, bool],
        tp_group: TPGroup | None,
        added_vocab: bool = False,
    ) -> Tree:
        """Tree mode's draft at these settings (`propose_tree`); `host_sum` is
        `host_prefix_sum`'s (sum, exact); `added_vocab` for a worker-v1 head."""
        return propose_tree(
            draft_hidden=draft_hidden,
            lm_head=lm_head,
            topk=self.settings.topk,
            budget=self.settings.budget,
            width=self.settings.width,
            root_tokens=root_tokens,
            prefix_lens=prefix_lens,
            prefix_lens_sum=host_sum[0],
            prefix_lens_sum_exact=host_sum[1],
            tp_group=tp_group,
            added_vocab=added_vocab,
        )

    def step(
        self,
        *,
        tree: Tree | None,
        draft_tokens: torch.Tensor,
        prefix_lens: torch.Tensor,
        block_cache_loc: torch.Tensor | None = None,
        req_to_token: torch.Tensor | None = None,
        req_pool_indices: torch.Tensor | None = None,
    ) -> Step:
        """The step of a proposed `tree`, or (None, shadow_linear) of DFLASH's `draft_tokens`
        chain. A tree wider than B verifies in the first W slots of the window the release
        reserved for W (`window_cache_loc`); otherwise in the block's own `block_cache_loc`.
        Worker v1 passes no slots: its verify input reserves the window (`accept_window`)."""
        if tree is None:
            tree = chain_tree(draft_tokens, prefix_lens)
        cache_loc = block_cache_loc
        width = int(tree.tokens.shape[1])
        if cache_loc is not None and width > self.block_size:
            assert req_to_token is not None, "a window wider than the block needs req_to_token"
            assert req_pool_indices is not None, "and the batch's req_pool_indices"
            cache_loc = window_cache_loc(req_to_token, req_pool_indices, prefix_lens, width)
        return Step(
            tree=tree,
            mode=self.settings.mode,
            cache_loc=cache_loc,
            prefix_lens=prefix_lens,
            block_size=self.block_size,
        )
