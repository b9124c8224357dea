"""The one check of every string setting: no character that can break a line of a file.

Config strings land in systemd units, environment files, shell commands, folder names and
reports; a newline (or CR, NUL, another control character, a Unicode line separator) in one of
them could start a new unit directive or a new command. No setting needs one, except a field
declared `multiline()` (a validation prompt's text, which only travels inside JSON). The
renderers check again (`service.quoting`), so a value that bypassed composition still cannot
write a line.
"""

from __future__ import annotations

import dataclasses
import unicodedata
from collections.abc import Iterator
from typing import Any

from omegaconf import MISSING

MULTILINE = "multiline"  # the metadata key of a field that may hold line breaks
# Unicode categories that break or hide a line: control (C0, DEL, C1), surrogate, line and
# paragraph separators.
_BREAKING = frozenset({"Cc", "Cs", "Zl", "Zp"})


def multiline(default: Any = MISSING) -> Any:
    """A dataclass field whose string may hold line breaks and tabs (it reaches no file line)."""
    return dataclasses.field(default=default, metadata={MULTILINE: True})


def breaking_character(value: str) -> str | None:
    """The first character of `value` that could break a line of a file, as `U+XXXX`, or None."""
    for ch in value:
        if unicodedata.category(ch) in _BREAKING:
            return f"U+{ord(ch):04X}"
    return None


def text_problems(node: object, prefix: str = "") -> Iterator[str]:
    """One sentence per string (or dict key) of the dataclass tree `node` that holds a
    line-breaking character, naming the key as a Hydra override would."""
    for field in dataclasses.fields(node):  # type: ignore[arg-type]
        if not field.metadata.get(MULTILINE):
            yield from _value_problems(f"{prefix}{field.name}", getattr(node, field.name))


def _value_problems(key: str, value: object) -> Iterator[str]:
    if dataclasses.is_dataclass(value):
        yield from text_problems(value, f"{key}.")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _value_problems(f"{key}[{index}]", item)
    elif isinstance(value, dict):
        for name, item in value.items():
            yield from _value_problems(f"{key} (the key {name!r})", name)
            yield from _value_problems(f"{key}.{name}", item)
    elif isinstance(value, str) and (found := breaking_character(value)):
        yield (
            f"{key} holds the control character {found}, which could add a line to a unit, "
            "an environment file or a command; give it on one line without control characters."
        )
