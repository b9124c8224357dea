"""ddtree_kernels.sglang: DDTree's SGLang logic, on CPU, against the kernels' reference.

These are the checks `tests/patching/verify_path/` runs inside each release's patched SGLang for
the logic the sets share, once, without SGLang: every answer is compared with the reference ops
(`ddtree_kernels.reference`), with plain torch, or with a hand-checked tree. SGLang's own pieces
the module is handed (a TP group, a KV pool's move) are TEST DOUBLES here, named where used; the
verify-path checks call the same functions with SGLang's real ones.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from types import SimpleNamespace

import pytest
import torch
from inputs import random_topk
from torch.utils._python_dispatch import TorchDispatchMode

from ddtree_kernels import ExtensionUnavailableError, _extension, ops, reference
from ddtree_kernels import sglang as S
from ddtree_kernels.types import Tree


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(torch.equal(a, b))


def _plain_topk(hidden: torch.Tensor, weight: torch.Tensor, k: int) -> tuple[torch.Tensor, ...]:
    """The definition: full-vocabulary log-softmax of the head's logits, top k, ties to the
    smaller id (a stable descending sort)."""
    logits = torch.matmul(hidden.to(weight.dtype), weight.T).float()
    logp = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    values, ids = torch.sort(logp, dim=-1, descending=True, stable=True)
    return values[:, :k], ids[:, :k]


class ThreadGroup:
    """TEST DOUBLE for SGLang's TP group: `world_size` ranks, one thread each;
    all_gather_into_tensor concatenates along dim 0 (what the module asks of the group)."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._barrier = threading.Barrier(world_size)
        self._parts: list[torch.Tensor | None] = [None] * world_size
        self._rank = threading.local()

    def all_gather_into_tensor(self, output: torch.Tensor, input: torch.Tensor) -> None:
        self._parts[self._rank.value] = input.clone()
        self._barrier.wait()
        output.copy_(torch.cat([p for p in self._parts if p is not None]).view_as(output))
        self._barrier.wait()

    def run(self, fn: Callable[[int], object]) -> list[object]:
        results: list[object] = [None] * self.world_size
        errors: list[BaseException] = []

        def body(rank: int) -> None:
            self._rank.value = rank
            try:
                results[rank] = fn(rank)
            except BaseException as e:  # re-raised below
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


def _sglang_mask(ancestor: torch.Tensor, prefix_lens: list[int]) -> torch.Tensor:
    """SGLang's verify mask written out request by request: [N, prefix + N], prefix True."""
    n = ancestor.shape[1]
    return torch.cat(
        [
            torch.cat([torch.ones(n, p, dtype=torch.bool), ancestor[b]], 1).reshape(-1)
            for b, p in enumerate(prefix_lens)
        ]
    )


