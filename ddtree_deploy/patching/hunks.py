"""Apply one file's unified-diff hunks (parsed by `unidiff`) in memory, as GNU `patch` does.

The rules follow GNU `patch`: every context and removed line must match exactly; a hunk may be
found at an offset from its stated line (searched nearest first, never before the end of the
previous hunk), and the offset is reported; a hunk with less leading than trailing context is
anchored at the start of the file, one with less trailing context at its end. Lines split on
`\\n` only, and `\\ No newline at end of file` markers are honoured, so the output is
byte-identical to what `patch -p1` writes.

`apply_hunks` is the engine's: fuzz 0, and the first hunk that does not match raises.
`fit_hunks` is `action=port`'s: up to `max_fuzz` lines of outer context may be ignored (GNU's
`--fuzz`: the ignored lines keep the file's text), and a hunk that still does not match is
skipped and reported with the line that did not match, as `patch` leaves a `.rej`.
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


@dataclass(frozen=True)
class HunkFit:
    """Where one hunk landed in a port: offset and fuzz, or (`mismatch`) why it did not."""

    patch: str
    index: int
    line: int
    offset: int
    fuzz: int
    mismatch: str | None  # None: applied; else the sentence naming the line that differs

    @property
    def applied(self) -> bool:
        return self.mismatch is None


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
    old_kinds: list[str]  # " " (context) or "-" (removed), one per `old` line

    def fuzzed(self, fuzz: int) -> tuple[_Sides, bool, bool]:
        """The hunk with up to `fuzz` outer context lines dropped, as GNU `locate_hunk` does,
        and whether it is anchored at the file's start or end (the shorter context side)."""
        context = max(self.leading_context, self.trailing_context)
        prefix = fuzz + self.leading_context - context
        suffix = fuzz + self.trailing_context - context
        at_start = prefix < 0 and self.start <= 0
        at_end = suffix < 0
        prefix, suffix = max(prefix, 0), max(suffix, 0)
        if not prefix and not suffix:
            return self, at_start, at_end
        trimmed = _Sides(
            self.old[prefix : len(self.old) - suffix],
            self.new[prefix : len(self.new) - suffix],
            self.start + prefix,
            self.leading_context - prefix,
            self.trailing_context - suffix,
            self.old_kinds[prefix : len(self.old_kinds) - suffix],
        )
        return trimmed, at_start, at_end


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
    old_kinds: list[str] = []
    new_kinds: list[str] = []
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
            old_kinds.append("-" if line.line_type == LINE_TYPE_REMOVED else " ")
        if line.line_type != LINE_TYPE_REMOVED:
            new.append(line.value)
            new_kinds.append("-" if line.line_type == LINE_TYPE_ADDED else " ")
    leading = next((i for i, kind in enumerate(types) if kind != " "), len(types))
    trailing = next((i for i, kind in enumerate(reversed(types)) if kind != " "), len(types))
    start, length = hunk.source_start, hunk.source_length
    if reverse:
        old, new, old_kinds = new, old, new_kinds
        start, length = hunk.target_start, hunk.target_length
    # "@@ -N,0" means "insert after line N", so the 0-based position is N itself.
    return _Sides(old, new, start if length == 0 else start - 1, leading, trailing, old_kinds)


def _candidates(
    sides: _Sides, guess: int, floor: int, size: int, *, at_start: bool, at_end: bool
) -> list[int]:
    """Positions to try, nearest to `guess` first, honouring the start/end anchoring."""
    last = size - len(sides.old)
    if at_start:
        return [0] if floor <= 0 <= last else []
    if at_end:
        return [last] if last >= floor else []
    ordered = [guess]
    for distance in range(1, max(guess - floor, last - guess) + 1):
        ordered += [guess + distance, guess - distance]
    return [pos for pos in ordered if floor <= pos <= last]


def _locate(
    lines: list[str], sides: _Sides, guess: int, floor: int, max_fuzz: int
) -> tuple[_Sides, int, int] | None:
    """(the hunk as matched, its position, the fuzz it needed), trying fuzz 0 first."""
    context = max(sides.leading_context, sides.trailing_context)
    for fuzz in range(min(max_fuzz, context) + 1):
        fitted, at_start, at_end = sides.fuzzed(fuzz)
        # The guess moves with the dropped leading lines, so offsets stay comparable.
        moved = guess + (fitted.start - sides.start)
        for pos in _candidates(fitted, moved, floor, len(lines), at_start=at_start, at_end=at_end):
            if lines[pos : pos + len(fitted.old)] == fitted.old:
                return fitted, pos, fuzz
    return None


