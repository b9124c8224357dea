"""Compose `conf/` through Hydra's compose API into a validated `DeployConfig`.

Hydra's own errors are multi-line and name internals; this module turns each into the one
sentence the user reads (`ConfigError`), so `cli` never shows a traceback for bad input.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import resources

import yaml
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from omegaconf import OmegaConf
from omegaconf.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    InterpolationResolutionError,
    MissingMandatoryValue,
    OmegaConfBaseException,
    ValidationError,
)
from packaging.version import InvalidVersion, Version

from ddtree_deploy.config.rules import check_config
from ddtree_deploy.config.schema import ACTIONS, DeployConfig, register_configs
from ddtree_deploy.errors import ConfigError

CONFIG_MODULE = "ddtree_deploy.conf"
_MISSING_OPTION = re.compile(r"Could not find '(?P<group>[^']+)/(?P<option>[^']+)'")
_SGLANG_OPTION = re.compile(r"^\+*sglang=(?P<value>.+)$")
_SGLANG_VERSION = re.compile(r"^\+*sglang\.version=(?P<value>.+)$")
# "In 'fleet/x': ValidationError raised while composing config:\n<why>\n    full_key: <key>"
_IN_FILE = re.compile(
    r"In '(?P<file>[^']+)': \w+ raised while composing config:\n"
    r"(?P<why>.*)\n\s*full_key: ?(?P<key>.*)"
)
# Hydra warns, and goes on, when a hydra.searchpath folder does not exist; we refuse instead.
_SEARCHPATH_MISSING = re.compile(r"provider=hydra\.searchpath in \S+, path=(?P<path>.*) is not")


def compose_config(overrides: Sequence[str] = ()) -> DeployConfig:
    """Compose `config.yaml` with command-line style overrides and check every rule.

    Raises `ConfigError` with one sentence for unknown options, wrong types, unknown keys,
    missing values and broken cross-field rules.
    """
    register_configs()
    _check_added_keys(_parse_overrides(overrides))
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message=_SEARCHPATH_MISSING.pattern)
            with initialize_config_module(CONFIG_MODULE, version_base="1.3"):
                raw = compose("config", overrides=_with_release_option(overrides))
        cfg = OmegaConf.to_object(raw)
    except UserWarning as err:
        raise _searchpath_error(err) from err
    except yaml.MarkedYAMLError as err:
        raise _yaml_error(err) from err
    except (HydraException, OmegaConfBaseException) as err:
        raise _as_config_error(err) from err
    assert isinstance(cfg, DeployConfig)
    check_config(cfg)
    return cfg


@dataclass(frozen=True)
class GroupOptions:
    """A config group a run picks with `group=option`: its options and the default's pick."""

    group: str
    options: tuple[str, ...]
    default: str | None  # what the plain composition picks (host=local's gpu, abi, model...)


