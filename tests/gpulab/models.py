"""Random-weight models for the GPU lab, made on the spot: targets, DFlash drafts, tokenizer.

Two targets, each at two sizes, all with a 64-token character vocabulary: a pure-attention
`Qwen3ForCausalLM`, and a hybrid (gated delta-net layers between attention layers): at the
tiny size a `Qwen3NextForCausalLM` (MoE in every layer), at the realistic size a dense Qwen3.5,
production's architecture (Qwen3.6-27B; `qwen3_5_config` says how SGLang loads it). A vocabulary
that small makes the target's greedy token fall among the draft's top-k often, so tree mode
accepts through sibling branches: the path a hybrid target's recurrent state can get wrong. All
weights are drawn from a fixed seed and written as safetensors, so every server start reads the
same models. The tokenizer is a real `tokenizers` character vocabulary, so the validation
prompts (text) go through SGLang's tokenizer and detokenizer as in production.

Sizes (`SIZES`):

- `tiny`: 4 layers of width 128, initializer_range 0.4 (wide logit gaps, few bf16 near-ties);
  written on the CPU in float32, then cast to bf16.
- `realistic`: the attention target has Qwen3-8B's dimensions (hidden 4096, 36 layers, 32/8
  heads of 128, intermediate 12288: 7.0 B parameters, 13.9 GB in bf16). The hybrid is a dense
  Qwen3.5 of the same width (hidden 4096, intermediate 12288, 32 layers, every fourth one
  attention: 8 gated-attention layers of 16/4 heads of 256, 24 gated delta-nets of 8 key and 16
  value heads of 128): 6.1 B parameters, 12.2 GB in bf16, a Mamba state of 24.6 MiB per
  request. Qwen3.6-27B is wider and deeper (hidden 5120, 64 layers, 48 value heads): at its
  size five servers and their speculative Mamba states (one per request and verify token)
  would not fit one GPU. A random MoE router flips near-tied experts between prefill and verify
  (the realistic Qwen3-Next's linear DFlash tokens sat up to 5 nats off the prefill's, GPU lab
  run 10); a dense MLP has no router. Both at initializer_range 0.02, as trained models are
  initialised: logit gaps under 0.05 every 10 to 20 tokens, the near-ties a bf16 server flips.
  Written on the GPU (`with torch.device("cuda")`, bf16: float32 init of 7 B parameters on a
  CPU takes minutes), never carried. Their drafters have the target's width, one Qwen3 layer
  (32/8 heads of 128, intermediate 12288), and read five target layers spread over its depth,
  as Qwen3-8B's DFlash drafter (36 layers: 1, 9, 17, 25, 33; 32 layers: 1, 8, 15, 22, 29).

Random weights alone give a drafter that almost never agrees with the target (acceptance
about 1.04), which exercises no tree. So the models are shaped, and only this way: the target's
output rows for four FAVOURED tokens are scaled up, so its greedy token is usually one of them,
in an order the context decides; the drafter (which reads the target's embedding and output
head, as DFlash does) sees the [MASK] embedding pointed at those four rows with falling
weights, so its top-4 is the favoured set, best first, nudged by its small random layer. The
chain then accepts when the target picks the first favoured token; the tree also accepts
through the siblings. The shaping is scale-free, so the realistic size keeps it (the favoured
set wins the target's argmax about 60% of the time at any width); what depends on the width is
rescaled (`shaping`) so the drafter's [MASK] logits and the weight of its random layer against
the [MASK] direction stay the tiny drafter's.

`write_model(root, kind, size)` needs torch, tokenizers and transformers (the SGLang venv has
them; the realistic size a GPU too); `write_target(dir, config, on_gpu=False)` writes a target of
any config (the CPU tests write a small Qwen3.5 of the realistic layout and have SGLang load it:
sglang_target.py); `write_configs(root, kind, size)` writes the configs only, which is what CPU
tests of argument resolution need. Command line (on the GPU machine):
`python models.py OUT_DIR [SIZE [KIND...]]` writes OUT_DIR/SIZE/KIND/{target,draft}.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any, NamedTuple

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[EOS]", "[MASK]")
CHARACTERS = "abcdefghijklmnopqrstuvwxyz0123456789 .,:;!?'\"()[]{}-_/*+=<>\n"
PAD_ID, UNK_ID, EOS_ID, MASK_ID = range(4)
VOCAB = {token: i for i, token in enumerate([*SPECIAL_TOKENS, *CHARACTERS])}
assert len(VOCAB) == 64, len(VOCAB)

SEED = 20261201
KINDS = ("attention", "hybrid")
SIZES = ("tiny", "realistic")
DRAFT_BLOCK_SIZE = 16
FAVOURED = "eta "  # the tokens the target mostly emits and the drafter ranks first, in order
FAVOURED_SCALE = 3.0  # their output rows' growth in the target
DRAFT_CONTEXT_LAYERS = 5  # target layers a realistic drafter reads (Qwen3-8B's DFlash: 5)

_COMMON: dict[str, Any] = {
    "vocab_size": len(VOCAB),
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "pad_token_id": PAD_ID,
    "eos_token_id": EOS_ID,
}
_TINY: dict[str, Any] = {
    **_COMMON,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    # Twenty times the usual spread: wider logit gaps, fewer bf16 near-ties in greedy decoding.
    "initializer_range": 0.4,
}
_REALISTIC: dict[str, Any] = {**_COMMON, "initializer_range": 0.02}
_QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}
_QWEN3_NEXT = {
    "architectures": ["Qwen3NextForCausalLM"],
    "model_type": "qwen3_next",
    "partial_rotary_factor": 0.25,
    "linear_conv_kernel_dim": 4,
    "decoder_sparse_step": 1,
    "norm_topk_prob": True,
    "mlp_only_layers": [],
}


def qwen3_5_config(
    *,
    hidden: int,
    layers: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    intermediate: int,
    linear_key_heads: int,
    linear_value_heads: int,
    linear_head_dim: int,
    attention_interval: int = 4,
    initializer_range: float = 0.02,
) -> dict[str, Any]:
    """A text-only dense Qwen3.5 hybrid (Qwen3.6-27B's architecture) as SGLang loads it.

    SGLang registers no text-only Qwen3.5 class (0.5.11 and 0.5.14 models/qwen3_5.py: EntryClass
    is the two ForConditionalGeneration classes): a dense Qwen3.5 checkpoint says
    `Qwen3_5ForConditionalGeneration`, model_type `qwen3_5`, and nests its text model under
    `text_config` (model_type `qwen3_5_text`: a dense MLP in every layer). SGLang reads the layer
    pattern from `full_attention_interval` (configs/qwen3_next.py `layers_block_type`);
    transformers from `layer_types`: both are given and agree. RoPE is given as
    `rope_parameters` (utils/hf_transformers/common.py `get_rope_config` reads its rope_theta),
    with no `mrope_section`: positions are plain token positions, as the Qwen3-Next's are. The vision tower SGLang builds
    from `vision_config` is the smallest that constructs (the lab writes no vision weights, so
    it stays as allocated; text never runs it, and the lab's servers skip SGLang's warmup,
    which would send it an image).
    """
    kinds = ["full_attention" if (i + 1) % attention_interval == 0 else "linear_attention"
             for i in range(layers)]  # fmt: skip
    text = {
        **{k: v for k, v in _COMMON.items() if k != "rope_theta"},
        "model_type": "qwen3_5_text",
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "partial_rotary_factor": 0.25,
        # Qwen3.5's spelling: SGLang's attention reads rope_theta from here when the dict is
        # there, and SGLang's Qwen3_5TextConfig always makes one (an empty one fails).
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": _COMMON["rope_theta"],
            "partial_rotary_factor": 0.25,
        },
        "full_attention_interval": attention_interval,
        "layer_types": kinds,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": linear_head_dim,
        "linear_value_head_dim": linear_head_dim,
        "linear_num_key_heads": linear_key_heads,
        "linear_num_value_heads": linear_value_heads,
        "initializer_range": initializer_range,
    }
    vision = {"depth": 1, "hidden_size": 64, "intermediate_size": 128, "num_heads": 2,
              "num_position_embeddings": 64, "out_hidden_size": hidden,
              "deepstack_visual_indexes": []}  # fmt: skip
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "text_config": text,
        "vision_config": vision,
    }


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The settings of a target's language model: its `text_config` if nested (Qwen3.5)."""
    nested: dict[str, Any] | None = config.get("text_config")
    return nested if nested is not None else config


TARGETS: dict[str, dict[str, dict[str, Any]]] = {
    "tiny": {
        "attention": {**_TINY, **_QWEN3},
        "hybrid": {
            **_TINY,
            **_QWEN3_NEXT,
            "full_attention_interval": 2,  # layers 1 and 3 attend; 0 and 2 are gated delta-nets
            "linear_key_head_dim": 64,
            "linear_value_head_dim": 64,
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 4,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 64,
            "shared_expert_intermediate_size": 64,
        },
    },
    "realistic": {
        "attention": {
            **_REALISTIC,
            **_QWEN3,
            "hidden_size": 4096,
            "intermediate_size": 12288,
            "num_hidden_layers": 36,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 128,
        },
        "hybrid": qwen3_5_config(
            hidden=4096,
            layers=32,
            heads=16,
            kv_heads=4,
            head_dim=256,
            intermediate=12288,
            linear_key_heads=8,
            linear_value_heads=16,
            linear_head_dim=128,
        ),
    },
}

# A realistic drafter's attention heads and MLP (a Qwen3 layer at the target's width).
_REALISTIC_DRAFT_LAYER = {
    "attention": {"num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 12288},
    "hybrid": {"num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 12288},
}


class Shaping(NamedTuple):
    """The drafter's two width-dependent numbers (module docstring: how the models are shaped)."""

    draft_norm: float  # its final norm's scale: how sharp its [MASK] logits are
    draft_std: float  # the spread of its random layer: how much the context nudges it


# The tiny drafter's: a final norm soft enough (top-1 about -0.5 nats, the second -1.2) that the
# best-first tree spends its budget on siblings, not on a 15-deep chain of the top-1 token.
TINY_SHAPING = Shaping(draft_norm=0.045, draft_std=0.02)


def shaping(size: str, kind: str) -> Shaping:
    """The tiny drafter's shaping, rescaled to the target's width d and init spread s.

    Its [MASK] logits are head rows (norm s * sqrt(d)) against the final norm of [MASK]
    (norm draft_norm * sqrt(d)): keeping draft_norm * d * s keeps them. Its random layer adds
    about draft_std**2 * d per component to a [MASK] embedding of s per component: keeping
    draft_std**2 * d / s keeps the nudge.
    """
    if size == "tiny":
        return TINY_SHAPING
    tiny, target = text_config(TARGETS["tiny"][kind]), text_config(TARGETS[size][kind])
    ratio = (tiny["hidden_size"] * tiny["initializer_range"]) / (
        target["hidden_size"] * target["initializer_range"]
    )
    spread = (target["initializer_range"] / tiny["initializer_range"]) * (
        tiny["hidden_size"] / target["hidden_size"]
    )
    return Shaping(TINY_SHAPING.draft_norm * ratio, TINY_SHAPING.draft_std * math.sqrt(spread))


def context_layers(num_layers: int, count: int = DRAFT_CONTEXT_LAYERS) -> list[int]:
    """`count` target layers from 1 to num_layers - 3, evenly spaced (36 -> 1, 9, 17, 25, 33)."""
    last = num_layers - 3
    return [round(1 + i * (last - 1) / (count - 1)) for i in range(count)]


def draft_config(kind: str, size: str = "tiny") -> dict[str, Any]:
    """A one-layer DFlash drafter for target `kind` of `size` (its width, its layer count)."""
    target = text_config(TARGETS[size][kind])
    if size == "tiny":
        layer = {k: v for k, v in _TINY.items() if k != "initializer_range"}
        context = [1, 2]
    else:
        layer = {**{k: v for k, v in _REALISTIC.items() if k != "initializer_range"},
                 **_REALISTIC_DRAFT_LAYER[kind], "hidden_size": target["hidden_size"],
                 "head_dim": 128}  # fmt: skip
        context = context_layers(target["num_hidden_layers"])
    return {
        **layer,
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "num_hidden_layers": 1,
        "num_target_layers": target["num_hidden_layers"],
        "block_size": DRAFT_BLOCK_SIZE,
        "dflash_config": {"target_layer_ids": context, "mask_token_id": MASK_ID},
    }


def parameter_count(config: dict[str, Any]) -> int:
    """Parameters of a target's language model (Qwen3, Qwen3-Next, Qwen3.5; a Qwen3.5's vision
    tower is left out) or of a DFlash drafter config, by the shapes."""
    config = text_config(config)
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    heads, kv, head_dim = (
        config[k] for k in ("num_attention_heads", "num_key_value_heads", "head_dim")
    )
    q_out = heads * head_dim
    if "dflash_config" in config:  # the target's embedding and head; its own context projection
        total = len(config["dflash_config"]["target_layer_ids"]) * hidden * hidden + 2 * hidden
    else:  # embedding, output head, final norm
        total = 2 * config["vocab_size"] * hidden + hidden
    if config["model_type"] == "qwen3":
        attention = hidden * (q_out + 2 * kv * head_dim) + q_out * hidden + 2 * head_dim
        mlp = 3 * hidden * config["intermediate_size"]
        return total + layers * (attention + mlp + 2 * hidden)
    # Qwen3-Next and Qwen3.5: gated attention (q_proj doubled), gated delta-nets; the MLP is a
    # routed and a shared MoE (Qwen3-Next) or dense (Qwen3.5).
    attention = hidden * (2 * q_out + 2 * kv * head_dim) + q_out * hidden + 2 * head_dim
    keys = config["linear_num_key_heads"] * config["linear_key_head_dim"]
    values = config["linear_num_value_heads"] * config["linear_value_head_dim"]
    value_heads = config["linear_num_value_heads"]
    linear = (
        hidden * (2 * keys + 2 * values)  # in_proj_qkvz (in_proj_qkv, in_proj_z)
        + hidden * 2 * value_heads  # in_proj_ba (in_proj_b, in_proj_a)
        + (2 * keys + values) * config["linear_conv_kernel_dim"]  # conv1d
        + 2 * value_heads  # dt_bias, A_log
        + config["linear_value_head_dim"]  # the gated output norm
        + values * hidden  # out_proj
    )
    if config["model_type"] == "qwen3_5_text":
        mlp = 3 * hidden * config["intermediate_size"]
    else:
        experts = config["num_experts"]
        mlp = (
            hidden * experts  # router
            + experts * 3 * hidden * config["moe_intermediate_size"]
            + 3 * hidden * config["shared_expert_intermediate_size"]
            + hidden  # shared expert gate
        )
    attending = layers // config["full_attention_interval"]
    return (
        total + attending * attention + (layers - attending) * linear + layers * (mlp + 2 * hidden)
    )


def kv_bytes_per_token(config: dict[str, Any]) -> int:
    """The target's bf16 KV cache per token (attention layers only on a hybrid)."""
    config = text_config(config)
    layers = config["num_hidden_layers"] // config.get("full_attention_interval", 1)
    return layers * config["num_key_value_heads"] * config["head_dim"] * 2 * 2


def mamba_bytes_per_request(config: dict[str, Any]) -> int:
    """A hybrid target's recurrent state per request, as SGLang 0.5.11 sizes it: a float32
    delta-net state and a bf16 convolution window per linear layer. SGLang also reserves one
    per request and verify token for speculative decoding."""
    config = text_config(config)
    layers = (
        config["num_hidden_layers"]
        - config["num_hidden_layers"] // config["full_attention_interval"]
    )
    value_heads, key_dim, value_dim = (
        config[k]
        for k in ("linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim")
    )
    conv = (2 * config["linear_num_key_heads"] * key_dim + value_heads * value_dim) * (
        config["linear_conv_kernel_dim"] - 1
    )
    return layers * (value_heads * key_dim * value_dim * 4 + conv * 2)


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


# A Qwen3.5 target is multimodal to SGLang (every Qwen3_5ForConditionalGeneration is), so its
# tokenizer manager builds the model's processor at start: transformers' Qwen3VLProcessor, which
# needs an image and a video processor config beside the tokenizer. Text never reaches them.
PROCESSOR_CONFIGS = {
    "preprocessor_config.json": {"image_processor_type": "Qwen2VLImageProcessorFast"},
    "video_preprocessor_config.json": {"video_processor_type": "Qwen3VLVideoProcessor"},
}
_PROCESSOR_SHAPE = {"processor_class": "Qwen3VLProcessor", "patch_size": 16, "merge_size": 2,
                    "temporal_patch_size": 2}  # fmt: skip


def write_configs(root: Path, kind: str, size: str = "tiny") -> tuple[Path, Path]:
    """Write the `root/size/kind/{target,draft}` configs (no weights, no tokenizer); return both."""
    target, draft = root / size / kind / "target", root / size / kind / "draft"
    for path in (target, draft):
        path.mkdir(parents=True, exist_ok=True)
    write_target_config(target, TARGETS[size][kind])
    _write_json(draft / "config.json", draft_config(kind, size))
    return target, draft


def write_target_config(target: Path, config: dict[str, Any]) -> None:
    """A target's config.json (and a Qwen3.5's processor configs) exactly as `config` says."""
    _write_json(target / "config.json", config)
    if config["model_type"] == "qwen3_5":
        for name, settings in PROCESSOR_CONFIGS.items():
            _write_json(target / name, {**settings, **_PROCESSOR_SHAPE})


def write_model(root: Path, kind: str, size: str = "tiny") -> tuple[Path, Path]:
    """`write_configs`, the tokenizer, and seeded weights for target and drafter (bf16)."""
    from safetensors.torch import save_file

    target, draft = write_configs(root, kind, size)
    write_target(target, TARGETS[size][kind], on_gpu=size != "tiny")
    weights = _draft_weights(draft_config(kind, size), shaping(size, kind))
    save_file(weights, str(draft / "model.safetensors"))
    return target, draft


def write_target(target: Path, config: dict[str, Any], *, on_gpu: bool) -> None:
    """A target of `config` in `target`: tokenizer, seeded shaped weights (bf16), config.json.

    Drawn on the CPU in float32, or `on_gpu` in bf16 (float32 init of billions of parameters on
    a CPU takes minutes). A Qwen3.5 target is drawn as transformers' text-only Qwen3.5 model, so
    its checkpoint holds the language model's tensors in SGLang's checkpoint names
    (`model.layers.N.linear_attn.in_proj_qkv`, `...self_attn.q_proj`, ...) and no vision tower.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    target.mkdir(parents=True, exist_ok=True)
    (target / "tokenizer.json").write_text(tokenizer_json())
    _write_json(target / "tokenizer_config.json", TOKENIZER_CONFIG)
    settings = text_config(config)
    hf_config = AutoConfig.for_model(
        settings["model_type"], **{k: v for k, v in settings.items() if k != "model_type"}
    )
    torch.manual_seed(SEED)
    if on_gpu:
        with torch.device("cuda"):
            model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.bfloat16)
    else:
        model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    _favour(model.lm_head.weight.data, model.get_input_embeddings().weight.data)
    model.to(torch.bfloat16).save_pretrained(target, safe_serialization=True)
    del model  # the realistic target's GBs leave the GPU before the drafter is drawn
    # save_pretrained rewrites config.json in transformers' own spelling (SGLang's Qwen3-Next
    # config reads `full_attention_interval`, which transformers folds into `layer_types`; a
    # Qwen3.5 model is saved as its text model): the lab's config goes back on top.
    saved = json.loads((target / "config.json").read_text())
    write_target_config(target, config if "text_config" in config else {**saved, **config})


def _favour(head: Any, embedding: Any) -> None:
    """Scale the favoured output rows; point the [MASK] embedding at them, best first (in
    float32 whatever the weights' dtype)."""
    import torch

    ids = [VOCAB[c] for c in FAVOURED]
    head[ids] *= FAVOURED_SCALE
    rows = head[ids].float()
    rows = rows / rows.norm(dim=1, keepdim=True)
    weights = torch.arange(len(ids), 0, -1, dtype=torch.float32, device=rows.device)
    mask = (weights.unsqueeze(1) * rows).sum(0)  # 4, 3, 2, 1
    norms = embedding.float().norm(dim=1)
    embedding[MASK_ID] = (mask * norms.mean() / mask.norm()).to(embedding.dtype)


def _draft_weights(config: dict[str, Any], shaped: Shaping) -> dict[str, Any]:
    """A one-layer DFlash drafter in SGLang's checkpoint names: small random projections (so the
    target's hidden states nudge it), unit norms inside (so [MASK] keeps its direction), a soft
    final norm (`shaped.draft_norm`)."""
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
        name: torch.randn(shape, generator=generator) * shaped.draft_std
        for name, shape in shapes.items()
    }
    for name in ("layers.0.input_layernorm", "layers.0.post_attention_layernorm", "hidden_norm"):
        tensors[f"{name}.weight"] = torch.ones(hidden)
    tensors["norm.weight"] = torch.full((hidden,), shaped.draft_norm)
    for name in ("q_norm", "k_norm"):
        tensors[f"layers.0.self_attn.{name}.weight"] = torch.ones(config["head_dim"])
    return {name: t.to(torch.bfloat16).contiguous() for name, t in tensors.items()}


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    out, size = Path(sys.argv[1]), (sys.argv[2] if len(sys.argv) > 2 else "tiny")
    for name in sys.argv[3:] or KINDS:
        made = write_model(out, name, size)
        print(f"> {size} {name}: {made[0]} (draft {made[1]})", flush=True)
