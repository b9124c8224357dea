"""The held-out prompts: code prefixes from held-out files, for prompts.json and acceptance.

Each prompt starts at a `def` or `class` line past the file's first quarter (past licence and
import boilerplate) and takes whole lines until its token count lies in the wanted range, so
it is text a person would send and it tokenizes the same on the server as here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpulab.trained.corpus import Doc

if TYPE_CHECKING:
    from tokenizers import Tokenizer

STARTS = ("def ", "class ", "async def ", "    def ")


@dataclass(frozen=True)
class Prompt:
    """A named held-out prompt and its token ids."""

    name: str
    text: str
    ids: list[int]

    def entry(self, max_new_tokens: int) -> dict[str, object]:
        """Its prompts.json entry (the product's validation-set shape)."""
        return {
            "name": self.name,
            "kind": "code",
            "text": self.text,
            "max_new_tokens": max_new_tokens,
        }


def _prompt_from(doc: Doc, tokenizer: Tokenizer, low: int, high: int) -> Prompt | None:
    """The doc's first fitting prompt, or None when no start line gives one.

    A prompt ends on a line that opens a block (ends with ':'), without its newline, so code
    must follow: a prompt that looks like a file's end would let the target answer EOS at once.
    """
    lines = doc.text.splitlines(keepends=True)
    for start in range(len(lines) // 4, len(lines)):
        if not lines[start].startswith(STARTS):
            continue
        text = ""
        for line in lines[start:]:
            text += line
            if not line.rstrip().endswith(":"):
                continue
            ids = tokenizer.encode(text).ids
            if len(ids) > high:
                break
            if len(ids) >= low:
                # Without its newline: a bare "\n" token ends files in training (EOS follows),
                # while inside code BPE merges the newline with the next line's indentation.
                text = text.rstrip("\n")
                return Prompt(f"{doc.name}:{start + 1}", text, tokenizer.encode(text).ids)
    return None


def held_out_prompts(
    docs: Sequence[Doc], tokenizer: Tokenizer, count: int, token_range: tuple[int, int]
) -> list[Prompt]:
    """`count` prompts, one per held-out doc, in the corpus's fixed order.

    Raises ValueError when the held-out docs give fewer.
    """
    prompts: list[Prompt] = []
    for doc in docs:
        if "<|" in doc.text:  # a literal special-token string would tokenize as one
            continue
        prompt = _prompt_from(doc, tokenizer, *token_range)
        if prompt is not None:
            prompts.append(prompt)
        if len(prompts) == count:
            return prompts
    raise ValueError(f"the held-out files gave {len(prompts)} prompts, fewer than {count}")
