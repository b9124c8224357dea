"""Reference tree build against the brute force, hand-checked cases and the chain case."""

from __future__ import annotations

import re

import pytest
import torch
from brute_force import brute_tree
from inputs import random_topk, tied_topk

from ddtree_kernels import reference
from ddtree_kernels.types import Tree


def _build(logp: torch.Tensor, ids: torch.Tensor, budget: int, prefix: list[int]) -> Tree:
    batch = logp.shape[0]
    roots = torch.arange(batch) + 500
    prefix_lens = torch.tensor(prefix)
    return reference.build_tree(logp, ids, roots, prefix_lens, budget, sum(prefix))


def _assert_matches_brute(tree: Tree, logp: torch.Tensor, ids: torch.Tensor, budget: int) -> None:
    n = budget + 1
    for b in range(logp.shape[0]):
        want = brute_tree(logp[b], ids[b], 500 + b, budget)
        real = len(want.tokens)
        assert int(tree.num_nodes[b]) == real
        assert tree.tokens[b, :real].tolist() == want.tokens
        assert tree.parents[b, :real].tolist() == want.parents
        assert tree.depths[b, :real].tolist() == want.depths
        for i in range(real):
            row = tree.ancestor_mask[b, i].nonzero().flatten().tolist()
            assert set(row) == want.ancestors[i]
            children = [j for j in range(real) if want.parents[j] == i]
            first = min(children, key=lambda j: want.ranks[j]) if children else -1
            assert int(tree.retrieve_next_token[b, i]) == first
            same_parent = [j for j in range(1, real) if i and want.parents[j] == want.parents[i]]
            sibs = [j for j in same_parent if want.ranks[j] == want.ranks[i] + 1]
            assert int(tree.retrieve_next_sibling[b, i]) == (sibs[0] if sibs else -1)
        pad = slice(real, n)
        assert (tree.parents[b, pad] == -1).all()
        assert (tree.retrieve_index[b, pad] == -1).all()
        assert tree.retrieve_index[b, :real].tolist() == [b * n + i for i in range(real)]


@pytest.mark.parametrize(
    ("max_depth", "k", "budget"),
    [(3, 3, 10), (4, 2, 7), (1, 4, 3), (1, 4, 9), (5, 1, 3), (3, 2, 20), (2, 3, 12), (4, 3, 30)],
)
def test_build_tree_matches_brute_force_on_random_inputs(
    max_depth: int, k: int, budget: int
) -> None:
    logp, ids = random_topk(3, max_depth, k, vocab=50, seed=max_depth * 100 + k * 10 + budget)
    tree = _build(logp, ids, budget, [3, 0, 11])
    _assert_matches_brute(tree, logp, ids, budget)


@pytest.mark.parametrize(("max_depth", "k", "budget"), [(3, 3, 12), (4, 2, 15), (2, 4, 9)])
def test_build_tree_matches_brute_force_with_tied_scores(
    max_depth: int, k: int, budget: int
) -> None:
    for seed in range(4):
        logp, ids = tied_topk(3, max_depth, k, seed)
        tree = _build(logp, ids, budget, [1, 2, 3])
        _assert_matches_brute(tree, logp, ids, budget)


def test_build_tree_pads_when_budget_exceeds_possible_nodes() -> None:
    logp, ids = random_topk(2, 2, 2, vocab=10, seed=1)  # 2 + 4 = 6 possible nodes
    tree = _build(logp, ids, 10, [4, 5])
    assert tree.num_nodes.tolist() == [7, 7]
    assert (tree.tokens[:, 7:] == 0).all()
    assert (tree.depths[:, 7:] == 0).all()
    assert (tree.positions[:, 7:] == torch.tensor([[4], [5]])).all()
    assert (tree.retrieve_next_token[:, 7:] == -1).all()
    eye = torch.eye(11, dtype=torch.bool)
    assert torch.equal(tree.ancestor_mask[:, 7:], eye[7:].expand(2, 4, 11))