def group_options() -> tuple[GroupOptions, ...]:
    """The groups of `conf/` that `DeployConfig` selects, in its field order, as Hydra lists
    them (the schemas' `base_*` entries left out); `--help` prints them."""
    register_configs()
    fields = [f.name for f in dataclasses.fields(DeployConfig)]
    with initialize_config_module(CONFIG_MODULE, version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        choices = compose("config", return_hydra_config=True).hydra.runtime.choices
        groups = set(loader.list_groups(""))
        return tuple(
            GroupOptions(
                name,
                tuple(o for o in loader.get_group_options(name) if not o.startswith("base_")),
                choices.get(name),
            )
            for name in fields
            if name in groups
        )


def _release_option(version: str) -> str | None:
    """The `sglang=` option that holds SGLang `version`'s pins and traits (a .post release's is
    its base release's: 0.5.15.post1 -> v0_5_15), or None when conf/ has none for it."""
    try:
        base = Version(version).base_version
    except InvalidVersion:
        return None
    option = "v" + base.replace(".", "_")
    found = resources.files(CONFIG_MODULE).joinpath("sglang", f"{option}.yaml").is_file()
    return option if found else None


def _with_release_option(overrides: Sequence[str]) -> list[str]:
    """`sglang.version=X` alone also picks X's own `sglang=` option, where conf/ has one: the
    host's default option holds another release's pins and traits (whether its hybrid tree is
    proven, its budget limit), which must not pass for X's. Naming X's option with another
    release's is refused."""
    versions = [m["value"].strip("'\"") for o in overrides if (m := _SGLANG_VERSION.match(o))]
    if not versions or (own := _release_option(versions[-1])) is None:
        return list(overrides)
    chosen = [m["value"].strip("'\"") for o in overrides if (m := _SGLANG_OPTION.match(o))]
    if not chosen:
        return [*overrides, f"sglang={own}"]
    if chosen[-1] != own:
        raise ConfigError(
            f"sglang.version={versions[-1]} does not match sglang={chosen[-1]}, which holds "
            f"another release's pins and traits; drop sglang= or name sglang={own}."
        )
    return list(overrides)


# Keys a former release read, with what replaced them (a config that still sets one is told so).
RETIRED_KEYS = {
    "validation.hybrid_divergence": (
        "the tree gate judges hybrid and pure-attention targets alike by the target's own "
        "scores; drop it (validation.tie_tolerance says how near a tie may be)."
    ),
}


def _as_config_error(err: Exception) -> ConfigError:
    if isinstance(err, MissingConfigException):
        return _missing_option_error(err)
    if (in_file := _IN_FILE.search(str(err))) is not None:
        return _file_shape_error(in_file)
    cause = err.__cause__ if isinstance(err.__cause__, OmegaConfBaseException) else err
    key = getattr(cause, "full_key", None)
    first_line = _first_line(getattr(cause, "msg", None) or str(cause))
    if isinstance(cause, MissingMandatoryValue):
        return ConfigError(f"Config key {key} is required but has no value; set {key}=<value>.")
    if isinstance(cause, ConfigAttributeError | ConfigKeyError) and key in RETIRED_KEYS:
        return ConfigError(f"Config key {key} was retired: {RETIRED_KEYS[key]}")
    if isinstance(cause, ConfigAttributeError | ConfigKeyError) and key:
        return _unknown_key_error(str(key))
    if isinstance(cause, InterpolationResolutionError) and key:
        return ConfigError(
            f"Config key {key} cannot be resolved ({first_line.rstrip('.')}); give a plain value "
            "or a ${...} that names a key of the config or a set environment variable."
        )
    if isinstance(cause, ValidationError) and key and "is not a ListConfig" in first_line:
        return ConfigError(f"Config key {key} takes a list; give it as {key}=[a,b].")
    if isinstance(cause, ValidationError) and key:
        return ConfigError(f"Config key {key} has an invalid value: {first_line.rstrip('.')}.")
    return ConfigError(f"The configuration could not be composed: {first_line.rstrip('.')}.")


def _parse_overrides(overrides: Sequence[str]) -> list[Override]:
    """Each override parsed by Hydra's own grammar, one at a time so the sentence names the one
    it cannot read (Hydra's lexer error names only its internals)."""
    parser = OverridesParser.create()
    parsed = []
    for override in overrides:
        try:
            parsed += parser.parse_overrides([override])
        except OverrideParseException as err:
            if "=" not in override and not override.startswith("~"):
                raise ConfigError(_not_an_override(override)) from err
            raise ConfigError(
                f"Cannot read the override {override!r}: a value holding ';', spaces, quotes, "
                "brackets or non-ASCII characters must be quoted for Hydra, as in "
                "\"model.name='my model'\" (single quotes inside the shell's double quotes)."
            ) from err
    return parsed


def _not_an_override(word: str) -> str:
    """The sentence for a bare word (`ddtree-deploy deploy`): every argument is key=value."""
    example = f"action={word}" if word in ACTIONS else "action=deploy or host=ct200"
    return f"{word!r} is not an override: give each setting as key=value, e.g. {example}."


def _check_added_keys(overrides: Sequence[Override]) -> None:
    """Refuse `+key=value` for a key the schema does not have: Hydra adds it, and the typed
    config then drops it without a word (a typo such as `+algo.bugdet=3` would be ignored)."""
    for override in overrides:
        key = override.key_or_group
        if override.type not in (OverrideType.ADD, OverrideType.FORCE_ADD):
            continue
        if key.startswith("hydra.") or key == "hydra" or _schema_has(key):
            continue
        raise _unknown_key_error(key)


def _unknown_key_error(key: str) -> ConfigError:
    if "." in key and _schema_has(key):  # a new key of a dict field (service.environment.X)
        return ConfigError(
            f"Config key {key} is not set yet and Hydra adds a key only when asked; give it as "
            f"+{key}=<value>."
        )
    return ConfigError(f"Config key {key} does not exist; {_nearest_key(key)}")


def _nearest_key(key: str) -> str:
    """What to do about a key the schema does not have: the nearest known key (difflib's ratio
    over every dotted key of the schema: typos are near in letters, not in meaning)."""
    nearest = difflib.get_close_matches(key, list(_schema_keys(DeployConfig)), n=1)
    return f"did you mean {nearest[0]}?" if nearest else "docs/configuration.md lists every key."


def _schema_has(key: str) -> bool:
    """Whether dotted `key` names a field of `DeployConfig` (any key below a dict field does:
    `service.environment.X`; a group's name does: `+sglang=v0_5_14`)."""
    node: object = DeployConfig
    for part in key.split("."):
        if not (isinstance(node, type) and dataclasses.is_dataclass(node)):
            return typing.get_origin(node) is dict
        hints = typing.get_type_hints(node)
        if part not in hints:
            return False
        node = _unwrap_optional(hints[part])
    return True


def _schema_keys(node: type, prefix: str = "") -> Iterator[str]:
    """Every dotted key of the dataclass `node`, depth first."""
    for name, hint in typing.get_type_hints(node).items():
        key, inner = f"{prefix}{name}", _unwrap_optional(hint)
        yield key
        if isinstance(inner, type) and dataclasses.is_dataclass(inner):
            yield from _schema_keys(inner, f"{key}.")


def _unwrap_optional(hint: object) -> object:
    """`X | None` -> `X`; any other hint unchanged."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    is_union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    return args[0] if is_union and len(args) == 1 else hint


def _yaml_error(err: yaml.MarkedYAMLError) -> ConfigError:
    """A YAML syntax error in a config file: the file, line and column, in one sentence."""
    mark = err.problem_mark or err.context_mark
    where = f"{mark.name}, line {mark.line + 1}, column {mark.column + 1}" if mark else "a file"
    problem = (err.problem or err.context or "invalid YAML").rstrip(".")
    return ConfigError(
        f"{where} is not valid YAML ({problem}); fix it there (indent with spaces, not tabs, "
        "and close every bracket and quote)."
    )


def _searchpath_error(err: UserWarning) -> ConfigError:
    match = _SEARCHPATH_MISSING.search(str(err))
    path = match["path"] if match else str(err)
    return ConfigError(
        f"hydra.searchpath names {path}, which does not exist; give the folder that holds your "
        "config groups (host/, fleet/...) as hydra.searchpath=[file:///absolute/path]."
    )


def _file_shape_error(found: re.Match[str]) -> ConfigError:
    """A config file whose value does not fit the schema's shape or type (Hydra's sentence for
    it is "ValidationError raised while composing config:" and nothing after the colon)."""
    where, key, why = (
        f"{found['file']}.yaml",
        found["key"].strip(),
        found["why"].strip().rstrip("."),
    )
    fleet = found["file"].startswith("fleet/")
    doc = "docs/fleet.md" if fleet else "docs/configuration.md"
    group, _, rest = key.partition(".")
    if group and rest.split(".")[0] == group:  # host.host: Hydra read no `# @package` header
        return ConfigError(
            f"A {group}/ file of yours put its keys under {group}.{group} ({why}): its "
            "`# @package _global_` line must be the file's first line, above any other comment."
        )
    if why.endswith("is not Optional"):
        why = "it is empty (null) and must hold a value"
    elif why.startswith("Key '") and " not in " in why:
        return ConfigError(
            f"{where} sets {key}, which is no key of the config; {_nearest_key(key)}"
        )
    elif why.startswith("Cannot merge DictConfig with ListConfig"):
        why = "a list stands where a mapping ({name: value, ...}) belongs"
    if fleet and key in ("", "fleet.hosts"):
        why += " (hosts: maps each host's option to its entry, e.g. {ct129: {}})"
    subject = f"{key} in {where}" if key else where
    return ConfigError(f"{subject} does not fit the schema: {why}; see {doc}.")


def _missing_option_error(err: MissingConfigException) -> ConfigError:
    match = _MISSING_OPTION.search(str(err))
    if match is None:
        return ConfigError(f"The configuration could not be composed: {_first_line(str(err))}")
    group, option = match["group"], match["option"]
    choices = sorted(o for o in (err.options or []) if not o.startswith("base_"))
    return ConfigError(f"Unknown {group} {option!r}; choose one of: {', '.join(choices)}.")


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text
