"""The inflated pair computes the small pair's function exactly (float32, on the CPU).

A toy target (transformers' own Qwen3ForCausalLM, random weights) and a toy drafter
(drafter.py) are inflated to three times the width, more than twice the depth, more heads per
KV group and a wider MLP. Then, against the small pair: the target's logits agree to within
float32 summation order (tolerance below), its greedy tokens are identical, and the drafter fed
the inflated target's hidden states at its moved layer ids proposes the same block logits.
Each compensation is then left out in turn (its function in inflate.py swapped for the naive
zero-padding one): every one of them breaks the equality, so none is decoration.

Runs in the 0.5.11 staging venv, which has transformers (the real Qwen3 the lab serves).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from staging import require_staging_venv

# |inflated - small| over the largest |small| logit: float32 rounding of sums taken in another
# order and over zeros (a few 1e-7 here); a left-out compensation moves logits by 1e-2 or more.
TOLERANCE = 1e-5

SCRIPT = r"""
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import torch
from safetensors.torch import save_file
from transformers import Qwen3Config, Qwen3ForCausalLM
from gpulab.trained import inflate
from gpulab.trained.drafter import DraftConfig, Drafter, config_json, load

root = Path(sys.argv[2])
torch.manual_seed(0)
small_config = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                    max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=1e6,
                    tie_word_embeddings=False, attention_bias=False)
target = Qwen3ForCausalLM(Qwen3Config(**small_config, attn_implementation="eager")).float().eval()
with torch.no_grad():  # norms away from 1, so a norm weight left untiled would show
    for name, p in target.named_parameters():
        if "norm" in name:
            p.uniform_(0.5, 1.5)
pair = root / "pair"
target.save_pretrained(str(pair / "target"), safe_serialization=True)
drafter = Drafter(DraftConfig(hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2,
                              head_dim=8, intermediate_size=48, target_layer_ids=(0, 1),
                              num_target_layers=3, block_size=4, mask_token_id=63,
                              vocab_size=64))
drafter.init_weights(0.2)
with torch.no_grad():
    for name, p in drafter.named_parameters():
        if "norm" in name:
            p.uniform_(0.5, 1.5)
(pair / "draft").mkdir(parents=True)
(pair / "draft" / "config.json").write_text(json.dumps(config_json(drafter.config)))
save_file({k: v.contiguous() for k, v in drafter.state_dict().items()},
          str(pair / "draft" / "model.safetensors"))

# Each compensation's naive stand-in: what inflating without it would write.
NAIVE = {
    "tile_stream": lambda t, r: torch.cat([t, t.new_zeros(*t.shape[:-1], t.shape[-1] * (r - 1))], -1),
    "read_copy_0": lambda w, r: w.repeat(1, r),
    "write_every_copy": lambda w, r: torch.cat([w, w.new_zeros(w.shape[0] * (r - 1), w.shape[1])]),
    "identity_output": lambda w: w,
    "moved_layer_ids": lambda ids, plan: list(ids),
    "fc_reading_copy_0": lambda fc, h, r: inflate.read_copy_0(fc, r),
}
shape = inflate.Shape(hidden_size=96, num_layers=7, num_heads=12, num_kv_heads=3,
                      intermediate_size=80)
ids = torch.randint(0, 63, (2, 40), generator=torch.Generator().manual_seed(1))


def block_logits(model, out, draft_dir, layer_ids):
    # SGLang's DFLASH draft step on one sequence: features of the first 30 tokens
    # (hidden_states[k + 1]: after layer k), a block of the anchor then mask ids after them.
    d = load(draft_dir).float().eval()
    features = torch.cat([out.hidden_states[k + 1][0, :30] for k in layer_ids], dim=-1)
    block = torch.tensor([ids[0, 30].item(), 63, 63, 63])
    embed = model.get_input_embeddings().weight
    hidden = d(features[None], torch.arange(30)[None], embed[block][None],
               torch.arange(30, 34)[None], torch.ones(1, 4, 34, dtype=torch.bool))
    return hidden[0] @ model.lm_head.weight.T