def test_build_tree_hand_checked_small_case() -> None:
    # depth 1: ids 10 (-0.1), 11 (-1.0); depth 2: ids 20 (-0.2), 21 (-0.5)
    logp = torch.tensor([[[-0.1, -1.0], [-0.2, -0.5]]])
    ids = torch.tensor([[[10, 11], [20, 21]]])
    tree = reference.build_tree(logp, ids, torch.tensor([7]), torch.tensor([100]), 4, 100)
    # pops: (0)=-0.1, (0,0)=-0.3, (0,1)=-0.6, (1)=-1.0; (1,0)=-1.2 is cut by the budget
    assert tree.tokens.tolist() == [[7, 10, 20, 21, 11]]
    assert tree.parents.tolist() == [[-1, 0, 1, 1, 0]]
    assert tree.depths.tolist() == [[0, 1, 2, 2, 1]]
    assert tree.positions.tolist() == [[100, 101, 102, 102, 101]]
    assert tree.retrieve_next_token.tolist() == [[1, 2, -1, -1, -1]]
    assert tree.retrieve_next_sibling.tolist() == [[-1, 4, 3, -1, -1]]
    assert tree.ancestor_mask.int().tolist() == [
        [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 0, 1, 0], [1, 0, 0, 0, 1]]
    ]


def test_build_tree_breaks_score_ties_by_smaller_rank_tuple() -> None:
    # (0,1) and (1,0) both score -1; (0,1) < (1,0) lexicographically, so it is emitted first.
    logp = torch.tensor([[[0.0, -1.0], [0.0, -1.0]]])
    ids = torch.tensor([[[10, 11], [20, 21]]])
    tree = reference.build_tree(logp, ids, torch.tensor([7]), torch.tensor([0]), 4, None)
    assert tree.tokens.tolist() == [[7, 10, 20, 21, 11]]
    assert tree.parents.tolist() == [[-1, 0, 1, 1, 0]]


def test_build_tree_is_the_argmax_chain_when_k_is_one() -> None:
    max_depth = 6
    logits = torch.randn(2, max_depth, 30, generator=torch.Generator().manual_seed(3))
    topk = reference.topk_logprobs(logits, 1)
    tree = reference.build_tree(
        topk.logp, topk.ids, torch.tensor([1, 2]), torch.tensor([9, 4]), max_depth, 13
    )
    argmax = logits.argmax(dim=-1)
    assert torch.equal(tree.tokens[:, 1:], argmax)
    assert tree.parents.tolist() == [list(range(-1, max_depth))] * 2
    assert torch.equal(tree.positions, torch.tensor([[9], [4]]) + torch.arange(max_depth + 1))
    causal = torch.ones(max_depth + 1, max_depth + 1, dtype=torch.bool).tril()
    assert torch.equal(tree.ancestor_mask, causal.expand(2, -1, -1))
    assert tree.retrieve_next_token[:, :-1].tolist() == [list(range(1, max_depth + 1))] * 2
    assert (tree.retrieve_next_sibling == -1).all()


def test_build_tree_custom_mask_is_prefix_ones_then_ancestor_mask_per_request() -> None:
    logp, ids = random_topk(3, 3, 2, vocab=20, seed=5)
    prefix = [2, 0, 5]
    tree = _build(logp, ids, 6, prefix)
    blocks = []
    for b, p in enumerate(prefix):
        rows = []
        for i in range(7):
            rows.extend([True] * p + tree.ancestor_mask[b, i].tolist())
        blocks.extend(rows)
    assert tree.custom_mask.tolist() == blocks


def test_build_tree_skips_custom_mask_without_prefix_sum() -> None:
    logp, ids = random_topk(1, 2, 2, vocab=20, seed=6)
    tree = reference.build_tree(logp, ids, torch.tensor([1]), torch.tensor([3]), 3, None)
    assert tree.custom_mask.numel() == 0


def test_build_tree_rejects_bad_dtypes() -> None:
    logp, ids = random_topk(1, 2, 2, vocab=20, seed=6)
    with pytest.raises(ValueError, match="float32"):
        reference.build_tree(logp.double(), ids, torch.tensor([1]), torch.tensor([3]), 3)


def test_reference_refuses_the_views_the_cuda_kernel_refuses() -> None:
    """A column of the block ids is a strided view: the kernel refuses it, so must the reference.

    The shadow-linear verify once passed `block_ids[:, 0]` as `root_tokens`; the reference took
    it and every CPU test passed, then the first request on a GPU server crashed the scheduler.
    """
    logp, ids = random_topk(3, 4, 2, vocab=50, seed=4)
    block_ids = torch.arange(3 * 16).view(3, 16)
    with pytest.raises(ValueError, match="ddtree: root_tokens must be contiguous"):
        reference.build_tree(logp, ids, block_ids[:, 0], torch.zeros(3, dtype=torch.long), 5)
    with pytest.raises(ValueError, match="ddtree: logp must be contiguous"):
        reference.build_tree(
            logp.transpose(1, 2).contiguous().transpose(1, 2), ids, block_ids[:, 0].clone(),
            torch.zeros(3, dtype=torch.long), 5,
        )  # fmt: skip


