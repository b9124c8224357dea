"""Input generators for the DDTree op tests (CPU by default, any device on request)."""

from __future__ import annotations

import torch


def random_topk(
    batch: int, max_depth: int, k: int, vocab: int, seed: int, device: str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted log-probs and distinct ids [B, L, K], as the drafter's top-k would give."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, max_depth, vocab, generator=gen) * 3
    logp, ids = torch.log_softmax(logits, -1).topk(k, dim=-1)
    return logp.to(device), ids.to(device)


def tied_topk(
    batch: int, max_depth: int, k: int, seed: int, device: str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs drawn from {0, -1, -2, -3} (sorted): path sums tie exactly and often."""
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.randint(0, 4, (batch, max_depth, k), generator=gen).float()
    logp = logp.sort(dim=-1, descending=True).values
    ids = torch.stack(
        [torch.randperm(1000, generator=gen)[:k] for _ in range(batch * max_depth)]
    ).view(batch, max_depth, k)
    return logp.to(device), ids.to(device)
