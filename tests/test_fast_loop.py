"""The fast loop's reading of test code: what reaches a heavy part, however indirectly, is out."""

from __future__ import annotations

from pathlib import Path

import pytest
from fast_loop import HeavyReach
from patching import trees
from staging import require_staging_venv


def _pure(tmp_path: Path) -> str:
    return str(tmp_path / "x")


def _needs_venv() -> Path:
    return require_staging_venv("0.5.11")


class _Helper:
    def python(self) -> Path:
        return _needs_venv() / "bin" / "python"


def _through_a_module() -> Path:
    return trees.wheel_path("0.5.11")  # trees.wheel_path -> fetch_wheel


def _through_a_nested_function() -> object:
    def inner() -> Path:
        return _Helper().python()

    return inner


def _through_the_cli() -> list[str]:
    return ["action=port", "sglang.version=0.5.12"]


@pytest.mark.parametrize(
    ("func", "heavy"),
    [
        (_pure, False),
        (_needs_venv, True),
        (_Helper.python, True),
        (_through_a_module, True),
        (_through_a_nested_function, True),
        (_through_the_cli, True),
    ],
)
def test_a_heavy_part_is_found_through_functions_classes_modules_and_cli_arguments(
    func: object, heavy: bool
) -> None:
    assert HeavyReach().function(func) is heavy  # type: ignore[arg-type]


def test_conftest_marks_a_test_that_needs_nothing_heavy_fast(
    request: pytest.FixtureRequest,
) -> None:
    assert request.node.get_closest_marker("fast") is not None