with torch.no_grad():
    small_out = target(input_ids=ids, output_hidden_states=True)
    small_greedy = target.generate(ids[:, :8], max_new_tokens=32, do_sample=False, pad_token_id=0)
    small_block = block_logits(target, small_out, pair / "draft", [0, 1])
results = {}
for ablate in ["none", *NAIVE, "place_heads"]:
    saved = {name: getattr(inflate, name) for name in NAIVE}
    query_head = inflate.Plan.query_head
    if ablate == "place_heads":
        inflate.Plan.query_head = lambda self, head: head
    elif ablate != "none":
        setattr(inflate, ablate, NAIVE[ablate])
    try:
        out_dir = root / ablate
        record = inflate.inflate(pair, out_dir, shape, torch.device("cpu"), torch.float32)
    finally:
        inflate.Plan.query_head = query_head
        for name, function in saved.items():
            setattr(inflate, name, function)
    big = Qwen3ForCausalLM.from_pretrained(str(out_dir / "target"), dtype=torch.float32,
                                           attn_implementation="eager").eval()
    with torch.no_grad():
        big_out = big(input_ids=ids, output_hidden_states=True)
        scale = small_out.logits.abs().max().item()
        big_greedy = big.generate(ids[:, :8], max_new_tokens=32, do_sample=False, pad_token_id=0)
        draft_config = json.loads((out_dir / "draft" / "config.json").read_text())
        big_block = block_logits(big, big_out, out_dir / "draft",
                                 draft_config["dflash_config"]["target_layer_ids"])
    results[ablate] = {
        "logit_error": (big_out.logits - small_out.logits).abs().max().item() / scale,
        "greedy_same": bool(torch.equal(small_greedy, big_greedy)),
        "draft_error": (big_block - small_block).abs().max().item() / small_block.abs().max().item(),
        "draft_argmax_same": bool(torch.equal(small_block.argmax(-1), big_block.argmax(-1))),
        "record": record,
        "big_hidden": big.config.hidden_size,
    }
print(json.dumps(results))
"""
COMPENSATIONS = (
    "tile_stream",
    "read_copy_0",
    "write_every_copy",
    "place_heads",
    "identity_output",
    "moved_layer_ids",
    "fc_reading_copy_0",
)


@pytest.fixture(scope="module")
def inflated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Each run of the script by what it left out ("none": every compensation in place)."""
    python = require_staging_venv("0.5.11") / "bin" / "python"
    tests = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [str(python), "-c", SCRIPT, str(tests), str(tmp_path_factory.mktemp("inflate"))],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results: dict[str, dict[str, Any]] = json.loads(proc.stdout.strip().splitlines()[-1])
    return results


def test_the_inflated_pair_computes_the_small_pairs_function(
    inflated: dict[str, dict[str, Any]],
) -> None:
    result = inflated["none"]
    assert result["big_hidden"] == 96
    assert result["record"]["layer_at"] == [0, 3, 6]
    assert result["record"]["target_layer_ids"] == {"small": [0, 1], "inflated": [0, 3]}
    assert result["logit_error"] < TOLERANCE
    assert result["greedy_same"]
    assert result["draft_error"] < TOLERANCE
    assert result["draft_argmax_same"]


@pytest.mark.parametrize("compensation", COMPENSATIONS)
def test_leaving_out_any_one_compensation_breaks_the_equality(
    inflated: dict[str, dict[str, Any]], compensation: str
) -> None:
    result = inflated[compensation]
    worst = max(result["logit_error"], result["draft_error"])
    assert worst > 1e3 * TOLERANCE, (compensation, result)


def test_a_shape_that_cannot_hold_the_small_model_is_refused_in_one_sentence() -> None:
    from gpulab.trained.inflate import Shape, make_plan

    small = {"hidden_size": 512, "num_attention_heads": 8, "num_key_value_heads": 4,
             "intermediate_size": 1536, "num_hidden_layers": 8, "head_dim": 64}  # fmt: skip
    with pytest.raises(ValueError, match=r"^cannot inflate: hidden 1000 is not a multiple of 512"):
        make_plan(small, Shape(1000, 36, 64, 16, 12288))
    with pytest.raises(ValueError, match="KV groups of 1 < 2"):
        make_plan(small, Shape(4096, 36, 16, 16, 12288))
