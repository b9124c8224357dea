"""The args probe's warm children stay bounded: each holds SGLang imported (about 550 MB), and a
worker that met every release's patched and pristine trees kept one per tree until it exited (CI
ran out of memory with sixteen releases). A stand-in child here: only the cache's policy is
under test, not SGLang."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import ClassVar

import pytest

from patching import sglang_args_probe as probe


class _Child:
    """Stands in for `_Resolver`: answers at once, remembers whether it was closed."""

    made: ClassVar[list[_Child]] = []

    def __init__(self, python: str, sglang_root: str | None) -> None:
        self.root, self.closed = sglang_root, False
        self.proc = self  # resolve_server_args polls `proc` to see whether the child lives
        _Child.made.append(self)

    def poll(self) -> int | None:
        return 1 if self.closed else None

    def ask(self, argv: Sequence[str], timeout: float) -> probe.Resolution:
        return probe.Resolution(True, {"root": self.root})

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def children(monkeypatch: pytest.MonkeyPatch) -> list[_Child]:
    monkeypatch.setattr(probe, "_Resolver", _Child)
    monkeypatch.setattr(probe, "_RESOLVERS", OrderedDict())
    _Child.made = []
    return _Child.made


def test_at_most_three_children_stay_warm_and_the_least_recent_goes(children: list[_Child]) -> None:
    for root in ("patched-a", "pristine-a", "patched-a", "patched-b", "pristine-b"):
        assert probe.resolve_server_args("python", [], root).fields == {"root": root}
    assert [c.root for c in children] == ["patched-a", "pristine-a", "patched-b", "pristine-b"]
    # patched-a was asked again after pristine-a, so pristine-a was the least recent one
    assert [c.root for c in children if c.closed] == ["pristine-a"]
    assert len([c for c in children if not c.closed]) == probe.MAX_WARM_RESOLVERS


def test_a_dead_child_is_replaced(children: list[_Child]) -> None:
    probe.resolve_server_args("python", [], "root")
    children[0].close()
    probe.resolve_server_args("python", [], "root")
    assert len(children) == 2 and not children[1].closed
