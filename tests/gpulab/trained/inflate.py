"""Grow the trained pair to a realistic shape that computes exactly the same function.

    python tests/gpulab/trained/inflate.py PAIR_DIR OUT_DIR --shape 8b|27b [--device cuda]

PAIR_DIR is what train.py wrote (target/, draft/); OUT_DIR gets target/ and draft/ of the
shape's width and depth, which SGLang serves at a realistic step cost with the small pair's
acceptance (GPU lab issue 45: the trained pair has real acceptance, a random 8B target has a
realistic step, neither has both).

How, for a small hidden size h grown to H = r * h:
- **The residual stream becomes r identical copies of the small one.** The embedding is tiled
  r times; every projection that writes into the residual stream (o_proj, down_proj, the
  drafter's fc) writes its output into every copy; every projection that reads from it (q, k,
  v, gate, up, lm_head, fc) reads copy 0 and has zero weights on the others. An RMSNorm over r
  identical copies has exactly the small one's RMS, so norm weights (tiled) and eps keep their
  trained values bit for bit. Zero-padding the stream instead would need every norm weight
  scaled by sqrt(H / h) and eps by h / H, which bf16 cannot hold exactly for r = 8 or 10.
- **Extra heads and MLP rows are zero.** head_dim stays (RoPE and the attention scale with it);
  an original query head keeps its place in its KV group (group size may grow): original head
  i of group g sits at g * new_group + i % old_group, KV head g at g. A zero query attends
  uniformly to zero values and adds nothing; zero gate/up rows give silu(0) * 0 = 0.
- **Deeper with identity layers**: the original layers are spread over the new depth (the
  first at 0, the last at the end); each added layer repeats the weights of the original before
  it but has zero o_proj and down_proj, so it adds exactly zero to the stream while costing its
  full compute and memory traffic. The drafter's target_layer_ids move with their layers, so
  it reads the same hidden states (whichever side of a layer SGLang captures: the layers
  between two originals are identities).
- **The vocabulary stays the trained one (4,096)**, not Qwen3's 151,936. A real vocabulary adds
  the same lm_head reads (about 1.2 GB at 8B, once for the target and once for the drafter) to
  every step of both algorithms, which brings tree mode's step ratio to DFLASH closer to 1:
  leaving it out understates tree mode's gain, never overstates it. Padding the vocabulary
  exactly would need padded logits below every real one, which no row of a linear head gives.

The drafter keeps its depth and is widened the same way. What moved where is written to
OUT_DIR/inflation.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file


@dataclass(frozen=True)
class Shape:
    """The inflated model's width and depth (head_dim stays the trained one)."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int


# head_dim 64 (the trained one): Qwen3-8B's 32 x 128 query and 8 x 128 KV widths are 64 and 16
# heads of 64, the same FLOPs and KV bytes per token.
SHAPES = {
    "8b": Shape(
        hidden_size=4096, num_layers=36, num_heads=64, num_kv_heads=16, intermediate_size=12288
    ),  # Qwen3-8B's dimensions
    # Qwen3.6-27B's width, depth and MLP (24 x 256 query, 4 x 256 KV) with every layer full
    # attention (its gated-delta-net layers read as attention layers of the same width):
    # 21.8 B parameters besides the vocabulary.
    "27b": Shape(
        hidden_size=5120, num_layers=64, num_heads=96, num_kv_heads=16, intermediate_size=17408
    ),
}


