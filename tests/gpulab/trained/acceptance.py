"""The acceptance a DFLASH server will report, predicted without the server.

For each prompt the target's greedy continuation is the reference (what verify at temperature 0
commits). Serving starts with the first generated token as the anchor at position P (context:
the prompt); each step drafts argmax of block positions 1..B-1, accepts the leading drafts that
equal the greedy continuation, commits those plus the target's bonus token, and anchors the next
block on that bonus token. The mean committed tokens per step (bonus included, at most B) is
SGLang's logged `accept len`. The drafter's blocks for every anchor come from one masked
forward per prompt; the walk itself (`walk`) is plain Python, so tests check it by hand.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gpulab.trained.blocks import build_blocks
from gpulab.trained.drafter import Drafter
from gpulab.trained.generate import greedy_answers, target_features
from gpulab.trained.loop import autocast
from gpulab.trained.tokenizer import EOS_ID


def walk(drafts: Sequence[Sequence[int]], generated: Sequence[int]) -> list[int]:
    """Tokens committed per verify step, walking generated [G] with drafts[i] = the B-1 drafts
    of the block anchored on generated[i]. The first token (prefill's) is not a step; a step's
    commit is its accepted drafts plus the bonus, cut at the end of generated."""
    commits = []
    index, last = 0, len(generated) - 1
    while index < last:
        reference = generated[index + 1 :]
        accepted = 0
        for draft, token in zip(drafts[index], reference, strict=False):
            if draft != token:
                break
            accepted += 1
        commits.append(min(accepted + 1, last - index))
        index += accepted + 1
    return commits


@dataclass(frozen=True)
class PromptAcceptance:
    """One prompt's predicted walk."""

    name: str
    answer: list[int]  # the greedy continuation walked (cut after EOS)
    steps: int

    @property
    def generated(self) -> int:
        return len(self.answer)

    @property
    def mean(self) -> float:
        """Committed tokens per step: tokens after prefill's first, over verify steps."""
        return (self.generated - 1) / self.steps if self.steps else 0.0


@torch.inference_mode()
def block_drafts(
    drafter: Drafter, target: torch.nn.Module, sequence: torch.Tensor, first: int
) -> torch.Tensor:
    """Drafts [G, B-1] for anchors at positions first .. S-1 of sequence [S] (one forward)."""
    config = drafter.config
    tokens = sequence[None]
    length = tokens.shape[1]
    features = target_features(target, tokens, config.target_layer_ids)
    anchors = torch.arange(first, length, device=tokens.device)[None]
    blocks = build_blocks(tokens, anchors, config.block_size, config.mask_token_id)
    embed = target.get_input_embeddings().weight
    lm_head = target.get_output_embeddings().weight
    positions = torch.arange(length, device=tokens.device)[None]
    hidden = drafter(features, positions, embed[blocks.ids], blocks.positions, blocks.mask)
    hidden = hidden.view(anchors.shape[1], config.block_size, -1)[:, 1:]
    return (hidden @ lm_head.T.to(hidden.dtype)).argmax(-1)


def predict(
    drafter: Drafter,
    target: torch.nn.Module,
    prompts: Sequence[tuple[str, list[int]]],
    max_new_tokens: int,
    device: torch.device,
) -> list[PromptAcceptance]:
    """The predicted walk of each (name, prompt ids) at greedy decoding of max_new_tokens."""
    drafter.to(device).eval()
    target.to(device).eval()
    answers = greedy_answers(target, [ids for _, ids in prompts], max_new_tokens, EOS_ID, device)
    results = []
    for (name, ids), generated in zip(prompts, answers, strict=True):
        sequence = torch.tensor(ids + generated, device=device)
        with autocast(device):
            drafts = block_drafts(drafter, target, sequence, len(ids)).cpu().tolist()
        results.append(PromptAcceptance(name, generated, len(walk(drafts, generated))))
    return results


def summary(results: Sequence[PromptAcceptance]) -> dict[str, object]:
    """Pooled mean (all committed tokens over all steps, as the server's log averages) and
    the per-prompt means."""
    tokens = sum(result.generated - 1 for result in results)
    steps = sum(result.steps for result in results)
    return {
        "mean_accept_len": round(tokens / steps, 3) if steps else None,
        "per_prompt": {result.name: round(result.mean, 3) for result in results},
    }
