"""The drafter's checkpoint and config are what SGLang 0.5.11's DFlash loader reads.

The expected names and config fields are the research doc's (research/dflash-training.md,
sections 1.1, 1.2 and gotchas G1-G5), written out here rather than taken from the module.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gpulab.trained.drafter import DraftConfig, Drafter, config_json, export, load

CONFIG = DraftConfig(
    hidden_size=64,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    head_dim=32,
    intermediate_size=96,
    target_layer_ids=(1, 3, 4),
    num_target_layers=6,
    block_size=16,
    mask_token_id=1,
    vocab_size=128,
)


def sglang_names(
    h: int, k: int, q: int, kv: int, d: int, i: int, layers: int
) -> dict[str, tuple[int, ...]]:
    """SGLang's DFlash checkpoint tensors and shapes (research doc 1.2): hidden h, k target
    layers, q = heads * d and kv = kv_heads * d wide projections, intermediate i."""
    names = {"fc.weight": (h, k * h), "hidden_norm.weight": (h,), "norm.weight": (h,)}
    for n in range(layers):
        p = f"layers.{n}."
        names |= {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "self_attn.q_norm.weight": (d,),
            p + "self_attn.k_norm.weight": (d,),
            p + "mlp.gate_proj.weight": (i, h),
            p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i),
        }
    return names


def test_export_writes_exactly_sglangs_tensors_in_bf16(tmp_path: Path) -> None:
    export(Drafter(CONFIG), tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    assert {name: tuple(t.shape) for name, t in tensors.items()} == sglang_names(
        64, 3, 64, 32, 32, 96, layers=2
    )
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}


def test_config_has_the_fields_sglang_0_5_11_needs() -> None:
    config = config_json(CONFIG)
    assert config["architectures"] == ["DFlashDraftModel"]
    assert config["model_type"] == "qwen3"
    assert config["num_hidden_layers"] == 2 and config["head_dim"] == 32  # explicit head_dim
    assert config["block_size"] == 16 and config["hidden_act"] == "silu"
    assert config["rope_theta"] == 1e6 and config["rope_parameters"]["rope_theta"] == 1e6  # G1
    assert config["num_target_layers"] == 6  # G2
    assert config["dflash_config"] == {
        "block_size": 16,
        "target_layer_ids": [1, 3, 4],
        "num_target_layers": 6,
        "mask_token": "<|MASK|>",
        "mask_token_id": 1,
    }
    assert set(config["layer_types"]) == {"full_attention"}  # G5


@pytest.mark.parametrize("ids", [(1, 5), (3, 1), (2, 2)])
def test_config_refuses_layer_ids_sglang_cannot_capture(ids: tuple[int, ...]) -> None:
    bad = DraftConfig(**{**CONFIG.__dict__, "target_layer_ids": ids})  # 5 = L-1 (G3), unsorted
    with pytest.raises(ValueError, match="target_layer_ids"):
        config_json(bad)


def test_load_reads_back_what_export_wrote(tmp_path: Path) -> None:
    drafter = Drafter(CONFIG)
    drafter.init_weights()
    export(drafter, tmp_path)
    loaded = load(tmp_path)
    assert loaded.config == CONFIG
    assert json.loads((tmp_path / "config.json").read_text()) == config_json(CONFIG)
    for name, tensor in drafter.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor.to(torch.bfloat16).float())
