"""Tiny random-weight models for the GPU lab, made on the spot: targets, DFlash drafts, tokenizer.

Two targets: a pure-attention `Qwen3ForCausalLM` and a hybrid `Qwen3NextForCausalLM` (gated
delta-net layers between attention layers), both with a 64-token character vocabulary. A
vocabulary that small makes the target's greedy token fall among the draft's top-k often, so
tree mode accepts through sibling branches: the path a hybrid target's recurrent state can get
wrong. All weights are drawn from a fixed seed and written as safetensors, so every server
start reads the same models. The tokenizer is a real `tokenizers` character vocabulary, so the
validation prompts (text) go through SGLang's tokenizer and detokenizer as in production.

Random weights alone give a drafter that almost never agrees with the target (acceptance
about 1.04), which exercises no tree. So the models are shaped, and only this way: the target's
output rows for four FAVOURED tokens are scaled up, so its greedy token is usually one of them,
in an order the context decides; the drafter (which reads the target's embedding and output
head, as DFlash does) sees the [MASK] embedding pointed at those four rows with falling
weights, so its top-4 is the favoured set, best first, nudged by its small random layer. The
chain then accepts when the target picks the first favoured token; the tree also accepts
through the siblings.

`write_model(root, kind)` needs torch, tokenizers and transformers (the SGLang venv has them);
`write_configs(root, kind)` writes the configs only, which is what CPU tests of argument
resolution need. Command line (on the GPU machine): `python models.py OUT_DIR`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[EOS]", "[MASK]")
CHARACTERS = "abcdefghijklmnopqrstuvwxyz0123456789 .,:;!?'\"()[]{}-_/*+=<>\n"
PAD_ID, UNK_ID, EOS_ID, MASK_ID = range(4)
VOCAB = {token: i for i, token in enumerate([*SPECIAL_TOKENS, *CHARACTERS])}
assert len(VOCAB) == 64, len(VOCAB)

SEED = 20261201
KINDS = ("attention", "hybrid")
DRAFT_BLOCK_SIZE = 16
DRAFT_TARGET_LAYERS = [1, 2]  # target layers whose hidden states feed the drafter
FAVOURED = "eta "  # the tokens the target mostly emits and the drafter ranks first, in order
FAVOURED_SCALE = 3.0  # their output rows' growth in the target
# The drafter's final norm scale: soft enough (top-1 about -0.5 nats, the second -1.2) that the
# best-first tree spends its budget on siblings, not on a 15-deep chain of the top-1 token.
DRAFT_NORM = 0.045

_COMMON: dict[str, Any] = {
    "vocab_size": len(VOCAB),
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    # Twenty times the usual spread: wider logit gaps, fewer bf16 near-ties in greedy decoding.
    "initializer_range": 0.4,
    "pad_token_id": PAD_ID,
    "eos_token_id": EOS_ID,
}

TARGETS: dict[str, dict[str, Any]] = {
    "attention": {**_COMMON, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"},
    "hybrid": {
        **_COMMON,
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        "full_attention_interval": 2,  # layers 1 and 3 attend; 0 and 2 are gated delta-nets
        "partial_rotary_factor": 0.25,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 64,
        "linear_value_head_dim": 64,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 64,
        "shared_expert_intermediate_size": 64,
        "decoder_sparse_step": 1,
        "norm_topk_prob": True,
        "mlp_only_layers": [],
    },
}


def draft_config(kind: str) -> dict[str, Any]:
    """A one-layer DFlash drafter for target `kind` (its hidden size, its layer count)."""
    target = TARGETS[kind]
    return {
        **{k: v for k, v in _COMMON.items() if k != "initializer_range"},
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "num_hidden_layers": 1,
        "num_target_layers": target["num_hidden_layers"],
        "block_size": DRAFT_BLOCK_SIZE,
        "dflash_config": {"target_layer_ids": DRAFT_TARGET_LAYERS, "mask_token_id": MASK_ID},
    }


def tokenizer_json() -> str:
    """A character-level `tokenizers` vocabulary: lower-cased, one token per character."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel(VOCAB, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    return tokenizer.to_str(pretty=True)


TOKENIZER_CONFIG = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "model_max_length": 4096,
    "pad_token": "[PAD]",
    "unk_token": "[UNK]",
    "eos_token": "[EOS]",
    "mask_token": "[MASK]",
    "clean_up_tokenization_spaces": False,
}


