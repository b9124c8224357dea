"""TEST DOUBLE: a planted verify bug, so the tree gate can be shown to catch a real one.

`take_a_wrong_child` turns a correct verify walk into one that also accepts the last accepted
node's first child, a draft token the target did not pick: the wrong-child bug a tree walk can
have (following the drafter's best branch instead of the target's choice). A server whose
`ddtree_kernels.ops` walks (`verify_walk`, and `walk_accept`, the same walk in DFlash's accept
outputs) are wrapped by `install()` commits such tokens whenever the tree offers one, so the gate, which judges divergences from DFLASH by the target's own scores,
must fail it. The GPU lab plants it in one server through `plant/sitecustomize.py`.

Never imported by the product: only the lab and tests load it.
"""

from __future__ import annotations

from typing import Any

import torch
from ddtree_kernels.reference import as_accept
from ddtree_kernels.types import Accept, Walk

BUGS = ("wrong_child",)  # the values DDTREE_LAB_PLANTED_BUG may take


def take_a_wrong_child(
    walk: Walk, tokens: torch.Tensor, parents: torch.Tensor, target_tokens: torch.Tensor
) -> Walk:
    """`walk` extended, per request, by the last accepted node's first child (its lowest node
    index) when it has one, a slot is left and the target did not choose it.

    The committed tokens then hold that child's draft token where the target's belonged, and
    the bonus is the target's token at the child, as a walk that had taken it would give.
    Runs on CPU or CUDA tensors [B, N] (a loop on the host: test code, not a kernel).
    """
    device = walk.accept_index.device
    index, length, committed, bonus = (t.detach().cpu().clone() for t in walk)
    tokens, parents, target = tokens.cpu(), parents.cpu(), target_tokens.cpu()
    slots = index.shape[1]
    for b in range(index.shape[0]):
        n = int(length[b])
        last = int(index[b, n - 1])
        children = (parents[b] == last).nonzero().flatten()
        if n == slots or children.numel() == 0:
            continue
        child = int(children[0])
        if int(tokens[b, child]) == int(target[b, last]):
            continue  # the target's own choice: a correct walk takes it, nothing wrong to add
        index[b, n] = child
        committed[b, n - 1] = tokens[b, child]
        committed[b, n] = target[b, child]
        length[b] = n + 1
        bonus[b] = target[b, child]
    return Walk(*(t.to(device) for t in (index, length, committed, bonus)))


def install() -> None:
    """Wrap `ddtree_kernels.ops.verify_walk` and `walk_accept` with `take_a_wrong_child` in this
    process.

    The patched SGLang looks the ops up on the module at every verify (`ops.verify_walk`,
    `self._ddtree_ops.verify_walk`; the module's greedy accept `ops.walk_accept`), so replacing
    the module attributes reaches them.
    """
    from ddtree_kernels import ops

    correct = ops.verify_walk

    def planted(
        tokens: torch.Tensor, parents: torch.Tensor, target_tokens: torch.Tensor, max_depth: int
    ) -> Walk:
        walk = correct(tokens, parents, target_tokens, max_depth)
        return take_a_wrong_child(walk, tokens, parents, target_tokens)

    def planted_accept(*args: Any) -> Accept:  # ops.walk_accept's arguments, positional
        *walk_args, prefix_lens = args
        return as_accept(planted(*walk_args), prefix_lens)

    ops.verify_walk = planted
    ops.walk_accept = planted_accept
