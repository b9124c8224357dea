"""Weight-less model directories the stand-in's SGLang parser reads (SGLang 0.5.11 opens config.json).

TEST DOUBLE support: a 2-layer Qwen3 `config.json` for the target and a DFlash draft config whose
`block_size` gives the verify width (also used by `tests/patching/sglang_args_probe.py`).
"""

from __future__ import annotations

import json

TARGET_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 1024,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def model_configs(block_size: int = 16) -> dict[str, str]:
    """`{"target/config.json": text, "draft/config.json": text}` for a model root."""
    draft = dict(TARGET_CONFIG, num_hidden_layers=1, architectures=["DFlashDraftModel"])
    draft["block_size"] = block_size
    draft["dflash_config"] = {"target_layer_ids": [0, 1]}
    return {
        "target/config.json": json.dumps(TARGET_CONFIG, indent=1),
        "draft/config.json": json.dumps(draft, indent=1),
    }