def write_configs(root: Path, kind: str) -> tuple[Path, Path]:
    """Write the `root/kind/{target,draft}` configs (no weights, no tokenizer); return both."""
    target, draft = root / kind / "target", root / kind / "draft"
    for path in (target, draft):
        path.mkdir(parents=True, exist_ok=True)
    _write_json(target / "config.json", TARGETS[kind])
    _write_json(draft / "config.json", draft_config(kind))
    return target, draft


def write_model(root: Path, kind: str) -> tuple[Path, Path]:
    """`write_configs`, the tokenizer, and seeded weights for target and drafter (bf16)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    target, draft = write_configs(root, kind)
    (target / "tokenizer.json").write_text(tokenizer_json())
    _write_json(target / "tokenizer_config.json", TOKENIZER_CONFIG)
    torch.manual_seed(SEED)
    config = AutoConfig.from_pretrained(target)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _favour(model.lm_head.weight.data, model.get_input_embeddings().weight.data)
    model.to(torch.bfloat16).save_pretrained(target, safe_serialization=True)
    save_file(_draft_weights(draft_config(kind)), str(draft / "model.safetensors"))
    # save_pretrained rewrites config.json in transformers' own spelling; SGLang's Qwen3-Next
    # config reads `full_attention_interval`, which transformers folds into `layer_types`.
    _write_json(target / "config.json", {**json.loads((target / "config.json").read_text()),
                                         **TARGETS[kind]})  # fmt: skip
    return target, draft


def _favour(head: Any, embedding: Any) -> None:
    """Scale the favoured output rows; point the [MASK] embedding at them, best first."""
    import torch

    ids = [VOCAB[c] for c in FAVOURED]
    head[ids] *= FAVOURED_SCALE
    rows = head[ids] / head[ids].norm(dim=1, keepdim=True)
    weights = torch.arange(len(ids), 0, -1, dtype=head.dtype).unsqueeze(1)  # 4, 3, 2, 1
    mask = (weights * rows).sum(0)
    embedding[MASK_ID] = mask * embedding.norm(dim=1).mean() / mask.norm()


def _draft_weights(config: dict[str, Any]) -> dict[str, Any]:
    """A one-layer DFlash drafter in SGLang's checkpoint names: small random projections (so the
    target's hidden states nudge it), unit norms inside (so [MASK] keeps its direction), a soft
    final norm (DRAFT_NORM)."""
    import torch

    hidden, inter = config["hidden_size"], config["intermediate_size"]
    q_dim = config["num_attention_heads"] * config["head_dim"]
    kv_dim = config["num_key_value_heads"] * config["head_dim"]
    contexts = len(config["dflash_config"]["target_layer_ids"])
    shapes = {
        "layers.0.self_attn.q_proj.weight": (q_dim, hidden),
        "layers.0.self_attn.k_proj.weight": (kv_dim, hidden),
        "layers.0.self_attn.v_proj.weight": (kv_dim, hidden),
        "layers.0.self_attn.o_proj.weight": (hidden, q_dim),
        "layers.0.mlp.gate_proj.weight": (inter, hidden),
        "layers.0.mlp.up_proj.weight": (inter, hidden),
        "layers.0.mlp.down_proj.weight": (hidden, inter),
        "fc.weight": (hidden, hidden * contexts),
    }
    generator = torch.Generator().manual_seed(SEED + 1)
    tensors = {
        name: torch.randn(shape, generator=generator) * 0.02 for name, shape in shapes.items()
    }
    for name in ("layers.0.input_layernorm", "layers.0.post_attention_layernorm", "hidden_norm"):
        tensors[f"{name}.weight"] = torch.ones(hidden)
    tensors["norm.weight"] = torch.full((hidden,), DRAFT_NORM)
    for name in ("q_norm", "k_norm"):
        tensors[f"layers.0.self_attn.{name}.weight"] = torch.ones(config["head_dim"])
    return {name: t.to(torch.bfloat16).contiguous() for name, t in tensors.items()}


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    out = Path(sys.argv[1])
    for name in KINDS:
        made = write_model(out, name)
        print(f"> {name}: {made[0]} (draft {made[1]})", flush=True)
