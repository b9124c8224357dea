"""The DFlash drafter as a plain torch module whose state_dict names are SGLang's checkpoint names.

It mirrors SGLang 0.5.11's `DFlashDraftModel` (research doc, section 1): Qwen3 pre-norm layers
with per-head q/k RMSNorm, neox RoPE at base 1e6 (0.5.11 reads no other value, gotcha G1) and a
SiLU MLP; no embedding and no lm_head (the target's frozen ones are used). The target's features
become `ctx = hidden_norm(fc(features))`; every layer turns that same ctx into context keys and
values with its own k_proj/v_proj (no input_layernorm), then k_norm and RoPE at the context
token's position. One forward takes an explicit boolean mask over the keys [context | blocks],
so the same code trains many blocks per sequence and drafts a single serving block. The module
imports no transformers, so CPU tests use it directly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

ROPE_THETA = 1_000_000.0
MASK_TOKEN = "<|MASK|>"


@dataclass(frozen=True)
class DraftConfig:
    """The drafter's shapes and its DFlash settings (what config.json records)."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    target_layer_ids: tuple[int, ...]
    num_target_layers: int
    block_size: int
    mask_token_id: int
    vocab_size: int
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6

    @classmethod
    def from_json(cls, config: dict[str, Any]) -> DraftConfig:
        dflash = config["dflash_config"]
        return cls(
            hidden_size=config["hidden_size"],
            num_layers=config["num_hidden_layers"],
            num_heads=config["num_attention_heads"],
            num_kv_heads=config["num_key_value_heads"],
            head_dim=config["head_dim"],
            intermediate_size=config["intermediate_size"],
            target_layer_ids=tuple(dflash["target_layer_ids"]),
            num_target_layers=config["num_target_layers"],
            block_size=config["block_size"],
            mask_token_id=dflash["mask_token_id"],
            vocab_size=config["vocab_size"],
            max_position_embeddings=config["max_position_embeddings"],
            rms_norm_eps=config["rms_norm_eps"],
        )


def config_json(config: DraftConfig) -> dict[str, Any]:
    """SGLang 0.5.11's draft config.json (research doc 1.1 and gotchas G1-G5).

    Explicit head_dim (transformers would fill 128), rope_theta 1e6 with a matching
    rope_parameters, num_target_layers at the top level and in dflash_config (G2), every layer
    full attention (G5).
    """
    ids = list(config.target_layer_ids)
    if ids != sorted(set(ids)) or ids[-1] > config.num_target_layers - 2 or ids[0] < 0:
        raise ValueError(f"target_layer_ids {ids} must be distinct, ascending, <= L-2 (G3)")
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "intermediate_size": config.intermediate_size,
        "hidden_act": "silu",
        "attention_bias": False,
        "rms_norm_eps": config.rms_norm_eps,
        "max_position_embeddings": config.max_position_embeddings,
        "rope_theta": ROPE_THETA,
        "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA},
        "layer_types": ["full_attention"] * config.num_layers,
        "vocab_size": config.vocab_size,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "block_size": config.block_size,
        "num_target_layers": config.num_target_layers,
        "dflash_config": {
            "block_size": config.block_size,
            "target_layer_ids": ids,
            "num_target_layers": config.num_target_layers,
            "mask_token": MASK_TOKEN,
            "mask_token_id": config.mask_token_id,
        },
    }


