"""The README and docs/ stay true to the code: relative links resolve (files and #anchors), and
every action, config group and key the code knows is documented."""

from __future__ import annotations

import dataclasses
import re
import typing
from importlib import resources
from pathlib import Path

import pytest

from ddtree_deploy.config import ACTIONS, DeployConfig

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} +(.+?) *$", re.MULTILINE)
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(h) for h in HEADING.findall(FENCE.sub("", page.read_text()))}


def broken_links(page: Path) -> list[str]:
    """Relative links of `page` whose file or #anchor does not exist."""
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z]+:", target):  # https:, mailto:: not ours to check here
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists() or (anchor and anchor not in anchors(dest)):
            broken.append(target)
    return broken


def sections(page: Path, level: str = "###") -> dict[str, str]:
    """Each `level` heading's text (backticks dropped) -> the text up to the next heading."""
    parts = re.split(rf"^{level} +(.+)$", page.read_text(), flags=re.MULTILINE)
    return {parts[i].replace("`", "").split()[0]: parts[i + 1] for i in range(1, len(parts), 2)}


def row_names(text: str) -> set[str]:
    """Backticked names in the first cell of each table row (`patch` / `unpatch` gives both)."""
    cells = [line.split("|")[1] for line in text.splitlines() if line.startswith("| `")]
    return {name for cell in cells for name in re.findall(r"`([^`]+)`", cell)}


def undocumented_actions(actions: tuple[str, ...]) -> list[str]:
    """Actions missing from the README's table or from docs/actions.md's."""
    readme = row_names((ROOT / "README.md").read_text())
    reference = row_names((ROOT / "docs" / "actions.md").read_text())
    return [a for a in actions if a not in readme or a not in reference]


def undocumented_groups(groups: list[str]) -> list[str]:
    """Config groups without a section of their own in docs/configuration.md."""
    documented = sections(ROOT / "docs" / "configuration.md")
    return [g for g in groups if g not in documented]


def conf_groups() -> list[str]:
    conf = resources.files("ddtree_deploy.conf")
    return sorted(p.name for p in conf.iterdir() if p.is_dir() and not p.name.startswith("_"))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page: Path) -> None:
    assert broken_links(page) == []


def test_every_action_is_documented_in_the_readme_and_docs() -> None:
    assert undocumented_actions(ACTIONS) == []
    # An action added to the code without docs is caught:
    assert undocumented_actions(("fly",)) == ["fly"]


def test_every_config_group_has_a_section_in_the_configuration_reference() -> None:
    assert "host" in conf_groups() and "staging" in conf_groups()
    assert undocumented_groups(conf_groups()) == []
    assert undocumented_groups(["fleet_of_nowhere"]) == ["fleet_of_nowhere"]


def test_every_config_key_is_in_its_groups_table() -> None:
    documented = sections(ROOT / "docs" / "configuration.md")
    missing = []
    for name, hint in typing.get_type_hints(DeployConfig).items():
        # An optional group (fleet: none unless chosen) documents its schema's keys all the same.
        schema = next((t for t in typing.get_args(hint) if dataclasses.is_dataclass(t)), hint)
        if dataclasses.is_dataclass(schema):
            rows = row_names(documented.get(name, ""))
            missing += [
                f"{name}.{f.name}" for f in dataclasses.fields(schema) if f.name not in rows
            ]
        elif name not in row_names(documented["Top-level"]):
            missing.append(name)
    assert missing == []
