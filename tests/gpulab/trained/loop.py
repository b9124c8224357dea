"""What the training loops share: autocast, the learning-rate schedule, a stage's record.

A stage stops at its step count or at its wall-clock cap, whichever comes first; the record
says which, so a capped run on a slow machine is visible in training.json, never silent.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

WARMUP_FRACTION = 0.05
FINAL_LR_FRACTION = 0.1


def lr_at(step: int, steps: int, peak: float) -> float:
    """Linear warmup over the first 5% of steps, then cosine down to 10% of peak."""
    warmup = max(1, int(steps * WARMUP_FRACTION))
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, steps - warmup))
    return peak * (
        FINAL_LR_FRACTION + (1 - FINAL_LR_FRACTION) * 0.5 * (1 + math.cos(math.pi * progress))
    )


def adamw(
    params: Iterable[torch.nn.Parameter], peak: float, weight_decay: float, device: torch.device
) -> torch.optim.AdamW:
    """The optimizer both stages train with (fused kernels on CUDA)."""
    return torch.optim.AdamW(
        params, lr=peak, betas=(0.9, 0.95), weight_decay=weight_decay, fused=device.type == "cuda"
    )


def schedule(optimizer: torch.optim.Optimizer, step: int, steps: int, peak: float) -> None:
    """Set every group's rate for `step` (`lr_at`)."""
    for group in optimizer.param_groups:
        group["lr"] = lr_at(step, steps, peak)


def autocast(device: torch.device) -> torch.autocast:
    """bf16 autocast on CUDA; disabled on a CPU (float32 there is faster and exact)."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


@dataclass
class StageRecord:
    """One training stage's outcome, as training.json shows it."""

    steps_planned: int
    cap_s: float
    steps_done: int = 0
    capped: bool = False  # stopped by the wall-clock cap before steps_planned
    seconds: float = 0.0
    tokens: int = 0  # tokens processed (the loop says which tokens it counts)
    losses: list[tuple[int, float]] = field(default_factory=list)  # (step, loss) at intervals
    started: float = field(default_factory=time.monotonic, repr=False)

    def log_every(self) -> int:
        """Steps between recorded losses: about 20 records per stage."""
        return max(1, self.steps_planned // 20)

    def over_cap(self) -> bool:
        return time.monotonic() - self.started > self.cap_s

    def finish(self, steps_done: int) -> StageRecord:
        self.steps_done = steps_done
        self.capped = steps_done < self.steps_planned
        self.seconds = round(time.monotonic() - self.started, 2)
        return self

    def summary(self) -> dict[str, object]:
        return {
            "steps_planned": self.steps_planned,
            "steps_done": self.steps_done,
            "capped": self.capped,
            "cap_s": self.cap_s,
            "seconds": self.seconds,
            "tokens": self.tokens,
            "tokens_per_s": round(self.tokens / self.seconds) if self.seconds else None,
            "losses": [[step, round(loss, 4)] for step, loss in self.losses],
        }
