"""The planted wrong-child bug (tests/standin/planted_bug.py) on reference trees, and its plant.

The GPU lab proves the tree gate fails a server that commits tokens the target did not pick;
these checks make sure the planted server really does that, so a pass there means the gate
missed it, not that the plant did nothing.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ddtree_kernels import ops, reference
from ddtree_kernels.types import Tree, Walk
from inputs import random_topk
from standin.planted_bug import install, take_a_wrong_child

PLANT = Path(__file__).resolve().parents[1] / "standin" / "plant"


def _hand_tree() -> Tree:
    # root 7 -> {10 (node 1) -> {20 (node 2), 21 (node 3)}, 11 (node 4)}
    logp = torch.tensor([[[-0.1, -1.0], [-0.2, -0.5]]])
    ids = torch.tensor([[[10, 11], [20, 21]]])
    return reference.build_tree(logp, ids, torch.tensor([7]), torch.tensor([0]), 4)


def _walk(tree: Tree, target: torch.Tensor, max_depth: int) -> Walk:
    return reference.verify_walk(tree.tokens, tree.parents, target, max_depth)


def test_the_first_child_the_target_did_not_pick_is_accepted() -> None:
    tree = _hand_tree()
    target = torch.tensor([[10, 22, 5, 99, 6]])  # root -> node 1; after node 1 the target says 22
    planted = take_a_wrong_child(_walk(tree, target, 2), tree.tokens, tree.parents, target)
    assert planted.accept_index.tolist() == [[0, 1, 2]]  # node 2 (token 20), not the target's 22
    assert planted.accept_len.tolist() == [3]
    assert planted.accept_tokens.tolist() == [[10, 20, 5]]  # 20 committed where 22 belonged
    assert planted.bonus.tolist() == [5]  # the target's token at node 2


def test_a_walk_ending_on_a_leaf_or_on_the_targets_child_is_unchanged() -> None:
    tree = _hand_tree()
    leaf = torch.tensor([[10, 21, 5, 99, 6]])  # root -> 1 -> 3, a leaf
    correct = _walk(tree, leaf, 2)
    same = take_a_wrong_child(correct, tree.tokens, tree.parents, leaf)
    assert all(torch.equal(a, b) for a, b in zip(same, correct, strict=True))
    # A walk stopped short at node 1 whose first child is the target's choice: nothing wrong
    # to add (only a truncated walk can end there).
    chosen = torch.tensor([[10, 20, 5, 99, 6]])
    short = Walk(torch.tensor([[0, 1, -1]]), torch.tensor([2]), torch.tensor([[10, 20, -1]]),
                 torch.tensor([20]))  # fmt: skip
    kept = take_a_wrong_child(short, tree.tokens, tree.parents, chosen)
    assert all(torch.equal(a, b) for a, b in zip(kept, short, strict=True))


def test_random_batched_trees_commit_one_wrong_token_each_where_a_child_waits() -> None:
    batch, depth = 16, 4
    logp, ids = random_topk(batch, depth, 3, vocab=6, seed=5)
    roots = torch.zeros(batch, dtype=torch.long)
    tree = reference.build_tree(logp, ids, roots, torch.zeros(batch), 12)
    target = torch.randint(0, 6, (batch, 13), generator=torch.Generator().manual_seed(3))
    correct = _walk(tree, target, depth)
    planted = take_a_wrong_child(correct, tree.tokens, tree.parents, target)
    grown = 0
    for b in range(batch):
        n, last = (
            int(correct.accept_len[b]),
            int(correct.accept_index[b, correct.accept_len[b] - 1]),
        )
        children = (tree.parents[b] == last).nonzero().flatten().tolist()
        if not children:
            assert int(planted.accept_len[b]) == n
            continue
        grown += 1
        child = children[0]
        assert int(planted.accept_len[b]) == n + 1
        path = planted.accept_index[b, : n + 1].tolist()
        assert path == [*correct.accept_index[b, :n].tolist(), child]
        assert int(tree.tokens[b, child]) != int(target[b, last])  # a token the target did not pick
        for j, (node, nxt) in enumerate(itertools.pairwise(path)):
            assert int(tree.parents[b, nxt]) == node
            assert int(planted.accept_tokens[b, j]) == int(tree.tokens[b, nxt])
        assert int(planted.accept_tokens[b, n]) == int(planted.bonus[b]) == int(target[b, child])
        assert planted.accept_index[b, n + 1 :].tolist() == [-1] * (depth - n)
    assert 0 < grown < batch  # both kinds of request were in the batch


def test_a_full_path_has_no_slot_left() -> None:
    # max_depth 1 gives two slots: the walk fills them (root, node 1) and node 1's child,
    # which the target did not pick (21, not 20), would need a third.
    logp = torch.tensor([[[-0.1], [-0.2]]])
    tree = reference.build_tree(logp, torch.tensor([[[10], [20]]]), torch.tensor([7]),
                                torch.tensor([0]), 2)  # fmt: skip
    target = torch.tensor([[10, 21, 30]])
    walk = _walk(tree, target, 1)
    assert walk.accept_len.tolist() == [2]
    same = take_a_wrong_child(walk, tree.tokens, tree.parents, target)
    assert same.accept_index.tolist() == [[0, 1]]


def test_install_changes_what_both_walks_of_ops_return(monkeypatch: pytest.MonkeyPatch) -> None:
    """The module's greedy accept walks through `walk_accept`, v1 sets through `verify_walk`:
    the plant reaches both, or a gate run against it would pass as "the gate missed it"."""
    monkeypatch.setattr(ops, "verify_walk", ops.verify_walk)  # restored after the test
    monkeypatch.setattr(ops, "walk_accept", ops.walk_accept)
    tree = _hand_tree()
    target = torch.tensor([[10, 22, 5, 99, 6]])
    prefix = torch.tensor([30])
    assert ops.verify_walk(tree.tokens, tree.parents, target, 2).accept_len.tolist() == [2]
    assert ops.walk_accept(tree.tokens, tree.parents, target, 2, prefix).commit_lens.tolist() == [2]
    install()
    walk = ops.verify_walk(tree.tokens, tree.parents, target, 2)
    assert walk.accept_index.tolist() == [[0, 1, 2]]
    accept = ops.walk_accept(tree.tokens, tree.parents, target, 2, prefix)
    assert accept.accept_index.tolist() == [[0, 1, 2]]
    assert accept.commit_lens.tolist() == [3]
    assert accept.out_tokens.tolist() == [[10, 20, 5]]  # 20 committed where 22 belonged
    assert accept.new_seq_lens.tolist() == [33]


_PROBE = """
import torch
from ddtree_kernels import ops, reference
logp = torch.tensor([[[-0.1, -1.0], [-0.2, -0.5]]])
tree = reference.build_tree(logp, torch.tensor([[[10, 11], [20, 21]]]), torch.tensor([7]),
                            torch.tensor([0]), 4)
