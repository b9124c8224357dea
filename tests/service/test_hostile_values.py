"""No config value can add a line or a directive to the rendered unit or environment file.

The keys are found by rendering, not by a list: every string of the composed config (and one
item of each string list and dict) is set to its own marker, and the keys whose marker shows up
in the unit or the environment file are the ones tried. Each hostile value goes through the
compose function the command uses; it is either refused (exit 2, one sentence naming the key) or
rendered, read back by systemd's rules (tests/systemd_syntax.py) and found exactly as given:
the same directives as a plain render, ExecStart's argv and every environment value exact.
`systemd-analyze verify` then judges one unit per hostile value with every accepted key set.
"""

from __future__ import annotations

import copy
import dataclasses
import re
import shutil
import types
import typing
from enum import Enum
from pathlib import Path

import pytest
import yaml
from systemd_syntax import env_file_values, exec_argv, specifiers_resolved, unit_directives

from ddtree_deploy.config import compose_config
from ddtree_deploy.config.schema import DeployConfig
from ddtree_deploy.errors import ConfigError
from ddtree_deploy.service.lint import lint_unit
from ddtree_deploy.service.render import RenderedService, render_service

# Settings that must hold an absolute path (their markers are one).
ABSOLUTE_PATHS = ("host.sglang_venv", "service.unit_dir", "service.env_dir")
BASE = ["host=ct200"]  # a systemd host with a hybrid target: its release's hybrid args render
HOSTILE = {
    "newline-directive": "/h\nExecStartPre=/bin/true",
    "carriage-return": "/h\rx",
    "nul": "/h\x00x",
    "escape": "/h\x1bx",
    "line-separator": "/h\u2028x",
    "specifiers": "/h%n%%x%",
    "dollars": "/h$HOME$$x$",
    "quotes": '/h\'q"x"',
    "backslashes": "/h\\x\\n\\",
    "spaces": "/h a  b ",
    "semicolon": "/h ; x;",
    "long": "/h" + "x" * 10_000,
}


@dataclasses.dataclass(frozen=True)
class Key:
    """A string the config can hold, and the Hydra override that sets it to a value."""

    name: str  # as a sentence names it
    override: str  # with {} for the Hydra-quoted value; "" for a dict's key (see _overrides)


def _string_slots(node: object, prefix: str) -> typing.Iterator[tuple[Key, object, str]]:
    """(key, owning object, attribute or dict key) for every string field of the dataclass tree,
    one new item for each list[str] and dict[str, str] (its value, and its key)."""
    hints = typing.get_type_hints(type(node))
    for field in dataclasses.fields(node):  # type: ignore[arg-type]
        key, hint, value = f"{prefix}{field.name}", hints[field.name], getattr(node, field.name)
        if dataclasses.is_dataclass(value):
            yield from _string_slots(value, f"{key}.")
        elif isinstance(value, list) and value and dataclasses.is_dataclass(value[0]):
            yield from _string_slots(value[0], f"{key}[0].")  # a prompt
        elif hint == list[str]:
            value.append("")
            yield Key(f"{key}[{len(value) - 1}]", f"{key}=[{{}}]"), value, len(value) - 1
        elif hint == dict[str, str]:
            value["MARKER_KEY"] = ""
            yield Key(f"{key}.MARKER_KEY", f"{key}={{{{MARKER_KEY: {{}}}}}}"), value, "MARKER_KEY"
            yield Key(key, ""), value, None  # the dict key itself
        elif str in _types(hint) and not isinstance(value, Enum):
            yield Key(key, f"{key}={{}}"), node, field.name


def _types(hint: object) -> tuple[object, ...]:
    return typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)


def _reaching_keys() -> list[Key]:
    """The keys whose value shows up in a rendered file: set each to a marker and look."""
    cfg = copy.deepcopy(compose_config(BASE))
    markers: dict[str, Key] = {}
    for n, (key, owner, slot) in enumerate(list(_string_slots(cfg, ""))):
        marker = f"MK{n}Z" if slot is None else f"mk{n}z"
        if key.name in ABSOLUTE_PATHS:
            marker = f"/{marker}"
        if slot is None:  # a dict key: rename the marker entry
            owner[marker] = owner.pop("MARKER_KEY")  # type: ignore[index,attr-defined]
        elif isinstance(owner, list | dict):
            owner[slot] = marker  # type: ignore[index]
        else:
            setattr(owner, str(slot), marker)
        markers[marker.lstrip("/")] = key
    rendered = render_service(cfg, None)
    text = rendered.unit_text + rendered.env_text
    return [key for marker, key in markers.items() if re.search(rf"\b{marker}\b", text)]


