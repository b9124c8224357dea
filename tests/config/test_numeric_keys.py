"""Every numeric key of the composed config refuses nan, inf, -inf and a negative number.

The keys are found by composing `conf/` (the default, each host and each fleet: the options
that change which keys and list items exist) and walking the result for int and float nodes,
so a key added later is covered without editing this file. A list's items share their key's
range, so only its first item is tried. No key takes any of these values today; a key that
should (a documented allowance) would be listed in docs/configuration.md and here.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from omegaconf import DictConfig, ListConfig
from omegaconf.nodes import FloatNode, IntegerNode

from ddtree_deploy.cli import main
from ddtree_deploy.config import compose_config, group_options
from ddtree_deploy.config.compose import CONFIG_MODULE
from ddtree_deploy.config.schema import register_configs
from ddtree_deploy.errors import ConfigError

HOSTILE = ("nan", "inf", "-inf", "-1")
# Groups whose options change which numeric keys exist: a fleet adds its strategy, a host its
# GPU ids (and picks the model, gpu and release that fill the rest).
KEY_GROUPS = ("host", "fleet")


def _numeric_keys(node: DictConfig | ListConfig, prefix: str) -> Iterator[tuple[str, str]]:
    """(key, Hydra override template with {} for the value) for every numeric node under
    `node`; a list of numbers is given whole, with {} in its first item's place."""
    if isinstance(node, ListConfig):
        items = [node._get_node(i) for i in range(len(node))]
        if items and isinstance(items[0], IntegerNode | FloatNode):
            rest = ",".join(str(item._value()) for item in items[1:])
            yield f"{prefix}[0]", f"{prefix}=[{{}}{',' if rest else ''}{rest}]"
        elif items and isinstance(items[0], DictConfig):
            yield from _numeric_keys(items[0], f"{prefix}[0]")
        return
    for name in node:
        child = node._get_node(name)
        key = f"{prefix}.{name}" if prefix else str(name)
        if isinstance(child, IntegerNode | FloatNode):
            yield key, f"{key.replace('[0]', '.0')}={{}}"  # Hydra names a list item a.0.b
        elif isinstance(child, DictConfig | ListConfig) and not child._is_none():
            yield from _numeric_keys(child, key)


def _compositions() -> list[list[str]]:
    options = {g.group: g.options for g in group_options()}
    return [[], *([f"{group}={o}"] for group in KEY_GROUPS for o in options[group])]


def _cases() -> list[pytest.ParameterSet]:
    register_configs()
    found: dict[str, tuple[list[str], str]] = {}
    for base in _compositions():
        with initialize_config_module(CONFIG_MODULE, version_base="1.3"):
            raw = compose("config", overrides=base)
        for key, template in _numeric_keys(raw, ""):
            found.setdefault(key, (base, template))
    return [
        pytest.param(base, template.format(value), key, id=f"{key}={value}")
        for key, (base, template) in sorted(found.items())
        for value in HOSTILE
    ]


CASES = _cases()


def _said(key: str) -> re.Pattern[str]:
    """The key as a sentence may name it: `a.b[0].c` or `a.b.0.c`."""
    return re.compile(re.escape(key).replace(r"\[0\]", r"(\[0\]|\.0)"))


def test_the_walk_finds_the_keys_of_every_group() -> None:
    keys = {case.values[2] for case in CASES}
    for key in (
        "validation.tie_tolerance",
        "validation.min_speedup",
        "validation.tree.timeout_s",
        "validation.prompts[0].max_new_tokens",
        "service.max_total_tokens",  # null by default: an int node all the same
        "tune.budgets[0]",
        "host.gpu_ids[0]",  # ct hosts list GPU ids; the local host has none
        "fleet.batch_size",  # only a fleet composition has it
    ):
        assert key in keys


@pytest.mark.parametrize(("base", "override", "key"), CASES)
def test_numeric_key_refuses_a_non_finite_or_negative_value(
    base: list[str], override: str, key: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        compose_config([*base, override])
    sentence = str(caught.value)
    assert caught.value.exit_code == 2
    assert _said(key).search(sentence), sentence
    assert "\n" not in sentence


def test_nan_tie_tolerance_is_refused_by_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """nan compares false with every bound, so it used to pass the range rule and switch the
    tree gate's token check off (every 'beyond the tolerance' comparison false)."""
    runs = tmp_path / "runs"
    rc = main(["validation.tie_tolerance=nan", f"rollout.runs_dir={runs}"])
    err = capsys.readouterr().err
    assert rc == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines == [
        "error: validation.tie_tolerance=nan is not a finite number; give a number at least 0 "
        "(nats; 0 asks every tree token to be the target's top-1)."
    ], err
    assert not runs.exists()  # refused before a run folder is made
