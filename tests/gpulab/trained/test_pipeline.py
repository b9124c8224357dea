"""The toy pipeline end to end, in the 0.5.11 staging venv (transformers, tokenizers).

Two runs with one seed must write the same files; the target dir must load in transformers
with its tokenizer; the draft dir must hold SGLang's tensor names for the toy's shapes.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from staging import require_staging_venv

from gpulab.trained.sizes import TOY
from gpulab.trained.test_drafter import sglang_names

SCRIPT = r"""
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from gpulab.trained.train import main
root = Path(sys.argv[2])
for name in ("first", "second"):
    main([str(root / name), "--toy", "--seed", "3"])
from transformers import AutoModelForCausalLM, AutoTokenizer
target = root / "first" / "target"
tokenizer = AutoTokenizer.from_pretrained(target)
model = AutoModelForCausalLM.from_pretrained(target)
text = "def f(x):\n    return x  # <|MASK|> here\n"
ids = tokenizer(text)["input_ids"]
print(json.dumps({
    "roundtrip": tokenizer.decode(ids) == text,
    "mask_id": tokenizer.convert_tokens_to_ids("<|MASK|>"),
    "mask_in_ids": tokenizer.convert_tokens_to_ids("<|MASK|>") in ids,
    "eos_id": tokenizer.eos_token_id,
    "model_class": type(model).__name__,
    "vocab_rows": model.get_input_embeddings().weight.shape[0],
    "head_dim": model.config.head_dim,
}))
"""


@pytest.fixture(scope="module")
def toy_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    python = require_staging_venv("0.5.11") / "bin" / "python"
    root = tmp_path_factory.mktemp("trained")
    tests = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [str(python), "-c", SCRIPT, str(tests), str(root)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root, json.loads(proc.stdout.strip().splitlines()[-1])


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _stable(record: dict[str, Any]) -> dict[str, Any]:
    """training.json without what depends on the clock."""
    return {
        "target": record["target"]["losses"],
        "drafter": record["drafter"]["losses"],
        "acceptance": record["acceptance"],
        "greedy": record["greedy"]["new_tokens"],
    }


def test_seeded_runs_write_identical_models(toy_runs: tuple[Path, dict[str, Any]]) -> None:
    root, _ = toy_runs
    for relative in ("target/model.safetensors", "draft/model.safetensors", "prompts.json"):
        assert _digest(root / "first" / relative) == _digest(root / "second" / relative), relative
    first, second = (
        json.loads((root / n / "training.json").read_text()) for n in ("first", "second")
    )
    assert _stable(first) == _stable(second)
    assert first["seed"] == 3 and first["target"]["steps_done"] == TOY.target_steps


def test_target_dir_loads_in_transformers_with_its_tokenizer(
    toy_runs: tuple[Path, dict[str, Any]],
) -> None:
    root, loaded = toy_runs
    assert loaded == {
        "roundtrip": True,
        "mask_id": 1,
        "mask_in_ids": True,
        "eos_id": 0,
        "model_class": "Qwen3ForCausalLM",
        "vocab_rows": TOY.vocab_size,
        "head_dim": TOY.head_dim,
    }
    config = json.loads((root / "first" / "target" / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"] and config["model_type"] == "qwen3"
    assert config["rope_theta"] == 1e6 and config["rope_parameters"]["rope_theta"] == 1e6
    assert config["tie_word_embeddings"] is False and config["max_position_embeddings"] >= 2048


def test_draft_dir_holds_sglangs_names_for_the_toy_shapes(
    toy_runs: tuple[Path, dict[str, Any]],
) -> None:
    from safetensors.torch import load_file

    root, _ = toy_runs
    draft = root / "first" / "draft"
    config = json.loads((draft / "config.json").read_text())
    assert config["dflash_config"]["mask_token_id"] == 1
    assert config["num_target_layers"] == TOY.num_layers
    h, d = TOY.hidden_size, TOY.head_dim
    expected = sglang_names(
        h,
        len(TOY.target_layer_ids),
        TOY.num_heads * d,
        TOY.num_kv_heads * d,
        d,
        TOY.intermediate_size,
        TOY.draft_layers,
    )
    tensors = load_file(str(draft / "model.safetensors"))
    assert {name: tuple(t.shape) for name, t in tensors.items()} == expected
    assert tensors["fc.weight"].shape == (h, len(TOY.target_layer_ids) * h)


def test_prompts_fit_the_trained_sequence_length(toy_runs: tuple[Path, dict[str, Any]]) -> None:
    root, _ = toy_runs
    prompts = json.loads((root / "first" / "prompts.json").read_text())
    record = json.loads((root / "first" / "training.json").read_text())
    assert len(prompts) == TOY.prompts
    assert {p["kind"] for p in prompts} == {"code"}
    assert all(p["max_new_tokens"] == TOY.max_new_tokens for p in prompts)
    assert set(record["acceptance"]["per_prompt"]) == {p["name"] for p in prompts}
    assert 1.0 <= record["acceptance"]["mean_accept_len"] <= TOY.block_size
