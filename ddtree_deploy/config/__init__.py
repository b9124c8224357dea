"""Configuration room: typed schemas, composition from `conf/`, and cross-field rules."""

from ddtree_deploy.config.compose import GroupOptions, compose_config, group_options
from ddtree_deploy.config.schema import (
    ACTIONS,
    AbiConfig,
    Algo,
    AlgoConfig,
    DeployConfig,
    GpuConfig,
    HostConfig,
    ModelConfig,
    Output,
    SglangConfig,
    Transport,
    TreeMode,
)

__all__ = [
    "ACTIONS",
    "AbiConfig",
    "Algo",
    "AlgoConfig",
    "DeployConfig",
    "GpuConfig",
    "GroupOptions",
    "HostConfig",
    "ModelConfig",
    "Output",
    "SglangConfig",
    "Transport",
    "TreeMode",
    "compose_config",
    "group_options",
]
