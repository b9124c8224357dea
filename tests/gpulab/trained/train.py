"""Train the lab's small Qwen3 target and its DFlash drafter, and write what SGLang serves.

    python tests/gpulab/trained/train.py OUT_DIR [--seed 0] [--toy] [--device cuda|cpu]

Stages: corpus (stdlib source) -> tokenizer -> target -> greedy continuations -> drafter ->
predicted acceptance. Writes OUT_DIR/target/ (config, safetensors, tokenizer files),
OUT_DIR/draft/ (config.json, model.safetensors), OUT_DIR/prompts.json (held-out prompts) and
OUT_DIR/training.json (seed, sizes, parameter counts, steps, losses, seconds and tokens/s per
stage, predicted DFLASH acceptance). One short line per stage on stdout. `--toy` runs tiny
sizes on a CPU in seconds (tests); the default sizes take about five minutes of one H200.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import asdict, fields, replace
from pathlib import Path

if __package__ in (None, ""):
    # Run as a script (the GPU lab's way): make `gpulab.trained` importable from tests/.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

from gpulab.trained import acceptance, corpus, tokenizer
from gpulab.trained.distill import train_drafter
from gpulab.trained.drafter import DraftConfig, Drafter, export
from gpulab.trained.generate import greedy_continue
from gpulab.trained.prompts import held_out_prompts
from gpulab.trained.sizes import DEFAULT, TOY, Sizes
from gpulab.trained.target import (
    MAX_POSITIONS,
    build_target,
    evaluate_loss,
    save_target,
    target_config,
    train_target,
)

HELD_OUT_LOSS_BYTES = 200_000  # held-out text encoded for the held-out loss (about 60K tokens)


def _say(stage: str, started: float, detail: str) -> None:
    print(f"[{stage:>9}] {time.monotonic() - started:6.1f}s  {detail}", flush=True)


def _params(module: torch.nn.Module) -> int:
    return sum(parameter.numel() for parameter in module.parameters())


def draft_config(sizes: Sizes) -> DraftConfig:
    """The drafter's config: the target's width and head layout, its own depth."""
    return DraftConfig(
        hidden_size=sizes.hidden_size,
        num_layers=sizes.draft_layers,
        num_heads=sizes.num_heads,
        num_kv_heads=sizes.num_kv_heads,
        head_dim=sizes.head_dim,
        intermediate_size=sizes.intermediate_size,
        target_layer_ids=sizes.target_layer_ids,
        num_target_layers=sizes.num_layers,
        block_size=sizes.block_size,
        mask_token_id=tokenizer.MASK_ID,
        vocab_size=sizes.vocab_size,
        max_position_embeddings=MAX_POSITIONS,
    )


def run(out: Path, sizes: Sizes, seed: int, device: torch.device) -> dict[str, object]:
    """Every stage in order; returns what training.json records."""
    random.seed(seed)
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    import transformers

    record: dict[str, object] = {
        "seed": seed,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "sizes": asdict(sizes),
    }
    seconds: dict[str, float] = {}
    started = stage = time.monotonic()

    texts = corpus.load_corpus(None, sizes.min_corpus_bytes, sizes.max_train_bytes)
    train_texts = [doc.text for doc in texts.train]
    seconds["corpus"] = round(time.monotonic() - stage, 2)
    record["corpus"] = {
        "root": str(texts.root),
        "train_files": len(texts.train),
        "held_out_files": len(texts.held_out),
        "train_bytes": texts.train_bytes,
    }
    _say("corpus", started, f"{len(texts.train)} train / {len(texts.held_out)} held-out files")

    stage = time.monotonic()
    bpe = tokenizer.train_tokenizer(
        tokenizer.sample_texts(train_texts, sizes.tokenizer_sample_bytes), sizes.vocab_size
    )
    windows = tokenizer.pack(tokenizer.encode(bpe, train_texts), sizes.seq_len)
    held_texts = tokenizer.sample_texts([doc.text for doc in texts.held_out], HELD_OUT_LOSS_BYTES)
    held_windows = tokenizer.pack(tokenizer.encode(bpe, held_texts), sizes.seq_len)
    seconds["tokenizer"] = round(time.monotonic() - stage, 2)
    record["tokens"] = {"train": windows.numel(), "held_out": held_windows.numel()}
    _say("tokenizer", started, f"vocab {bpe.get_vocab_size()}, {windows.numel():,} train tokens")

    config = target_config(sizes)
    model = build_target(config)
    target_record = train_target(model, windows, sizes, device, generator)
    held_loss = evaluate_loss(
        model, held_windows[: 8 * sizes.target_batch], sizes.target_batch, device
    )
    seconds["target"] = target_record.seconds
    record["target"] = {
        "params": _params(model),
        "epochs": round(target_record.tokens / windows.numel(), 2),
        "held_out_loss": round(held_loss, 4),
        **target_record.summary(),
    }
    save_target(model, config, out / "target")
    tokenizer.save_tokenizer(bpe, out / "target", MAX_POSITIONS)
    model.to(device)  # save_target cast it to bf16: the weights SGLang serves, used from here on
    if device.type == "cpu":
        model.float()
    _say("target", started, f"{target_record.steps_done} steps, held-out loss {held_loss:.3f}")

    stage = time.monotonic()
    prompt_len = sizes.greedy_prompt_len
    wanted = min(sizes.greedy_sequences, len(windows))  # one prompt per training window at most
    rows = torch.randperm(len(windows), generator=generator)[:wanted]
    sequences = greedy_continue(
        model,
        windows[rows, :prompt_len],
        sizes.seq_len - prompt_len,
        sizes.greedy_batch,
        device,
        sizes.greedy_cap_s,
    )
    seconds["greedy"] = round(time.monotonic() - stage, 2)
    new_tokens = len(sequences) * (sizes.seq_len - prompt_len)
    record["greedy"] = {
        "sequences": len(sequences),
        "capped": len(sequences) < wanted,
        "new_tokens": new_tokens,
        "tokens_per_s": round(new_tokens / seconds["greedy"]) if seconds["greedy"] else None,
    }
    _say("greedy", started, f"{len(sequences)} continuations")

    drafter = Drafter(draft_config(sizes))
    drafter.init_weights()
    draft_record = train_drafter(drafter, model, sequences, prompt_len, sizes, device, generator)
    seconds["drafter"] = draft_record.seconds
    record["drafter"] = {"params": _params(drafter), **draft_record.summary()}
    export(drafter, out / "draft")
    _say(
        "drafter",
        started,
        f"{draft_record.steps_done} steps, loss {draft_record.losses[-1][1]:.3f}",
    )

    stage = time.monotonic()
    prompts = held_out_prompts(texts.held_out, bpe, sizes.prompts, sizes.prompt_tokens)
    entries = [prompt.entry(sizes.max_new_tokens) for prompt in prompts]
    (out / "prompts.json").write_text(json.dumps(entries, indent=2) + "\n")
    results = acceptance.predict(
        drafter, model, [(p.name, p.ids) for p in prompts], sizes.max_new_tokens, device
    )
    seconds["acceptance"] = round(time.monotonic() - stage, 2)
    record["acceptance"] = {
        "block_size": sizes.block_size,
        **acceptance.summary(results),
        "first_answer": bpe.decode(results[0].answer),
    }
    record["seconds"] = {**seconds, "total": round(time.monotonic() - started, 2)}
    _say(
        "accept", started, f"predicted DFLASH accept len {record['acceptance']['mean_accept_len']}"
    )
    return record


def override(sizes: Sizes, assignments: list[str]) -> Sizes:
    """sizes with FIELD=VALUE assignments applied (values parsed as JSON: 3, 1e-3, [1,4,6])."""
    changes: dict[str, object] = {}
    for assignment in assignments:
        name, _, value = assignment.partition("=")
        if name not in {field.name for field in fields(Sizes)}:
            raise SystemExit(f"--set {assignment}: Sizes has no field {name!r}")
        parsed = json.loads(value)
        changes[name] = tuple(parsed) if isinstance(parsed, list) else parsed
    return replace(sizes, **changes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="output folder (target/, draft/, JSON files)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--toy", action="store_true", help="tiny sizes for a CPU (tests)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override one Sizes field (experiments; training.json records the sizes used)",
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    record = run(args.out, override(TOY if args.toy else DEFAULT, args.set), args.seed, device)
    (args.out / "training.json").write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
