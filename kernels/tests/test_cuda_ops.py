"""CUDA kernels against the reference: exact ids/trees/walks, fp32-rounding log-probs,
sampling in distribution, and a whole step captured in one CUDA graph."""

from __future__ import annotations

import pytest
import torch
from inputs import random_topk, tied_topk

from ddtree_kernels import _extension, ops, reference

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
    pytest.mark.skipif(not _extension.is_loaded(), reason=f"{_extension.load_error()}"),
]


def _assert_same(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...]) -> None:
    for name, a, b in zip(type(want)._fields, got, want, strict=True):
        assert a.dtype == b.dtype, f"{name} is {a.dtype}, the reference's {b.dtype}"
        assert torch.equal(a.cpu(), b.cpu()), f"{name} differs"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    ("rows", "vocab", "k"),
    [(1, 1, 1), (3, 7, 5), (15, 1000, 8), (720, 4099, 4), (5, 32001, 16), (15, 151936, 8),
     (48, 248320, 16), (2, 100003, 3)],
)  # fmt: skip
def test_cuda_topk_matches_reference(rows: int, vocab: int, k: int, dtype: torch.dtype) -> None:
    if k > vocab:
        pytest.skip("k above vocab")
    gen = torch.Generator(device="cuda").manual_seed(rows * vocab + k)
    logits = (torch.randn(rows, vocab, device="cuda", generator=gen) * 4).to(dtype)
    assert ops.backend_for(logits) is ops.Backend.CUDA
    got = ops.topk_logprobs(logits, k)
    want = reference.topk_logprobs(logits, k)
    assert torch.equal(got.ids, want.ids)
    torch.testing.assert_close(got.logp, want.logp, rtol=1e-5, atol=2e-5)


def test_cuda_topk_handles_ties_and_unaligned_rows() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    base = torch.randint(-3, 3, (33, 5001), device="cuda", generator=gen).to(torch.bfloat16)
    logits = base[:, 1:]  # row starts off 16-byte alignment, many exact ties
    for k in (1, 6, 16):
        got = ops.topk_logprobs(logits, k)
        want = reference.topk_logprobs(logits, k)
        assert torch.equal(got.ids, want.ids)
        torch.testing.assert_close(got.logp, want.logp, rtol=1e-5, atol=2e-5)


def test_cuda_topk_handles_masked_logits() -> None:
    logits = torch.full((4, 3000), float("-inf"), device="cuda")
    logits[:, 17] = 1.0
    logits[2, 2999] = 1.0
    got = ops.topk_logprobs(logits, 4)
    want = reference.topk_logprobs(logits, 4)
    assert torch.equal(got.ids, want.ids)
    assert torch.equal(got.logp, want.logp)


@pytest.mark.parametrize(
    ("batch", "max_depth", "k", "budget"),
    [(1, 1, 1, 1), (1, 15, 1, 15), (3, 1, 4, 9), (48, 15, 8, 64), (7, 15, 16, 128),
     (5, 15, 4, 31), (2, 3, 2, 50), (4, 32, 2, 100), (2, 15, 8, 511), (33, 9, 5, 33)],
)  # fmt: skip
def test_cuda_build_tree_matches_reference(batch: int, max_depth: int, k: int, budget: int) -> None:
    for tied in (False, True):
        seed = batch + max_depth + k + budget
        make = tied_topk if tied else random_topk
        args = (batch, max_depth, k, seed) if tied else (batch, max_depth, k, 3000, seed)
        logp, ids = make(*args)
        logp, ids = logp.cuda(), ids.cuda()
        roots = torch.arange(batch, device="cuda") + 11
        prefix = torch.randint(0, 300, (batch,), device="cuda")
        total = int(prefix.sum())
        got = ops.build_tree(logp, ids, roots, prefix.int(), budget, total)
        want = reference.build_tree(logp, ids, roots, prefix, budget, total)
        _assert_same(got, want)


