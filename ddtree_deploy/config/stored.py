"""A resolved configuration kept as a file, for runs that have no command line of their own.

The re-validation timer runs on the GPU host, where the operator's `conf/` folder and command
line are not: the deploy stores the configuration it validated (`stored_config_text`, YAML of
the typed `DeployConfig`, no secret in it: the API key is named, never held) and the timer's
service runs `ddtree-deploy --from <file> action=revalidate`, which loads it back through the
same schema and rules (`load_stored_config`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ddtree_deploy.config.rules import check_config
from ddtree_deploy.config.schema import DeployConfig
from ddtree_deploy.errors import ConfigError


def stored_config_text(cfg: DeployConfig) -> str:
    """`cfg` as YAML that `load_stored_config` reads back to an equal `DeployConfig`."""
    plain = dataclasses.replace(cfg, fleet=None)
    return OmegaConf.to_yaml(OmegaConf.structured(plain))


def load_stored_config(path: Path, overrides: Sequence[str] = ()) -> DeployConfig:
    """The configuration stored at `path`, with `key=value` overrides; `ConfigError` with one
    sentence when the file is missing or does not fit the schema."""
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError(
            f"The stored configuration {path} cannot be read ({err.strerror}); run the deploy "
            "that writes it again."
        ) from err
    try:
        merged = OmegaConf.merge(
            OmegaConf.structured(DeployConfig),
            OmegaConf.create(text),
            OmegaConf.from_dotlist([o for o in overrides if "=" in o]),
        )
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        first = (getattr(err, "msg", None) or str(err)).strip().splitlines()[0]
        where = f" at {err.full_key}" if getattr(err, "full_key", None) else ""
        raise ConfigError(
            f"The stored configuration {path} does not fit this ddtree-deploy{where} ({first}); "
            "run the deploy that writes it again with this version."
        ) from err
    bare = [o for o in overrides if "=" not in o]
    if bare:
        raise ConfigError(f"{bare[0]!r} is not a key=value override; write it as key=value.")
    assert isinstance(cfg, DeployConfig)
    check_config(cfg)
    return cfg
