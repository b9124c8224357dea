"""Checks of the 0.5.11 / 0.5.12 / 0.5.13 DDTREE verify path, run inside the SGLang staging venv.

Run as `python checks.py NAME... | all` with the patched `sglang/` first on PYTHONPATH, `kernels/`
(the ddtree_kernels reference ops) importable and TRITON_INTERPRET=1 (SGLang's Triton
req_to_token kernel then runs on CPU tensors), and this folder's parent (checklib.py: each check
runs in its own fork, the imports paid once, and prints one JSON line the pytest side asserts on).

The sets are on ddtree_kernels.sglang (docs/ddtree-module.md): their DDTREE logic is the module's,
which these checks reach through the set's own loader (`ddtree = spec_info.load_ddtree()`, as the
worker holds it); the worker's hunks are compiled from the patched worker and run with test
doubles.

What is real: every DDTREE function the patches add, DFlashVerifyInput (prepare_for_verify,
verify), SGLang's ForwardMode, vocab shard indices, Triton req_to_token writer and native KV
move, the hybrid backend's verify metadata and its Triton conv kernel (interpreted). TEST
DOUBLES (a ScheduleBatch needs a scheduler, a Req a tokenizer, a KV pool a GPU): `FakeBatch`,
`FakeReq`, `FakeAllocator`, `FakeMambaPool`, checklib's `Group` (simulated TP ranks in threads).
"""

from __future__ import annotations

import ast
import copy
import functools
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import sglang.srt.speculative.dflash_info as info
import sglang.srt.speculative.dflash_utils as utils
import sglang.srt.speculative.spec_info as SI
import torch
from checklib import Group, check, conv_over_tree_links, main
from ddtree_kernels import reference
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.layers.vocab_parallel_embedding import VocabParallelEmbedding
from sglang.srt.mem_cache.memory_pool import move_kv_cache_native
from sglang.srt.model_executor.forward_batch_info import ForwardMode

ddtree = SI.load_ddtree()  # ddtree_kernels.sglang, as the set's worker holds it

# ---------------------------------------------------------------- test doubles


class FakeReq:
    def __init__(self, max_new_tokens: int) -> None:
        self.output_ids: list[int] = []
        self.origin_input_ids = [7]
        self.max_new_tokens = max_new_tokens
        self.grammar = None
        self.spec_verify_ct = 0
        self.spec_accepted_drafts = 0  # 0.5.11's counter
        self.spec_num_correct_drafts = 0  # the same counter, renamed in 0.5.12
        self.kv_committed_len = 0
        self.kv_allocated_len = 0

    def check_finished(self) -> None:
        pass

    update_finish_state = check_finished  # the same call, renamed in 0.5.13

    def finished(self) -> bool:
        return len(self.output_ids) >= self.max_new_tokens


class FakeAllocator:
    """Hands out slots from a counter (page-aligned per request), records frees, owns a KV buffer."""

    def __init__(self, size: int = 512) -> None:
        self.next = 64
        self.freed: list[int] = []
        self.k = [torch.arange(size, dtype=torch.float32).unsqueeze(1).repeat(1, 2)]
        self.v = [self.k[0] * 10]

    def free(self, slots: torch.Tensor) -> None:
        self.freed.extend(int(x) for x in slots.tolist())

    def get_kvcache(self):
        return SimpleNamespace(
            move_kv_cache=lambda tgt, src: move_kv_cache_native(self.k, self.v, tgt, src)
        )


class FakeBatch:
    def __init__(self, prefixes: list[int], width: int, page_size: int, max_new: list[int]):
        bs = len(prefixes)
        self.reqs = [FakeReq(m) for m in max_new]
        self.forward_mode = ForwardMode.TARGET_VERIFY
        self.device = torch.device("cpu")
        self.sampling_info = None
        self.seq_lens = torch.tensor(prefixes, dtype=torch.int64)
        self.seq_lens_cpu = self.seq_lens.clone()
        self.seq_lens_sum = sum(prefixes)
        self.req_pool_indices = torch.arange(bs, dtype=torch.int64)
        self.req_to_token_pool = SimpleNamespace(
            req_to_token=torch.zeros(bs, 128, dtype=torch.int32)
        )
        self.token_to_kv_pool_allocator = FakeAllocator()
        self.tree_cache = None
        # The verify window's slots: contiguous after each prefix (as paged allocation does).
        alloc = self.token_to_kv_pool_allocator
        locs = []
        for p in prefixes:
            start = alloc.next + (-(alloc.next + p) % page_size if page_size > 1 else 0)
            locs.append(torch.arange(start, start + width))
            alloc.next = start + width + page_size
        self.window = torch.cat(locs)

    def batch_size(self) -> int:
        return len(self.reqs)


def allocate_window(batch: FakeBatch) -> None:
    """Make prepare_for_verify's slot allocation hand out `batch.window` (no tree cache here)."""
    info.alloc_token_slots = lambda cache, n: batch.window.clone()
    info.get_last_loc = lambda *a: None
    info.alloc_paged_token_slots_extend = lambda *a: batch.window.clone()


def from_draft(*, logp, ids, root_tokens, prefix_lens, budget, width, shadow=False):
    """The verify input the worker hunk (_prepare_ddtree_verify) builds, through
    ddtree_kernels.sglang's Verifier and Step: the tree of the draft's top-k `logp`/`ids`
    [bs, L, K] at the verify width; shadow_linear: DFlash's argmax chain (`ids` [bs, L, 1])."""
    prefix = torch.tensor(prefix_lens)
    mode = "shadow_linear" if shadow else "tree"
    settings = ddtree.Settings(mode=mode, budget=budget, topk=ids.shape[-1], width=width)
    chain = tree = None
    if shadow:
        chain = torch.cat([root_tokens.unsqueeze(1), ids[..., 0]], 1)
    else:
        tree = ddtree.build_verify_tree(
            logp=logp, ids=ids, root_tokens=root_tokens, prefix_lens=prefix, budget=budget,
            width=width, prefix_lens_sum=sum(prefix_lens),
        )  # fmt: skip
    step = ddtree.Verifier(settings, ids.shape[1] + 1).step(
        tree=tree, draft_tokens=chain, prefix_lens=prefix
    )
    return step.verify_input(
        info.DDTreeVerifyInput, draft_token=step.tree.tokens.view(-1), ddtree_step=step
    )


