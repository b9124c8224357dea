"""Every size, step count and time cap of a training run, in one frozen value per preset.

`DEFAULT` is sized for about five minutes of one H200 in total; `TOY` runs the whole pipeline on
a CPU in seconds, for tests. Step counts are explicit so a run is reproducible; the `*_cap_s`
fields stop a stage early on a slow machine (the stage's record says so) because the GPU machine
kills a command after ten minutes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sizes:
    """One preset: corpus, tokenizer, target, greedy data, drafter, held-out prompts."""

    # corpus and tokenizer
    min_corpus_bytes: int  # fewer bytes of source found: the run fails with one sentence
    max_train_bytes: int  # training documents read (in split order) at most
    tokenizer_sample_bytes: int  # training text the BPE learns its merges from
    vocab_size: int
    # target (Qwen3ForCausalLM)
    seq_len: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    target_steps: int
    target_batch: int  # sequences of seq_len per step
    target_lr: float
    target_cap_s: float
    # greedy continuations (the drafter's training data)
    greedy_sequences: int  # at most one per training window (the H200's stdlib gives ~5400)
    greedy_prompt_len: int  # prompt tokens; the continuation fills the rest of seq_len
    greedy_batch: int
    greedy_cap_s: float
    # drafter (DFlashDraftModel)
    draft_layers: int
    target_layer_ids: tuple[int, ...]  # ascending, each <= num_layers - 2 (research doc G3)
    block_size: int
    anchors_per_seq: int
    draft_steps: int
    draft_batch: int
    draft_lr: float
    draft_cap_s: float
    # held-out prompts (prompts.json) and the acceptance prediction
    prompts: int
    prompt_tokens: tuple[int, int]  # a prompt's token count lies in [low, high]
    max_new_tokens: int


DEFAULT = Sizes(
    min_corpus_bytes=5_000_000,
    max_train_bytes=64_000_000,
    tokenizer_sample_bytes=4_000_000,
    vocab_size=4096,
    seq_len=512,
    hidden_size=512,
    num_layers=8,
    num_heads=8,
    num_kv_heads=4,
    head_dim=64,
    intermediate_size=1536,
    target_steps=1200,
    target_batch=16,  # 3.5 epochs: a target that memorises its corpus is hard to draft for
    target_lr=2e-3,
    target_cap_s=150.0,
    greedy_sequences=8192,
    greedy_prompt_len=128,
    greedy_batch=2048,
    greedy_cap_s=60.0,
    draft_layers=3,
    target_layer_ids=(1, 4, 6),
    block_size=16,
    anchors_per_seq=64,
    draft_steps=2600,
    draft_batch=32,
    draft_lr=8e-4,
    draft_cap_s=150.0,
    prompts=16,
    prompt_tokens=(100, 200),
    max_new_tokens=256,
)

TOY = Sizes(
    min_corpus_bytes=1_000_000,
    max_train_bytes=500_000,
    tokenizer_sample_bytes=200_000,
    vocab_size=512,
    seq_len=96,
    hidden_size=64,
    num_layers=4,
    num_heads=2,
    num_kv_heads=1,
    head_dim=32,
    intermediate_size=128,
    target_steps=8,
    target_batch=4,
    target_lr=3e-3,
    target_cap_s=60.0,
    greedy_sequences=8,
    greedy_prompt_len=32,
    greedy_batch=8,
    greedy_cap_s=60.0,
    draft_layers=1,
    target_layer_ids=(1, 2),
    block_size=16,
    anchors_per_seq=4,
    draft_steps=8,
    draft_batch=4,
    draft_lr=1e-3,
    draft_cap_s=60.0,
    prompts=2,
    prompt_tokens=(24, 48),
    max_new_tokens=32,
)
