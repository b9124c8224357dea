"""The stand-in's tiny deterministic "target" and "draft", decoded with `ddtree_kernels.reference`.

TEST DOUBLE: real SGLang cannot run without GPUs, so the stand-in server decodes with this toy
instead of a language model. What it keeps from the real thing is what the gates observe:

- the target is greedy over a fixed pseudo-random table (the next token depends on the last
  two), so every speculative scheme that is lossless yields exactly the same tokens; its
  scores (`target_logprobs`, what a prompt-scoring request returns) put that token first and a
  runner-up second, nearly tied with it in a few contexts (`NEAR_TIE_SHARE`), as a bf16 model
  is: a tree that picks the runner-up there (the `flip_near_ties` fault) flips a near-tie,
  one that commits any other token (a planted bug) is far below the target's choice;
- the draft gives, for each of the L = block_size - 1 positions after the root, a distribution
  in which the target's true token sits at rank 0 most of the time, sometimes at rank 1 or 2,
  rarely nowhere near the top (a deterministic hash decides), so a tree with top-k > 1 recovers
  misses a chain cannot: tree acceptance is longer than linear acceptance;
- linear DFlash and DDTREE shadow_linear verify the chain (tree build with top-k 1 and budget L,
  which DDTREE.md says equals the chain), DDTREE tree mode verifies the best-first tree, both
  with the project's reference ops `build_tree` and `verify_walk`.

Each verify pass is paced from its start to a modelled time, so throughput differs between
modes by acceptance and verify width, as on a GPU, and not by CPU load, as long as the toy's own
compute per pass stays below it. The model (`pass_time`) is a roofline in one line: a pass costs
`step_s * (1 + batch_nodes / KNEE_NODES)`, where `batch_nodes` is the tokens verified by every
request in flight (each verifies `budget + 1` nodes, the chain `block_size`; a tree's nodes cost
`tree_cost` times a chain's, for the mask). At batch 1 the fixed cost (weights) dominates, so
the longest acceptance wins and big trees pay off; at batch 32 the verified tokens dominate, so
small trees win and the full-width chain is dearest: what DDTree serving reports. With many
requests in flight on a busy CPU, the toy's own per-pass compute (Python, under the GIL) can
exceed the modelled time; it too grows with the nodes each request verifies, so the order of
the candidates holds while the measured speedups shrink (seen on this project's 2-core machine:
1.7 x at 32 in flight where the model alone gives 2.1 x).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from ddtree_kernels import reference

from standin.planted_bug import take_a_wrong_child

VOCAB = 64
_SEED = 20261130


def _table() -> torch.Tensor:
    gen = torch.Generator().manual_seed(_SEED)
    return torch.randint(0, VOCAB, (VOCAB, VOCAB), generator=gen)


_TARGET = _table()
# Logits by rank. A calibrated draft: confident where it is right, unsure (near-tied top
# candidates) where it might not be, which is where a best-first tree spends its budget.
_CONFIDENT = torch.tensor([6.0, 1.0, 0.5, 0.2] + [0.0] * (VOCAB - 4))
_UNSURE = torch.tensor([2.0, 1.9, 1.8, 0.3] + [0.0] * (VOCAB - 4))
_MISS_RANK = 9  # beyond any top-k the configs use: the tree cannot recover it either
# (upper bound of a uniform draw, true rank, draft unsure): 55 % confident and right, 20 % right
# but unsure, 17 % second, 5 % third, 3 % a miss. Linear acceptance ~4.1, tree (top-k 4) ~4.7.
_RANKS = ((0.55, 0, False), (0.75, 0, True), (0.92, 1, True), (0.97, 2, True))
KNEE_NODES = 64  # verified tokens per pass at which compute costs as much as the fixed part
# The target's scores: its greedy token at TOP_LOGIT, a runner-up RUNNER_UP_GAP below it, or
# NEAR_TIE_GAP below in NEAR_TIE_SHARE of the contexts, every other token at 0.
TOP_LOGIT = 4.0
RUNNER_UP_GAP = 2.0
NEAR_TIE_GAP = 0.05
NEAR_TIE_SHARE = 0.15


def pass_time(step_s: float, batch_nodes: float) -> float:
    """Modelled seconds of one batched verify pass that checks `batch_nodes` tokens in all."""
    return step_s * (1.0 + batch_nodes / KNEE_NODES)


def tokenize(text: str) -> list[int]:
    """Bytes onto the vocabulary but its last id, which (as a real vocabulary's padding id)
    no text holds: SGLang reports that id as 0 in scored prompts (`standin.server._scored`)."""
    return [b % (VOCAB - 1) for b in text.encode()] or [0]


def detokenize(ids: list[int]) -> str:
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,\n:;"
    return "".join(alphabet[i % len(alphabet)] for i in ids)


def target_next(prev: int, last: int) -> int:
    return int(_TARGET[prev, last])


def near_tie(prev: int, last: int) -> bool:
    """Whether the target's top two are nearly tied after (prev, last)."""
    return _unit(_SEED, -1, prev, last) < NEAR_TIE_SHARE


def runner_up(prev: int, last: int) -> int:
    """The target's second choice after (prev, last): never its first nor the token after it
    (the `tree_divergence` fault's wrong token stays far from the target's choice)."""
    return (target_next(prev, last) + 2 + (7 * prev + last) % (VOCAB - 3)) % VOCAB


def flipped_next(prev: int, last: int) -> int:
    """What a tree verify that flips near-ties picks: the runner-up where the top two tie."""
    return runner_up(prev, last) if near_tie(prev, last) else target_next(prev, last)


def target_logprobs(prev: int, last: int) -> torch.Tensor:
    """[VOCAB] log-probs of the target's next token after (prev, last)."""
    logits = torch.zeros(VOCAB, dtype=torch.float64)
    logits[target_next(prev, last)] = TOP_LOGIT
    gap = NEAR_TIE_GAP if near_tie(prev, last) else RUNNER_UP_GAP
    logits[runner_up(prev, last)] = TOP_LOGIT - gap
    return torch.log_softmax(logits, dim=0)


def _unit(*parts: int) -> float:
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64


def _true_rank(pos: int, last: int, depth: int, collapsed: bool) -> tuple[int, bool]:
    """Where the target's token sits in the draft's row, and whether the draft is unsure."""
    if collapsed:  # no hidden states: the draft guesses blind, confidently wrong
        return _MISS_RANK, False
    u = _unit(_SEED, pos, last, depth)
    for bound, rank, unsure in _RANKS:
        if u < bound:
            return rank, unsure
    return _MISS_RANK, False


def draft_logits(context: list[int], width: int, *, collapsed: bool) -> torch.Tensor:
    """[width, VOCAB] draft logits for the positions after `context` (its last token is the root)."""
    prev, last = (context[-2] if len(context) > 1 else 0), context[-1]
    rows = torch.empty(width, VOCAB)
    for depth in range(width):
        truth = target_next(prev, last)
        rank, unsure = _true_rank(len(context), context[-1], depth, collapsed)
        # A deterministic order of the other tokens; the true one is moved to `rank`.
        order = [(truth + 1 + 7 * j) % VOCAB for j in range(VOCAB)]
        order = [t for t in order if t != truth]
        order.insert(rank, truth)
        rows[depth, torch.tensor(order)] = _UNSURE if unsure else _CONFIDENT
        prev, last = last, truth
    return rows


@dataclass(frozen=True)
class Decoded:
    """One request's output with the speculative counters SGLang reports."""

    output_ids: list[int]
    verify_ct: int
    accepted_drafts: int


@dataclass(frozen=True)
class Decoder:
    """Speculative decoding over the toy model; `topk`/`budget` 1/L is the linear chain."""

    block_size: int
    topk: int
    budget: int
    step_s: float
    tree_cost: float
    collapsed: bool = False
    diverge_at: int | None = None  # emit a wrong token at this output position (fault)
    flip_near_ties: bool = False  # verify picks the runner-up at near-ties (a bf16 flip)
    wrong_child: bool = False  # the walk also takes a child the target did not pick (a bug)

    @property
    def is_tree(self) -> bool:
        return self.topk > 1

    @property
    def nodes(self) -> float:
        """Tokens one request verifies per pass, in chain-token cost units."""
        if self.is_tree:
            return (self.budget + 1) * self.tree_cost
        return float(self.block_size)

    def generate(
        self, prompt: list[int], max_new_tokens: int, in_flight: Callable[[], int] = lambda: 1
    ) -> Decoded:
        """Decode greedily; `in_flight` says how many requests share each pass (the batch)."""
        context = list(prompt)
        out: list[int] = []
        verify_ct = accepted = 0
        width = self.block_size - 1
        while len(out) < max_new_tokens:
            started = time.monotonic()
            committed = self._verify_step(context, width)
            verify_ct += 1
            accepted += len(committed) - 1
            for token in committed[: max_new_tokens - len(out)]:
                if self.diverge_at is not None and len(out) == self.diverge_at:
                    token = (token + 1) % VOCAB
                out.append(token)
                context.append(token)
            # A verify pass takes its modelled time, whatever the CPU spent on the toy above.
            pass_s = pass_time(self.step_s, in_flight() * self.nodes)
            time.sleep(max(0.0, started + pass_s - time.monotonic()))
        return Decoded(out, verify_ct, accepted)

    def _verify_step(self, context: list[int], width: int) -> list[int]:
        """One draft + verify pass: the tokens it commits (accepted drafts, then the bonus)."""
        top = reference.topk_logprobs(
            draft_logits(context, width, collapsed=self.collapsed), self.topk
        )
        tree = reference.build_tree(
            top.logp.unsqueeze(0),
            top.ids.unsqueeze(0),
            torch.tensor([context[-1]]),
            torch.tensor([len(context)]),
            self.budget,
        )
        tokens, parents = tree.tokens[0], tree.parents[0]
        n = int(tree.num_nodes[0])
        before_root = context[-2] if len(context) > 1 else 0
        choose = flipped_next if self.flip_near_ties else target_next
        target = torch.zeros_like(tokens)
        for i in range(n):  # the target's greedy token after each node's path
            parent = int(parents[i])
            prev = before_root if parent < 0 else int(tokens[parent])
            target[i] = choose(prev, int(tokens[i]))
        walk = reference.verify_walk(
            tokens.unsqueeze(0), parents.unsqueeze(0), target.unsqueeze(0), width
        )
        if self.wrong_child:
            walk = take_a_wrong_child(
                walk, tokens.unsqueeze(0), parents.unsqueeze(0), target.unsqueeze(0)
            )
        return [int(t) for t in walk.accept_tokens[0, : int(walk.accept_len[0])]]
