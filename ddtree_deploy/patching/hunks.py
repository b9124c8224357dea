"""Apply one file's unified-diff hunks (parsed by `unidiff`) in memory, with fuzz 0.

The rules follow GNU `patch --fuzz=0`: every context and removed line must match exactly; a
hunk may be found at an offset from its stated line (searched nearest first, never before the
end of the previous hunk), and the offset is reported; a hunk with less leading than trailing
context is anchored at the start of the file, one with less trailing context at its end.
Lines split on `\\n` only, and `\\ No newline at end of file` markers are honoured, so the
output is byte-identical to what `patch -p1 --fuzz=0` writes.
"""

from __future__ import annotations

from dataclasses import dataclass

from unidiff.constants import LINE_TYPE_ADDED, LINE_TYPE_NO_NEWLINE, LINE_TYPE_REMOVED
from unidiff.patch import Hunk, PatchedFile


@dataclass(frozen=True)
class HunkOffset:
    """Where one hunk applied: its 1-based index, stated line, and offset in lines."""

    patch: str
    index: int
    line: int
    offset: int


class HunkMismatch(Exception):
    """A hunk's context was not found; `index` is its 1-based number in the file's diff."""

    def __init__(self, index: int, line: int) -> None:
        super().__init__(f"hunk #{index} (line {line}) does not match")
        self.index = index
        self.line = line


@dataclass(frozen=True)
class _Sides:
    """A hunk as the lines it expects (`old`) and the lines it leaves (`new`)."""

    old: list[str]
    new: list[str]
    start: int  # 0-based index where `old` begins in the stated numbering
    leading_context: int
    trailing_context: int


def split_lines(text: str) -> list[str]:
    """Lines with their `\\n` kept; the last has none when the text does not end with one."""
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def _sides(hunk: Hunk, *, reverse: bool) -> _Sides:
    old: list[str] = []
    new: list[str] = []
    last_type = ""
    types: list[str] = []
    for line in hunk:
        if line.line_type == LINE_TYPE_NO_NEWLINE:
            # The marker removes the newline of the line just before it, on that line's side(s).
            if last_type != LINE_TYPE_ADDED:
                old[-1] = old[-1].removesuffix("\n")
            if last_type != LINE_TYPE_REMOVED:
                new[-1] = new[-1].removesuffix("\n")
            continue
        last_type = line.line_type
        types.append(line.line_type)
        if line.line_type != LINE_TYPE_ADDED:
            old.append(line.value)
        if line.line_type != LINE_TYPE_REMOVED:
            new.append(line.value)
    leading = next((i for i, kind in enumerate(types) if kind != " "), len(types))
    trailing = next((i for i, kind in enumerate(reversed(types)) if kind != " "), len(types))
    start, length = hunk.source_start, hunk.source_length
    if reverse:
        old, new = new, old
        start, length = hunk.target_start, hunk.target_length
    # "@@ -N,0" means "insert after line N", so the 0-based position is N itself.
    return _Sides(old, new, start if length == 0 else start - 1, leading, trailing)


def _candidates(sides: _Sides, guess: int, floor: int, size: int) -> list[int]:
    """Positions to try, nearest to `guess` first, honouring fuzz-0 anchoring."""
    last = size - len(sides.old)
    if sides.leading_context < sides.trailing_context and sides.start <= 0:
        return [0] if floor <= 0 <= last else []
    if sides.trailing_context < sides.leading_context:
        return [last] if last >= floor else []
    ordered = [guess]
    for distance in range(1, max(guess - floor, last - guess) + 1):
        ordered += [guess + distance, guess - distance]
    return [pos for pos in ordered if floor <= pos <= last]


def apply_hunks(
    text: str, diff: PatchedFile, *, patch: str, reverse: bool = False
) -> tuple[str, tuple[HunkOffset, ...]]:
    """`text` with every hunk of `diff` applied (or un-applied with `reverse`).

    Raises `HunkMismatch` for the first hunk whose lines are not found exactly.
    """
    lines = split_lines(text)
    out: list[str] = []
    cursor = 0  # first line of `lines` not yet copied
    last_offset = 0
    offsets: list[HunkOffset] = []
    for index, hunk in enumerate(diff, start=1):
        sides = _sides(hunk, reverse=reverse)
        guess = sides.start + last_offset
        found = next(
            (
                pos
                for pos in _candidates(sides, guess, cursor, len(lines))
                if lines[pos : pos + len(sides.old)] == sides.old
            ),
            None,
        )
        if found is None:
            raise HunkMismatch(index, sides.start + 1)
        out += lines[cursor:found]
        out += sides.new
        cursor = found + len(sides.old)
        last_offset = found - sides.start
        offsets.append(HunkOffset(patch, index, sides.start + 1, last_offset))
    out += lines[cursor:]
    return "".join(out), tuple(offsets)