class RMSNorm(nn.Module):
    """Qwen3's RMSNorm: normalise in float32, scale in the input's dtype."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Neox-style RoPE tables for positions [N, T]: cos and sin [N, 1, T, head_dim], float32."""
    exponent = torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim
    inv_freq = 1.0 / (ROPE_THETA**exponent)
    angles = positions.float()[..., None] * inv_freq
    angles = torch.cat([angles, angles], dim=-1)[:, None]
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [N, heads, T, d] (rotate-half, as HF Qwen3 and SGLang's neox rope)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


class Attention(nn.Module):
    """Qwen3 attention whose keys are [context K/V | the block's own K/V]."""

    def __init__(self, config: DraftConfig) -> None:
        super().__init__()
        hidden, heads, kv_heads, dim = (
            config.hidden_size,
            config.num_heads,
            config.num_kv_heads,
            config.head_dim,
        )
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim
        self.q_proj = nn.Linear(hidden, heads * dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * dim, bias=False)
        self.o_proj = nn.Linear(heads * dim, hidden, bias=False)
        self.q_norm = RMSNorm(dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(dim, config.rms_norm_eps)

    def _heads(self, x: torch.Tensor, count: int) -> torch.Tensor:
        return x.view(*x.shape[:2], count, self.head_dim).transpose(1, 2)

    def keys_values(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """K (k_norm, then RoPE) and V [N, kv_heads, T, d] of x [N, T, H]."""
        k = apply_rope(self.k_norm(self._heads(self.k_proj(x), self.kv_heads)), cos, sin)
        return k, self._heads(self.v_proj(x), self.kv_heads)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        context: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor,
    ) -> torch.Tensor:
        cos, sin = rope
        q = apply_rope(self.q_norm(self._heads(self.q_proj(x), self.heads)), cos, sin)
        k, v = self.keys_values(x, cos, sin)
        k = torch.cat([context[0], k], dim=2).to(q.dtype)
        v = torch.cat([context[1], v], dim=2).to(q.dtype)
        repeat = self.heads // self.kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])
        return self.o_proj(out.transpose(1, 2).reshape(*x.shape[:2], -1))


class MLP(nn.Module):
    def __init__(self, config: DraftConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    """A Qwen3 pre-norm decoder layer (the names SGLang loads)."""

    def __init__(self, config: DraftConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        context: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, context, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Drafter(nn.Module):
    """DFlashDraftModel's weights and forward; state_dict() names are the checkpoint's."""

    def __init__(self, config: DraftConfig) -> None:
        super().__init__()
        self.config = config
        hidden = config.hidden_size
        self.fc = nn.Linear(len(config.target_layer_ids) * hidden, hidden, bias=False)
        self.hidden_norm = RMSNorm(hidden, config.rms_norm_eps)
        self.layers = nn.ModuleList(Layer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(hidden, config.rms_norm_eps)

    def init_weights(self, std: float = 0.02) -> None:
        """Normal(0, std) projections, unit norms (as a Qwen3 layer is initialised)."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=std)

    def forward(
        self,
        features: torch.Tensor,
        context_positions: torch.Tensor,
        block_embeds: torch.Tensor,
        block_positions: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """Final-normed hidden states [N, M, H] of the block queries.

        features [N, S, K*H] (target features of the context tokens), context_positions [N, S],
        block_embeds [N, M, H] (target embeddings of the block ids), block_positions [N, M],
        mask [N, M, S+M] bool over keys [context | blocks] (True: may attend).
        """
        ctx = self.hidden_norm(self.fc(features))
        ctx_rope = rope_cos_sin(context_positions, self.config.head_dim)
        block_rope = rope_cos_sin(block_positions, self.config.head_dim)
        x = block_embeds
        for layer in self.layers:
            context = layer.self_attn.keys_values(ctx, *ctx_rope)
            x = layer(x, block_rope, context, mask)
        return self.norm(x)


def export(drafter: Drafter, directory: Path) -> None:
    """Write config.json and model.safetensors (bf16) into directory, as SGLang loads them."""
    directory.mkdir(parents=True, exist_ok=True)
    config = config_json(drafter.config)
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tensors = {
        name: tensor.detach().to(torch.bfloat16).contiguous().cpu()
        for name, tensor in drafter.state_dict().items()
    }
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})


def load(directory: Path) -> Drafter:
    """The drafter a draft dir holds (float32 on the CPU); every checkpoint tensor is required."""
    config = DraftConfig.from_json(json.loads((directory / "config.json").read_text()))
    drafter = Drafter(config)
    state = load_file(str(directory / "model.safetensors"))
    drafter.load_state_dict({name: tensor.float() for name, tensor in state.items()}, strict=True)
    return drafter


@torch.no_grad()
def reference_block_logits(
    draft_dir: Path,
    embed: torch.Tensor,
    lm_head: torch.Tensor,
    features: torch.Tensor,
    block_ids: torch.Tensor,
) -> torch.Tensor:
    """SGLang's DFLASH draft step for one request, by this module: float32 logits [B, V].
    features [S, K*H]: target features (residual stream after each target layer in
    target_layer_ids, concatenated in ascending layer order) of context tokens at positions
    0..S-1; block_ids [B]: the anchor (last verified token) at position S, then mask ids, at
    positions S..S+B-1; embed/lm_head [V, H] the target's. Logits = lm_head(norm(hidden))
    for every block position (SGLang's draft tokens are argmax over positions 1..B-1)."""
    drafter = load(Path(draft_dir)).float().eval()
    context_len, block = features.shape[0], block_ids.shape[0]
    hidden = drafter(
        features.float()[None],
        torch.arange(context_len)[None],
        embed.float()[block_ids][None],
        torch.arange(context_len, context_len + block)[None],
        torch.ones(1, block, context_len + block, dtype=torch.bool),
    )
    return hidden[0] @ lm_head.float().T
