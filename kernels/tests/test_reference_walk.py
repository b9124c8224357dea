"""Reference verify walk, commit indices and target sampling."""

from __future__ import annotations

import itertools

import pytest
import torch
from brute_force import linear_acceptance
from inputs import random_topk

from ddtree_kernels import reference


def _hand_tree() -> reference.Tree:
    # root 7 -> {10 (node 1) -> {20 (node 2), 21 (node 3)}, 11 (node 4)}
    logp = torch.tensor([[[-0.1, -1.0], [-0.2, -0.5]]])
    ids = torch.tensor([[[10, 11], [20, 21]]])
    return reference.build_tree(logp, ids, torch.tensor([7]), torch.tensor([0]), 4)


def test_verify_walk_hand_checked_tree() -> None:
    tree = _hand_tree()
    # target after root says 10 -> node 1; after node 1 says 21 -> node 3; after node 3 says 99.
    target = torch.tensor([[10, 21, 5, 99, 6]])
    walk = reference.verify_walk(tree.tokens, tree.parents, target, max_depth=2)
    assert walk.accept_index.tolist() == [[0, 1, 3]]
    assert walk.accept_len.tolist() == [3]
    assert walk.accept_tokens.tolist() == [[10, 21, 99]]
    assert walk.bonus.tolist() == [99]


def test_verify_walk_accepts_only_root_when_no_child_matches() -> None:
    tree = _hand_tree()
    target = torch.tensor([[12, 21, 5, 99, 6]])
    walk = reference.verify_walk(tree.tokens, tree.parents, target, max_depth=2)
    assert walk.accept_index.tolist() == [[0, -1, -1]]
    assert walk.accept_len.tolist() == [1]
    assert walk.accept_tokens.tolist() == [[12, -1, -1]]
    assert walk.bonus.tolist() == [12]


def test_verify_walk_equals_linear_acceptance_for_the_chain() -> None:
    max_depth, batch = 8, 16
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(batch, max_depth, 12, generator=gen)
    topk = reference.topk_logprobs(logits, 1)
    roots = torch.randint(0, 12, (batch,), generator=gen)
    tree = reference.build_tree(topk.logp, topk.ids, roots, torch.zeros(batch), max_depth)
    draft = tree.tokens[:, 1:]
    # Target agrees with the draft for a random number of positions, then diverges.
    agree = torch.randint(0, max_depth + 1, (batch,), generator=gen)
    target = torch.randint(0, 12, (batch, max_depth + 1), generator=gen)
    for b in range(batch):
        target[b, : agree[b]] = draft[b, : agree[b]]
    walk = reference.verify_walk(tree.tokens, tree.parents, target, max_depth)
    for b in range(batch):
        accepted = linear_acceptance(draft[b].tolist(), target[b].tolist())
        assert int(walk.accept_len[b]) == accepted + 1
        assert walk.accept_index[b, : accepted + 1].tolist() == list(range(accepted + 1))
        assert int(walk.bonus[b]) == int(target[b, accepted])


def test_verify_walk_follows_target_tokens_on_random_trees() -> None:
    logp, ids = random_topk(8, 4, 3, vocab=6, seed=9)  # small vocab: many matches
    tree = reference.build_tree(logp, ids, torch.zeros(8, dtype=torch.long), torch.zeros(8), 20)
    target = torch.randint(0, 6, (8, 21), generator=torch.Generator().manual_seed(2))
    walk = reference.verify_walk(tree.tokens, tree.parents, target, 4)
    for b in range(8):
        path = walk.accept_index[b, : walk.accept_len[b]].tolist()
        for prev, node in itertools.pairwise(path):
            assert int(tree.parents[b, node]) == prev
            assert int(tree.tokens[b, node]) == int(target[b, prev])
        last = path[-1]
        children = (tree.parents[b] == last).nonzero().flatten().tolist()
        assert all(int(tree.tokens[b, c]) != int(walk.bonus[b]) for c in children)
        assert int(walk.bonus[b]) == int(target[b, last])