def test_cuda_build_tree_without_custom_mask() -> None:
    logp, ids = random_topk(3, 15, 8, 500, seed=1, device="cuda")
    roots, prefix = torch.zeros(3, dtype=torch.long, device="cuda"), torch.zeros(3, device="cuda")
    got = ops.build_tree(logp, ids, roots, prefix, 64)
    assert got.custom_mask.numel() == 0
    want = reference.build_tree(logp, ids, roots, prefix, 64)
    _assert_same(got, want)


@pytest.mark.parametrize("off", [9, -1])
def test_cuda_build_tree_mask_from_a_bound_or_a_short_sum(off: int) -> None:
    """The flat mask is sized from the host's prefix sum and laid out by the device's lengths:
    from an upper bound (worker v2 under overlap) its tail past the rows is True; from a sum one
    short (or a graph replayed at longer prefixes) it holds the first entries and nothing is
    written past it; both as the reference's."""
    logp, ids = random_topk(4, 15, 4, 500, seed=2, device="cuda")
    roots = torch.arange(4, device="cuda")
    prefix = torch.tensor([7, 0, 30, 5], device="cuda")
    host_sum = int(prefix.sum()) + off
    got = ops.build_tree(logp, ids, roots, prefix, 31, host_sum)
    assert got.custom_mask.numel() == ops.custom_mask_numel(host_sum, 4, 31)
    _assert_same(got, reference.build_tree(logp, ids, roots, prefix, 31, host_sum))


def _storages(outputs: tuple[torch.Tensor, ...]) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in outputs if t.numel()}


def test_cuda_ops_return_outputs_of_their_own() -> None:
    """Each op returns fresh outputs, as its schema says (no `(a)` alias annotation): none shares
    another's storage, so none is a view torch must track, and torch's schema check passes."""
    logp, ids = random_topk(3, 15, 4, 500, seed=4, device="cuda")
    roots, prefix = torch.arange(3, device="cuda"), torch.tensor([4, 9, 2], device="cuda")
    tree = ops.build_tree(logp, ids, roots, prefix, 15, int(prefix.sum()))
    target = tree.tokens.gather(1, tree.retrieve_next_token.clamp(min=0))
    walk = ops.verify_walk(tree.tokens, tree.parents, target, 15)
    numel = ops.custom_mask_numel(int(prefix.sum()), 3, 15)
    calls = {
        "build_tree": (logp, ids, roots, prefix, 15, numel),
        "verify_walk": (tree.tokens, tree.parents, target, 16),
        "walk_accept": (tree.tokens, tree.parents, target, prefix.int(), 16),
        "commit_indices": (walk.accept_index, torch.arange(48, device="cuda").view(3, 16), 50),
        "topk_logprobs": (torch.randn(2, 15, 900, device="cuda"), 4),
    }
    for name, args in calls.items():
        op = getattr(torch.ops.ddtree, name).default
        outputs = op(*args)
        assert len(_storages(outputs)) == sum(1 for t in outputs if t.numel()), name
        assert all(t._base is None for t in outputs), f"{name} returns views"
        torch.library.opcheck(op, args, test_utils=("test_schema",))


