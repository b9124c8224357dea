"""The GPU lab's models, checked on CPU: a real tokenizer, and a drafter whose tree branches.

The lab's second GPU run had every check green and proved nothing about trees: its drafter
gave its top-1 token -1e-7 nats and the next -16, so the best-first tree was a 15-deep chain
and tree acceptance equalled the chain's. These checks run `models.py` in the 0.5.11 staging
venv (torch, transformers, tokenizers) and read back what it wrote.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from staging import require_staging_venv

CHECK = r"""
import json, sys
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer
sys.path.insert(0, sys.argv[2])
from gpulab import models

root, kind = __import__("pathlib").Path(sys.argv[1]), sys.argv[3]
target, draft = models.write_model(root, kind)
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
