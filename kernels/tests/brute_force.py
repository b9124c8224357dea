"""Independent brute-force tree builder for the tests: enumerate every rank path, sort, cut.

Scores are summed in fp32 in path order (the reference's stated convention), and the order is
(score descending, rank tuple ascending). Nothing here shares code with ddtree_kernels.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class BruteTree:
    """Expected per-request outputs, unpadded (length = number of real nodes)."""

    tokens: list[int]
    parents: list[int]
    depths: list[int]
    ranks: list[int]
    ancestors: list[set[int]]


def _path_score(logp: torch.Tensor, path: tuple[int, ...]) -> float:
    score = torch.zeros((), dtype=torch.float32)
    for depth, rank in enumerate(path):
        score = score + logp[depth, rank]
    return float(score)


def brute_tree(logp: torch.Tensor, ids: torch.Tensor, root: int, budget: int) -> BruteTree:
    """Top-`budget` rank paths of one request's `logp`/`ids` [L, K], as a tree."""
    max_depth, k = logp.shape
    paths = [
        p for length in range(1, max_depth + 1) for p in itertools.product(range(k), repeat=length)
    ]
    chosen = sorted(paths, key=lambda p: (-_path_score(logp, p), p))[:budget]
    index = {(): 0}
    tokens, parents, depths, ranks = [root], [-1], [0], [0]
    ancestors: list[set[int]] = [{0}]
    for path in chosen:
        parent = index[path[:-1]]  # KeyError here would mean the top set is not prefix-closed
        index[path] = len(tokens)
        tokens.append(int(ids[len(path) - 1, path[-1]]))
        parents.append(parent)
        depths.append(len(path))
        ranks.append(path[-1])
        ancestors.append(ancestors[parent] | {index[path]})
    return BruteTree(tokens, parents, depths, ranks, ancestors)


def linear_acceptance(draft: list[int], target: list[int]) -> int:
    """DFlash chain acceptance: drafts accepted while draft[i] equals the target's token before it.

    `target[i]` is the target's token after position i of [root, draft...]; returns how many draft
    tokens are accepted.
    """
    accepted = 0
    for i, token in enumerate(draft):
        if token != target[i]:
            break
        accepted += 1
    return accepted
