"""Train and serve agree (issue 23): SGLang's own DFlash draft code and the training side's
reference drafter give the same block logits for the same tiny weights and inputs.

If they did not, every GPU acceptance figure would measure a bug. The serving side runs in a
staging venv (`sglang_block.py`, whose docstring lists what of SGLang runs for real and what is
replaced); the reference (`gpulab.trained.drafter.reference_block_logits`) runs here. One
subprocess per release drafts every case. The drafter is random but not degenerate: logits
spread over about ±30, and the block positions do not all pick the same token.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from staging import require_staging_venv

# The drafter's files are safetensors; saving them goes through numpy.
pytest.importorskip("numpy", reason="safetensors.torch saves through numpy; install numpy")
safetensors_torch = pytest.importorskip(
    "safetensors.torch", reason="the drafter's files are safetensors; install safetensors"
)

RELEASES = ("0.5.11", "0.5.14")
SCRIPT = Path(__file__).with_name("sglang_block.py")
HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE = 64, 2, 4, 2, 16, 128
VOCAB, BLOCK, TARGET_LAYERS, CONTEXT_LAYER_IDS = 97, 16, 6, [1, 3]
MASK_ID = VOCAB - 1  # a reserved slot below the vocabulary size, as SGLang requires
RELATIVE_TOLERANCE = 1e-4  # of the largest |logit|


@dataclass(frozen=True)
class Case:
    """One drafter and one block: its seed, context length, anchor id and RoPE base."""

    name: str
    seed: int
    context: int
    anchor: int
    rope_theta: float = 1e6


CASES = (
    Case("long_context", seed=1, context=20, anchor=5),
    Case("one_context_token", seed=2, context=1, anchor=40),
    # Same weights and inputs as long_context, but config.json asks for another RoPE base.
    Case("rope_base_1e4", seed=1, context=20, anchor=5, rope_theta=1e4),
)
MATCHED = [case.name for case in CASES if case.rope_theta == 1e6]


def draft_config(rope_theta: float) -> dict[str, object]:
    """A two-layer Qwen3-style DFlash drafter reading target layers 1 and 3 of 6."""
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "rms_norm_eps": 1e-6,
        "rope_theta": rope_theta,
        "max_position_embeddings": 4096,
        "hidden_act": "silu",
        "vocab_size": VOCAB,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "num_target_layers": TARGET_LAYERS,  # 0.5.11 checks the ids against it (see research)
        "block_size": BLOCK,
        "dflash_config": {"target_layer_ids": CONTEXT_LAYER_IDS, "mask_token_id": MASK_ID},
    }


def draft_weights(generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Random draft tensors in SGLang's checkpoint names, scaled like a trained layer (1/sqrt
    of the input width), with norm weights around 1 so every norm matters."""

    def linear(rows: int, cols: int) -> torch.Tensor:
        return torch.randn(rows, cols, generator=generator) * cols**-0.5

    def norm(width: int) -> torch.Tensor:
        return 1 + 0.2 * torch.randn(width, generator=generator)

    features = len(CONTEXT_LAYER_IDS) * HIDDEN
    tensors = {
        "fc.weight": linear(HIDDEN, features),
        "hidden_norm.weight": norm(HIDDEN),
        "norm.weight": norm(HIDDEN),
    }
    for layer in range(LAYERS):
        prefix = f"layers.{layer}."
        tensors |= {
            prefix + "input_layernorm.weight": norm(HIDDEN),
            prefix + "post_attention_layernorm.weight": norm(HIDDEN),
            prefix + "self_attn.q_proj.weight": linear(HEADS * HEAD_DIM, HIDDEN),
            prefix + "self_attn.k_proj.weight": linear(KV_HEADS * HEAD_DIM, HIDDEN),
            prefix + "self_attn.v_proj.weight": linear(KV_HEADS * HEAD_DIM, HIDDEN),
            prefix + "self_attn.o_proj.weight": linear(HIDDEN, HEADS * HEAD_DIM),
            prefix + "self_attn.q_norm.weight": norm(HEAD_DIM),
            prefix + "self_attn.k_norm.weight": norm(HEAD_DIM),
            prefix + "mlp.gate_proj.weight": linear(INTERMEDIATE, HIDDEN),
            prefix + "mlp.up_proj.weight": linear(INTERMEDIATE, HIDDEN),
            prefix + "mlp.down_proj.weight": linear(HIDDEN, INTERMEDIATE),
        }
    return tensors


def write_case(root: Path, case: Case) -> Path:
    """CASE_DIR as sglang_block.py reads it."""
    case_dir = root / case.name
    (case_dir / "draft").mkdir(parents=True)
    generator = torch.Generator().manual_seed(case.seed)
    config = json.dumps(draft_config(case.rope_theta), indent=1)
    (case_dir / "draft" / "config.json").write_text(config)
    safetensors_torch.save_file(
        draft_weights(generator), str(case_dir / "draft" / "model.safetensors")
    )
    head = {
        "embed": torch.randn(VOCAB, HIDDEN, generator=generator),
        "lm_head": torch.randn(VOCAB, HIDDEN, generator=generator),
    }
    safetensors_torch.save_file(head, str(case_dir / "target_head.safetensors"))
    block_ids = torch.full((BLOCK,), MASK_ID, dtype=torch.int64)
    block_ids[0] = case.anchor
    features = torch.randn(case.context, len(CONTEXT_LAYER_IDS) * HIDDEN, generator=generator)
    inputs = {"features": features, "block_ids": block_ids}
    safetensors_torch.save_file(inputs, str(case_dir / "inputs.safetensors"))
    return case_dir


