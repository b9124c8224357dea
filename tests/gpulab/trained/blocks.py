"""DFlash's training blocks: anchors, the block tokens, the attention mask and the labels.

Pure torch, so tests run it without transformers. The rules are SGLang's serving semantics
(research doc, sections 1.4 and 2): a block is `[token[a], MASK x (B-1)]` at positions
`a .. a+B-1`; its queries see every context key at a position strictly before the anchor a
(by position, never by block index: overlapping anchors must not leak) and all B keys of their
own block, in both directions; block position k predicts token[a+k] (same position, k=0 has no
label). Keys are laid out `[context (S) | blocks (A*B)]`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

DECAY_GAMMA = {16: 7.0, 10: 5.0, 8: 4.0}  # SpecForge's exp(-(k-1)/gamma) per block size


@dataclass(frozen=True)
class Blocks:
    """A batch of blocks over N sequences of S context tokens, A anchors each (M = A*B)."""

    ids: torch.Tensor  # [N, M] block token ids: anchor token, then mask ids
    positions: torch.Tensor  # [N, M] absolute positions a .. a+B-1
    mask: torch.Tensor  # [N, M, S+M] bool: True where a block query may attend
    labels: torch.Tensor  # [N, M] token[a+k] (0 where out of range)
    weights: torch.Tensor  # [N, M] float loss weight (0: no label)


def sample_anchors(
    loss_mask: torch.Tensor, count: int, block_size: int, generator: torch.Generator
) -> torch.Tensor:
    """`count` distinct anchors per row, sorted: supervised positions a with a <= S - B.

    loss_mask [N, S] bool. Raises ValueError when a row has fewer eligible positions.
    """
    _, length = loss_mask.shape
    eligible = loss_mask.clone()
    eligible[:, length - block_size + 1 :] = False
    fewest = int(eligible.sum(1).min())
    if fewest < count:
        raise ValueError(f"a sequence has {fewest} anchor positions, fewer than {count}")
    scores = torch.rand(loss_mask.shape, generator=generator, device=loss_mask.device)
    scores = scores.masked_fill(~eligible, -1.0)
    return scores.topk(count, dim=1).indices.sort(dim=1).values


def decay_weights(block_size: int, gamma: float | None = None) -> torch.Tensor:
    """Loss weight of block offsets 0..B-1: 0 for the anchor, exp(-(k-1)/gamma) after it."""
    gamma = gamma or DECAY_GAMMA.get(block_size, 7.0)
    weights = torch.tensor([math.exp(-(k - 1) / gamma) for k in range(block_size)])
    weights[0] = 0.0
    return weights


def build_blocks(
    tokens: torch.Tensor,
    anchors: torch.Tensor,
    block_size: int,
    mask_id: int,
    loss_mask: torch.Tensor | None = None,
    decay: torch.Tensor | None = None,
) -> Blocks:
    """Blocks for tokens [N, S] at anchors [N, A]; see the module docstring for the rules.

    loss_mask [N, S] (default: all supervised) and decay [B] (default: all ones after k=0)
    weight the labels; a label past the sequence's end gets weight 0.
    """
    length = tokens.shape[1]
    device = tokens.device
    offsets = torch.arange(block_size, device=device)
    positions = anchors[:, :, None] + offsets  # [N, A, B]
    in_range = positions < length
    clamped = positions.clamp(max=length - 1)
    ids = torch.full_like(positions, mask_id)
    ids[:, :, 0] = tokens.gather(1, anchors)
    labels = tokens.gather(1, clamped.flatten(1)).view_as(positions) * in_range
    if loss_mask is None:
        loss_mask = torch.ones_like(tokens, dtype=torch.bool)
    if decay is None:
        decay = (offsets > 0).float()
    supervised = loss_mask.gather(1, clamped.flatten(1)).view_as(positions) & in_range
    weights = supervised.float() * decay.to(device)
    mask = block_attention_mask(anchors, length, block_size)
    return Blocks(
        ids=ids.flatten(1),
        positions=positions.flatten(1),
        mask=mask,
        labels=labels.flatten(1),
        weights=weights.flatten(1),
    )


def block_attention_mask(anchors: torch.Tensor, context_len: int, block_size: int) -> torch.Tensor:
    """[N, A*B, S + A*B] bool: context keys at positions < anchor, plus the query's own block."""
    count, num_anchors = anchors.shape
    device = anchors.device
    context = torch.arange(context_len, device=device)[None, None, :] < anchors[:, :, None]
    context = context[:, :, None, :].expand(count, num_anchors, block_size, context_len)
    block_of = torch.arange(num_anchors * block_size, device=device) // block_size
    own = (block_of[:, None] == block_of[None, :]).expand(count, -1, -1)
    return torch.cat([context.reshape(count, num_anchors * block_size, context_len), own], dim=2)
