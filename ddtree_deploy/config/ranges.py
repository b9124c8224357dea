"""The one check of every numeric setting: finite, and inside the range its schema field declares.

A schema field declares its range where it is defined (`ranged(...)` puts a `Range` in the
dataclass field's metadata, which OmegaConf ignores), so the range sits beside the key's comment
and a new numeric key cannot be forgotten by a hand-kept table. `range_problems` walks the
composed config: every float must be finite (nan compares false with everything, so a nan gate
setting would switch its comparison off; no key takes inf), and every number inside its range.
OmegaConf itself refuses nan and inf for an int key. Rules between keys (budget against the
release's limit, topk against budget) stay in `config.rules`, which runs after this check.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from omegaconf import MISSING

RANGE = "range"  # the metadata key of a field's Range


@dataclass(frozen=True)
class Range:
    """The values a numeric key may take (bounds inclusive unless `*_open`), and what they mean."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    why: str = ""  # the unit or meaning, said in parentheses after the range

    def holds(self, value: float) -> bool:
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def describe(self) -> str:
        """The range as words: 'at least 0', 'above 0', 'between 1 and 65535', 'in [0, 1)'."""
        low, high = _number(self.low), _number(self.high)
        if self.low is not None and self.high is not None:
            if not (self.low_open or self.high_open):
                text = f"between {low} and {high}"
            else:
                opening, closing = "(["[not self.low_open], ")]"[not self.high_open]
                text = f"in {opening}{low}, {high}{closing}"
        elif self.low is not None:
            text = f"above {low}" if self.low_open else f"at least {low}"
        elif self.high is not None:
            text = f"below {high}" if self.high_open else f"at most {high}"
        else:
            text = "of any size"
        return f"{text} ({self.why})" if self.why else text


def ranged(
    default: Any = MISSING,
    *,
    factory: Callable[[], Any] | None = None,
    at_least: float | None = None,
    above: float | None = None,
    at_most: float | None = None,
    below: float | None = None,
    why: str = "",
) -> Any:
    """A dataclass field whose value (or each item of its list) must lie in the given range."""
    bounds = Range(
        low=above if above is not None else at_least,
        high=below if below is not None else at_most,
        low_open=above is not None,
        high_open=below is not None,
        why=why,
    )
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata={RANGE: bounds})
    return dataclasses.field(default=default, metadata={RANGE: bounds})


def range_problems(node: object, prefix: str = "") -> Iterator[str]:
    """One sentence per numeric value of the dataclass tree `node` that is not finite or lies
    outside its field's range, naming the key as a Hydra override would (`a.b[0].c`)."""
    for field in dataclasses.fields(node):  # type: ignore[arg-type]
        yield from _value_problems(
            f"{prefix}{field.name}", getattr(node, field.name), field.metadata.get(RANGE)
        )


def _value_problems(key: str, value: object, bounds: Range | None) -> Iterator[str]:
    if dataclasses.is_dataclass(value):
        yield from range_problems(value, f"{key}.")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _value_problems(f"{key}[{index}]", item, bounds)
    elif isinstance(value, dict):
        for name, item in value.items():
            yield from _value_problems(f"{key}.{name}", item, bounds)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        wanted = f"a number {bounds.describe()}" if bounds else "a finite number"
        if not math.isfinite(value):
            yield f"{key}={value} is not a finite number; give {wanted}."
        elif bounds is not None and not bounds.holds(value):
            yield f"{key}={value} is out of range: give {wanted}."


def _number(value: float | None) -> str:
    return f"{value:g}" if value is not None else ""
