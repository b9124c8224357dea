"""The GPU lab's models, checked on CPU: a real tokenizer, and a drafter whose tree branches.

The lab's second GPU run had every check green and proved nothing about trees: its drafter
gave its top-1 token -1e-7 nats and the next -16, so the best-first tree was a 15-deep chain
and tree acceptance equalled the chain's. The tiny models are written by `models.py` in the
0.5.11 staging venv (torch, transformers, tokenizers) and read back. The realistic ones are
written on the GPU only (7 B parameters): here their configs go through transformers (on the
meta device) and SGLang's config classes, their drafter's shaping is checked on the output
head and embedding alone, and five servers of each must fit one H200.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from staging import require_staging_venv

from ddtree_deploy.config import compose_config
from gpulab import models

CHECK = r"""
import json, sys
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer
sys.path.insert(0, sys.argv[2])
from gpulab import models

root, kind = __import__("pathlib").Path(sys.argv[1]), sys.argv[3]
target, draft = models.write_model(root, kind, "tiny")
tokenizer = AutoTokenizer.from_pretrained(target)
ids = tokenizer("Merge the Intervals, please: [1, 3]")["input_ids"]
model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
# What the drafter computes at a [MASK] position when its one small random layer adds little:
# the target's head over its final norm of the [MASK] embedding (DFlash shares both).
mask = model.get_input_embeddings().weight[models.MASK_ID]
norm = load_file(str(draft / "model.safetensors"))["norm.weight"].float()
draft_logp = torch.log_softmax(model.lm_head.weight @ (norm * mask / mask.pow(2).mean().sqrt()), -1)
top = draft_logp.topk(4)
out = model.generate(torch.tensor([ids]), max_new_tokens=128, do_sample=False)[0, len(ids):]
print(json.dumps({
    "decoded": tokenizer.decode(ids),
    "unknown": ids.count(models.UNK_ID),
    "draft_top": top.indices.tolist(),
    "draft_logp": top.values.tolist(),
    "favoured": [models.VOCAB[c] for c in models.FAVOURED],
    "favoured_share": sum(int(t) in [models.VOCAB[c] for c in models.FAVOURED] for t in out) / len(out),
}))
"""


def _check(kind: str, tmp_path: Path) -> dict[str, object]:
    python = require_staging_venv("0.5.11") / "bin" / "python"
    tests = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [str(python), "-c", CHECK, str(tmp_path), str(tests), kind],
        capture_output=True, text=True, timeout=600, env={"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    data: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return data


def test_lab_models_tokenize_text_and_draft_a_branching_tree(tmp_path: Path) -> None:
    for kind in ("attention", "hybrid"):
        got = _check(kind, tmp_path)
        assert got["decoded"] == "merge the intervals, please: [1, 3]"
        assert got["unknown"] == 0
        assert got["draft_top"] == got["favoured"]  # the drafter ranks the favoured set first
        best, second = got["draft_logp"][:2]  # type: ignore[index]
        assert best > -1.0, "the drafter's top-1 must leave room for siblings"
        assert second - best > -1.5, "the second choice must be close enough to be explored"
        assert got["favoured_share"] >= 0.5  # the target mostly emits what the drafter offers


REALISTIC_CHECK = r"""
import json, sys
import torch
from transformers import AutoConfig, AutoModelForCausalLM
sys.path.insert(0, sys.argv[1])
from gpulab import models
from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape
from sglang.srt.configs.qwen3_next import Qwen3NextConfig
from sglang.srt.speculative.dflash_utils import parse_dflash_draft_config

counts = {}
for kind, config in models.TARGETS["realistic"].items():
    settings = {k: v for k, v in config.items() if k != "model_type"}
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(config["model_type"], **settings))
    counts[kind] = sum(p.numel() for p in model.parameters())
hybrid = Qwen3NextConfig(**models.TARGETS["realistic"]["hybrid"])
shape = Mamba2StateShape.create(
    tp_world_size=1, intermediate_size=hybrid.linear_value_head_dim * hybrid.linear_num_value_heads,
    n_groups=hybrid.linear_num_key_heads, num_heads=hybrid.linear_num_value_heads,
    head_dim=hybrid.linear_value_head_dim, state_size=hybrid.linear_key_head_dim,
    conv_kernel=hybrid.linear_conv_kernel_dim,
)
drafts = {}
for kind, config in models.TARGETS["realistic"].items():
    draft = parse_dflash_draft_config(draft_hf_config=AutoConfig.for_model(
        "qwen3", **{k: v for k, v in models.draft_config(kind, "realistic").items() if k != "model_type"}))
    drafts[kind] = [draft.resolve_target_layer_ids(target_num_layers=config["num_hidden_layers"],
                                                    draft_num_layers=1), draft.mask_token_id]