@dataclass(frozen=True)
class Plan:
    """Where the small model's parts go in the big one."""

    copies: int  # r: the residual stream's copies
    small_hidden: int
    head_dim: int
    old_group: int  # query heads per KV head, small
    new_group: int  # and big
    layer_at: tuple[int, ...]  # new index of each original layer

    def query_head(self, head: int) -> int:
        """New index of original query head `head` (its KV group kept)."""
        return (head // self.old_group) * self.new_group + head % self.old_group

    def original_before(self, layer: int) -> int:
        """The original layer at or before new index `layer` (whose weights an identity repeats)."""
        return max(i for i, at in enumerate(self.layer_at) if at <= layer)


def spread(layers: int, new_layers: int) -> tuple[int, ...]:
    """New indices of `layers` original layers over `new_layers`: the first at 0, the last at
    the end, evenly between."""
    if layers == 1:
        return (0,)
    return tuple(round(i * (new_layers - 1) / (layers - 1)) for i in range(layers))


def make_plan(config: dict[str, Any], shape: Shape) -> Plan:
    """The plan for a small Qwen3 config, or ValueError saying which dimension cannot grow."""
    hidden, heads, kv = (
        config[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads")
    )
    problems = []
    if shape.hidden_size % hidden:
        problems.append(f"hidden {shape.hidden_size} is not a multiple of {hidden}")
    if shape.num_kv_heads < kv or shape.num_heads % shape.num_kv_heads:
        problems.append(f"{shape.num_heads}/{shape.num_kv_heads} heads cannot hold {heads}/{kv}")
    elif shape.num_heads // shape.num_kv_heads < heads // kv:
        problems.append(f"KV groups of {shape.num_heads // shape.num_kv_heads} < {heads // kv}")
    if shape.intermediate_size < config["intermediate_size"]:
        problems.append(f"intermediate {shape.intermediate_size} < {config['intermediate_size']}")
    if shape.num_layers < config["num_hidden_layers"]:
        problems.append(f"{shape.num_layers} layers < {config['num_hidden_layers']}")
    if problems:
        raise ValueError("cannot inflate: " + "; ".join(problems))
    return Plan(
        copies=shape.hidden_size // hidden,
        small_hidden=hidden,
        head_dim=config["head_dim"],
        old_group=heads // kv,
        new_group=shape.num_heads // shape.num_kv_heads,
        layer_at=spread(config["num_hidden_layers"], shape.num_layers),
    )


# -- the parts of a compensation, each a function of one tensor (tests leave each one out) -------


def tile_stream(vector_rows: torch.Tensor, copies: int) -> torch.Tensor:
    """A tensor whose last dimension lies along the residual stream, as `copies` copies
    (the embedding's rows, a norm's weight)."""
    return vector_rows.repeat(*([1] * (vector_rows.dim() - 1)), copies)


def read_copy_0(weight: torch.Tensor, copies: int) -> torch.Tensor:
    """A projection reading the stream [out, h] -> [out, r*h]: copy 0 only, zeros elsewhere."""
    out = weight.new_zeros(weight.shape[0], weight.shape[1] * copies)
    out[:, : weight.shape[1]] = weight
    return out


def write_every_copy(weight: torch.Tensor, copies: int) -> torch.Tensor:
    """A projection writing into the stream [h, in] -> [r*h, in]: the same rows for each copy."""
    return weight.repeat(copies, 1)


def place_heads(
    weight: torch.Tensor, plan: Plan, heads: int, new_heads: int, *, query: bool
) -> torch.Tensor:
    """Rows of a q/k/v projection [heads*d, in] at their new heads [new_heads*d, in] (o_proj's
    columns, transposed)."""
    d = plan.head_dim
    out = weight.new_zeros(new_heads * d, weight.shape[1])
    for head in range(heads):
        at = plan.query_head(head) if query else head
        out[at * d : (at + 1) * d] = weight[head * d : (head + 1) * d]
    return out


def pad_rows(weight: torch.Tensor, rows: int) -> torch.Tensor:
    """Zero rows appended (MLP gate/up: the extra intermediate units; down_proj's columns,
    transposed)."""
    return torch.cat([weight, weight.new_zeros(rows - weight.shape[0], *weight.shape[1:])])


def fc_reading_copy_0(fc: torch.Tensor, hidden: int, copies: int) -> torch.Tensor:
    """The drafter's fc [h, K*h] -> [h, K*r*h]: copy 0 of each of the K target features."""
    features, wide = fc.shape[1] // hidden, hidden * copies
    out = fc.new_zeros(fc.shape[0], features * wide)
    for k in range(features):
        out[:, k * wide : k * wide + hidden] = fc[:, k * hidden : (k + 1) * hidden]
    return out


def moved_layer_ids(ids: list[int], plan: Plan) -> list[int]:
    """The drafter's target_layer_ids in the deeper target: where their layers went."""
    return [plan.layer_at[i] for i in ids]


def identity_output(weight: torch.Tensor) -> torch.Tensor:
    """An added layer's o_proj or down_proj: zero, so the layer adds nothing to the stream."""
    return torch.zeros_like(weight)


def layer_tensors(
    small: Callable[[str], torch.Tensor],
    prefix: str,
    plan: Plan,
    shape: Shape,
    config: dict[str, Any],
    *,
    identity: bool,
) -> dict[str, torch.Tensor]:
    """One inflated decoder layer's tensors (names after `prefix`), from the small layer whose
    tensors `small(name)` gives; `identity` zeroes what the layer writes into the stream."""
    r, heads, kv = plan.copies, config["num_attention_heads"], config["num_key_value_heads"]
    # o_proj's columns are its query heads and down_proj's its MLP units: placed and padded as
    # q_proj's and gate_proj's rows are.
    o_big = place_heads(small("self_attn.o_proj.weight").T, plan, heads, shape.num_heads,
                        query=True).T  # fmt: skip
    down_big = pad_rows(small("mlp.down_proj.weight").T, shape.intermediate_size).T
    tensors = {
        "input_layernorm.weight": tile_stream(small("input_layernorm.weight"), r),
        "post_attention_layernorm.weight": tile_stream(small("post_attention_layernorm.weight"), r),
        "self_attn.q_norm.weight": small("self_attn.q_norm.weight"),
        "self_attn.k_norm.weight": small("self_attn.k_norm.weight"),
        "self_attn.q_proj.weight": read_copy_0(
            place_heads(small("self_attn.q_proj.weight"), plan, heads, shape.num_heads, query=True),
            r,
        ),
        "self_attn.k_proj.weight": read_copy_0(
            place_heads(
                small("self_attn.k_proj.weight"), plan, kv, shape.num_kv_heads, query=False
            ),
            r,
        ),
        "self_attn.v_proj.weight": read_copy_0(
            place_heads(
                small("self_attn.v_proj.weight"), plan, kv, shape.num_kv_heads, query=False
            ),
            r,
        ),
        "self_attn.o_proj.weight": write_every_copy(o_big, r),
        "mlp.gate_proj.weight": read_copy_0(
            pad_rows(small("mlp.gate_proj.weight"), shape.intermediate_size), r
        ),
        "mlp.up_proj.weight": read_copy_0(
            pad_rows(small("mlp.up_proj.weight"), shape.intermediate_size), r
        ),
        "mlp.down_proj.weight": write_every_copy(down_big, r),
    }
    if identity:
        for name in ("self_attn.o_proj.weight", "mlp.down_proj.weight"):
            tensors[name] = identity_output(tensors[name])
    return {prefix + name: tensor for name, tensor in tensors.items()}


# -- whole models ------------------------------------------------------------------------------


class Checkpoint:
    """A safetensors checkpoint (one file or an index of shards) read tensor by tensor."""

    def __init__(self, directory: Path, device: torch.device, dtype: torch.dtype | None) -> None:
        self.device, self.dtype = device, dtype
        self.where: dict[str, Path] = {}
        for path in sorted(directory.glob("*.safetensors")):
            with safe_open(str(path), "pt") as handle:
                self.where.update(dict.fromkeys(handle.keys(), path))

    def __call__(self, name: str) -> torch.Tensor:
        with safe_open(str(self.where[name]), "pt", device="cpu") as handle:
            tensor = handle.get_tensor(name)
        return tensor.to(self.device, self.dtype or tensor.dtype)


def target_shards(
    small: Checkpoint, config: dict[str, Any], shape: Shape, plan: Plan
) -> Iterator[dict[str, torch.Tensor]]:
    """The inflated target's tensors, one shard per layer (embedding and head in the first)."""
    r = plan.copies
    yield {
        "model.embed_tokens.weight": tile_stream(small("model.embed_tokens.weight"), r),
        "model.norm.weight": tile_stream(small("model.norm.weight"), r),
        "lm_head.weight": read_copy_0(small("lm_head.weight"), r),
    }
    for layer in range(shape.num_layers):
        source = plan.original_before(layer)
        yield layer_tensors(
            lambda name, s=source: small(f"model.layers.{s}.{name}"),
            f"model.layers.{layer}.",
            plan,
            shape,
            config,
            identity=plan.layer_at[source] != layer,
        )


def draft_tensors(
    small: Checkpoint, draft: dict[str, Any], target: dict[str, Any], shape: Shape, plan: Plan
) -> dict[str, torch.Tensor]:
    """The inflated drafter (its heads laid out as the target's): fc reads copy 0 of each target
    feature and writes every copy."""
    r, h = plan.copies, plan.small_hidden
    tensors = {
        "fc.weight": write_every_copy(fc_reading_copy_0(small("fc.weight"), h, r), r),
        "hidden_norm.weight": tile_stream(small("hidden_norm.weight"), r),
        "norm.weight": tile_stream(small("norm.weight"), r),
    }
    for layer in range(draft["num_hidden_layers"]):
        tensors.update(
            layer_tensors(
                lambda name, n=layer: small(f"layers.{n}.{name}"),
                f"layers.{layer}.",
                plan,
                shape,
                target,
                identity=False,
            )
        )
    return tensors


def grown_config(config: dict[str, Any], shape: Shape) -> dict[str, Any]:
    """A Qwen3 config's width and depth fields set to `shape`'s."""
    grown = {
        **config,
        "hidden_size": shape.hidden_size,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_kv_heads,
        "intermediate_size": shape.intermediate_size,
    }
    if "layer_types" in config:
        grown["layer_types"] = ["full_attention"] * shape.num_layers
    if "max_window_layers" in config:
        grown["max_window_layers"] = shape.num_layers
    return grown


def inflate(
    pair: Path, out: Path, shape: Shape, device: torch.device, dtype: torch.dtype | None = None
) -> dict[str, Any]:
    """Write out/target and out/draft; return what moved where (inflation.json)."""
    target_config = json.loads((pair / "target" / "config.json").read_text())
    draft_config = json.loads((pair / "draft" / "config.json").read_text())
    plan = make_plan(target_config, shape)
    layout = ("num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size")
    if any(draft_config[key] != target_config[key] for key in layout):
        raise ValueError(
            f"cannot inflate: the drafter's {', '.join(layout)} differ from the "
            "target's (train.py gives it the target's)"
        )
    target_out, draft_out = out / "target", out / "draft"
    for folder in (target_out, draft_out):
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
    for path in (pair / "target").iterdir():  # tokenizer files and the like
        if path.name != "config.json" and ".safetensors" not in path.name:
            shutil.copy2(path, target_out / path.name)

    small_target = Checkpoint(pair / "target", device, dtype)
    weight_map: dict[str, str] = {}
    shards = list(enumerate(target_shards(small_target, target_config, shape, plan)))
    for index, shard in shards:
        name = f"model-{index + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(
            {k: v.contiguous().cpu() for k, v in shard.items()},
            str(target_out / name),
            metadata={"format": "pt"},
        )
        weight_map.update(dict.fromkeys(shard, name))
    (target_out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1) + "\n"
    )
    (target_out / "config.json").write_text(
        json.dumps(grown_config(target_config, shape), indent=2) + "\n"
    )

    small_draft = Checkpoint(pair / "draft", device, dtype)
    tensors = draft_tensors(small_draft, draft_config, target_config, shape, plan)
    save_file(
        {k: v.contiguous().cpu() for k, v in tensors.items()},
        str(draft_out / "model.safetensors"),
        metadata={"format": "pt"},
    )
    ids = moved_layer_ids(draft_config["dflash_config"]["target_layer_ids"], plan)
    draft_grown = grown_config(draft_config, replace_layers(shape, draft_config))
    draft_grown["num_target_layers"] = shape.num_layers
    draft_grown["dflash_config"] = {
        **draft_config["dflash_config"],
        "target_layer_ids": ids,
        "num_target_layers": shape.num_layers,
    }
    (draft_out / "config.json").write_text(json.dumps(draft_grown, indent=2) + "\n")
    record = {
        "shape": asdict(shape),
        "copies": plan.copies,
        "layer_at": list(plan.layer_at),
        "target_layer_ids": {
            "small": draft_config["dflash_config"]["target_layer_ids"],
            "inflated": ids,
        },
        "parameters": sum(t.numel() for _, s in shards for t in s.values()),
        "draft_parameters": sum(t.numel() for t in tensors.values()),
    }
    (out / "inflation.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def replace_layers(shape: Shape, draft_config: dict[str, Any]) -> Shape:
    """`shape` at the drafter's own depth (the drafter is widened, not deepened)."""
    return Shape(
        shape.hidden_size,
        draft_config["num_hidden_layers"],
        shape.num_heads,
        shape.num_kv_heads,
        shape.intermediate_size,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pair", type=Path, help="train.py's output folder (target/, draft/)")
    parser.add_argument("out", type=Path)
    parser.add_argument("--shape", choices=sorted(SHAPES), required=True)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    try:
        record = inflate(args.pair, args.out, SHAPES[args.shape], torch.device(args.device))
    except ValueError as error:
        raise SystemExit(str(error)) from None
    print(
        f"inflated to {args.shape}: {record['parameters'] / 1e9:.2f} B target parameters, "
        f"layers at {record['layer_at']}, drafter reads {record['target_layer_ids']['inflated']}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