@pytest.mark.parametrize(("max_depth", "k"), [(4, 3), (6, 2), (3, 4)])
def test_build_tree_matches_brute_force_at_budget_63(max_depth: int, k: int) -> None:
    """Budget 63 (a 64-token verify, the widest the 0.5.11 patch set serves), tree and mask."""
    logp, ids = random_topk(2, max_depth, k, vocab=50, seed=63 + max_depth)
    tree = _build(logp, ids, 63, [5, 0])
    _assert_matches_brute(tree, logp, ids, 63)
    assert tree.custom_mask.numel() == 64 * 5 + 2 * 64 * 64
    first = tree.custom_mask[: 64 * (5 + 64)].view(64, 5 + 64)
    assert first[:, :5].all()
    assert torch.equal(first[:, 5:], tree.ancestor_mask[0])


@pytest.mark.parametrize("off", [0, 7, -3])
def test_the_flat_mask_from_a_bound_has_a_true_tail_and_from_a_short_sum_is_cut(off: int) -> None:
    """The mask's blocks follow `prefix_lens`; its length follows the host's sum: an upper bound
    (worker v2 under overlap scheduling) leaves a True tail, a short sum keeps the first entries."""
    logp, ids = random_topk(3, 4, 3, vocab=50, seed=11)
    prefix = torch.tensor([5, 0, 2])
    roots = torch.zeros(3, dtype=torch.long)
    exact = reference.build_tree(logp, ids, roots, prefix, 9, 7).custom_mask
    got = reference.build_tree(logp, ids, roots, prefix, 9, 7 + off).custom_mask
    assert got.numel() == exact.numel() + 10 * off
    assert torch.equal(got[: exact.numel()], exact[: got.numel()])
    assert bool(got[exact.numel() :].all())


def test_build_tree_at_budget_63_with_the_drafters_depth_and_topk_8() -> None:
    """L = 15, K = 8, budget 63: every node's parent precedes it and its depth is one more."""
    logp, ids = random_topk(3, 15, 8, vocab=200, seed=7)
    tree = _build(logp, ids, 63, [3, 0, 11])
    assert tree.num_nodes.tolist() == [64, 64, 64]
    parents, depths = tree.parents[:, 1:], tree.depths[:, 1:]
    assert (parents < torch.arange(1, 64)).all()
    assert (parents >= 0).all()
    assert torch.equal(depths, tree.depths.gather(1, parents) + 1)
    assert tree.ancestor_mask.sum(-1).tolist() == (tree.depths + 1).tolist()


@pytest.mark.parametrize(
    ("max_depth", "k", "budget", "refusal"),
    [
        (15, 8, 512, "1 <= budget <= 511; got 512"),
        (15, 8, 0, "1 <= budget <= 511; got 0"),
        (4, 17, 63, "1 <= K <= 16; got 17"),
        (33, 2, 63, "1 <= L <= 32; got 33"),
        (16, 16, 63, "cannot key L=16 ranks of K=16 in 64 bits"),
    ],
)
def test_reference_refuses_the_sizes_the_cuda_kernel_refuses(
    max_depth: int, k: int, budget: int, refusal: str
) -> None:
    """The kernel's TORCH_CHECKs on budget, K and L (tree.cu), as the reference's ValueErrors."""
    logp, ids = random_topk(1, max_depth, k, vocab=40, seed=1)
    with pytest.raises(ValueError, match=re.escape(refusal)):
        reference.build_tree(logp, ids, torch.tensor([1]), torch.tensor([3]), budget)


def test_reference_takes_the_largest_sizes_the_cuda_kernel_takes() -> None:
    for max_depth, k, budget in ((15, 16, 63), (32, 2, 40), (2, 3, 511)):
        logp, ids = random_topk(1, max_depth, k, vocab=40, seed=2)
        tree = reference.build_tree(logp, ids, torch.tensor([1]), torch.tensor([3]), budget)
        assert tree.tokens.shape == (1, budget + 1)
