"""The drafter's training loop: DFlash blocks on the target's own greedy continuations.

The data is the target's greedy continuation of corpus prefixes, not the corpus itself: at
temperature 0 a DFLASH server accepts a draft only where it equals the target's greedy token, so
that is what the drafter must predict (SpecForge and z-lab regenerate responses with the target
for the same reason; research doc, section 2). The loss covers continuation tokens only. Each
step runs the frozen target once for the features of whole sequences, samples anchors among the
supervised positions, and trains every block of the batch in one masked drafter forward, with
SpecForge's exp(-(k-1)/gamma) weight on block offset k.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gpulab.trained.blocks import build_blocks, decay_weights, sample_anchors
from gpulab.trained.drafter import Drafter
from gpulab.trained.generate import target_features
from gpulab.trained.loop import StageRecord, adamw, autocast, schedule
from gpulab.trained.sizes import Sizes


def block_loss(
    drafter: Drafter,
    target: torch.nn.Module,
    tokens: torch.Tensor,
    loss_mask: torch.Tensor,
    anchors: torch.Tensor,
) -> torch.Tensor:
    """Weighted cross-entropy of the drafter's blocks at anchors [N, A] of tokens [N, S]."""
    config = drafter.config
    with torch.no_grad():
        features = target_features(target, tokens, config.target_layer_ids)
        embed = target.get_input_embeddings().weight
        lm_head = target.get_output_embeddings().weight
    decay = decay_weights(config.block_size).to(tokens.device)
    blocks = build_blocks(
        tokens, anchors, config.block_size, config.mask_token_id, loss_mask, decay
    )
    count, length = tokens.shape
    positions = torch.arange(length, device=tokens.device).expand(count, length)
    hidden = drafter(features, positions, embed[blocks.ids], blocks.positions, blocks.mask)
    chosen = blocks.weights > 0
    logits = (hidden[chosen] @ lm_head.T.to(hidden.dtype)).float()
    losses = F.cross_entropy(logits, blocks.labels[chosen], reduction="none")
    weights = blocks.weights[chosen]
    return (losses * weights).sum() / weights.sum()


def train_drafter(
    drafter: Drafter,
    target: torch.nn.Module,
    sequences: torch.Tensor,
    prompt_len: int,
    sizes: Sizes,
    device: torch.device,
    generator: torch.Generator,
) -> StageRecord:
    """Train on sequences [N, S] = prompt (prompt_len) + greedy continuation; target frozen.

    Counts block tokens (anchors x block size) as the stage's tokens.
    """
    record = StageRecord(steps_planned=sizes.draft_steps, cap_s=sizes.draft_cap_s)
    target.to(device).eval().requires_grad_(False)
    drafter.to(device).train()
    optimizer = adamw(drafter.parameters(), sizes.draft_lr, 0.01, device)
    sequences = sequences.to(device)
    loss_mask = torch.zeros(sequences.shape[1], dtype=torch.bool, device=device)
    loss_mask[prompt_len:] = True
    step = 0
    while step < sizes.draft_steps and not record.over_cap():
        schedule(optimizer, step, sizes.draft_steps, sizes.draft_lr)
        rows = torch.randint(len(sequences), (sizes.draft_batch,), generator=generator)
        tokens = sequences[rows.to(device)]
        mask = loss_mask.expand_as(tokens)
        anchors = sample_anchors(mask.cpu(), sizes.anchors_per_seq, sizes.block_size, generator)
        with autocast(device):
            loss = block_loss(drafter, target, tokens, mask, anchors.to(device))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        record.tokens += anchors.numel() * sizes.block_size
        if step % record.log_every() == 0 or step == sizes.draft_steps - 1:
            record.losses.append((step, loss.item()))
        step += 1
    return record.finish(step)
