"""Compose `conf/` through Hydra's compose API into a validated `DeployConfig`.

Hydra's own errors are multi-line and name internals; this module turns each into the one
sentence the user reads (`ConfigError`), so `cli` never shows a traceback for bad input.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources

from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException, MissingConfigException
from omegaconf import OmegaConf
from omegaconf.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    MissingMandatoryValue,
    OmegaConfBaseException,
    ValidationError,
)
from packaging.version import InvalidVersion, Version

from ddtree_deploy.config.rules import check_config
from ddtree_deploy.config.schema import DeployConfig, register_configs
from ddtree_deploy.errors import ConfigError

CONFIG_MODULE = "ddtree_deploy.conf"
_MISSING_OPTION = re.compile(r"Could not find '(?P<group>[^']+)/(?P<option>[^']+)'")
_SGLANG_OPTION = re.compile(r"^\+*sglang=(?P<value>.+)$")
_SGLANG_VERSION = re.compile(r"^\+*sglang\.version=(?P<value>.+)$")


def compose_config(overrides: Sequence[str] = ()) -> DeployConfig:
    """Compose `config.yaml` with command-line style overrides and check every rule.

    Raises `ConfigError` with one sentence for unknown options, wrong types, unknown keys,
    missing values and broken cross-field rules.
    """
    register_configs()
    try:
        with initialize_config_module(CONFIG_MODULE, version_base="1.3"):
            raw = compose("config", overrides=_with_release_option(overrides))
        cfg = OmegaConf.to_object(raw)
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
    cause = err.__cause__ if isinstance(err.__cause__, OmegaConfBaseException) else err
    key = getattr(cause, "full_key", None)
    first_line = _first_line(getattr(cause, "msg", None) or str(cause))
    if isinstance(cause, MissingMandatoryValue):
        return ConfigError(f"Config key {key} is required but has no value; set {key}=<value>.")
    if isinstance(cause, ConfigAttributeError | ConfigKeyError) and key in RETIRED_KEYS:
        return ConfigError(f"Config key {key} was retired: {RETIRED_KEYS[key]}")
    if isinstance(cause, ConfigAttributeError | ConfigKeyError) and key:
        return ConfigError(
            f"Config key {key} does not exist; check its spelling against the files in conf/."
        )
    if isinstance(cause, ValidationError) and key:
        return ConfigError(f"Config key {key} has an invalid value: {first_line.rstrip('.')}.")
    return ConfigError(f"The configuration could not be composed: {first_line.rstrip('.')}.")


def _missing_option_error(err: MissingConfigException) -> ConfigError:
    match = _MISSING_OPTION.search(str(err))
    if match is None:
        return ConfigError(f"The configuration could not be composed: {_first_line(str(err))}")
    group, option = match["group"], match["option"]
    choices = sorted(o for o in (err.options or []) if not o.startswith("base_"))
    return ConfigError(f"Unknown {group} {option!r}; choose one of: {', '.join(choices)}.")


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text
