"""Every action's outcome type has its own renderer (report.outcomes.present).

The runner hands whatever an action returns to `present`, which dispatches on the type; a type
without a registered renderer would fall through to the base and fail only when a user runs that
action. These tests fail first: when an action handler declares a type that has no renderer, or
an outcome type is added without one.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from pathlib import Path

import pytest

from ddtree_deploy.config import compose_config
from ddtree_deploy.report.outcomes import present
from ddtree_deploy.rollout import outcomes
from ddtree_deploy.rollout.actions import HANDLERS
from ddtree_deploy.rollout.outcomes import ActionOutcome


def _subclasses(cls: type) -> set[type]:
    direct = set(cls.__subclasses__())
    return direct.union(*(_subclasses(sub) for sub in direct))


@pytest.mark.parametrize("action", sorted(HANDLERS))
def test_every_action_returns_a_type_with_its_own_renderer(action: str) -> None:
    """The type each handler declares it returns (its annotation, which mypy holds the handler
    to) is registered with `present` itself, not left to the base's fallback."""
    returned = typing.get_type_hints(HANDLERS[action])["return"]
    assert returned is not ActionOutcome, f"{action}: declare its own outcome type"
    assert issubclass(returned, ActionOutcome)
    assert returned in present.registry, f"{returned.__name__} has no renderer"


def test_every_outcome_type_has_its_own_renderer() -> None:
    """A renderer registered for a parent type would render a subclass's own fields not at all."""
    defined = {cls for cls in _subclasses(ActionOutcome) if cls.__module__ == outcomes.__name__}
    assert defined, "rollout.outcomes defines the action outcome types"
    missing = sorted(cls.__name__ for cls in defined - set(present.registry))
    assert missing == []


def test_an_outcome_without_renderer_is_refused_by_name(tmp_path: Path) -> None:
    @dataclass(frozen=True, kw_only=True)
    class Unrendered(ActionOutcome):
        pass

    cfg = compose_config(["action=plan"])
    with pytest.raises(TypeError, match="no renderer for Unrendered"):
        present(Unrendered(), cfg, tmp_path, False)