@pytest.fixture(scope="module", params=RELEASES)
def drafted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every case, drafted by SGLang `request.param`'s code in one subprocess."""
    venv = require_staging_venv(request.param)
    root = tmp_path_factory.mktemp(f"sglang-{request.param}")
    dirs = [write_case(root, case) for case in CASES]
    result = subprocess.run(
        [str(venv / "bin" / "python"), str(SCRIPT), *map(str, dirs)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(
            f"sglang_block.py failed under SGLang {request.param}:\n{result.stderr[-4000:]}"
        )
    return root


def sglang_output(case_dir: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    path = str(case_dir / "sglang_logits.safetensors")
    with safetensors_torch.safe_open(path, "pt") as handle:
        metadata = handle.metadata()
    return safetensors_torch.load_file(path), metadata


def reference_logits(case_dir: Path, draft_dir: Path | None = None) -> torch.Tensor:
    """The training side's logits for `case_dir` (its drafter, or the one in `draft_dir`)."""
    from gpulab.trained.drafter import reference_block_logits

    head = safetensors_torch.load_file(str(case_dir / "target_head.safetensors"))
    inputs = safetensors_torch.load_file(str(case_dir / "inputs.safetensors"))
    return reference_block_logits(
        draft_dir or case_dir / "draft",
        head["embed"],
        head["lm_head"],
        inputs["features"],
        inputs["block_ids"],
    ).float()


def mismatch(served: torch.Tensor, reference: torch.Tensor) -> float:
    """Largest |difference|, in units of the largest |served logit|."""
    return float((served - reference).abs().max() / served.abs().max())


@pytest.mark.parametrize("name", MATCHED)
def test_sglang_block_matches_reference(drafted: Path, name: str) -> None:
    served, metadata = sglang_output(drafted / name)
    logits = served["logits"]
    reference = reference_logits(drafted / name)
    assert logits.shape == reference.shape == (BLOCK, VOCAB)
    print(
        f"{metadata['sglang']} {name}: max |diff| / max |logit| = {mismatch(logits, reference):.2e}"
    )
    assert mismatch(logits, reference) < RELATIVE_TOLERANCE, metadata
    assert torch.equal(logits.argmax(-1), reference.argmax(-1)), metadata
    # The worker's own greedy pick over the target head is the written logits' argmax.
    assert torch.equal(served["draft_tokens"], logits[1:].argmax(-1))
    assert len(set(logits.argmax(-1).tolist())) > 1, "degenerate drafter: one token everywhere"


def test_comparison_fails_when_the_reference_weights_differ(drafted: Path, tmp_path: Path) -> None:
    """One context-path weight changed in the reference's copy must show."""
    case_dir = drafted / MATCHED[0]
    draft = shutil.copytree(case_dir / "draft", tmp_path / "draft")
    tensors = safetensors_torch.load_file(str(draft / "model.safetensors"))
    tensors["layers.1.self_attn.k_proj.weight"][3, 7] += 0.5
    safetensors_torch.save_file(tensors, str(draft / "model.safetensors"))
    served = sglang_output(case_dir)[0]["logits"]
    assert mismatch(served, reference_logits(case_dir, draft)) > 100 * RELATIVE_TOLERANCE


def test_comparison_fails_when_context_positions_differ(drafted: Path, tmp_path: Path) -> None:
    """The same context tokens at other positions (reversed order) must show: the comparison
    sees RoPE at the context positions, not just the set of context keys."""
    case_dir = drafted / MATCHED[0]
    shifted = shutil.copytree(case_dir, tmp_path / "reversed")
    inputs = safetensors_torch.load_file(str(shifted / "inputs.safetensors"))
    inputs["features"] = inputs["features"].flip(0).contiguous()
    safetensors_torch.save_file(inputs, str(shifted / "inputs.safetensors"))
    served = sglang_output(case_dir)[0]["logits"]
    assert mismatch(served, reference_logits(shifted)) > 100 * RELATIVE_TOLERANCE


def test_sglang_rope_base_when_config_asks_for_another(drafted: Path) -> None:
    """0.5.11 builds the draft's RoPE with base 1e6 whatever config.json says (it reads
    `config.rope_theta`, which transformers 5 moved into `rope_parameters`); 0.5.14 reads
    `rope_parameters`. A drafter trained with another base would be served wrongly by 0.5.11."""
    honoured, honoured_meta = sglang_output(drafted / "rope_base_1e4")
    default = sglang_output(drafted / "long_context")[0]["logits"]
    if honoured_meta["sglang"].startswith("0.5.11"):
        assert float(honoured_meta["rope_base"]) == 1e6
        assert torch.equal(honoured["logits"], default)
    else:
        assert float(honoured_meta["rope_base"]) == 1e4
        assert mismatch(honoured["logits"], default) > 100 * RELATIVE_TOLERANCE