def prepare(verify_input, batch: FakeBatch, page_size: int, build_custom_mask: bool) -> None:
    """Run the real prepare_for_verify with the window's slots as the allocation."""
    allocate_window(batch)
    verify_input.prepare_for_verify(batch, page_size, build_custom_mask=build_custom_mask)


def run_verify(
    verify_input, batch: FakeBatch, logits: torch.Tensor, hidden: torch.Tensor, page_size: int
):
    out = LogitsProcessorOutput(next_token_logits=logits.clone(), hidden_states=hidden.clone())
    new_id, commit, next_hidden, accepted = verify_input.verify(
        batch=batch, logits_output=out, page_size=page_size
    )
    bs = batch.batch_size()
    return {
        "output_ids": [r.output_ids for r in batch.reqs],
        "new_verified_id": new_id.tolist(),
        "commit_lens": commit.tolist(),
        "accepted": accepted,
        "next_hidden": next_hidden[:, 0].tolist(),
        "req_to_token": [
            batch.req_to_token_pool.req_to_token[b, : int(batch.seq_lens[b])].tolist()
            for b in range(bs)
        ],
        "seq_lens": batch.seq_lens.tolist(),
        "seq_lens_sum": batch.seq_lens_sum,
        "freed": sorted(batch.token_to_kv_pool_allocator.freed),
        "kv": batch.token_to_kv_pool_allocator.k[0][:, 0].tolist(),
    }


# ---------------------------------------------------------------- draft log-probs


def _rank_topk(hs, heads, k, group, rank):
    """One TP rank's DDTree top-k over its shard of the head."""
    return ddtree.vocab_parallel_topk_logprobs(hs, heads[rank], k, group, chunk_size=3)


def shard_head(
    w_full: torch.Tensor, org: int, org_padded: int, vocab_padded: int, rank: int, tp: int
):
    """One rank's lm_head: SGLang's own shard indices, padding rows filled with a huge value."""
    idx = VocabParallelEmbedding._get_indices(
        vocab_padded, org_padded, w_full.shape[0], org, rank, tp
    )
    n_org_pad = idx.num_org_elements_padded
    n_add_pad = idx.padded_added_vocab_end_index - idx.padded_added_vocab_start_index
    weight = torch.full((n_org_pad + n_add_pad, w_full.shape[1]), 100.0)
    weight[: idx.num_org_elements] = w_full[idx.org_vocab_start_index : idx.org_vocab_end_index]
    weight[n_org_pad : n_org_pad + idx.num_added_elements] = w_full[
        idx.added_vocab_start_index : idx.added_vocab_end_index
    ]
    return SimpleNamespace(weight=weight, shard_indices=idx)


@check
def draft_logprobs():
    torch.manual_seed(0)
    hidden, k = 8, 4
    hs = torch.randn(7, hidden)
    hs[3] = 0  # an all-tie row: ids must come out smallest first
    results = {}
    for label, org, org_padded, vocab, vocab_padded in (
        ("base", 61, 64, 61, 64),
        ("added", 50, 64, 56, 72),
    ):
        w_full = torch.randn(vocab, hidden)
        logits = hs @ w_full.T
        want_logp, want_ids = torch.sort(logits, dim=-1, descending=True, stable=True)
        want_logp = (want_logp - torch.logsumexp(logits, dim=-1, keepdim=True))[:, :k]
        for tp in (1, 2, 4):
            group = Group(tp)
            heads = [shard_head(w_full, org, org_padded, vocab_padded, r, tp) for r in range(tp)]
            outs = group.run(functools.partial(_rank_topk, hs, heads, k, group))
            results[f"{label}-tp{tp}"] = {
                "max_logp_err": max(float((o[0] - want_logp).abs().max()) for o in outs),
                "ids_equal": all(torch.equal(o[1], want_ids[:, :k]) for o in outs),
                "tie_row_ids": outs[0][1][3].tolist(),
            }
    chain = ddtree.chain_tree(torch.tensor([[4, 5, 6, 7], [0, 1, 2, 3]]), torch.tensor([2, 9]))
    return {
        "cases": results,
        "chain_ids": chain.tokens[:, 1:].tolist(),
        "chain_parents": chain.parents.tolist(),
        "chain_positions": chain.positions.tolist(),
    }


# ---------------------------------------------------------------- tree and mask