print(json.dumps({
    "counts": counts,
    "attention_layers": hybrid.full_attention_layer_ids,
    "mamba_per_request": Mamba2CacheParams(shape=shape, layers=hybrid.linear_layer_ids).mamba_cache_per_req,
    "drafts": drafts,
}))
"""


def test_realistic_configs_are_what_transformers_and_sglang_build() -> None:
    python = require_staging_venv("0.5.11") / "bin" / "python"
    tests = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [str(python), "-c", REALISTIC_CHECK, str(tests)], capture_output=True, text=True,
        timeout=600, env={"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    realistic = models.TARGETS["realistic"]
    assert got["counts"] == {kind: models.parameter_count(c) for kind, c in realistic.items()}
    assert 6.9e9 < got["counts"]["attention"] < 7.0e9  # Qwen3-8B less its 151k-token vocabulary
    assert 2.2e9 < got["counts"]["hybrid"] < 2.4e9  # 4.6 GB in bf16
    assert got["attention_layers"] == list(range(3, 48, 4))
    assert got["mamba_per_request"] == models.mamba_bytes_per_request(realistic["hybrid"])
    assert got["drafts"] == {
        "attention": [[1, 9, 17, 25, 33], models.MASK_ID],  # Qwen3-8B's DFlash drafter's layers
        "hybrid": [[1, 12, 23, 34, 45], models.MASK_ID],
    }


@pytest.mark.parametrize("kind", models.KINDS)
def test_realistic_drafter_ranks_the_favoured_set_first(kind: str) -> None:
    """The drafter's [MASK] distribution at the realistic width, as the tiny test computes it
    (head over the final norm of [MASK]), on an output head and embedding drawn as the target's
    are: the favoured set first, best first, with room for siblings."""
    config, shaped = models.TARGETS["realistic"][kind], models.shaping("realistic", kind)
    generator = torch.Generator().manual_seed(models.SEED)
    shape = (config["vocab_size"], config["hidden_size"])
    head, embedding = (torch.randn(shape, generator=generator) * config["initializer_range"]
                       for _ in range(2))  # fmt: skip
    models._favour(head, embedding)
    mask = embedding[models.MASK_ID]
    logp = torch.log_softmax(head @ (shaped.draft_norm * mask / mask.pow(2).mean().sqrt()), -1)
    top = logp.topk(4)
    assert top.indices.tolist() == [models.VOCAB[c] for c in models.FAVOURED]
    best, second = top.values[:2].tolist()
    assert -1.0 < best < -0.2, "sure enough to chain, not so sure the tree is one chain"
    assert second - best > -1.5
    # The random layer adds about draft_std**2 * hidden per component to [MASK]'s spread: the
    # tiny drafter's share of it.
    tiny = models.TARGETS["tiny"][kind]
    nudge = shaped.draft_std**2 * config["hidden_size"] / config["initializer_range"]
    tiny_nudge = models.TINY_SHAPING.draft_std**2 * tiny["hidden_size"] / tiny["initializer_range"]
    assert nudge == pytest.approx(tiny_nudge)


# Five servers of one target run at once: DFLASH, shadow_linear, the trees at budgets 15 and 63,
# the planted tree at 15. Verify widths: the block (16), or budget + 1 when wider.
VERIFY_WIDTHS = (16, 16, 16, 64, 16)
PER_SERVER_OVERHEAD = 3e9  # CUDA context, graphs, activations: an estimate, not a measurement
H200_USABLE = 130e9


@pytest.mark.parametrize("kind", models.KINDS)
def test_five_realistic_servers_fit_one_h200(kind: str) -> None:
    cfg = compose_config(["host=h200_lab", "service=lab_realistic", "validation=lab",
                          f"model=lab_{kind}_realistic"])  # fmt: skip
    args = cfg.service.extra_args
    running = int(args[args.index("--max-running-requests") + 1])
    tokens = cfg.service.max_total_tokens
    assert tokens is not None
    target = models.TARGETS["realistic"][kind]
    draft = models.draft_config(kind, "realistic")
    weights = 2 * (models.parameter_count(target) + models.parameter_count(draft))
    kv = tokens * (models.kv_bytes_per_token(target) + models.kv_bytes_per_token(draft))
    total = 0.0
    for width in VERIFY_WIDTHS:
        # SGLang keeps a state per request and, for speculative decoding, one per verify token.
        mamba = (
            running * (1 + width) * models.mamba_bytes_per_request(target)
            if kind == "hybrid"
            else 0
        )
        total += weights + kv + mamba + PER_SERVER_OVERHEAD
    assert total < H200_USABLE, f"{total / 1e9:.1f} GB"
    assert running >= 8  # the batched pass keeps 8 requests in flight