walk = ops.verify_walk(tree.tokens, tree.parents, torch.tensor([[10, 22, 5, 99, 6]]), 2)
print(walk.accept_len.item())
"""


def _probe(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    other = tmp_path / "other"  # a sitecustomize the plant shadows: it must still run
    other.mkdir(exist_ok=True)
    (other / "sitecustomize.py").write_text("import sys; print('other ran', file=sys.stderr)\n")
    path = os.pathsep.join([str(PLANT), str(other)])
    return subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": path, **env},
    )  # fmt: skip


def test_the_plant_wraps_verify_walk_only_when_asked(tmp_path: Path) -> None:
    planted = _probe(tmp_path, DDTREE_LAB_PLANTED_BUG="wrong_child")
    assert planted.returncode == 0, planted.stderr
    assert planted.stdout.split() == ["3"]
    assert "ddtree lab: planted bug wrong_child installed in pid" in planted.stderr
    assert "other ran" in planted.stderr
    clean = _probe(tmp_path)
    assert clean.stdout.split() == ["2"]
    assert "planted bug" not in clean.stderr and "other ran" in clean.stderr
    unknown = _probe(tmp_path, DDTREE_LAB_PLANTED_BUG="off_by_one")
    assert unknown.stdout.split() == ["2"]  # Python reports the error and goes on: no marker
    assert "off_by_one" in unknown.stderr and "installed" not in unknown.stderr