def _mismatch(lines: list[str], sides: _Sides, guess: int, floor: int) -> str:
    """Which expected line is not there: one missing from the file altogether, else the first
    that differs where most of the hunk's lines match (nearest to `guess` on a tie)."""
    present = set(lines[floor:])
    for want, kind in zip(sides.old, sides.old_kinds, strict=True):
        if want not in present:
            return f"{_kind(kind)} line {_shown(want)} is not in the file"
    best, best_score = max(floor, 0), -1
    for pos in range(max(floor, 0), max(len(lines) - len(sides.old), floor) + 1):
        window = lines[pos : pos + len(sides.old)]
        score = sum(a == b for a, b in zip(window, sides.old, strict=False))
        if score > best_score or (score == best_score and abs(pos - guess) < abs(best - guess)):
            best, best_score = pos, score
    window = lines[best : best + len(sides.old)]
    for number, (want, kind) in enumerate(zip(sides.old, sides.old_kinds, strict=True)):
        got = window[number] if number < len(window) else None
        if got != want:
            found = _shown(got) if got is not None else "the end of the file"
            return (
                f"{_kind(kind)} line {_shown(want)} does not match line {best + number + 1} "
                f"({found}) at the closest match ({best_score} of {len(sides.old)} lines)"
            )
    return "its lines match only before the end of the previous hunk"


def _kind(kind: str) -> str:
    return "removed" if kind == "-" else "context"


def _shown(line: str) -> str:
    text = line.rstrip("\n").strip()
    return repr(text if len(text) <= 80 else text[:77] + "...")


def fit_hunks(
    text: str, diff: PatchedFile, *, patch: str, max_fuzz: int
) -> tuple[str, tuple[HunkFit, ...]]:
    """`text` with every hunk of `diff` that fits applied (fuzz up to `max_fuzz`); the hunks
    that do not fit are left out and carry the reason in `HunkFit.mismatch`. Never raises."""
    return _fit(text, diff, patch=patch, reverse=False, max_fuzz=max_fuzz, strict=False)


def apply_hunks(
    text: str, diff: PatchedFile, *, patch: str, reverse: bool = False
) -> tuple[str, tuple[HunkOffset, ...]]:
    """`text` with every hunk of `diff` applied (or un-applied with `reverse`), fuzz 0.

    Raises `HunkMismatch` for the first hunk whose lines are not found exactly.
    """
    result, fits = _fit(text, diff, patch=patch, reverse=reverse, max_fuzz=0, strict=True)
    return result, tuple(HunkOffset(f.patch, f.index, f.line, f.offset) for f in fits)


def _fit(
    text: str, diff: PatchedFile, *, patch: str, reverse: bool, max_fuzz: int, strict: bool
) -> tuple[str, tuple[HunkFit, ...]]:
    """The one hunk loop; `strict` raises `HunkMismatch` at the first miss instead of
    explaining it and going on without that hunk."""
    lines = split_lines(text)
    out: list[str] = []
    cursor = 0  # first line of `lines` not yet copied
    last_offset = 0
    fits: list[HunkFit] = []
    for index, hunk in enumerate(diff, start=1):
        sides = _sides(hunk, reverse=reverse)
        guess = sides.start + last_offset
        located = _locate(lines, sides, guess, cursor, max_fuzz)
        if located is None:
            if strict:
                raise HunkMismatch(index, sides.start + 1)
            reason = _mismatch(lines, sides, guess, cursor)
            fits.append(HunkFit(patch, index, sides.start + 1, 0, 0, reason))
            continue
        fitted, found, fuzz = located
        out += lines[cursor:found]
        out += fitted.new
        cursor = found + len(fitted.old)
        last_offset = found - fitted.start
        fits.append(HunkFit(patch, index, sides.start + 1, last_offset, fuzz, None))
    out += lines[cursor:]
    return "".join(out), tuple(fits)