def _overrides(key: Key, value: str, folder: Path) -> list[str]:
    """What sets `key` to `value` on the command line. A dict's key cannot be quoted in a Hydra
    override, so it goes in a config file of the key's group, as a user's own file would."""
    if key.override:
        return [key.override.format(_hydra_quoted(value))]
    group, name = key.name.split(".")
    (folder / group).mkdir(exist_ok=True)
    option = {"defaults": [f"base_{group}", "_self_"], name: {value: "x"}}
    (folder / group / "hostile.yaml").write_text(yaml.safe_dump(option))
    return [f"hydra.searchpath=[file://{folder}]", f"{group}=hostile"]


def _hydra_quoted(value: str) -> str:
    """`value` as a single-quoted Hydra override string: a quote, and backslashes before a
    quote or the closing quote, escaped (Hydra's override grammar)."""
    escaped = re.sub(r"(\\*)'", lambda m: m[1] * 2 + "\\'", value)
    return "'" + re.sub(r"(\\+)$", lambda m: m[1] * 2, escaped) + "'"


KEYS = _reaching_keys()


def _intended(cfg: DeployConfig, rendered: RenderedService) -> dict[str, str]:
    """The values the unit's configured directives must read back as."""
    return {
        "Description": f"SGLang server ({cfg.model.name}, {cfg.algo.summary})",
        "User": cfg.service.user,
        "EnvironmentFile": str(rendered.env_path),
        "SyslogIdentifier": cfg.service.unit_name,
    }


def _check_read_back(cfg: DeployConfig, rendered: RenderedService, plain: RenderedService) -> None:
    directives = unit_directives(rendered.unit_text)
    baseline = unit_directives(plain.unit_text)
    assert [d[:2] for d in directives] == [d[:2] for d in baseline]
    intended = _intended(cfg, rendered)
    for (_, name, value), (_, _, before) in zip(directives, baseline, strict=True):
        if name == "ExecStart":
            assert exec_argv(value) == list(rendered.argv)
        elif name in intended:
            assert specifiers_resolved(value) == intended[name]
        else:
            assert value == before  # a setting no config string reaches
    assert env_file_values(rendered.env_text) == rendered.environment_masked


def test_the_markers_find_every_kind_of_key() -> None:
    names = {re.sub(r"\[\d+\]", "[]", key.name) for key in KEYS}
    assert {
        "model.name",  # Description=
        "service.user",  # User=
        "service.unit_name",  # SyslogIdentifier= and EnvironmentFile=
        "service.env_dir",  # EnvironmentFile=
        "host.sglang_venv",  # ExecStart's program
        "model.target_path",  # ExecStart's arguments
        "service.extra_args[]",
        "sglang.hybrid_speculative_args[]",  # reaches ExecStart on a hybrid target
        "service.environment.MARKER_KEY",  # an environment file value
        "service.environment",  # ... and its name
    } <= names, names
    assert "validation.prompts[].text" not in names


@pytest.mark.parametrize("value", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_value_is_refused_or_reads_back_exactly(value: str, tmp_path: Path) -> None:
    plain = render_service(compose_config(BASE), None)
    accepted: list[str] = []
    for key in KEYS:
        overrides = _overrides(key, value, tmp_path)
        try:
            cfg = compose_config([*BASE, *overrides])
        except ConfigError as refused:
            sentence = str(refused)
            assert refused.exit_code == 2
            assert "\n" not in sentence and "\r" not in sentence, sentence
            assert key.name.split("[")[0].removesuffix(".MARKER_KEY") in sentence, sentence
            continue
        rendered = render_service(cfg, None)
        _check_read_back(cfg, rendered, plain)
        arrived = [
            *_intended(cfg, rendered).values(),
            *rendered.argv,
            *rendered.environment_masked.values(),
        ]
        assert any(value in text for text in arrived), f"{key.name}: {value!r} did not arrive"
        accepted += overrides
    if accepted and shutil.which("systemd-analyze"):
        cfg = compose_config([*BASE, *accepted])
        lint = lint_unit(render_service(cfg, None), cfg.service.max_exposure)
        assert lint.verify_findings == (), lint.verify_findings
