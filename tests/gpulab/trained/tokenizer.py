"""The byte-level BPE tokenizer the target and drafter share, and the packed training windows.

Special tokens sit at fixed ids: `<|endoftext|>` (0; eos and pad) and `<|MASK|>` (1; the DFlash
mask token). Reserving the mask id inside the vocabulary matters: with `mask_token_id` set in the
draft config, SGLang checks it against the tokenizer and never adds a token past vocab_size
(research doc, section 1.4). The tokenizer is saved as `tokenizer.json` plus a
`tokenizer_config.json` naming PreTrainedTokenizerFast, which transformers and SGLang both load.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # `tokenizers` is imported where it is used: CPU tests import this module
    from tokenizers import Tokenizer

EOS = "<|endoftext|>"
MASK = "<|MASK|>"
EOS_ID = 0
MASK_ID = 1


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """Learn byte-level BPE merges from texts; ids 0 and 1 are EOS and MASK."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS, MASK],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    if tokenizer.token_to_id(EOS) != EOS_ID or tokenizer.token_to_id(MASK) != MASK_ID:
        raise RuntimeError("the BPE trainer did not put the special tokens at ids 0 and 1")
    return tokenizer


def sample_texts(texts: Sequence[str], max_bytes: int) -> list[str]:
    """The leading texts of a list, up to about max_bytes (the tokenizer's training sample)."""
    sample: list[str] = []
    size = 0
    for text in texts:
        if size >= max_bytes:
            break
        sample.append(text)
        size += len(text.encode())
    return sample


def save_tokenizer(tokenizer: Tokenizer, directory: Path, max_length: int) -> None:
    """Write tokenizer.json and tokenizer_config.json (a PreTrainedTokenizerFast) into directory."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS,
        "pad_token": EOS,
        "mask_token": MASK,
        "bos_token": None,
        "add_bos_token": False,
        "model_max_length": max_length,
        "clean_up_tokenization_spaces": False,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    special = {"eos_token": EOS, "pad_token": EOS, "mask_token": MASK}
    (directory / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")


def encode(tokenizer: Tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text (no special tokens added: the tokenizer has no post-processor)."""
    return [encoding.ids for encoding in tokenizer.encode_batch(list(texts))]


def pack(docs: Sequence[Sequence[int]], seq_len: int) -> torch.Tensor:
    """Documents joined by EOS and cut into windows [N, seq_len] (the tail is dropped)."""
    stream: list[int] = []
    for ids in docs:
        stream.extend(ids)
        stream.append(EOS_ID)
    count = len(stream) // seq_len
    if count == 0:
        raise ValueError(f"{len(stream)} tokens make no window of {seq_len}")
    return torch.tensor(stream[: count * seq_len], dtype=torch.long).view(count, seq_len)