def random_draft(bs: int, depth: int, k: int, vocab: int = 50, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    logp = torch.sort(-torch.rand(bs, depth, k, generator=g) * 3, dim=-1, descending=True).values
    ids = torch.stack([torch.randperm(vocab, generator=g)[:k] for _ in range(bs * depth)]).view(
        bs, depth, k
    )
    return logp, ids


def sglang_layout(ancestor: torch.Tensor, prefixes: list[int]) -> torch.Tensor:
    """The mask layout DFlash/EAGLE use, written out cell by cell."""
    cells = []
    width = ancestor.shape[1]
    for b, p in enumerate(prefixes):
        for q in range(width):
            for c in range(p + width):
                cells.append(True if c < p else bool(ancestor[b, q, c - p]))
    return torch.tensor(cells, dtype=torch.bool)


@check
def tree_arrays():
    width, prefixes = 6, [4, 0, 7]
    roots = torch.tensor([11, 12, 13])
    out = {}
    for budget in (5, 3):
        logp, ids = random_draft(3, width - 1, 3)
        vi = from_draft(
            logp=logp,
            ids=ids,
            root_tokens=roots,
            prefix_lens=prefixes,
            budget=budget,
            width=width,
        )
        ref = reference.build_tree(logp, ids, roots, torch.tensor(prefixes), budget)
        n = budget + 1
        tokens = vi.draft_token.view(3, width)
        pos = vi.positions.view(3, width)
        anc = torch.eye(width, dtype=torch.bool).repeat(3, 1, 1)
        anc[:, :n, :n] = ref.ancestor_mask
        rows = torch.arange(3).unsqueeze(1) * width + torch.arange(width)
        real = torch.arange(width) < ref.num_nodes.unsqueeze(1)
        out[f"budget{budget}"] = {
            "tokens": torch.equal(tokens[:, :n], ref.tokens) and bool((tokens[:, n:] == 0).all()),
            "positions": torch.equal(pos[:, :n], ref.positions)
            and torch.equal(pos[:, n:], torch.tensor(prefixes).unsqueeze(1).expand(3, width - n)),
            "parents": torch.equal(vi.tree_parents[:, :n], ref.parents)
            and bool((vi.tree_parents[:, n:] == -1).all()),
            "next_token": torch.equal(vi.retrieve_next_token[:, :n], ref.retrieve_next_token),
            "next_sibling": torch.equal(vi.retrieve_next_sibling[:, :n], ref.retrieve_next_sibling),
            "retrieve_index": torch.equal(vi.retrieve_index, torch.where(real, rows, -1)),
            "mask": torch.equal(vi.custom_mask, sglang_layout(anc, prefixes)),
            "mask_numel": vi.custom_mask.numel()
            == sum(p * width for p in prefixes) + 3 * width * width,
            "draft_token_num": vi.draft_token_num,
            "is_dflash_verify": isinstance(vi, info.DFlashVerifyInput)
            and vi.spec_input_type.name == "DFLASH_VERIFY",
        }
    # shadow_linear: the chain's tree mask is DFlash's own causal mask (its real builder).
    chain = torch.tensor([[21, 22, 23, 24, 25], [31, 32, 33, 34, 35], [41, 42, 43, 44, 45]])
    logp, ids = None, chain.unsqueeze(-1)  # DFlash's argmax chain
    shadow = from_draft(
        logp=logp,
        ids=ids,
        root_tokens=roots,
        prefix_lens=prefixes,
        budget=width - 1,
        width=width,
        shadow=True,
    )
    dflash = info.DFlashVerifyInput(
        draft_token=torch.cat([roots.unsqueeze(1), chain], 1).reshape(-1),
        positions=(torch.tensor(prefixes).unsqueeze(1) + torch.arange(width)).reshape(-1),
        draft_token_num=width,
    )
    prepare(dflash, FakeBatch(prefixes, width, 1, [99] * 3), 1, True)
    masks = {}
    for build in (True, False):
        vi = copy.deepcopy(shadow)
        prepare(vi, FakeBatch(prefixes, width, 1, [99] * 3), 1, build)
        masks[str(build)] = (
            None if vi.custom_mask is None else torch.equal(vi.custom_mask, dflash.custom_mask)
        )
    tree_vi = from_draft(
        logp=random_draft(3, width - 1, 3)[0],
        ids=random_draft(3, width - 1, 3)[1],
        root_tokens=roots,
        prefix_lens=prefixes,
        budget=5,
        width=width,
    )
    prepare(tree_vi, FakeBatch(prefixes, width, 1, [99] * 3), 1, False)
    out["shadow"] = {
        "tokens": torch.equal(shadow.draft_token, dflash.draft_token),
        "positions": torch.equal(shadow.positions, dflash.positions),
        "mask_with_dflash_policy": masks["True"],
        "mask_without_dflash_policy": masks["False"],
    }
    out["tree_mask_kept_when_policy_says_none"] = tree_vi.custom_mask is not None and torch.equal(
        tree_vi.custom_mask, tree_vi.ddtree_step.tree.custom_mask
    )
    return out


# ---------------------------------------------------------------- accept and commit


def walk_by_hand(tokens, parents, target, b):
    """Plain-Python tree walk: follow the child whose token is the target's, lowest index first."""
    path, cur = [0], 0
    while True:
        kids = [
            i
            for i in range(tokens.shape[1])
            if parents[b, i] == cur and tokens[b, i] == target[b, cur]
        ]
        if not kids:
            return path, int(target[b, cur])
        cur = kids[0]
        path.append(cur)


def accept_commit_case(width: int, depth: int, k: int, vocab: int, seed: int) -> dict:
    """Tree of width - 1 nodes over `depth` draft positions, verified and committed at page
    sizes 1 and 4 against a by-hand walk (the target follows each node's last child)."""
    prefixes = [4, 9]
    roots = torch.tensor([11, 12])
    logp, ids = random_draft(2, depth, k, vocab=vocab, seed=seed)
    out = {}
    for page_size in (1, 4):
        vi = from_draft(
            logp=logp,
            ids=ids,
            root_tokens=roots,
            prefix_lens=prefixes,
            budget=width - 1,
            width=width,
        )
        tokens, parents = vi.draft_token.view(2, width), vi.tree_parents
        # The target agrees with a deep branch: at each node it names the token of the node's
        # last child that has children of its own (else its last child; never the first of
        # several), ending with a token outside the tree (the bonus).
        target = torch.full((2, width), vocab - 1)
        for b in range(2):
            for i in range(width):
                kids = [j for j in range(width) if parents[b, j] == i]
                inner = [j for j in kids if (parents[b] == j).any()]
                if kids:
                    target[b, i] = tokens[b, (inner or kids)[-1]]
        logits = torch.full((2 * width, vocab), -5.0)
        logits[torch.arange(2 * width), target.reshape(-1)] = 5.0
        hidden = torch.arange(2 * width, dtype=torch.float32).unsqueeze(1).repeat(1, 3)
        batch = FakeBatch(prefixes, width, page_size, [99, 3])
        prepare(vi, batch, page_size, True)
        window = batch.window.view(2, width)
        got = run_verify(vi, batch, logits, hidden, page_size)
        want_tokens, want_commit, want_hidden, want_slots, want_kv = [], [], [], [], []
        for b in range(2):
            path, _ = walk_by_hand(tokens, parents, target, b)
            emitted = [int(target[b, i]) for i in path[:-1]] + [int(target[b, path[-1]])]
            emitted = emitted[: batch.reqs[b].max_new_tokens]
            commit = len(emitted)
            want_tokens.append(emitted)
            want_commit.append(commit)
            want_hidden += [float(b * width + i) for i in path[:commit]]
            if page_size == 1:
                want_slots.append([int(window[b, i]) for i in path[:commit]])
            else:
                want_slots.append(window[b, :commit].tolist())
                want_kv.append([float(window[b, i]) for i in path[:commit]])
            out.setdefault(f"path_depth_p{page_size}", []).append(len(path) - 1)
        accept_index = vi.ddtree_step.accept_index
        node_steps, _ = ddtree.mamba_steps(accept_index, torch.tensor(want_commit), None)
        out[f"page{page_size}"] = {
            "tokens": got["output_ids"] == want_tokens,
            "commit_lens": got["commit_lens"] == want_commit,
            "hidden_rows_in_path_order": got["next_hidden"] == want_hidden,
            "committed_slots": [got["req_to_token"][b][prefixes[b] :] for b in range(2)]
            == want_slots,
            "committed_kv": page_size == 1
            or [[got["kv"][s] for s in got["req_to_token"][b][prefixes[b] :]] for b in range(2)]
            == want_kv,
            "freed_is_rest_of_window": page_size > 1
            or got["freed"]
            == sorted(set(batch.window.tolist()) - {s for r in want_slots for s in r}),
            "bonus_is_last_emitted": got["new_verified_id"] == [t[-1] for t in want_tokens],
            "seq_lens": got["seq_lens"]
            == [p + c for p, c in zip(prefixes, want_commit, strict=True)],
            "accept_index_root_first": accept_index[:, 0].tolist() == [0, 0],
            "node_steps": node_steps.tolist()
            == [walk_by_hand(tokens, parents, target, b)[0][want_commit[b] - 1] for b in range(2)],
            "draft_token_num": vi.draft_token_num == width,
        }
    return out


@check
def accept_commit():
    out = accept_commit_case(width=6, depth=5, k=3, vocab=60, seed=3)
    # A 64-token verify (budget 63) over the drafter's 15 positions, top-8: the wide tree mode.
    out["wide"] = accept_commit_case(width=64, depth=15, k=8, vocab=300, seed=4)
    out["mamba_hunk"] = mamba_commit_hunk()
    out["path_rows"] = ddtree.path_rows(
        torch.tensor([[0, 3, 5, -1, -1, -1], [0, -1, -1, -1, -1, -1]]), 6
    ).tolist()
    return out


def mamba_commit_hunk() -> dict:
    """The worker's Mamba commit (real, compiled from the patched worker): under DDTREE the
    committed step and the tracked step (-1 kept) become tree nodes along the accepted path;
    a DFlash verify input keeps its steps. TEST DOUBLES: the worker, its backend (records the
    call), the batch. Request 0 commits 3 tokens and crosses a tracking point at step 2."""
    import sglang
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    ns = {
        "torch": torch,
        "Optional": __import__("typing").Optional,
        "ScheduleBatch": ScheduleBatch,
        "DFlashVerifyInput": info.DFlashVerifyInput,
        "DDTreeVerifyInput": info.DDTreeVerifyInput,
    }
    path = Path(sglang.__file__).parent / "srt/speculative/dflash_worker.py"
    commit_fn = function_from(path, "DFlashWorker._update_target_mamba_state_after_verify", ns)
    out = {}
    zeros = torch.zeros(8, dtype=torch.int64)
    for name, vi in (
        ("ddtree", info.DDTreeVerifyInput(
            draft_token=zeros, positions=zeros, draft_token_num=4,
            ddtree_step=ddtree.Step(
                tree=None, mode="tree", cache_loc=None, prefix_lens=None, block_size=4,
                accept_index=torch.tensor([[0, 2, 3, -1], [0, -1, -1, -1]]),
            ),
        )),
        ("dflash", info.DFlashVerifyInput(draft_token=zeros, positions=zeros, draft_token_num=4)),
    ):  # fmt: skip
        seen: dict = {}
        backend = SimpleNamespace(update_mamba_state_after_mtp_verify=seen.update)
        worker = SimpleNamespace(
            target_worker=SimpleNamespace(model_runner=SimpleNamespace(attn_backend=backend, model=None)),
            server_args=SimpleNamespace(mamba_track_interval=4),
        )  # fmt: skip
        batch = SimpleNamespace(
            mamba_track_indices=torch.tensor([0, 1]), seq_lens=torch.tensor([8, 10])
        )
        commit_fn(
            worker, batch=batch, seq_lens_pre_verify=torch.tensor([5, 9]),
            commit_lens=torch.tensor([3, 1], dtype=torch.int32), verify_input=vi,
        )  # fmt: skip
        steps = seen.get("accepted_steps", seen.get("last_correct_step_indices"))  # 0.5.12's name
        out[name] = [steps.tolist(), seen["mamba_steps_to_track"].tolist()]
    return out


# ---------------------------------------------------------------- shadow_linear == DFLASH


@check
def shadow_equals_dflash():
    width, prefixes, vocab = 6, [4, 9, 2], 40
    roots = torch.tensor([11, 12, 13])
    g = torch.Generator().manual_seed(5)
    draft_logits = torch.randn(3, width - 1, vocab, generator=g)
    chain = torch.argmax(draft_logits, dim=-1)  # what DFlash's argmax head gives
    # Target logits: agree with the chain for a per-request number of steps, then differ.
    target = torch.randint(0, vocab, (3, width), generator=g)
    for b, agree in enumerate((2, 5, 0)):
        target[b, :agree] = chain[b, :agree]
        if agree < width - 1:
            target[b, agree] = (chain[b, agree] + 1) % vocab
    logits = torch.randn(3 * width, vocab, generator=g)
    logits[torch.arange(3 * width), target.reshape(-1)] = 20.0
    hidden = torch.randn(3 * width, 4, generator=g)
    out = {}
    # A chain's path is its first nodes: shadow_linear reorders no rows (issue 22's host cost).
    reorders, kept_paths = [], []
    path_rows = ddtree.path_rows
    ddtree.path_rows = lambda *a, **kw: reorders.append(1) or path_rows(*a, **kw)
    for page_size in (1, 4):
        for sampled in (False, True):
            for max_new in ([99, 99, 99], [99, 2, 99]):
                results = []
                for algo in ("DFLASH", "DDTREE"):
                    batch = FakeBatch(prefixes, width, page_size, max_new)
                    if sampled:
                        batch.sampling_info = _Sampling(3)
                    if algo == "DFLASH":
                        vi = info.DFlashVerifyInput(
                            draft_token=torch.cat([roots.unsqueeze(1), chain], 1).reshape(-1),
                            positions=(
                                torch.tensor(prefixes).unsqueeze(1) + torch.arange(width)
                            ).reshape(-1),
                            draft_token_num=width,
                        )
                    else:
                        logp, ids = None, chain.unsqueeze(-1)  # DFlash's argmax chain
                        vi = from_draft(
                            logp=logp,
                            ids=ids,
                            root_tokens=roots,
                            prefix_lens=prefixes,
                            budget=width - 1,
                            width=width,
                            shadow=True,
                        )
                    prepare(vi, batch, page_size, True)
                    res = run_verify(vi, batch, logits, hidden, page_size)
                    if algo == "DDTREE" and vi.ddtree_step.accept_index is not None:
                        kept_paths.append(1)  # what the worker's Mamba commit would follow
                    res["mask"] = vi.custom_mask.tolist()
                    results.append(res)
                key = f"p{page_size}-{'sampled' if sampled else 'greedy'}-max{max_new[1]}"
                out[key] = {
                    "equal": results[0] == results[1],
                    "diff": sorted(k for k in results[0] if results[0][k] != results[1][k]),
                    "accepted": results[0]["accepted"],
                }
    ddtree.path_rows = path_rows
    out["reorders"] = len(reorders)
    out["kept_paths"] = len(kept_paths)
    return out


class _Sampling:
    """Sampling info of a non-greedy batch without penalties or custom processors (test double)."""

    is_all_greedy = False
    has_custom_logit_processor = False
    logit_bias = None
    penalizer_orchestrator = SimpleNamespace(is_required=False)

    def __init__(self, bs: int) -> None:
        self.bs = bs

    def __len__(self) -> int:
        return self.bs


# ---------------------------------------------------------------- small helpers


def init_ddtree(server_args, *, hybrid: bool = False) -> dict:
    """The worker's start-up hunk `_init_ddtree` (real, compiled from the patched worker):
    spec_info's load_ddtree, then the module's Verifier.start. TEST DOUBLE: the worker (block 16, on
    CPU; a hybrid target's backend has the Mamba commit)."""
    import sglang

    init = function_from(
        Path(sglang.__file__).parent / "srt/speculative/dflash_worker.py",
        "DFlashWorker._init_ddtree",
        {"torch": torch, "ServerArgs": object, "logger": None, "load_ddtree": SI.load_ddtree},
    )  # fmt: skip
    backend = SimpleNamespace(**({"update_mamba_state_after_mtp_verify": 1} if hybrid else {}))
    worker = SimpleNamespace(
        block_size=16, device="cpu", tp_rank=1, model_runner=SimpleNamespace(attn_backend=backend)
    )
    try:
        init(worker, server_args)
    except Exception as e:  # reported, asserted on by the test
        return {"error": f"{type(e).__name__}: {e}"}
    cfg = worker._ddtree.settings
    return {
        "shadow": cfg.mode == "shadow_linear",
        "budget": cfg.budget,
        "topk": cfg.topk,
        "width": cfg.width,
    }


@check
def helpers():
    out = {}
    args = lambda **kw: SimpleNamespace(  # noqa: E731
        **{
            "speculative_ddtree_mode": "tree",
            "speculative_ddtree_budget": 15,
            "speculative_ddtree_topk": 8,
            "speculative_ddtree_allow_hybrid_unsafe": False,
            "speculative_algorithm": "DDTREE",
            "speculative_num_draft_tokens": 16,  # the verify width (0.5.11 reads it)
            **kw,
        }
    )
    # The graph runner's capture mask (0005): DFlash's policy, or a DDTREE tree's.
    out["mask_policy"] = [
        policy or utils.is_ddtree_tree(a)
        for a, policy in (
            (args(), False),
            (args(speculative_ddtree_mode="shadow_linear"), False),
            (args(speculative_ddtree_mode="shadow_linear"), True),
            (args(speculative_algorithm="DFLASH"), False),
            (args(speculative_algorithm=SimpleNamespace(name="DDTREE")), False),
        )
    ]

    def config(**kw):
        hybrid = kw.pop("hybrid", False)
        got = init_ddtree(args(**kw), hybrid=hybrid)
        if "error" in got:
            return {"ok": False, "error": got["error"].split(": ", 1)[1]}
        return {"ok": True, **got}

    out["config"] = {
        "plain": config(),
        "hybrid_tree": config(hybrid=True),
        "hybrid_tree_allowed": config(hybrid=True, speculative_ddtree_allow_hybrid_unsafe=True),
        "hybrid_shadow": config(hybrid=True, speculative_ddtree_mode="shadow_linear"),
        "budget_too_big": config(speculative_ddtree_budget=16),
    }
    wide = {"speculative_num_draft_tokens": 64, "speculative_dflash_block_size": 16}
    out["wide"] = {
        "config": config(speculative_ddtree_budget=63, **wide),
        "topk_over_kernel": config(
            speculative_ddtree_budget=63, speculative_ddtree_topk=17, **wide
        ),
        "budget_over_width": config(speculative_ddtree_budget=63),
        "draft_block": [
            utils.dflash_draft_block_size(args(**wide)),
            utils.dflash_draft_block_size(
                args(speculative_algorithm="DFLASH", speculative_num_draft_tokens=8)
            ),
            utils.dflash_draft_block_size(args(speculative_ddtree_mode="shadow_linear")),
        ],
    }
    saved = sys.modules.get("ddtree_kernels")
    sys.modules["ddtree_kernels"] = None  # import fails as if the package were missing
    try:
        out["config"]["kernels_missing"] = config()
    finally:
        sys.modules["ddtree_kernels"] = saved

    # Target tokens (sampled): the inverse CDF of the filtered softmax, per node.
    g = torch.Generator().manual_seed(9)
    logits = torch.randn(6, 30, generator=g)
    sampling = SimpleNamespace(
        temperatures=torch.tensor([[0.7], [1.3]]),
        top_ks=torch.tensor([1, 5]),
        top_ps=torch.tensor([1.0, 0.6]),
    )
    uniforms = torch.rand(6, generator=g)
    got = ddtree.sample_target_tokens(
        logits, 3, temperatures=sampling.temperatures, top_ks=sampling.top_ks,
        top_ps=sampling.top_ps, uniforms=uniforms,
    )  # fmt: skip
    want = []
    for r in range(6):
        b = r // 3
        x = logits[r] / sampling.temperatures[b, 0]
        order = torch.argsort(x, descending=True)[: int(sampling.top_ks[b])]
        p = torch.softmax(x[order], dim=0)
        keep = (torch.cumsum(p, 0) - p) <= sampling.top_ps[b]
        p = torch.where(keep, p, 0.0)
        p = p / p.sum()
        want.append(
            int(
                order[
                    int(
                        torch.searchsorted(
                            torch.cumsum(p, 0), uniforms[r] * p.sum(), right=True
                        ).clamp(max=len(p) - 1)
                    )
                ]
            )
        )
    out["sampled_tokens"] = {"got": got.tolist(), "want": want}
    out["top_k1_is_argmax"] = got[:3].tolist() == torch.argmax(logits[:3], dim=-1).tolist()
    return out


# ---------------------------------------------------------------- hunks in modules that need a GPU


def function_from(path: Path, qualname: str, namespace: dict):
    """Compile one method of a patched module that cannot import on CPU, with given globals."""
    cls, name = qualname.split(".")
    tree = ast.parse(path.read_text())
    node = next(
        f
        for c in tree.body
        if isinstance(c, ast.ClassDef) and c.name == cls
        for f in c.body
        if isinstance(f, ast.FunctionDef) and f.name == name
    )
    exec(
        compile(textwrap.dedent(ast.get_source_segment(path.read_text(), node)), str(path), "exec"),
        namespace,
    )
    return namespace[name]


@check
def worker_and_server_hunks():
    import sglang
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.server_args import ServerArgs

    root = Path(sglang.__file__).parent / "srt"
    out = {}
    calls = []
    ns = {
        "torch": torch,
        "Optional": __import__("typing").Optional,
        "ScheduleBatch": ScheduleBatch,
        "ForwardMode": ForwardMode,
        "DDTreeVerifyInput": info.DDTreeVerifyInput,
        "DFlashVerifyInput": info.DFlashVerifyInput,
        "resolve_dflash_verify_mask_policy": utils.resolve_dflash_verify_mask_policy,
        "get_tp_group": lambda: Group(1),
    }
    prepare_fn = function_from(
        root / "speculative/dflash_worker.py", "DFlashWorker._prepare_ddtree_verify", ns
    )
    torch.manual_seed(2)
    bs, width, hidden_size, vocab = 2, 5, 8, 30
    w = torch.randn(vocab, hidden_size)
    head = SimpleNamespace(
        weight=w,
        shard_indices=VocabParallelEmbedding._get_indices(vocab, vocab, vocab, vocab, 0, 1),
    )
    draft_hidden = torch.randn(bs, width, hidden_size)

    class FlashInferAttnBackend:  # named like the real one: DFlash's policy builds no mask for it
        pass

    for mode in ("tree", "shadow_linear"):
        worker = SimpleNamespace(
            _ddtree=ddtree.Verifier(ddtree.Settings(mode, width - 1, 3, width), width),
            block_size=width,
            page_size=1,
            server_args=SimpleNamespace(
                speculative_algorithm="DDTREE", speculative_ddtree_mode=mode
            ),
            model_runner=SimpleNamespace(attn_backend=FlashInferAttnBackend()),
            _greedy_sample_from_vocab_parallel_head=lambda hidden_states, lm_head: (
                calls.append("argmax") or torch.argmax(hidden_states @ lm_head.weight.T, dim=-1)
            ),
        )
        batch = FakeBatch([3, 6], width, 1, [99, 99])
        batch.forward_mode = ForwardMode.DECODE
        allocate_window(batch)
        prepare_fn(worker, batch, draft_hidden, torch.tensor([1, 2]), head)
        vi = batch.spec_info
        logits = draft_hidden[:, 1:] @ w.T
        if mode == "tree":
            top = reference.topk_logprobs(logits, 3)
            ref = reference.build_tree(
                top.logp, top.ids, torch.tensor([1, 2]), torch.tensor([3, 6]), width - 1
            )
        else:
            ref_tokens = torch.cat([torch.tensor([[1], [2]]), torch.argmax(logits, dim=-1)], 1)
            ref = SimpleNamespace(
                tokens=ref_tokens, positions=torch.tensor([[3], [6]]) + torch.arange(width)
            )
        out[mode] = {
            "verify_type": type(vi).__name__,
            "target_verify": batch.forward_mode == ForwardMode.TARGET_VERIFY,
            "tokens": torch.equal(vi.draft_token.view(bs, width), ref.tokens),
            "positions": torch.equal(vi.positions.view(bs, width), ref.positions),
            "has_mask": vi.custom_mask is not None,
            "req_to_token": batch.req_to_token_pool.req_to_token[0, 3 : 3 + width].tolist()
            == batch.window[:width].tolist(),
        }
    out["argmax_calls"] = calls
    out["wide"] = wide_prepare(prepare_fn, FlashInferAttnBackend())

    def refusal(backends, mode="tree", device="cuda"):
        try:
            handle_ddtree_args(mode=mode, device=device, backends=backends)
            return None
        except ValueError as e:
            return str(e)

    out["refusals"] = {
        "fa3": refusal(("fa3", "fa3")),
        "trtllm_mha": refusal(("trtllm_mha", "trtllm_mha")),
        "flashinfer": refusal(("flashinfer", "flashinfer")),
        "triton": refusal(("triton", "triton")),
        "mixed": refusal(("flashinfer", "fa3")),
        "shadow_fa3": refusal(("fa3", "fa3"), mode="shadow_linear"),
        "cpu": refusal(("intel_amx", "intel_amx"), device="cpu"),
    }
    fake = SimpleNamespace(speculative_algorithm="DDTREE", speculative_ddtree_mode="tree")
    model_config = SimpleNamespace(hf_config=SimpleNamespace(architectures=["Qwen3ForCausalLM"]))
    out["default_backend_tree"] = ServerArgs._get_default_attn_backend(fake, False, model_config)
    return out


def handle_ddtree_args(
    *, mode="tree", device="cuda", backends=("flashinfer", "flashinfer")
) -> None:
    """0002's `_handle_ddtree_args` (real: one call into the module through spec_info's
    load_ddtree, the tree-mask backend check included) on the fields it reads and writes.
    TEST DOUBLE: the server arguments (block 16, no budget or topk given)."""
    from sglang.srt.server_args import ServerArgs

    args = SimpleNamespace(
        speculative_num_draft_tokens=16, speculative_ddtree_mode=mode,
        speculative_ddtree_budget=None, speculative_ddtree_topk=None, device=device,
        get_attention_backends=lambda: backends,
    )  # fmt: skip
    ServerArgs._handle_ddtree_args(args)


def wide_prepare(prepare_fn, attn_backend) -> dict:
    """The worker hunk in wide tree mode: a 16-token drafter block, a 64-token verify (budget
    63, top-8). The verify input must be 64 wide: tokens, positions, mask, 64 KV slots."""
    torch.manual_seed(4)
    bs, block, width, hidden_size, vocab, prefixes = 2, 16, 64, 8, 300, [3, 6]
    w = torch.randn(vocab, hidden_size)
    head = SimpleNamespace(
        weight=w,
        shard_indices=VocabParallelEmbedding._get_indices(vocab, vocab, vocab, vocab, 0, 1),
    )
    draft_hidden = torch.randn(bs, block, hidden_size)
    worker = SimpleNamespace(
        _ddtree=ddtree.Verifier(ddtree.Settings("tree", width - 1, 8, width), block),
        block_size=block,
        page_size=1,
        server_args=SimpleNamespace(speculative_algorithm="DDTREE", speculative_ddtree_mode="tree"),
        model_runner=SimpleNamespace(attn_backend=attn_backend),
    )
    batch = FakeBatch(prefixes, width, 1, [99, 99])
    batch.forward_mode = ForwardMode.DECODE
    allocate_window(batch)
    roots = torch.tensor([1, 2])
    prepare_fn(worker, batch, draft_hidden, roots, head)
    vi = batch.spec_info
    top = reference.topk_logprobs(draft_hidden[:, 1:] @ w.T, 8)
    ref = reference.build_tree(top.logp, top.ids, roots, torch.tensor(prefixes), width - 1)
    return {
        "draft_token_num": vi.draft_token_num,
        "tokens": torch.equal(vi.draft_token.view(bs, width), ref.tokens),
        "positions": torch.equal(vi.positions.view(bs, width), ref.positions),
        "mask_numel": vi.custom_mask.numel(),
        "mask": torch.equal(vi.custom_mask, sglang_layout(ref.ancestor_mask, prefixes)),
        "kv_slots": [
            batch.req_to_token_pool.req_to_token[b, p : p + width].tolist()
            == batch.window.view(bs, width)[b].tolist()
            for b, p in enumerate(prefixes)
        ],
        "max_depth": int(ref.depths.max()),
    }


@check
def hybrid_tree_links():
    """Patch 0007: the real linear-attention backend hands a DDTREE tree's links to the real
    Triton conv kernel (TRITON_INTERPRET=1), which then convolves each node over its ancestors."""
    out = hybrid_case(width=6, depth=5, k=3, budget=4)  # 5 nodes in a width of 6: one padding
    # The wide tree mode: 64 verify tokens (budget 63) over the drafter's 15 positions, top-8;
    # the graph buffers are sized from the verify width (max_num_tokens // max_bs).
    out["wide"] = hybrid_case(width=64, depth=15, k=8, budget=63)
    return out


def hybrid_backend(algorithm, mode="tree", eagle_topk=None):
    """SGLang's MambaAttnBackendBase over a TEST DOUBLE pool (HybridReqToTokenPool maps
    requests to Mamba slots; this one maps request i to slot i)."""
    from sglang.srt.layers.attention import hybrid_linear_attn_backend as hybrid

    class FakeMambaPool:
        def get_mamba_indices(self, req_pool_indices):
            return req_pool_indices.to(torch.int32)

    args = SimpleNamespace(
        speculative_algorithm=algorithm,
        speculative_ddtree_mode=mode,
        speculative_eagle_topk=eagle_topk,
    )
    runner = SimpleNamespace(
        device="cpu",
        server_args=args,
        spec_algorithm=SI.SpeculativeAlgorithm.from_string(algorithm),
        req_to_token_pool=FakeMambaPool(),
        is_draft_worker=False,  # read by 0.5.13's backend
        token_to_kv_pool=None,  # read by 0.5.13's backend; the verify metadata never uses it
    )
    return hybrid.MambaAttnBackendBase(runner)


def hybrid_case(width: int, depth: int, k: int, budget: int) -> dict:
    from sglang.srt.layers.attention.mamba.causal_conv1d_triton import causal_conv1d_update

    prefixes = [4, 0, 7]
    bs = len(prefixes)
    logp, ids = random_draft(bs, depth, k, vocab=max(50, 4 * k))
    vi = from_draft(
        logp=logp,
        ids=ids,
        root_tokens=torch.tensor([11, 12, 13]),
        prefix_lens=prefixes,
        budget=budget,
        width=width,
    )
    verify = SimpleNamespace(
        batch_size=bs,
        forward_mode=ForwardMode.TARGET_VERIFY,
        input_ids=torch.zeros(bs * width, dtype=torch.int64),
        spec_info=vi,
        req_pool_indices=torch.arange(bs),
        mamba_track_mask=None,
    )
    tree = hybrid_backend("DDTREE")
    eager = tree._forward_metadata(verify)
    tree.init_cuda_graph_state(max_bs=bs, max_num_tokens=bs * width)
    replay = tree._replay_metadata(
        bs, torch.arange(bs), ForwardMode.TARGET_VERIFY, vi, torch.tensor([9, 9, 9])
    )

    return {
        "topk": {
            "ddtree_tree": tree.topk,
            "ddtree_shadow": hybrid_backend("DDTREE", mode="shadow_linear").topk,
            "dflash": hybrid_backend("DFLASH", eagle_topk=1).topk,
            "eagle_topk4": hybrid_backend("EAGLE", eagle_topk=4).topk,
        },
        "eager_links": torch.equal(eager.retrieve_next_token, vi.retrieve_next_token)
        and torch.equal(eager.retrieve_next_sibling, vi.retrieve_next_sibling),
        "graph_links": torch.equal(replay.retrieve_next_token, vi.retrieve_next_token.int())
        and torch.equal(replay.retrieve_next_sibling, vi.retrieve_next_sibling.int()),
        "graph_buffer_width": list(replay.retrieve_next_token.shape),
        "verify_query_starts": replay.query_start_loc.tolist(),
        "shadow_links": hybrid_backend("DDTREE", mode="shadow_linear")
        ._forward_metadata(verify)
        .retrieve_next_token
        is None,
        **conv_over_tree_links(causal_conv1d_update, eager, vi.tree_parents, budget + 1),
    }


# ---------------------------------------------------------------- the thin set's API check


@check
def ddtree_api_refusal():
    """The set on ddtree_kernels.sglang (docs/ddtree-module.md): its DDTREE logic is the module's,
    at the API its spec_info.py names (DDTREE_SGLANG_API). `load_ddtree` (real, in spec_info.py),
    which the server arguments' `_handle_ddtree_args` and the worker's `_init_ddtree` (both real)
    call first, refuses at start, in one sentence, a module of another API version (the module's
    frozen `require`) or none; DFLASH's modules import, and its predicates answer, with no
    ddtree_kernels at all (the worker, which needs a GPU to import, is read: every name it
    imports from the set's modules is there without the kernels, and it imports no kernels).
    TEST DOUBLES: the worker and server arguments (as for helpers) and the installed module's
    version (patched)."""
    import importlib

    import ddtree_kernels
    import sglang

    def refusal(fn) -> str:
        try:
            fn()
        except RuntimeError as e:
            return str(e)
        return ""

    wanted = SI.DDTREE_SGLANG_API
    spec = SimpleNamespace(
        speculative_algorithm="DDTREE", speculative_ddtree_mode="tree",
        speculative_ddtree_budget=15, speculative_ddtree_topk=8,
        speculative_ddtree_allow_hybrid_unsafe=False, speculative_num_draft_tokens=16,
    )  # fmt: skip
    out = {"wanted": wanted, "module": ddtree.API_VERSION, "loads": SI.load_ddtree() is ddtree}
    ddtree.API_VERSION = wanted + 1
    try:
        out["newer"] = refusal(SI.load_ddtree)
        out["worker_newer"] = init_ddtree(spec)
        out["args_newer"] = refusal(handle_ddtree_args)
    finally:
        ddtree.API_VERSION = out["module"]
    # An older ddtree_kernels, without the module.
    sys.modules["ddtree_kernels.sglang"] = None
    del ddtree_kernels.sglang
    try:
        out["missing"] = refusal(SI.load_ddtree)
    finally:
        sys.modules["ddtree_kernels.sglang"] = ddtree_kernels.sglang = ddtree
    worker = ast.parse(
        (Path(sglang.__file__).parent / "srt/speculative/dflash_worker.py").read_text()
    )
    taken = [
        (node.module, a.name)
        for node in worker.body
        if isinstance(node, ast.ImportFrom)
        for a in node.names
    ]
    modules = [module or "" for module, _ in taken] + [
        a.name for node in worker.body if isinstance(node, ast.Import) for a in node.names
    ]
    # DFLASH without any ddtree_kernels: fresh imports of the patched modules.
    for name in [n for n in sys.modules if n.startswith("ddtree_kernels")]:
        sys.modules[name] = None
    own = ("spec_info", "dflash_utils", "dflash_info")
    for name in own:
        del sys.modules[f"sglang.srt.speculative.{name}"]
    fresh = {n: importlib.import_module(f"sglang.srt.speculative.{n}") for n in own}
    dflash = SimpleNamespace(speculative_algorithm="DFLASH", speculative_num_draft_tokens=16)
    out["dflash_without_kernels"] = {
        "imports": True,
        "tree_mask": fresh["dflash_utils"].is_ddtree_tree(dflash),
        "block": fresh["dflash_utils"].dflash_draft_block_size(dflash),
        "ddtree_loader": refusal(fresh["spec_info"].load_ddtree),
        "worker_missing_names": [
            name
            for module, name in taken
            if module in {f"sglang.srt.speculative.{n}" for n in own}
            and not hasattr(sys.modules[module], name)
        ],
        "worker_imports_kernels": [m for m in modules if m.startswith("ddtree_kernels")],
    }
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