@pytest.mark.parametrize("prefix_dtype", [torch.int32, torch.int64])
def test_walk_accept_gives_dflashs_accept_outputs_of_the_walk(prefix_dtype: torch.dtype) -> None:
    """Two requests of the hand-checked tree: one takes nodes 1 and 3, one only the root."""
    tree = _hand_tree()
    tokens, parents = tree.tokens.expand(2, -1), tree.parents.expand(2, -1)
    target = torch.tensor([[10, 21, 5, 99, 6], [12, 21, 5, 99, 6]])
    prefix = torch.tensor([40, 7], dtype=prefix_dtype)
    got = reference.walk_accept(tokens, parents, target, 2, prefix)
    assert got.accepted_drafts.tolist() == [2, 0]
    assert got.commit_lens.tolist() == [3, 1]
    assert got.accepted_drafts.dtype == got.commit_lens.dtype == torch.int32
    assert got.bonus.tolist() == [99, 12]
    assert got.out_tokens.tolist() == [[10, 21, 99], [12, 0, 0]]  # committed first, 0 after
    assert got.new_seq_lens.tolist() == [43, 8]
    assert got.new_seq_lens.dtype == prefix_dtype
    assert got.accept_index.tolist() == [[0, 1, 3], [0, -1, -1]]


def test_commit_indices_moves_accepted_kv_to_consecutive_slots() -> None:
    accept_index = torch.tensor([[0, 2, 5, -1], [0, -1, -1, -1]])
    cache_loc = torch.arange(12).view(2, 6) * 2 + 100  # ascending slots per request
    commit = reference.commit_indices(accept_index, cache_loc)
    # Padding moves the request's root slot onto itself: fixed-length lists, no host filter.
    assert commit.kv_source.tolist() == [100, 104, 110, 100, 112, 112, 112, 112]
    assert commit.kv_target.tolist() == [100, 102, 104, 100, 112, 112, 112, 112]
    assert (commit.kv_target <= commit.kv_source).all()  # an ascending copy reads before writing
    assert commit.row_order.numel() == 0  # no rows asked for


@pytest.mark.parametrize(("path_width", "padding"), [(6, 0), (4, 0), (4, 3)])
def test_commit_indices_row_order_puts_each_path_first_and_keeps_every_other_row(
    path_width: int, padding: int
) -> None:
    """Row b * N + j takes the j-th accepted node's row; rows past a path, and trailing
    alignment padding, keep their own."""
    accept_index = torch.tensor([[0, 2, 5, -1, -1, -1], [0, 1, -1, -1, -1, -1]])[:, :path_width]
    cache_loc = torch.zeros(2, 6, dtype=torch.int64)
    rows = 12 + padding
    order = reference.commit_indices(accept_index, cache_loc, rows).row_order
    assert order.tolist() == [0, 2, 5, 3, 4, 5, 6, 7, 8, 9, 10, 11, *range(12, rows)]


def test_commit_indices_refuses_fewer_rows_than_the_windows_hold() -> None:
    with pytest.raises(ValueError, match="at least B \\* N = 6"):
        reference.commit_indices(torch.zeros(2, 3, dtype=torch.int64), torch.zeros(2, 3), 5)


def _path_first(accept_index: list[list[int]], width: int) -> list[int]:
    """The definition, spelled out: each path, then the rest of its window in node order."""
    rows = []
    for b, path in enumerate(accept_index):
        nodes = [n for n in path if n >= 0]
        rest = [i for i in range(width) if i not in nodes]
        rows += [b * width + i for i in nodes + rest]
    return rows


def test_path_rows_put_each_walks_path_first_on_random_trees() -> None:
    g = torch.Generator().manual_seed(4)
    for width, depth in ((16, 15), (24, 15), (64, 7)):
        logp, ids = random_topk(5, depth, 4, 6, seed=width)
        tree = reference.build_tree(logp, ids, torch.zeros(5, dtype=torch.int64),
                                    torch.zeros(5, dtype=torch.int64), width - 1)  # fmt: skip
        target = torch.randint(0, 6, (5, width), generator=g)
        walk = reference.verify_walk(tree.tokens, tree.parents, target, depth)
        rows = reference.path_rows(walk.accept_index, width)
        assert rows.tolist() == _path_first(walk.accept_index.tolist(), width)


def test_sample_tokens_is_argmax_with_ties_to_smaller_id_at_zero_temperature() -> None:
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [5.0, 1.0, 2.0, 5.0]])
    got = reference.sample_tokens(logits, torch.zeros(2), torch.tensor([0.3, 0.9]))
    assert got.tolist() == [1, 0]


def test_sample_tokens_inverts_the_softmax_cdf() -> None:
    logits = torch.tensor([0.0, 1.0, -2.0, 0.5, -30.0])
    probs = torch.softmax(logits / 0.7, dim=-1)
    draws = 20000
    u = (torch.arange(draws) + 0.5) / draws  # evenly spaced: counts are exact up to rounding
    got = reference.sample_tokens(logits.expand(draws, -1), torch.full((draws,), 0.7), u)
    freq = torch.bincount(got, minlength=5).float() / draws
    torch.testing.assert_close(freq, probs, atol=2 / draws, rtol=0)
