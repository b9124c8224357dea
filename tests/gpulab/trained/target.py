"""The target LM: its Qwen3 config, its pretraining loop on packed code windows, its export.

The config is what SGLang's Qwen3ForCausalLM serves (explicit head_dim; rope_theta 1e6 written
both flat and as rope_parameters, which SGLang's Qwen3 reads; untied embeddings, so the drafter
borrows a real lm_head). Training keeps float32 master weights under bf16 autocast on CUDA
(float32 on a CPU, where the toy runs); the export is bf16 safetensors plus the tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from gpulab.trained.loop import StageRecord, adamw, autocast, schedule
from gpulab.trained.sizes import Sizes
from gpulab.trained.tokenizer import EOS_ID

ROPE_THETA = 1_000_000.0
MAX_POSITIONS = 2048


def target_config(sizes: Sizes) -> dict[str, Any]:
    """The target's config.json content (before transformers adds its own fields)."""
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": sizes.vocab_size,
        "hidden_size": sizes.hidden_size,
        "intermediate_size": sizes.intermediate_size,
        "num_hidden_layers": sizes.num_layers,
        "num_attention_heads": sizes.num_heads,
        "num_key_value_heads": sizes.num_kv_heads,
        "head_dim": sizes.head_dim,
        "hidden_act": "silu",
        "attention_bias": False,
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-6,
        "rope_theta": ROPE_THETA,
        "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA},
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "initializer_range": 0.02,
        "use_sliding_window": False,
        "bos_token_id": EOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": EOS_ID,
    }


def build_target(config: dict[str, Any]) -> torch.nn.Module:
    """A freshly initialised float32 Qwen3ForCausalLM with SDPA attention."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    fields = {
        key: value for key, value in config.items() if key not in ("architectures", "torch_dtype")
    }
    model = Qwen3ForCausalLM(Qwen3Config(**fields, attn_implementation="sdpa"))
    return model.float()


def train_target(
    model: torch.nn.Module,
    windows: torch.Tensor,
    sizes: Sizes,
    device: torch.device,
    generator: torch.Generator,
) -> StageRecord:
    """Next-token training on random packed windows [N, seq_len]; counts trained tokens."""
    record = StageRecord(steps_planned=sizes.target_steps, cap_s=sizes.target_cap_s)
    model.to(device).train()
    optimizer = adamw(model.parameters(), sizes.target_lr, 0.1, device)
    windows = windows.to(device)
    step = 0
    while step < sizes.target_steps and not record.over_cap():
        schedule(optimizer, step, sizes.target_steps, sizes.target_lr)
        rows = torch.randint(len(windows), (sizes.target_batch,), generator=generator)
        batch = windows[rows.to(device)]
        with autocast(device):
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        record.tokens += batch.numel()
        if step % record.log_every() == 0 or step == sizes.target_steps - 1:
            record.losses.append((step, loss.item()))
        step += 1
    return record.finish(step)


@torch.no_grad()
def evaluate_loss(
    model: torch.nn.Module, windows: torch.Tensor, batch: int, device: torch.device
) -> float:
    """Mean next-token loss over windows (the held-out split's, for training.json)."""
    model.eval()
    losses = []
    for start in range(0, len(windows), batch):
        chunk = windows[start : start + batch].to(device)
        with autocast(device):
            losses.append(float(model(input_ids=chunk, labels=chunk).loss) * len(chunk))
    return sum(losses) / max(1, len(windows))


def save_target(model: torch.nn.Module, config: dict[str, Any], directory: Path) -> None:
    """save_pretrained in bf16 safetensors, then our config fields written over transformers'.

    Rewriting keeps rope_theta and rope_parameters both present (a transformers version may
    write only one) and the dtype bf16, so every SGLang and transformers version reads the same.
    """
    model.to(torch.bfloat16).save_pretrained(str(directory), safe_serialization=True)
    path = directory / "config.json"
    written = json.loads(path.read_text())
    written.update(config)
    written["dtype"] = "bfloat16"
    path.write_text(json.dumps(written, indent=2) + "\n")