@pytest.mark.parametrize(("batch", "max_depth", "k", "budget"), [(48, 15, 8, 64), (5, 4, 3, 40)])
def test_cuda_walk_and_commit_match_reference(
    batch: int, max_depth: int, k: int, budget: int
) -> None:
    logp, ids = random_topk(batch, max_depth, k, 10, seed=budget, device="cuda")  # small vocab
    roots = torch.zeros(batch, dtype=torch.long, device="cuda")
    tree = ops.build_tree(logp, ids, roots, torch.zeros(batch, device="cuda"), budget)
    gen = torch.Generator(device="cuda").manual_seed(5)
    # Follow some child (first or random) 80% of the time, else a random token: deep paths.
    child = tree.tokens.gather(1, tree.retrieve_next_token.clamp(min=0))
    noise = torch.randint(0, 10, (batch, budget + 1), device="cuda", generator=gen)
    follow = torch.rand(batch, budget + 1, device="cuda", generator=gen) < 0.8
    target = torch.where(follow, child, noise)
    got = ops.verify_walk(tree.tokens, tree.parents, target, max_depth)
    want = reference.verify_walk(tree.tokens, tree.parents, target, max_depth)
    _assert_same(got, want)
    assert int(got.accept_len.max()) > 2  # the case exercises real paths
    cache_loc = torch.randperm(batch * (budget + 1), device="cuda").view(batch, -1)
    lens = torch.arange(batch, device="cuda") * 3
    for prefix in (lens, lens.int()):  # SGLang's sequence lengths: new_seq_lens keeps the dtype
        _assert_same(
            ops.walk_accept(tree.tokens, tree.parents, target, max_depth, prefix),
            reference.walk_accept(tree.tokens, tree.parents, target, max_depth, prefix),
        )
    assert torch.equal(ops.path_rows(got.accept_index, budget + 1),
                       reference.path_rows(want.accept_index, budget + 1))  # fmt: skip
    rows = cache_loc.numel() + 3  # with trailing alignment padding
    _assert_same(
        ops.commit_indices(got.accept_index, cache_loc, rows),
        reference.commit_indices(want.accept_index, cache_loc, rows),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_sample_tokens_greedy_matches_reference(dtype: torch.dtype) -> None:
    gen = torch.Generator(device="cuda").manual_seed(2)
    logits = torch.randint(-4, 4, (300, 5003), device="cuda", generator=gen).to(dtype)
    zeros = torch.zeros(300, device="cuda")
    u = torch.rand(300, device="cuda", generator=gen)
    assert torch.equal(
        ops.sample_tokens(logits, zeros, u), reference.sample_tokens(logits, zeros, u)
    )


def test_cuda_sample_tokens_follow_the_target_distribution() -> None:
    vocab, draws = 7, 400_000
    logits = torch.tensor([1.0, 0.0, -1.0, 2.0, 0.5, float("-inf"), -3.0], device="cuda")
    temperature = 0.8
    probs = torch.softmax(logits / temperature, dim=-1)
    gen = torch.Generator(device="cuda").manual_seed(3)
    u = torch.rand(draws, device="cuda", generator=gen)
    got = ops.sample_tokens(
        logits.expand(draws, -1), torch.full((draws,), temperature, device="cuda"), u
    )
    freq = torch.bincount(got, minlength=vocab).double() / draws
    sigma = (probs.double() * (1 - probs.double()) / draws).sqrt()
    assert freq[5] == 0  # masked token never drawn
    assert ((freq - probs.double()).abs() <= 5 * sigma + 1e-12).all(), (freq, probs)


def test_cuda_sampled_walk_emits_tokens_from_the_target_distribution() -> None:
    # Root children carry tokens 0 and 1; node 1 (token 0) has children. Emitted tokens must follow
    # the target's autoregressive distribution: first ~ p(root), second | first=0 ~ p(node 1).
    draws, vocab = 200_000, 4
    logp = torch.log(torch.tensor([[[0.6, 0.4], [0.7, 0.3]]], device="cuda"))
    ids = torch.tensor([[[0, 1], [2, 3]]], device="cuda")
    tree = ops.build_tree(
        logp.expand(draws, -1, -1).contiguous(), ids.expand(draws, -1, -1).contiguous(),
        torch.full((draws,), 3, device="cuda"), torch.zeros(draws, device="cuda"), 4,
    )  # fmt: skip
    n = 5
    target_logits = torch.randn(
        n, vocab, device="cuda", generator=torch.Generator("cuda").manual_seed(4)
    )
    rows = target_logits.repeat(draws, 1)
    u = torch.rand(draws * n, device="cuda", generator=torch.Generator("cuda").manual_seed(5))
    sampled = ops.sample_tokens(rows, torch.ones(draws * n, device="cuda"), u).view(draws, n)
    walk = ops.verify_walk(tree.tokens, tree.parents, sampled, 2)
    probs = torch.softmax(target_logits.double(), dim=-1)
    first = walk.accept_tokens[:, 0]
    freq = torch.bincount(first, minlength=vocab).double() / draws
    assert ((freq - probs[0]).abs() <= 5 * (probs[0] * (1 - probs[0]) / draws).sqrt()).all()
    node = int((tree.tokens[0] == 0).nonzero()[0])  # the child of the root with token 0
    cond = walk.accept_tokens[first == 0, 1]
    freq2 = torch.bincount(cond, minlength=vocab).double() / cond.numel()
    p2 = probs[node]
    assert ((freq2 - p2).abs() <= 5 * (p2 * (1 - p2) / cond.numel()).sqrt()).all()


def test_cuda_ops_capture_and_replay_in_a_cuda_graph() -> None:
    batch, max_depth, k, budget, vocab = 8, 15, 8, 64, 32000
    n = budget + 1
    gen = torch.Generator(device="cuda").manual_seed(6)
    logits = torch.empty(batch, max_depth, vocab, device="cuda", dtype=torch.bfloat16)
    roots = torch.empty(batch, dtype=torch.long, device="cuda")
    prefix = torch.empty(batch, dtype=torch.long, device="cuda")
    target = torch.empty(batch, n, dtype=torch.long, device="cuda")
    cache_loc = torch.arange(batch * n, device="cuda").view(batch, n)
    rows = batch * n  # the verify rows the commit orders
    prefix_sum = 100 * batch  # host-known, as SGLang's seq_lens_sum

    def fill() -> None:
        logits.copy_(torch.randn(logits.shape, device="cuda", generator=gen) * 3)
        roots.copy_(torch.randint(0, vocab, (batch,), device="cuda", generator=gen))
        prefix.copy_(torch.full((batch,), 100, device="cuda"))

    def step() -> tuple[tuple[torch.Tensor, ...] | torch.Tensor, ...]:
        topk = ops.topk_logprobs(logits, k)
        tree = ops.build_tree(topk.logp, topk.ids, roots, prefix, budget, prefix_sum)
        # Target "agrees" with the draft's best child where the root says so: deterministic.
        target.copy_(
            torch.where(
                tree.retrieve_next_token >= 0,
                tree.tokens.gather(1, tree.retrieve_next_token.clamp(min=0)),
                0,
            )
        )
        walk = ops.verify_walk(tree.tokens, tree.parents, target, max_depth)
        commit = ops.commit_indices(walk.accept_index, cache_loc, rows)
        accept = ops.walk_accept(tree.tokens, tree.parents, target, max_depth, prefix)
        return topk, tree, walk, commit, accept, ops.path_rows(walk.accept_index, n)

    fill()
    step()  # warm up (workspace, lazy init) outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step()
    for _ in range(3):
        fill()
        graph.replay()
        torch.cuda.synchronize()
        topk = reference.topk_logprobs(logits, k)
        assert torch.equal(outs[0].ids, topk.ids)
        tree = reference.build_tree(outs[0].logp, outs[0].ids, roots, prefix, budget, prefix_sum)
        _assert_same(outs[1], tree)
        walk = reference.verify_walk(tree.tokens, tree.parents, target, max_depth)
        _assert_same(outs[2], walk)
        assert int(walk.accept_len.min()) >= 2  # the target follows first children
        _assert_same(outs[3], reference.commit_indices(walk.accept_index, cache_loc, rows))
        _assert_same(outs[4], reference.walk_accept(tree.tokens, tree.parents, target, max_depth,
                                                    prefix))  # fmt: skip
        assert torch.equal(outs[5], reference.path_rows(walk.accept_index, n))


def test_cuda_build_tree_takes_a_column_of_the_block_ids() -> None:
    """What shadow-linear passes (`block_ids[:, 0]`, a strided view) runs on the CUDA path too."""
    logp, ids = random_topk(4, 15, 1, 300, seed=9, device="cuda")
    block_ids = torch.randint(0, 300, (4, 16), device="cuda")
    prefix = torch.tensor([5, 0, 17, 3], device="cuda")
    got = ops.build_tree(logp, ids, block_ids[:, 0], prefix, 15, int(prefix.sum()))
    want = reference.build_tree(logp, ids, block_ids[:, 0].contiguous(), prefix, 15, 25)
    _assert_same(got, want)