def _tree_inputs(bs: int, depth: int, k: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    top = reference.topk_logprobs(torch.randn(bs, depth, 50, generator=g) * 3, k)
    return top.logp, top.ids, torch.randint(0, 50, (bs,), generator=g)


def _branching_case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A hand-made tree (width 6) whose accepted path takes a second child:
    0 -> {1: tok 10, 2: tok 11}; 2 -> {3: tok 20}; 3 -> {4: tok 30, 5: tok 31}. The target says
    11 at the root (-> node 2), 20 at node 2 (-> 3), 31 at node 3 (-> 5), bonus 77 at node 5."""
    parents = torch.tensor([[-1, 0, 0, 2, 3, 3]])
    tokens = torch.tensor([[99, 10, 11, 20, 30, 31]])
    target = torch.tensor([[11, 0, 20, 31, 0, 77]])
    return tokens, parents, target


def _argmax_logits(target: torch.Tensor, vocab: int) -> torch.Tensor:
    logits = torch.full((target.numel(), vocab), -5.0)
    logits[torch.arange(target.numel()), target.reshape(-1)] = 5.0
    return logits


def _args(**kw: object) -> SimpleNamespace:
    base: dict[str, object] = {
        "speculative_num_draft_tokens": 8,
        "speculative_ddtree_mode": "tree",
        "speculative_ddtree_budget": 7,
        "speculative_ddtree_topk": 3,
        "speculative_ddtree_allow_hybrid_unsafe": False,
    }
    return SimpleNamespace(**{**base, **kw})


# ------------------------------------------------------------------ the API


def test_api_version_is_an_int_and_every_public_name_exists() -> None:
    assert isinstance(S.API_VERSION, int)
    assert S.API_VERSION >= 1
    assert all(hasattr(S, name) for name in S.__all__)


# ------------------------------------------------------------------ start-up


def test_settings_take_the_verify_width_and_mode() -> None:
    tree = S.resolve_settings(_args(), block_size=8, is_hybrid=False, on_cuda=False)
    assert tree == S.Settings(mode="tree", budget=7, topk=3, width=8)
    wide = _args(speculative_num_draft_tokens=64, speculative_ddtree_budget=63)
    assert S.resolve_settings(wide, block_size=16, is_hybrid=False, on_cuda=False).width == 64
    shadow = _args(speculative_ddtree_mode="shadow_linear")
    assert S.resolve_settings(shadow, block_size=8, is_hybrid=True, on_cuda=False).mode == (
        "shadow_linear"
    )


def test_hybrid_tree_is_refused_in_one_sentence_unless_allowed() -> None:
    with pytest.raises(ValueError, match="allow-hybrid-unsafe") as err:
        S.resolve_settings(_args(), block_size=8, is_hybrid=True, on_cuda=False)
    assert str(err.value) == S.HYBRID_REFUSAL
    assert "shadow_linear" in S.HYBRID_REFUSAL
    allowed = _args(speculative_ddtree_allow_hybrid_unsafe=True)
    assert S.resolve_settings(allowed, block_size=8, is_hybrid=True, on_cuda=False).mode == "tree"
    S.check_hybrid_target(mode="tree", is_hybrid=False, allow_hybrid_unsafe=False)


def test_settings_refuse_a_budget_past_the_width_and_a_tree_the_kernel_refuses() -> None:
    with pytest.raises(ValueError, match="does not fit") as err:
        S.resolve_settings(
            _args(speculative_num_draft_tokens=16, speculative_ddtree_budget=63),
            block_size=16, is_hybrid=False, on_cuda=False,
        )  # fmt: skip
    want = "DDTREE budget 63 does not fit the verify width 16 (budget + 1 <= width)."
    assert str(err.value) == want
    with pytest.raises(ValueError, match=r"1 <= K <= 16; got 17"):
        S.resolve_settings(
            _args(speculative_num_draft_tokens=64, speculative_ddtree_budget=63,
                  speculative_ddtree_topk=17),
            block_size=16, is_hybrid=False, on_cuda=False,
        )  # fmt: skip


@pytest.mark.skipif(_extension.is_loaded(), reason="the CUDA extension is loaded here")
def test_tree_mode_on_cuda_refuses_a_missing_extension(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(ops._state, "required", False)  # require_cuda() sets it
    with pytest.raises(ExtensionUnavailableError):
        S.resolve_settings(_args(), block_size=8, is_hybrid=False, on_cuda=True)
    shadow = _args(speculative_ddtree_mode="shadow_linear")  # DFlash's chain needs no kernel
    assert S.resolve_settings(shadow, block_size=8, is_hybrid=False, on_cuda=True).width == 8


# ------------------------------------------------------------------ draft log-probs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk_size", [16, 64])  # chunks, and one chunk (no output buffers)
def test_draft_topk_single_rank_equals_plain_torch(dtype: torch.dtype, chunk_size: int) -> None:
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(37, 32, generator=g)
    weight = torch.randn(500, 32, generator=g).to(dtype)
    logp, ids = S.draft_topk_logprobs(hidden, weight, 6, num_org=500, chunk_size=chunk_size)
    want_logp, want_ids = _plain_topk(hidden, weight, 6)
    assert _same(ids, want_ids)
    assert logp.dtype == torch.float32
    assert float((logp - want_logp).abs().max()) < 1e-5


def test_draft_topk_ignores_the_shard_padding() -> None:
    g = torch.Generator().manual_seed(1)
    weight = torch.randn(64, 32, generator=g)
    weight[50:] = 100.0  # padding rows past num_org would win every row
    _, ids = S.draft_topk_logprobs(torch.randn(9, 32, generator=g), weight, 4, num_org=50)
    assert bool((ids < 50).all())


def test_draft_topk_tensor_parallel_merge_equals_the_full_vocabulary() -> None:
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(21, 24, generator=g)
    vocab, tp, k = 600, 4, 8
    weight = torch.randn(vocab, 24, generator=g)
    shard = vocab // tp
    group = ThreadGroup(tp)

    def rank(r: int) -> object:
        head = SimpleNamespace(
            weight=weight[r * shard : (r + 1) * shard],
            shard_indices=SimpleNamespace(
                num_org_elements=shard, org_vocab_start_index=r * shard, num_added_elements=0
            ),
        )  # TEST DOUBLE: ParallelLMHead's weight and shard indices
        return S.lm_head_topk_logprobs(hidden, head, k, group)

    results = group.run(rank)
    want_logp, want_ids = _plain_topk(hidden, weight, k)
    assert all(_same(r[1], results[0][1]) for r in results)  # type: ignore[index]
    assert _same(results[0][1], want_ids)  # type: ignore[index]
    assert float((results[0][0] - want_logp).abs().max()) < 1e-5  # type: ignore[index]


def test_tp_merge_ties_go_to_the_smaller_id() -> None:
    logp = torch.tensor([[[-1.0, -2.0]], [[-1.0, -3.0]]])  # ids 3 (rank 0) and 7 (rank 1) tie
    ids = torch.tensor([[[3, 4]], [[7, 9]]])
    m_logp, m_ids = S.merge_tp_topk(logp, ids, torch.zeros(2, 1), 3)
    assert m_ids.tolist() == [[3, 7, 4]]
    want = torch.tensor([[-1.0, -1.0, -2.0]]) - torch.logsumexp(torch.zeros(2), 0)
    assert torch.allclose(m_logp, want)


def test_added_vocabulary_is_refused() -> None:
    head = SimpleNamespace(
        weight=torch.zeros(8, 4),
        shard_indices=SimpleNamespace(
            num_org_elements=8, org_vocab_start_index=0, num_added_elements=2
        ),
    )
    with pytest.raises(RuntimeError, match="added vocabulary"):
        S.lm_head_topk_logprobs(torch.zeros(1, 4), head, 2, None)


# ------------------------------------------------------------------ tree and verify input


def test_tree_at_full_width_is_the_reference_tree_with_sglang_mask() -> None:
    width, bs = 8, 3
    logp, ids, roots = _tree_inputs(bs, width - 1, 3, 3)
    prefix = [5, 0, 11]
    prefix_t = torch.tensor(prefix)
    tree = S.build_verify_tree(
        logp=logp, ids=ids, root_tokens=roots, prefix_lens=prefix_t, budget=width - 1,
        width=width, prefix_lens_sum=sum(prefix),
    )  # fmt: skip
    ref = reference.build_tree(logp, ids, roots, prefix_t, width - 1, sum(prefix))
    assert all(_same(getattr(tree, f), getattr(ref, f)) for f in ref._fields)
    assert _same(tree.custom_mask, _sglang_mask(ref.ancestor_mask, prefix))
    numel = width * sum(prefix) + bs * width * width
    assert _same(S.flat_tree_mask(ref.ancestor_mask, prefix_t, numel), ref.custom_mask)
    assert bool((tree.retrieve_next_sibling >= 0).any())  # a real tree


def test_mask_sized_from_an_upper_bound_keeps_the_layout_and_a_true_tail() -> None:
    width = 8
    logp, ids, roots = _tree_inputs(3, width - 1, 3, 3)
    prefix_t = torch.tensor([5, 0, 11])
    exact = reference.build_tree(logp, ids, roots, prefix_t, width - 1, 16).custom_mask
    upper = S.build_verify_tree(
        logp=logp, ids=ids, root_tokens=roots, prefix_lens=prefix_t, budget=width - 1,
        width=width, prefix_lens_sum=16 + 9, prefix_lens_sum_exact=False,
    ).custom_mask  # fmt: skip
    assert _same(upper[: exact.numel()], exact)
    assert bool(upper[exact.numel() :].all())
    assert upper.numel() - exact.numel() == 9 * width
    ancestor = reference.build_tree(logp, ids, roots, prefix_t, width - 1).ancestor_mask
    assert _same(upper, S.flat_tree_mask(ancestor, prefix_t, upper.numel()))  # the same bytes


def test_small_budget_tree_is_padded_to_the_verify_width() -> None:
    width, budget, bs = 8, 4, 2
    logp, ids, roots = _tree_inputs(bs, width - 1, 2, 4)
    prefix = [3, 6]
    prefix_t = torch.tensor(prefix)
    tree = S.build_verify_tree(
        logp=logp, ids=ids, root_tokens=roots, prefix_lens=prefix_t, budget=budget,
        width=width, prefix_lens_sum=sum(prefix),
    )  # fmt: skip
    ref = reference.build_tree(logp, ids, roots, prefix_t, budget)
    n, pad = budget + 1, slice(budget + 1, width)
    for f in ("tokens", "parents", "depths", "positions", "retrieve_next_token",
              "retrieve_next_sibling"):  # fmt: skip
        assert _same(getattr(tree, f)[:, :n], getattr(ref, f)), f
    assert _same(tree.ancestor_mask[:, :n, :n], ref.ancestor_mask)
    assert bool((tree.tokens[:, pad] == 0).all())
    assert bool((tree.parents[:, pad] == -1).all())
    assert bool((tree.retrieve_next_token[:, pad] == -1).all())
    assert _same(tree.positions[:, pad], prefix_t[:, None].expand(bs, width - n))
    eye = torch.eye(width - n, dtype=torch.bool).expand(bs, -1, -1)
    assert _same(tree.ancestor_mask[:, pad, pad], eye)
    assert not bool(tree.ancestor_mask[:, pad, :n].any())
    assert tree.retrieve_index.tolist() == [
        [0, 1, 2, 3, 4, -1, -1, -1], [8, 9, 10, 11, 12, -1, -1, -1],
    ]  # fmt: skip
    assert _same(tree.custom_mask, _sglang_mask(tree.ancestor_mask, prefix))
    with pytest.raises(ValueError, match="exceeds the verify width"):
        S.pad_tree(ref, 3)


def test_propose_tree_is_the_reference_tree_over_the_full_vocabulary() -> None:
    """A 64-node tree from a 16-token draft block (budget 63, the widest the sets verify)."""
    bs, block, hidden_size, vocab, width = 3, 16, 16, 64, 64
    g = torch.Generator().manual_seed(13)
    weight = torch.randn(vocab, hidden_size, generator=g)
    draft_hidden = torch.randn(bs, block, hidden_size, generator=g)
    roots, prefix = torch.tensor([1, 2, 3]), torch.tensor([4, 9, 2])
    tree = S.propose_tree(
        draft_hidden=draft_hidden, lm_head=SimpleNamespace(weight=weight), topk=8, budget=63,
        width=width, root_tokens=roots, prefix_lens=prefix, prefix_lens_sum=15,
        prefix_lens_sum_exact=True, tp_group=None,
    )  # fmt: skip
    logp, ids = _plain_topk(draft_hidden[:, 1:].reshape(-1, hidden_size), weight, 8)
    ref = reference.build_tree(
        logp.reshape(bs, block - 1, 8).contiguous(), ids.reshape(bs, block - 1, 8).contiguous(),
        roots, prefix, 63, 15,
    )  # fmt: skip
    assert all(_same(getattr(tree, f), getattr(ref, f)) for f in ref._fields)
    assert tree.custom_mask.numel() == 64 * 15 + 3 * 64 * 64
    assert int(tree.depths.max()) >= 2


def test_chain_tree_is_dflash_chain_with_causal_mask() -> None:
    draft = torch.tensor([[9, 1, 2, 3], [4, 5, 6, 7]])
    tree = S.chain_tree(draft, torch.tensor([5, 0]))
    assert _same(tree.tokens, draft)
    assert tree.parents.tolist() == [[-1, 0, 1, 2]] * 2
    assert tree.positions.tolist() == [[5, 6, 7, 8], [0, 1, 2, 3]]
    assert _same(tree.ancestor_mask[0], torch.ones(4, 4, dtype=torch.bool).tril())
    assert tree.retrieve_next_token.tolist() == [[1, 2, 3, -1]] * 2


@pytest.mark.parametrize(("bs", "width"), [(1, 2), (3, 8), (2, 16)])
def test_chain_tree_is_the_tree_the_kernels_build_from_the_chain(bs: int, width: int) -> None:
    """shadow_linear's chain from cached links is, field for field, what the kernels' build
    gives DFlash's chain at top-k 1 and budget B - 1 (what chain_tree called before issue 22)."""
    g = torch.Generator().manual_seed(bs * width)
    draft = torch.randint(0, 50, (bs, width), generator=g)
    prefix = torch.randint(0, 30, (bs,), generator=g)
    for _ in range(2):  # the second call reuses the links
        tree = S.chain_tree(draft, prefix)
        chain = draft[:, 1:].unsqueeze(-1)
        ref = ops.build_tree(torch.zeros(chain.shape), chain, draft[:, 0], prefix, width - 1)
        assert all(_same(getattr(tree, f), getattr(ref, f)) for f in ref._fields), ref._fields
        draft, prefix = draft.flip(0), prefix + 7


def test_chain_tree_links_are_shared_between_steps_and_batch_sizes() -> None:
    """The links live once per width, for the largest batch seen: a smaller batch reads their
    first rows, a larger one rebuilds them; tokens and positions are each step's own."""
    first = S.chain_tree(torch.tensor([[9, 1, 2, 3]]), torch.tensor([5]))
    second = S.chain_tree(torch.tensor([[4, 5, 6, 7]]), torch.tensor([6]))
    assert second.parents.data_ptr() == first.parents.data_ptr()
    assert first.tokens.tolist() == [[9, 1, 2, 3]]
    assert first.positions.tolist() == [[5, 6, 7, 8]]
    assert second.positions.tolist() == [[6, 7, 8, 9]]
    wide = 1 + max(64, S._ROW_CONSTANTS[("chain", 4, torch.device("cpu"))][0])  # a new capacity
    grown = S.chain_tree(torch.zeros(wide, 4, dtype=torch.int64), torch.zeros(wide))
    assert grown.retrieve_index[-1].tolist() == [4 * (wide - 1) + i for i in range(4)]
    third = S.chain_tree(torch.tensor([[4, 5, 6, 7]]), torch.tensor([6]))
    assert third.parents is first.parents  # batch 1's views, made once
    assert third.retrieve_index.tolist() == [[0, 1, 2, 3]]
    most = S.chain_tree(torch.zeros(wide - 1, 4, dtype=torch.int64), torch.zeros(wide - 1))
    assert most.parents.data_ptr() == grown.parents.data_ptr()  # the grown links' first rows
    assert most.retrieve_index[-1].tolist() == [4 * (wide - 2) + i for i in range(4)]


def test_a_chain_after_a_larger_batch_dispatches_nothing_for_its_links(
    recorder: _SyncRecorder,
) -> None:
    """Issue 22: batch 1 after a larger batch (a server's common case) takes the links' first
    row without a slice per tensor each step (eight dispatched calls before)."""
    S.chain_tree(torch.zeros(3, 5, dtype=torch.int64), torch.zeros(3))
    S.chain_tree(torch.zeros(1, 5, dtype=torch.int64), torch.zeros(1))
    with recorder:
        S.chain_tree(torch.zeros(1, 5, dtype=torch.int64), torch.zeros(1))
    assert not any(op.startswith("aten::slice") for op in recorder.ops), recorder.ops


def test_verify_input_fields_carry_the_mask_only_in_tree_mode() -> None:
    tree = S.chain_tree(torch.tensor([[9, 1, 2, 3]]), torch.tensor([5]))
    fields = S.verify_input_fields(tree, tree_mask=True)
    positions = fields["positions"]
    assert positions is not None
    assert positions.tolist() == [5, 6, 7, 8]
    assert fields["custom_mask"] is tree.custom_mask
    assert fields["tree_parents"] is tree.parents
    assert S.verify_input_fields(tree, tree_mask=False)["custom_mask"] is None


def test_window_cache_loc_is_each_requests_verify_window() -> None:
    req_to_token = torch.arange(300).view(3, 100) + 1000
    rows, prefix = torch.tensor([2, 0]), torch.tensor([5, 11])
    loc = S.window_cache_loc(req_to_token, rows, prefix, 64)
    assert _same(loc, torch.stack([req_to_token[2, 5:69], req_to_token[0, 11:75]]))


# ------------------------------------------------------------------ accept and commit


def test_greedy_accept_is_the_kernels_walk_in_dflash_outputs() -> None:
    tokens, parents, target = _branching_case()
    tree = SimpleNamespace(tokens=tokens, parents=parents)
    drafts, commit, bonus, out_tokens, seq, nodes = S.accept_tree(
        tree=tree, next_token_logits=_argmax_logits(target, 100), path_len=6,  # type: ignore[arg-type]
        prefix_lens=torch.tensor([40]),
    )  # fmt: skip
    assert nodes.tolist() == [[0, 2, 3, 5, -1, -1]]
    assert drafts.tolist() == [3]
    assert commit.tolist() == [4]
    assert commit.dtype == torch.int32
    assert bonus.tolist() == [77]
    assert out_tokens.tolist() == [[11, 20, 31, 77, 0, 0]]
    assert seq.tolist() == [44]


def test_sampled_accept_lays_the_sampler_out_as_the_walk() -> None:
    """A sampler hook reporting the walk's path (global node indices, -1 padded, wider than the
    path) gives exactly the greedy accept's outputs."""
    tokens, parents, target = _branching_case()
    tree = SimpleNamespace(tokens=tokens, parents=parents)
    logits = _argmax_logits(target, 100)
    walk = reference.verify_walk(tokens, parents, target, 5)

    def sample() -> S.SampledWalk:  # TEST DOUBLE for the release's tree rejection sampler
        accept_index = torch.full((1, 6), -1, dtype=torch.int32)
        accept_index[0, :4] = torch.tensor([0, 2, 3, 5], dtype=torch.int32)
        return walk.accept_len - 1, accept_index, target.reshape(-1).int()

    kw = {"tree": tree, "next_token_logits": logits, "path_len": 6}
    kw["prefix_lens"] = torch.tensor([40])
    greedy = S.accept_tree(**kw)  # type: ignore[arg-type]
    sampled = S.accept_tree(**kw, sample=sample)  # type: ignore[arg-type]
    assert all(_same(a, b) for a, b in zip(sampled, greedy, strict=True))


def test_walk_from_sampling_makes_local_indices() -> None:
    predicts = torch.zeros(12, dtype=torch.int32)
    predicts[[0, 2, 3, 5]] = torch.tensor([11, 20, 31, 77], dtype=torch.int32)
    predicts[6] = 55
    accept_index = torch.full((2, 6), -1, dtype=torch.int32)
    accept_index[0, :4] = torch.tensor([0, 2, 3, 5], dtype=torch.int32)
    accept_index[1, 0] = 6
    local, accept_len, tokens, bonus = S.walk_from_sampling(
        predicts, accept_index, torch.tensor([3, 0], dtype=torch.int32), 6
    )
    assert local.tolist() == [[0, 2, 3, 5, -1, -1], [0, -1, -1, -1, -1, -1]]
    assert accept_len.tolist() == [4, 1]
    assert bonus.tolist() == [77, 55]
    assert tokens[1].tolist() == [55, -1, -1, -1, -1, -1]


def test_commit_path_moves_kv_and_hidden_rows_to_the_window_front() -> None:
    tokens, parents, target = _branching_case()
    width = tokens.shape[1]
    walk = reference.verify_walk(tokens, parents, target, width - 1)
    cache_loc = torch.tensor([[100, 101, 102, 103, 104, 105]])
    pool = torch.arange(128, dtype=torch.float32)  # slot s holds s

    def move_kv_cache(tgt: torch.Tensor, src: torch.Tensor) -> None:
        pool[tgt] = pool[src].clone()  # TEST DOUBLE for SGLang's KV pool move

    hidden = torch.arange(width + 2, dtype=torch.float32).unsqueeze(1) * 10  # 2 padding rows
    path_hidden = S.commit_path(
        accept_index=walk.accept_index, cache_loc=cache_loc, move_kv_cache=move_kv_cache,
        hidden_states=hidden, width=width,
    )  # fmt: skip
    assert pool[cache_loc[0]].tolist()[:4] == [100.0, 102.0, 103.0, 105.0]
    assert path_hidden is not None
    assert path_hidden[:, 0].tolist() == [0.0, 20.0, 30.0, 50.0, 40.0, 50.0, 60.0, 70.0]
    assert S.commit_path(
        accept_index=walk.accept_index, cache_loc=cache_loc, move_kv_cache=move_kv_cache,
        hidden_states=None, width=width,
    ) is None  # fmt: skip


def test_commit_path_refuses_a_cache_loc_of_another_width() -> None:
    with pytest.raises(ValueError, match="width=4"):
        S.commit_path(accept_index=torch.tensor([[0, -1, -1]]), cache_loc=torch.zeros(1, 3),
                      move_kv_cache=lambda tgt, src: None, hidden_states=None, width=4)  # fmt: skip


def test_block_rows_take_each_windows_first_block() -> None:
    x = torch.arange(2 * 8 + 3).unsqueeze(1)  # 3 alignment rows
    assert S.block_rows(x, 2, 8, 3)[:, 0].tolist() == [0, 1, 2, 8, 9, 10]
    assert S.block_rows(x, 2, 8, 8) is x


def test_recurrent_state_steps_follow_the_tree() -> None:
    accept_index = torch.tensor([[0, 2, 3, 5, -1, -1], [0, -1, -1, -1, -1, -1]])
    commit = torch.tensor([4, 1], dtype=torch.int32)
    last, none = S.mamba_steps(accept_index, commit, None)
    _, tracked = S.mamba_steps(accept_index, commit, torch.tensor([2, -1]))
    assert last.tolist() == [5, 0]
    assert none is None
    assert tracked is not None
    assert tracked.tolist() == [3, -1]
    chain_last, _ = S.mamba_steps(torch.arange(6).expand(2, 6), commit, None)
    assert _same(chain_last, commit.long() - 1)


@pytest.mark.parametrize("budget", [15, 63])
def test_recurrent_state_steps_are_the_committed_nodes_not_the_paths_last(budget: int) -> None:
    """The committed step is the node at path position `commit_lens - 1`, which is the path's
    last node only when every accepted token is committed: 0.5.11 to 0.5.13 commit fewer at a
    request's max_new_tokens (their real-wheel checks caught a shortcut through the path's last
    node). Tracking takes the node at its position, -1 kept."""
    logp, ids = random_topk(6, 15, 4, vocab=50, seed=budget)
    prefix = torch.tensor([3, 0, 8, 1, 5, 2])
    tree = reference.build_tree(logp, ids, torch.arange(6), prefix, budget)
    # The target's token at each node: its first child's token where it has one, so the walk
    # goes down as far as the tree does; a path ends at a leaf.
    child = tree.retrieve_next_token
    target = torch.where(child >= 0, tree.tokens.gather(1, child.clamp(min=0)), -1)
    accept = reference.walk_accept(tree.tokens, tree.parents, target, 15, prefix)
    assert accept.commit_lens.min() > 3, "paths deep enough to stop short of their end"
    commit = accept.commit_lens.clone()
    commit[::2] = 2  # every other request at its max_new_tokens
    steps = (torch.arange(6) % 3) - 1  # -1, 0, 1, ...: tracking off, the root, the next node
    last, tracked = S.mamba_steps(accept.accept_index, commit, steps)
    rows = torch.arange(6)
    assert _same(last, accept.accept_index[rows, commit.long() - 1])
    assert not _same(last, accept.accept_index.amax(dim=1))
    assert tracked is not None
    want = torch.where(steps >= 0, accept.accept_index[rows, steps.clamp(min=0)], -1)
    assert _same(tracked, want)


def _vocab_parallel_head(weight: torch.Tensor, num_org: int, rank: int, tp: int) -> SimpleNamespace:
    """TEST DOUBLE for one rank's ParallelLMHead: the base vocabulary `weight[:num_org]` and the
    added one `weight[num_org:]`, each split evenly over `tp` ranks (a shard padded to the same
    size, padding rows 100.0 so they would win if read), base rows first, then added ones."""
    num_added_all = weight.shape[0] - num_org
    org_per, added_per = -(-num_org // tp), -(-num_added_all // tp)
    org_start, added_start = min(rank * org_per, num_org), min(rank * added_per, num_added_all)
    org = weight[org_start : min(org_start + org_per, num_org)]
    added = weight[num_org + added_start : num_org + min(added_start + added_per, num_added_all)]
    shard = torch.full((org_per + added_per, weight.shape[1]), 100.0, dtype=weight.dtype)
    shard[: org.shape[0]] = org
    shard[org_per : org_per + added.shape[0]] = added
    return SimpleNamespace(
        weight=shard,
        shard_indices=SimpleNamespace(
            num_org_elements=org.shape[0],
            num_org_elements_padded=org_per,
            num_added_elements=added.shape[0],
            org_vocab_start_index=org_start,
            added_vocab_start_index=num_org + added_start,
        ),
    )


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("num_added", [0, 9])
@pytest.mark.parametrize("chunk_size", [4, 64])  # chunks, and one chunk (one rank: no buffers)
def test_vocab_parallel_topk_with_added_vocabulary_equals_plain_torch(
    tp: int, num_added: int, chunk_size: int
) -> None:
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(11, 16, generator=g)
    hidden[4] = 0  # an all-tie row: the smallest ids, base before added
    num_org, k = 61, 5
    weight = torch.randn(num_org + num_added, 16, generator=g)
    group = ThreadGroup(tp)

    def rank(r: int) -> object:
        head = _vocab_parallel_head(weight, num_org, r, tp)
        return S.vocab_parallel_topk_logprobs(hidden, head, k, group, chunk_size=chunk_size)

    results = group.run(rank)
    want_logp, want_ids = _plain_topk(hidden, weight, k)
    for logp, ids in results:  # type: ignore[misc]
        assert _same(ids, want_ids)
        assert float((logp - want_logp).abs().max()) < 1e-5
    assert results[0][1][4].tolist() == [0, 1, 2, 3, 4]  # type: ignore[index]


@pytest.mark.parametrize("tp", [1, 2])
def test_vocab_parallel_topk_without_added_vocabulary_is_lm_head_topk(tp: int) -> None:
    """Bit for bit the head top-k the worker-v2 sets use, where both serve the head."""
    g = torch.Generator().manual_seed(4)
    hidden = torch.randn(13, 16, generator=g)
    weight = torch.randn(80, 16, generator=g)
    group = ThreadGroup(tp)

    def rank(r: int) -> object:
        head = _vocab_parallel_head(weight, 80, r, tp)
        new = S.vocab_parallel_topk_logprobs(hidden, head, 6, group)
        head.weight = head.weight[: head.shard_indices.num_org_elements]
        return new, S.lm_head_topk_logprobs(hidden, head, 6, group)

    for new, old in group.run(rank):  # type: ignore[misc]
        assert _same(new[0], old[0])
        assert _same(new[1], old[1])


def test_vocab_parallel_topk_pads_a_shard_smaller_than_k() -> None:
    g = torch.Generator().manual_seed(5)
    hidden = torch.randn(7, 8, generator=g)
    weight = torch.randn(10, 8, generator=g)  # 3 base ids per rank, the last rank holds 1
    group = ThreadGroup(4)
    results = group.run(
        lambda r: S.vocab_parallel_topk_logprobs(
            hidden, _vocab_parallel_head(weight, 10, r, 4), 5, group
        )
    )
    want_logp, want_ids = _plain_topk(hidden, weight, 5)
    assert _same(results[0][1], want_ids)  # type: ignore[index]
    assert float((results[0][0] - want_logp).abs().max()) < 1e-5  # type: ignore[index]
    with pytest.raises(ValueError, match="exceeds the vocabulary"):
        S.vocab_parallel_topk_logprobs(
            hidden, _vocab_parallel_head(weight, 10, 0, 1), 11, ThreadGroup(1)
        )


def test_sample_target_tokens_is_the_filtered_inverse_cdf() -> None:
    """Per node: temperature, then top-k, then top-p, then the inverse CDF of the uniform draw,
    written out row by row; top-k 1 is the argmax."""
    g = torch.Generator().manual_seed(9)
    logits = torch.randn(6, 30, generator=g)
    temperatures = torch.tensor([[0.7], [1.3]])
    top_ks, top_ps = torch.tensor([1, 5]), torch.tensor([1.0, 0.6])
    uniforms = torch.rand(6, generator=g)
    got = S.sample_target_tokens(
        logits, 3, temperatures=temperatures, top_ks=top_ks, top_ps=top_ps, uniforms=uniforms
    )
    want = []
    for r in range(6):
        b = r // 3
        x = logits[r] / temperatures[b, 0]
        order = torch.argsort(x, descending=True)[: int(top_ks[b])]
        p = torch.softmax(x[order], dim=0)
        p = torch.where((torch.cumsum(p, 0) - p) <= top_ps[b], p, 0.0)
        p = p / p.sum()
        pick = torch.searchsorted(torch.cumsum(p, 0), uniforms[r] * p.sum(), right=True)
        want.append(int(order[int(pick.clamp(max=len(p) - 1))]))
    assert got.tolist() == want
    assert got[:3].tolist() == torch.argmax(logits[:3], dim=-1).tolist()
    no_top_p = S.sample_target_tokens(
        logits, 3, temperatures=temperatures, top_ks=top_ks, top_ps=None, uniforms=uniforms
    )
    assert no_top_p[:3].tolist() == want[:3]


def test_walk_tree_is_the_kernels_walk_over_given_target_tokens() -> None:
    tokens, parents, target = _branching_case()
    walk = S.walk_tree(tokens, parents, target.int(), 6)
    want = reference.verify_walk(tokens, parents, target, 5)
    assert all(_same(a, b) for a, b in zip(walk, want, strict=True))
    assert walk.accept_index.tolist() == [[0, 2, 3, 5, -1, -1]]
    assert walk.bonus.tolist() == [77]
    short = S.walk_tree(tokens, parents, target, 3)  # a path of at most 3 nodes
    assert short.accept_index.tolist() == [[0, 2, 3]]
    assert short.bonus.tolist() == [31]


def test_path_rows_put_each_path_first_then_the_other_nodes() -> None:
    accept_index = torch.tensor([[0, 3, 5, -1, -1, -1], [0, -1, -1, -1, -1, -1]])
    rows = S.path_rows(accept_index, 6)
    assert rows.tolist() == [0, 3, 5, 1, 2, 4, 6, 7, 8, 9, 10, 11]
    tokens = torch.arange(12) * 10
    assert tokens[rows].view(2, 6)[0, :3].tolist() == [0, 30, 50]
    again = S.path_rows(torch.tensor([[0, 1, 4, -1, -1, -1], [0, 2, -1, -1, -1, -1]]), 6)
    assert again.tolist() == [0, 1, 4, 2, 3, 5, 6, 8, 7, 9, 10, 11]  # shared keys untouched


def test_path_rows_of_a_full_path_and_of_a_path_as_wide_as_the_window() -> None:
    assert S.path_rows(torch.tensor([[0, 2, 1, 3]]), 4).tolist() == [0, 2, 1, 3]
    assert S.path_rows(torch.tensor([[0, 2], [0, -1]]), 3).tolist() == [0, 2, 1, 3, 4, 5]


# ------------------------------------------------------------------ server arguments


def test_tree_args_defaults_and_the_verify_width() -> None:
    """Tree mode: budget B - 1 and topk min(8, budget) by default; a budget past the block widens
    the verify to budget + 1 (B kept for the drafter); shadow_linear keeps B (width None)."""
    assert S.resolve_tree_args(mode="tree", budget=None, topk=None, block_size=16) == S.TreeArgs(
        budget=15, topk=8, width=16, warning=None
    )
    wide = S.resolve_tree_args(mode="tree", budget=63, topk=8, block_size=16)
    assert (wide.budget, wide.topk, wide.width) == (63, 8, 64)
    assert S.resolve_tree_args(mode="tree", budget=4, topk=None, block_size=16).topk == 4
    shadow = S.resolve_tree_args(mode="shadow_linear", budget=None, topk=None, block_size=16)
    assert shadow == S.TreeArgs(budget=15, topk=1, width=None, warning=None)


def test_shadow_linear_overrides_other_values_with_a_warning() -> None:
    got = S.resolve_tree_args(mode="shadow_linear", budget=4, topk=None, block_size=16)
    assert (got.budget, got.topk, got.width) == (15, 1, None)
    assert got.warning == (
        "DDTREE shadow_linear verifies the DFlash chain: overriding budget=4, topk=None to "
        "budget=15, topk=1."
    )


@pytest.mark.parametrize(
    ("kw", "sentence"),
    [
        ({"budget": 64}, "--speculative-ddtree-budget 64 exceeds the verify width: it must be "
         "between 1 and 63 (tree mode verifies at most 64 tokens per request)."),
        ({"budget": 0}, "--speculative-ddtree-budget 0 is below the minimum: it must be between "
         "1 and 63 (tree mode verifies at most 64 tokens per request)."),
        ({"budget": 6, "topk": 7}, "--speculative-ddtree-topk 7 is out of range: it must be "
         "between 1 and the tree budget 6."),
        ({"topk": 0}, "--speculative-ddtree-topk 0 is out of range: it must be between 1 and the "
         "tree budget 15."),
        ({"mode": "wide"}, "--speculative-ddtree-mode must be 'tree' or 'shadow_linear', got "
         "'wide'."),
        ({"mode": "shadow_linear", "budget": 16}, "--speculative-ddtree-budget 16 exceeds the "
         "verify width: it must be between 1 and block_size - 1 = 15 (shadow_linear verifies the "
         "DFlash block of the draft model)."),
        ({"block_size": 1}, "DDTREE needs a DFlash block size of at least 2, got 1."),
    ],
)  # fmt: skip
def test_tree_args_refusals_are_one_sentence_each(kw: dict[str, object], sentence: str) -> None:
    args: dict[str, object] = {"mode": "tree", "budget": None, "topk": None, "block_size": 16}
    with pytest.raises(ValueError, match=re.escape(sentence)) as err:
        S.resolve_tree_args(**{**args, **kw})  # type: ignore[arg-type]
    assert str(err.value) == sentence


def test_tree_mode_on_cuda_refuses_a_backend_without_a_tree_mask() -> None:
    asked: list[bool] = []

    def backends(*names: str) -> Callable[[], tuple[str, ...]]:
        def get() -> tuple[str, ...]:
            asked.append(True)
            return names

        return get

    with pytest.raises(ValueError, match="cannot verify with attention backend fa3:") as err:
        S.check_attention_backends(backends("fa3", "flashinfer"), mode="tree", device="cuda")
    assert str(err.value).startswith("DDTREE tree mode cannot verify with attention backend fa3:")
    assert str(err.value).endswith("or use --speculative-ddtree-mode shadow_linear.")
    S.check_attention_backends(backends("triton", "flashinfer"), mode="tree", device="cuda")
    asked.clear()
    S.check_attention_backends(backends("fa3"), mode="shadow_linear", device="cuda")
    S.check_attention_backends(backends("fa3"), mode="tree", device="cpu")
    assert asked == []  # the release's getter is not asked outside tree mode on CUDA


# ------------------------------------------------------------------ the worker's verify step


def test_host_prefix_sum_takes_the_first_bound_then_the_exact_lengths() -> None:
    prefix = torch.tensor([4, 9])
    lens = torch.tensor([5, 10])
    assert S.host_prefix_sum(prefix, (None, None), (lens, 40)) == (40, False)
    assert S.host_prefix_sum(prefix, (lens, 30), (lens, 40)) == (30, False)
    assert S.host_prefix_sum(prefix, (None, None), exact_lens=lens) == (15, True)
    assert S.host_prefix_sum(prefix) == (13, True)


def test_tree_sampler_calls_the_release_sampler_on_the_tree() -> None:
    tree = S.chain_tree(torch.tensor([[9, 1, 2, 3]]), torch.tensor([5]))
    seen: dict[str, object] = {}

    def sampler(**kw: object) -> tuple[object, ...]:  # TEST DOUBLE: a set's extended sampler
        seen.update(kw)
        return "accepted", "bonus", "accept_index", "predicts"

    sample = S.tree_sampler(sampler, tree, max_top_k=4)  # type: ignore[arg-type]
    assert sample() == ("accepted", "accept_index", "predicts")
    assert seen["candidates"] is tree.tokens
    assert seen["max_top_k"] == 4
    assert seen["tree_retrieve"] == S.tree_retrieve(tree)


def _verifier(mode: str, budget: int, width: int, block: int) -> S.Verifier:
    return S.Verifier(S.Settings(mode=mode, budget=budget, topk=2, width=width), block)


def test_verifier_start_logs_the_settings_line() -> None:
    lines: list[str] = []
    verifier = S.Verifier.start(
        _args(), block_size=8, is_hybrid=False, on_cuda=False,
        log=lambda fmt, *args: lines.append(fmt % args),
    )  # fmt: skip
    assert verifier.settings == S.Settings(mode="tree", budget=7, topk=3, width=8)
    assert lines == ["DDTREE mode=tree budget=7 topk=3 block_size=8 verify_width=8"]


def test_step_of_a_chain_is_dflash_chain_in_the_block_slots() -> None:
    """shadow_linear: the step verifies DFLASH's chain in the block's own slots, with no tree mask,
    and its commit moves nothing (the path is already in window order)."""
    draft = torch.tensor([[9, 1, 2, 3], [4, 5, 6, 7]])
    prefix = torch.tensor([5, 0])
    block_loc = torch.arange(8).view(2, 4) + 100
    step = _verifier("shadow_linear", 3, 4, 4).step(
        tree=None, draft_tokens=draft, prefix_lens=prefix, block_cache_loc=block_loc,
        req_to_token=torch.zeros(1), req_pool_indices=torch.zeros(1),
    )  # fmt: skip
    assert _same(step.tree.tokens, draft)
    assert step.cache_loc is block_loc
    first_child, next_sibling = step.links
    assert first_child.tolist() == [[1, 2, 3, -1]] * 2
    assert next_sibling.tolist() == [[-1] * 4] * 2
    vi = step.verify_input(SimpleNamespace, draft_token=draft.reshape(-1))
    assert vi.custom_mask is None
    assert vi.draft_token_num == 4
    assert vi.positions.tolist() == [5, 6, 7, 8, 0, 1, 2, 3]
    hidden = torch.arange(8.0).unsqueeze(1)
    assert step.commit(lambda tgt, src: pytest.fail("moved"), hidden) is hidden


def test_step_of_a_wide_tree_verifies_in_the_window_and_commits_the_path() -> None:
    """A tree wider than the block verifies in the window's first W slots with its mask; greedy
    accept is the kernels' walk; the commit moves the path's KV to the window front and gives
    its hidden rows in the drafter's block layout."""
    tokens, parents, target = _branching_case()  # width 6
    prefix = torch.tensor([3])
    tree = S.pad_tree(reference.build_tree(*_tree_inputs(1, 3, 2, 5)[:2],
                                           tokens[:, 0], prefix, 4), 6)  # fmt: skip
    tree = tree._replace(tokens=tokens, parents=parents)  # the hand-made branching case
    req_to_token = torch.arange(20).view(1, 20) + 100
    step = _verifier("tree", 5, 6, 4).step(
        tree=tree, draft_tokens=tokens, prefix_lens=prefix, block_cache_loc=torch.zeros(1, 4),
        req_to_token=req_to_token, req_pool_indices=torch.tensor([0]),
    )  # fmt: skip
    assert step.cache_loc.tolist() == [[103, 104, 105, 106, 107, 108]]
    vi = step.verify_input(SimpleNamespace, draft_token=tokens.reshape(-1))
    assert vi.custom_mask is tree.custom_mask
    assert vi.draft_token_num == 6
    drafts, commit, bonus, _, seq = step.accept(_argmax_logits(target, 100))
    assert step.accept_index is not None
    assert step.accept_index.tolist() == [[0, 2, 3, 5]]
    assert (drafts.tolist(), commit.tolist(), bonus.tolist(), seq.tolist()) == (
        [3], [4], [77], [7]
    )  # fmt: skip
    pool = torch.arange(128, dtype=torch.float32)

    def move_kv_cache(tgt: torch.Tensor, src: torch.Tensor) -> None:
        pool[tgt] = pool[src].clone()  # TEST DOUBLE for SGLang's KV pool move

    rows = step.commit(move_kv_cache, torch.arange(6.0).unsqueeze(1) * 10)
    assert pool[103:107].tolist() == [103.0, 105.0, 106.0, 108.0]
    assert rows is not None
    assert rows[:, 0].tolist() == [0.0, 20.0, 30.0, 50.0]


# ------------------------------------------------------------------ API 2: the rules, once


def test_the_rules_dflash_hooks_ask_follow_the_mode() -> None:
    """The tree-mode predicate, the drafter's block, the recurrent top-k (a tree needs >= 2) and
    the default attention backend: one rule each, read off the mode."""
    tree = _args(speculative_num_draft_tokens=32, speculative_dflash_block_size=16)
    shadow = _args(speculative_ddtree_mode="shadow_linear", speculative_num_draft_tokens=16)
    assert (S.tree_mode(tree), S.tree_mode(shadow)) == (True, False)
    assert S.tree_mode(SimpleNamespace())  # a bag without the field: the default mode
    assert (S.draft_block_size(tree), S.draft_block_size(shadow)) == (16, 16)
    assert [S.recurrent_topk(tree, k) for k in (None, 0, 1, 2, 4)] == [2, 2, 2, 2, 4]
    assert [S.recurrent_topk(shadow, k) for k in (None, 1, 4)] == [None, 1, 4]
    assert S.default_attention_backend(tree, flashinfer_available=True) == "flashinfer"
    assert S.default_attention_backend(tree, flashinfer_available=False) == "triton"
    assert S.default_attention_backend(shadow, flashinfer_available=True) is None


def test_set_up_linear_attention_raises_a_trees_topk_or_refuses() -> None:
    """Tree mode on a hybrid target: the linear backend's top-k goes to >= 2; a backend with no
    top-k or with KDA's fused-accept pool is refused in one sentence; a chain changes nothing."""
    linear = SimpleNamespace(topk=0, accept_lens_pool=None)  # TEST DOUBLE: a linear backend
    _verifier("tree", 7, 8, 8).set_up_linear_attention(linear)
    assert linear.topk == 2
    chain = SimpleNamespace(topk=0)
    _verifier("shadow_linear", 7, 8, 8).set_up_linear_attention(chain)
    assert chain.topk == 0
    with pytest.raises(ValueError, match="no linear-attention tree path"):
        _verifier("tree", 7, 8, 8).set_up_linear_attention(SimpleNamespace())
    with pytest.raises(ValueError, match="KDA fused-accept state"):
        _verifier("tree", 7, 8, 8).set_up_linear_attention(
            SimpleNamespace(topk=1, accept_lens_pool=object())
        )


def _branching_step(mode: str = "tree") -> tuple[S.Step, torch.Tensor]:
    tokens, parents, target = _branching_case()
    tree = S.chain_tree(tokens, torch.tensor([3]))._replace(parents=parents)
    step = S.Step(tree=tree, mode=mode, cache_loc=torch.arange(6).view(1, 6) + 100,
                  prefix_lens=torch.tensor([3]), block_size=4)  # fmt: skip
    return step, target


def test_accept_with_greedy_walks_the_argmax_and_syncs_it_first() -> None:
    """Greedy (no sampler, all-greedy, or the gather's argmax given): the kernels' walk; with a
    TP sync the argmax [bs, W] is broadcast before the walk."""
    step, target = _branching_step()
    logits = _argmax_logits(target, 100)
    plain = step.accept_with(logits, None, sampler=None)
    synced: list[list[list[int]]] = []
    step2, _ = _branching_step()
    given = step2.accept_with(
        torch.zeros_like(logits), SimpleNamespace(is_all_greedy=False),
        sampler=lambda **kw: pytest.fail("sampled"), target_predict=target.reshape(-1),
        sync_greedy=lambda t: synced.append(t.tolist()),
    )  # fmt: skip
    assert [t.tolist() for t in plain] == [t.tolist() for t in given]
    assert plain[0].tolist() == [3]
    assert plain[2].tolist() == [77]
    assert synced == [target.tolist()]
    assert step2.accept_index is not None
    assert step2.accept_index.tolist() == [[0, 2, 3, 5]]


def test_accept_with_samples_through_the_release_sampler_and_syncs_its_outputs() -> None:
    step, _ = _branching_step()
    seen: dict[str, object] = {}
    synced: list[object] = []
    accept_index = torch.tensor([[0, 2, 3, -1]])
    predicts = torch.tensor([0, 0, 20, 31, 0, 0])

    def sampler(**kw: object) -> tuple[torch.Tensor, ...]:  # TEST DOUBLE: a set's sampler
        seen.update(kw)
        return torch.tensor([2]), torch.tensor([31]), accept_index, predicts

    info = SimpleNamespace(is_all_greedy=False)
    drafts, commit, bonus, _, _ = step.accept_with(
        torch.zeros(6, 100), info, sampler=sampler, sync_sample=synced.append, max_top_k=4
    )
    assert seen["sampling_info"] is info
    assert seen["max_top_k"] == 4
    assert seen["candidates"] is step.tree.tokens
    assert synced[1] is accept_index
    assert synced[2] is predicts
    assert (drafts.tolist(), commit.tolist(), bonus.tolist()) == ([2], [3], [31])


def test_accept_window_lays_the_path_out_as_dflash_commit_expects() -> None:
    """Worker v1: page size 1 reorders the slots and hidden rows, path first; pages copy the
    path's KV to the window front instead; shadow_linear sampled is DFLASH's own (None)."""
    step, target = _branching_step()
    logits = _argmax_logits(target, 100)
    slots = torch.arange(6) + 100
    hidden = torch.arange(6.0).unsqueeze(1)
    got = step.accept_window(
        logits, None, page_size=1, out_cache_loc=slots,
        move_kv_cache=lambda *a: pytest.fail("moved"), hidden_states=hidden,
    )  # fmt: skip
    assert got is not None
    assert got.candidates.tolist() == [[99, 11, 20, 31, 10, 30]]
    assert (got.accepted.tolist(), got.bonus.tolist()) == ([3], [77])
    assert got.out_cache_loc.tolist() == [100, 102, 103, 105, 101, 104]
    assert got.hidden_states is not None
    assert got.hidden_states[:, 0].tolist() == [0.0, 2.0, 3.0, 5.0, 1.0, 4.0]
    assert step.accept_index is not None
    pool = torch.arange(128, dtype=torch.float32)

    def move_kv_cache(tgt: torch.Tensor, src: torch.Tensor) -> None:
        pool[tgt] = pool[src].clone()  # TEST DOUBLE for SGLang's KV pool move

    paged = _branching_step()[0].accept_window(
        logits, None, page_size=16, out_cache_loc=slots, move_kv_cache=move_kv_cache,
        hidden_states=None,
    )  # fmt: skip
    assert paged is not None
    assert paged.out_cache_loc is slots
    assert pool[100:104].tolist() == [100.0, 102.0, 103.0, 105.0]
    shadow, _ = _branching_step("shadow_linear")
    sampled = SimpleNamespace(is_all_greedy=False)
    assert shadow.accept_window(logits, sampled, page_size=1, out_cache_loc=slots,
                                move_kv_cache=pytest.fail, hidden_states=None) is None  # fmt: skip
    chain = shadow.accept_window(logits, None, page_size=1, out_cache_loc=slots,
                                 move_kv_cache=pytest.fail, hidden_states=hidden)  # fmt: skip
    assert chain is not None
    assert chain.out_cache_loc is slots
    assert chain.hidden_states is hidden
    assert shadow.accept_index is None


def test_kv_plan_plans_a_wide_trees_window_and_keeps_the_blocks_otherwise() -> None:
    wide, _ = _branching_step()  # width 6 over a block of 4
    calls: list[dict[str, object]] = []

    def plan(**kw: object) -> str:  # TEST DOUBLE: the release's KV index translator
        calls.append(kw)
        return "window"

    assert wide.kv_plan("block", plan, seq_lens="lens") == "window"
    assert calls[0]["read_extent"] == 6
    assert calls[0]["seq_lens"] == "lens"
    assert calls[0]["write_virtual"].tolist() == list(range(100, 106))  # type: ignore[union-attr]
    narrow = S.Step(tree=wide.tree, mode="tree", cache_loc=wide.cache_loc,
                    prefix_lens=wide.prefix_lens, block_size=6)  # fmt: skip
    assert narrow.kv_plan("block", plan) == "block"
    assert len(calls) == 1


def test_step_mamba_steps_follow_a_trees_path_and_keep_a_chains() -> None:
    step, target = _branching_step()
    last, track = torch.tensor([7]), torch.tensor([1])
    chain, _ = _branching_step("shadow_linear")
    chain.accept(_argmax_logits(target, 100))
    assert chain.mamba_steps(torch.tensor([4]), last, track) == (last, track)
    step.accept(_argmax_logits(target, 100))
    got_last, got_track = step.mamba_steps(torch.tensor([4]), last, track)
    assert got_last.tolist() == [5]
    assert got_track is not None
    assert got_track.tolist() == [2]


def test_resolve_server_args_writes_back_the_release_way_and_checks_the_backend() -> None:
    """The set's `_handle_ddtree_args`: tree mode moves the block to
    speculative_dflash_block_size and widens the verify; writes go through the release's
    `write`; shadow_linear warns and keeps the block; a tree on CUDA asks the backend getter."""
    wide = SimpleNamespace(
        speculative_num_draft_tokens=16, speculative_ddtree_mode="tree",
        speculative_ddtree_budget=31, speculative_ddtree_topk=None, device="cuda",
    )  # fmt: skip
    writes: list[tuple[str, object]] = []

    def write(obj: object, name: str, value: object) -> None:
        writes.append((name, value))
        setattr(obj, name, value)

    S.resolve_server_args(
        wide, warn=pytest.fail, write=write, attention_backends=lambda: ("flashinfer",)
    )
    assert writes == [
        ("speculative_ddtree_budget", 31), ("speculative_ddtree_topk", 8),
        ("speculative_dflash_block_size", 16), ("speculative_num_draft_tokens", 32),
    ]  # fmt: skip
    warned: list[str] = []
    shadow = SimpleNamespace(
        speculative_num_draft_tokens=16, speculative_ddtree_mode="shadow_linear",
        speculative_ddtree_budget=4, speculative_ddtree_topk=None, device="cuda",
    )  # fmt: skip
    S.resolve_server_args(shadow, warn=warned.append, attention_backends=lambda: ("fa3",))
    assert (shadow.speculative_ddtree_budget, shadow.speculative_ddtree_topk) == (15, 1)
    assert shadow.speculative_num_draft_tokens == 16
    assert not hasattr(shadow, "speculative_dflash_block_size")
    assert len(warned) == 1
    tree = SimpleNamespace(**{**vars(wide), "speculative_num_draft_tokens": 16})
    with pytest.raises(ValueError, match="cannot verify with attention backend fa3"):
        S.resolve_server_args(tree, warn=pytest.fail, attention_backends=lambda: ("fa3",))


def test_require_gives_the_module_at_its_api_and_refuses_another_in_one_sentence() -> None:
    """`require` is the one name a set's loader calls before it trusts the rest: frozen."""
    assert S.require(S.API_VERSION) is S
    with pytest.raises(RuntimeError, match="action=build-kernels") as err:
        S.require(S.API_VERSION + 1)
    text = str(err.value)
    assert f"written for ddtree_kernels.sglang API {S.API_VERSION + 1}" in text
    assert f"provides API {S.API_VERSION};" in text
    assert text.endswith(".")
    assert ". " not in text[:-1]


def test_verifier_and_step_reach_the_per_step_helpers() -> None:
    """A worker holds a Verifier, not the module: the per-step helpers hang off it."""
    assert S.Verifier.host_prefix_sum is S.host_prefix_sum
    tree = S.chain_tree(torch.tensor([[9, 1, 2, 3]]), torch.tensor([5]))
    step = S.Step(tree=tree, mode="shadow_linear", cache_loc=torch.zeros(1, 4),
                  prefix_lens=torch.tensor([5]), block_size=4)  # fmt: skip

    def sampler(**kw: object) -> tuple[object, ...]:  # TEST DOUBLE: a set's extended sampler
        return kw["candidates"], "bonus", kw["tree_retrieve"], kw["top"]

    assert step.sampler(sampler, top=2)() == (tree.tokens, S.tree_retrieve(tree), 2)  # type: ignore[arg-type]


def test_step_accept_target_is_accept_on_the_argmax_it_was_given() -> None:
    """0.5.19+ walk the argmax after broadcasting it from TP rank 0: the same outputs and path
    as `accept` on the logits whose argmax it is."""
    tokens, parents, target = _branching_case()
    tree = SimpleNamespace(tokens=tokens, parents=parents)
    steps = [
        S.Step(tree=tree, mode="tree", cache_loc=torch.zeros(1, 6),  # type: ignore[arg-type]
               prefix_lens=torch.tensor([40]), block_size=6)
        for _ in range(2)
    ]  # fmt: skip
    by_logits = steps[0].accept(_argmax_logits(target, 100))
    by_target = steps[1].accept_target(target)
    assert all(_same(a, b) for a, b in zip(by_target, by_logits, strict=True))
    assert steps[1].accept_index is not None
    assert steps[1].accept_index.tolist() == [[0, 2, 3, 5, -1, -1]]


def test_step_commit_rows_lay_another_tensor_out_as_the_commit_did_the_hidden_rows() -> None:
    """The verify logits (0.5.19+'s log-probs read them) get the hidden rows' layout: the path
    first, the drafter's block; a chain's come back as they are."""
    tokens, parents, target = _branching_case()  # width 6
    tree = SimpleNamespace(tokens=tokens, parents=parents)
    step = S.Step(tree=tree, mode="tree", cache_loc=torch.arange(6).view(1, 6) + 100,  # type: ignore[arg-type]
                  prefix_lens=torch.tensor([3]), block_size=4)  # fmt: skip
    step.accept(_argmax_logits(target, 100))
    x = torch.arange(6.0).unsqueeze(1) * 10
    rows = step.commit(lambda tgt, src: None, x)
    assert rows is not None
    assert _same(step.commit_rows(x), rows)
    assert step.commit_rows(x)[:, 0].tolist() == [0.0, 20.0, 30.0, 50.0]
    chain = S.Step(tree=tree, mode="shadow_linear", cache_loc=torch.zeros(1, 6),  # type: ignore[arg-type]
                   prefix_lens=torch.tensor([3]), block_size=6)  # fmt: skip
    assert chain.commit_rows(x) is x


def test_step_commit_rows_reuse_the_commits_row_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """A log-prob step's logit rows (as many as the hidden rows) take the order `commit`
    computed: no second commit_indices; rows of another count, or after a commit without hidden
    rows, get an order of their own, laid out alike."""
    tokens, parents, target = _branching_case()  # width 6
    tree = SimpleNamespace(tokens=tokens, parents=parents)
    calls: list[int] = []
    commit_indices = S.ops.commit_indices
    monkeypatch.setattr(S.ops, "commit_indices",
                        lambda *a: calls.append(a[2]) or commit_indices(*a))  # fmt: skip

    def step() -> S.Step:
        made = S.Step(tree=tree, mode="tree", cache_loc=torch.arange(6).view(1, 6) + 100,  # type: ignore[arg-type]
                      prefix_lens=torch.tensor([3]), block_size=4)  # fmt: skip
        made.accept(_argmax_logits(target, 100))
        return made

    x = torch.arange(6.0).unsqueeze(1) * 10
    padded = torch.arange(8.0).unsqueeze(1) * 10
    reused = step()
    reused.commit(lambda tgt, src: None, x)
    assert reused.commit_rows(x)[:, 0].tolist() == [0.0, 20.0, 30.0, 50.0]
    assert calls == [6]
    assert reused.commit_rows(padded)[:, 0].tolist() == [0.0, 20.0, 30.0, 50.0]
    assert calls == [6, 8]
    calls.clear()
    without_hidden = step()
    assert without_hidden.commit(lambda tgt, src: None, None) is None
    assert without_hidden.commit_rows(x)[:, 0].tolist() == [0.0, 20.0, 30.0, 50.0]
    assert calls == [0, 6]


# Aten ops whose CUDA implementation makes the host wait for the device: a value read back
# (`.item()`, `int(t)`, `bool(t)`, `torch.equal`) or an output shape that depends on the data.
_SYNCING_OPS = {
    "aten::_local_scalar_dense", "aten::is_nonzero", "aten::equal", "aten::nonzero",
    "aten::nonzero_static", "aten::masked_select", "aten::unique_dim", "aten::_unique2",
    "aten::unique_consecutive", "aten::repeat_interleave.Tensor",
}  # fmt: skip


class _SyncRecorder(TorchDispatchMode):
    """The aten ops a call issues, outside the kernels' ops (on the GPU CUDA kernels that never
    synchronise, here the reference, which may)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []
        self.kernels: list[str] = []  # the kernels' ops called, in order
        self.paused = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if not self.paused:
            overload = func._overloadname
            self.ops.append(func._schema.name + ("" if overload == "default" else f".{overload}"))
        return func(*args, **(kwargs or {}))

    @property
    def syncs(self) -> list[str]:
        return [op for op in self.ops if op in _SYNCING_OPS or op.split(".")[0] in _SYNCING_OPS]


# The ops that run a kernel each on the GPU (the recorder lists them by name).
_KERNEL_OPS = {"build_tree", "verify_walk", "walk_accept", "commit_indices", "topk_logprobs",
               "sample_tokens"}  # fmt: skip


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> _SyncRecorder:
    """A recorder to enter around device work (host lengths are read before it)."""
    rec = _SyncRecorder()
    for name in sorted(_KERNEL_OPS):
        op = getattr(ops, name)

        def paused(
            *a: object, _op: Callable[..., object] = op, _name: str = name, **kw: object
        ) -> object:
            if not rec.paused:
                rec.kernels.append(_name)
            rec.paused += 1
            try:
                return _op(*a, **kw)
            finally:
                rec.paused -= 1

        monkeypatch.setattr(ops, name, paused)
    return rec


@pytest.mark.parametrize(("mode", "budget", "width"), [("tree", 7, 8), ("tree", 5, 8),
                                                        ("shadow_linear", 7, 8)])  # fmt: skip
def test_a_greedy_step_never_waits_on_the_device(
    recorder: _SyncRecorder, mode: str, budget: int, width: int
) -> None:
    """Issue 22: a greedy verify step's host work around the kernels (propose, verify input,
    accept, commit, the recurrent-state steps) reads no value back from the device, so the host
    runs ahead of the GPU and the step's ops can be captured. Budget 5 at width 8 pads the tree
    and builds the mask here, not in the kernel."""
    bs, block, hidden_size, vocab = 2, 8, 16, 40
    g = torch.Generator().manual_seed(3)
    verifier = _verifier(mode, budget, width, block)
    prefix = torch.tensor([4, 9])
    roots = torch.tensor([1, 2])
    host_sum = S.host_prefix_sum(prefix, exact_lens=torch.tensor([4, 9]))  # seq_lens_cpu
    draft_hidden = torch.randn(bs, block, hidden_size, generator=g)
    lm_head = SimpleNamespace(weight=torch.randn(vocab, hidden_size, generator=g))
    draft_tokens = torch.randint(0, vocab, (bs, block), generator=g)
    logits = torch.randn(bs * width, vocab, generator=g)
    hidden = torch.randn(bs * width, hidden_size, generator=g)
    pool = torch.zeros(256)

    def move_kv_cache(tgt: torch.Tensor, src: torch.Tensor) -> None:
        pool[tgt] = pool[src].clone()  # TEST DOUBLE for SGLang's KV pool move

    with recorder:
        tree = None
        if mode == "tree":
            tree = verifier.propose(
                draft_hidden=draft_hidden, lm_head=lm_head, root_tokens=roots,
                prefix_lens=prefix, host_sum=host_sum, tp_group=None,
            )  # fmt: skip
        step = verifier.step(
            tree=tree, draft_tokens=draft_tokens, prefix_lens=prefix,
            block_cache_loc=torch.arange(bs * block).view(bs, block),
            req_to_token=torch.arange(2 * 64).view(2, 64), req_pool_indices=torch.tensor([1, 0]),
        )  # fmt: skip
        step.verify_input(SimpleNamespace)
        accepted = step.accept(logits)
        step.commit(move_kv_cache, hidden)
        if step.accept_index is not None:
            S.mamba_steps(step.accept_index, accepted[1], torch.tensor([0, -1]))
    assert recorder.ops, "the recorder saw the step"
    assert recorder.syncs == []


def test_the_sync_recorder_sees_a_read_back(recorder: _SyncRecorder) -> None:
    """What the test above relies on: a device read-back (the prefix sum's device fallback, used
    only where a release has no host lengths) shows as a syncing op."""
    with recorder:
        S.host_prefix_sum(torch.tensor([4, 9]))
    assert recorder.syncs == ["aten::_local_scalar_dense"]


# Ops that only make a view: no launch, no allocation on the device.
_VIEW_OPS = {"aten::view", "aten::unsqueeze", "aten::squeeze", "aten::reshape", "aten::slice",
             "aten::expand", "aten::select", "aten::alias", "aten::_reshape_alias", "aten::t",
             "aten::permute"}  # fmt: skip

# The host's launches around the kernels in a greedy shadow_linear step at batch 2 and width 8
# (the chain, its verify input, accept, commit): each is a launch or an allocation on the GPU,
# 5-10 us of the host, and a batch-1 step of an 8B target is host-bound (RESULTS.md, run 15).
# Issue 22 measured 7 besides the walk (before it the kernels' build of the chain added another
# kernel call with its eleven allocations), then 6 once the new sequence lengths came from the
# walk's int64 lengths instead of a second conversion, then 2 (the chain's positions and the
# target's argmax) once the walk's kernel wrote DFlash's accept outputs itself (`walk_accept`).
SHADOW_STEP_HOST_OPS = 2


def _windows(bs: int, block: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A step's KV slots: the block's, req_to_token and the requests' rows in it."""
    return (
        torch.arange(bs * block).view(bs, block),
        torch.arange(2 * 64).view(2, 64),
        torch.tensor([1, 0]),
    )


def _greedy_step(
    verifier: S.Verifier,
    tree: Tree | None,
    draft_tokens: torch.Tensor,
    prefix: torch.Tensor,
    logits: torch.Tensor,
    hidden: torch.Tensor | None,
    windows: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
) -> S.Step:
    """One greedy step through a worker's hooks: step, verify input, accept, commit."""
    block_cache_loc, req_to_token, req_pool_indices = windows
    step = verifier.step(
        tree=tree, draft_tokens=draft_tokens, prefix_lens=prefix, block_cache_loc=block_cache_loc,
        req_to_token=req_to_token, req_pool_indices=req_pool_indices,
    )  # fmt: skip
    step.verify_input(SimpleNamespace)
    step.accept(logits)
    step.commit(lambda tgt, src: None, hidden)
    return step


def _launches(recorder: _SyncRecorder) -> list[str]:
    return [op for op in recorder.ops if op.split(".")[0] not in _VIEW_OPS]


def test_a_shadow_linear_step_launches_only_the_walk_and_few_ops(recorder: _SyncRecorder) -> None:
    """Issue 22: shadow_linear (DFLASH's chain through the DDTree step) builds no tree on the
    device: the chain's links are cached, so the walk is its only DDTree kernel, and its host
    work stays within SHADOW_STEP_HOST_OPS ops, so its step costs about what DFLASH's does."""
    bs, block = 2, 8
    verifier = _verifier("shadow_linear", block - 1, block, block)
    prefix = torch.tensor([4, 9])
    draft_tokens = torch.randint(0, 40, (bs, block), generator=torch.Generator().manual_seed(5))
    logits = torch.randn(bs * block, 40, generator=torch.Generator().manual_seed(6))
    windows = _windows(bs, block)
    for _ in range(2):  # the first step builds the cached links, the second is measured
        recorder.ops.clear()
        recorder.kernels.clear()
        with recorder:
            _greedy_step(verifier, None, draft_tokens, prefix, logits, None, windows)
    assert recorder.kernels == ["walk_accept"]
    assert len(_launches(recorder)) <= SHADOW_STEP_HOST_OPS, _launches(recorder)


# A tree step's recurrent-state steps on a hybrid target: the committed node's gather (its index's
# conversion and offset, three launches), and with tracking the tracked node's gather and its -1
# (eight launches until the -1 took a masked_fill, not a where with a scalar tensor).
MAMBA_STEPS_HOST_OPS = 3, 7


@pytest.mark.parametrize("mode", ["shadow_linear", "tree"])
def test_only_a_tree_step_adds_recurrent_state_steps(recorder: _SyncRecorder, mode: str) -> None:
    """Issue 22 (the hybrid target): a set commits Mamba state through `mamba_steps` only when
    the step kept a path (`accept_index=ddtree_step.accept_index`, then `if accept_index is not
    None`). A chain keeps none, so shadow_linear's recurrent-state commit is DFLASH's own, with
    no launch of ours (three to seven before, with tracking); a tree keeps its path and its
    commit follows it (MAMBA_STEPS_HOST_OPS launches, without and with tracking)."""
    bs, block = 2, 8
    verifier = _verifier(mode, block - 1, block, block)
    prefix = torch.tensor([4, 9])
    chain = torch.randint(0, 40, (bs, block), generator=torch.Generator().manual_seed(5))
    tree = None if mode == "shadow_linear" else S.chain_tree(chain, prefix)
    logits = torch.randn(bs * block, 40, generator=torch.Generator().manual_seed(6))
    logits[:, 7] += 100.0  # the target always picks 7: a path of the root and node 1
    chain[:, 1], chain[:, 2] = 7, 8
    step = _greedy_step(verifier, tree, chain, prefix, logits, None, _windows(bs, block))
    commit_lens = torch.tensor([2, 2], dtype=torch.int32)
    launches = []
    for tracking in (None, torch.tensor([1, -1])):
        recorder.ops.clear()
        with recorder:  # the set's hook, as every worker-v2 set calls it
            if step.accept_index is not None:
                S.mamba_steps(step.accept_index, commit_lens, tracking)
        launches.append(_launches(recorder))
    if mode == "shadow_linear":
        assert step.accept_index is None
        assert launches == [[], []]
    else:
        assert step.accept_index is not None
        assert step.accept_index[:, :3].tolist() == [[0, 1, -1], [0, 1, -1]]
        budgets = zip(launches, MAMBA_STEPS_HOST_OPS, strict=True)
        assert all(0 < len(ops) <= most for ops, most in budgets), launches


# The same count for a greedy tree step at full width (budget 7, width 8 = the block): the draft
# head's matmul and its input copy, the target's argmax and the hidden rows' gather (17 until the
# same change; 16 until a verify at the block's width took its path rows from cached window rows;
# 15 until one commit kernel gave the KV moves and the row order; 9 until the walk's kernel wrote
# the accept outputs).
TREE_STEP_HOST_OPS = 5


@pytest.mark.parametrize("lens", ["exact", "bound"])
def test_a_tree_step_launches_its_four_kernels_and_few_ops(
    recorder: _SyncRecorder, lens: str
) -> None:
    """Issue 22's budget for tree mode's host work outside the kernels (top-k, tree build, walk,
    commit indices), so a change that adds launches to every step shows here first; with the
    host's exact prefix sum, and with the upper bound the worker-v2 sets size the mask from
    under overlap scheduling (the mask then took about ten launches of its own)."""
    bs, block, hidden_size, vocab = 2, 8, 16, 40
    g = torch.Generator().manual_seed(3)
    verifier = _verifier("tree", block - 1, block, block)
    prefix, roots = torch.tensor([4, 9]), torch.tensor([1, 2])
    host_lens = torch.tensor([4, 9])
    host_sum = (
        S.host_prefix_sum(prefix, exact_lens=host_lens)
        if lens == "exact"
        else S.host_prefix_sum(prefix, (host_lens, int(host_lens.sum()) + bs * block))
    )
    assert host_sum[1] == (lens == "exact")
    draft_hidden = torch.randn(bs, block, hidden_size, generator=g)
    lm_head = SimpleNamespace(weight=torch.randn(vocab, hidden_size, generator=g))
    logits = torch.randn(bs * block, vocab, generator=g)
    hidden = torch.randn(bs * block, hidden_size, generator=g)
    windows = _windows(bs, block)
    with recorder:
        tree = verifier.propose(
            draft_hidden=draft_hidden, lm_head=lm_head, root_tokens=roots, prefix_lens=prefix,
            host_sum=host_sum, tp_group=None,
        )  # fmt: skip
        _greedy_step(verifier, tree, tree.tokens, prefix, logits, hidden, windows)
    assert recorder.kernels == ["topk_logprobs", "build_tree", "walk_accept", "commit_indices"]
    assert len(_launches(recorder)) <= TREE_STEP_HOST_OPS, _launches(recorder)
