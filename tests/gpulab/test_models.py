"""The GPU lab's models, checked on CPU: a real tokenizer, and a drafter whose tree branches.

The lab's second GPU run had every check green and proved nothing about trees: its drafter
gave its top-1 token -1e-7 nats and the next -16, so the best-first tree was a 15-deep chain
and tree acceptance equalled the chain's. The tiny models are written by `models.py` in the
0.5.11 staging venv (torch, transformers, tokenizers) and read back. The realistic ones are
written on the GPU only (7 B parameters): here their configs go through transformers (on the
meta device) and SGLang's config classes, their drafter's shaping is checked on the output
head and embedding alone, and five servers of each must fit one H200. The realistic hybrid is
a dense Qwen3.5 (production's architecture): SGLang's own model class for it is built and loaded
on CPU from both staging wheels, at a small version of its layout (sglang_target.py).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from staging import require_staging_venv

from ddtree_deploy.config import compose_config
from ddtree_deploy.service.render import speculative_args
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
from sglang.srt.configs.qwen3_5 import Qwen3_5Config
from sglang.srt.speculative.dflash_utils import parse_dflash_draft_config

counts = {}
for kind, config in models.TARGETS["realistic"].items():
    text = models.text_config(config)  # the language model transformers draws the weights of
    settings = {k: v for k, v in text.items() if k != "model_type"}
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(text["model_type"], **settings))
    counts[kind] = sum(p.numel() for p in model.parameters())
hybrid = Qwen3_5Config(**models.TARGETS["realistic"]["hybrid"]).text_config
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
    drafts[kind] = [draft.resolve_target_layer_ids(target_num_layers=models.text_config(config)["num_hidden_layers"],
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
    assert 6.0e9 < got["counts"]["hybrid"] < 6.2e9  # 12.2 GB in bf16
    assert got["attention_layers"] == list(range(3, 32, 4))
    assert got["mamba_per_request"] == models.mamba_bytes_per_request(realistic["hybrid"])
    assert got["drafts"] == {
        "attention": [[1, 9, 17, 25, 33], models.MASK_ID],  # Qwen3-8B's DFlash drafter's layers
        "hybrid": [[1, 8, 15, 22, 29], models.MASK_ID],
    }


@pytest.mark.parametrize("kind", models.KINDS)
def test_realistic_drafter_ranks_the_favoured_set_first(kind: str) -> None:
    """The drafter's [MASK] distribution at the realistic width, as the tiny test computes it
    (head over the final norm of [MASK]), on an output head and embedding drawn as the target's
    are: the favoured set first, best first, with room for siblings."""
    config = models.text_config(models.TARGETS["realistic"][kind])
    shaped = models.shaping("realistic", kind)
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
    tiny = models.text_config(models.TARGETS["tiny"][kind])
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
    assert total < 0.9 * H200_USABLE, f"{total / 1e9:.1f} GB"  # a tenth to spare
    assert running >= 8  # the batched pass keeps 8 requests in flight


@pytest.mark.parametrize("release", ["0.5.11", "0.5.14"])
def test_sglang_builds_and_fully_loads_the_qwen3_5_hybrid(release: str, tmp_path: Path) -> None:
    """SGLang's own Qwen3.5 class, from the real wheel on CPU, on a small target of the realistic
    hybrid's layout written by the lab's own writer (sglang_target.py says how)."""
    python = require_staging_venv(release) / "bin" / "python"
    script = Path(__file__).with_name("sglang_target.py")
    proc = subprocess.run(
        [str(python), str(script), str(tmp_path)], capture_output=True, text=True, timeout=600,
        env={"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    small = models.text_config(got["small"])
    assert got["sglang"] == release
    # SGLang's config classes (its registry, not transformers'): the hybrid runner properties
    # that choose the hybrid attention backend and Mamba pools, which both patch sets read as
    # "hybrid", find the text config.
    assert got["config"] == "Qwen3_5Config"
    assert got["text_config"] == "sglang.srt.configs.qwen3_5.Qwen3_5TextConfig"
    assert got["text_is_qwen3_next"]
    assert got["hybrid_gdn_config"] == got["mambaish_config"] == "Qwen3_5TextConfig"
    assert got["layers_block_type"] == [
        "attention" if kind == "full_attention" else kind for kind in small["layer_types"]
    ]
    assert got["model_class"] == "sglang.srt.models.qwen3_5.Qwen3_5ForConditionalGeneration"
    assert got["is_multimodal"]  # every Qwen3_5ForConditionalGeneration is, text-only or not
    assert got["mlp"] == ["Qwen2MoeMLP"]  # SGLang's dense MLP in every layer: no router
    assert got["attn_output_gate"]
    assert got["rotary"] == [1000000.0, small["head_dim"] * small["partial_rotary_factor"]]
    # Every tensor the lab writes is taken, every text parameter is filled, none twice.
    weights = got["weights"]
    assert weights["names_given"] == weights["checkpoint_names"]
    assert weights["returned"] == weights["text_params"]
    assert weights["unloaded"] == []
    assert weights["checkpoint_numel"] == weights["text_numel"]
    assert weights["text_numel"] == models.parameter_count(got["small"])
    assert not [w for w in weights["warnings"] if "not found" in w], weights["warnings"]
    assert weights["lm_head_equal"]  # the shaped head arrives as written
    assert 0 < weights["vision_numel"] < 1e6  # the smallest tower SGLang builds; never loaded
    # DFlash reads the output of each context layer: SGLang marks the layer after it.
    capture = got["capture"]
    assert capture["marked_layers"] == [i + 1 for i in capture["context_layers"]]
    assert capture["capture_aux"]
    # The processor a multimodal model's tokenizer manager builds, and its tokenizer is the lab's.
    assert got["processors"]["processor"] == "Qwen3VLProcessor"
    assert got["processors"]["mm_processor"] == "QwenVLImageProcessor"
    assert got["processors"]["ids"] == [models.VOCAB[c] for c in "merge the intervals"]
    realistic = models.TARGETS["realistic"]["hybrid"]
    assert got["realistic_mamba_per_request"] == models.mamba_bytes_per_request(realistic)


def test_realistic_hybrid_composes_as_a_hybrid_tree_deployment() -> None:
    """The product takes the realistic hybrid as the lab's tree cell does (the hybrid flag is the
    conf/model option's; the patched server's own gate reads the runner's Mamba config, which
    the test above finds)."""
    cfg = compose_config(["host=h200_lab", "service=lab_realistic", "validation=lab",
                          "model=lab_hybrid_realistic", "algo=ddtree",
                          "algo.allow_hybrid_unsafe=true"])  # fmt: skip
    assert cfg.model.hybrid
    assert cfg.model.target_path.endswith("/models/realistic/hybrid/target")
    assert cfg.model.draft_block_size == models.DRAFT_BLOCK_SIZE
    args = speculative_args(cfg)
    assert "--speculative-ddtree-allow-hybrid-unsafe" in args
    assert set(cfg.sglang.hybrid_speculative_args) <= set(args)
    assert "--disable-radix-cache" in args  # 0.5.11 refuses a hybrid speculative server without
    assert models.TARGETS["realistic"]["hybrid"]["model_type"] == "qwen3_5"


IMAGE_WARMED = [(size, kind) for size, targets in models.TARGETS.items()
                for kind, config in targets.items() if "vision_config" in config]  # fmt: skip


@pytest.mark.parametrize(("size", "kind"), IMAGE_WARMED)
def test_a_target_sglang_warms_with_an_image_is_served_without_the_warmup(
    size: str, kind: str
) -> None:
    """SGLang 0.5.11 to 0.5.17 warm a target whose config has a vision_config by sending it an
    image through the chat endpoint; the lab's Qwen3.5 has neither vision weights nor a chat
    template, so each such server failed to start (GPU lab run 13)."""
    cfg = compose_config(["host=h200_lab", f"service=lab_{size}", "validation=lab",
                          f"model=lab_{kind}_{size}"])  # fmt: skip
    assert "--skip-server-warmup" in cfg.service.extra_args
    assert ("realistic", "hybrid") in IMAGE_WARMED
