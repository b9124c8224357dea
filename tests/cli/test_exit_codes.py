"""Exit codes: numbered in one place (`errors.ExitCode`), each error family exits with one of
them, and the README's list names every one."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import ddtree_deploy
from ddtree_deploy.errors import DeployError, ExitCode

README = Path(__file__).resolve().parents[2] / "README.md"


def _families() -> list[type[DeployError]]:
    for module in pkgutil.walk_packages(ddtree_deploy.__path__, "ddtree_deploy."):
        importlib.import_module(module.name)  # every error class defined
    found, todo = [], [DeployError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo += cls.__subclasses__()
    return found


def test_every_error_family_exits_with_a_numbered_code() -> None:
    families = _families()
    assert len(families) > 20  # the walk found the rooms' error trees
    loose = [cls.__qualname__ for cls in families if not isinstance(cls.exit_code, ExitCode)]
    assert loose == []


def test_the_readme_lists_every_exit_code() -> None:
    text = README.read_text()
    listed = text[text.index("**Exit codes:**") :].split("\n\n", 1)[0]
    numbers = {int(n) for n in re.findall(r"(?<![\w=.])(\d+)\s+[a-z`]", listed)}
    assert numbers == {code.value for code in ExitCode} - {ExitCode.INTERRUPTED}
