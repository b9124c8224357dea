"""Typed schemas for every config group, registered in Hydra's ConfigStore.

The YAML files under `conf/` carry the values; these dataclasses carry the types, so a wrong type
or an unknown key fails at compose time. Cross-field rules live in `config.rules`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


class Algo(StrEnum):
    """Speculative algorithm SGLang is launched with."""

    DFLASH = "DFLASH"
    DDTREE = "DDTREE"


class TreeMode(StrEnum):
    """How DDTree verifies: a real tree, or the chain that must equal linear DFlash."""

    # Member names equal their values: OmegaConf matches YAML strings against enum names.
    tree = "tree"
    shadow_linear = "shadow_linear"


class Transport(StrEnum):
    """How the toolkit reaches a host."""

    local = "local"
    ssh = "ssh"


class Output(StrEnum):
    """How read-only actions print their result."""

    table = "table"
    json = "json"


@dataclass
class GpuConfig:
    """One GPU model: what the host's GPUs must report."""

    name: str = MISSING  # product name as nvidia-smi prints it ("none" for a host without GPUs)
    arch: str = MISSING  # "sm_120"; "" when there is no GPU
    memory_gb: int = MISSING


@dataclass
class AbiConfig:
    """The torch/CUDA/C++ ABI tuple the host's SGLang venv must have (kernels are built for it)."""

    torch: str = MISSING  # public torch version, "2.11.0"
    cuda: str | None = MISSING  # torch's CUDA version, "13.0"; null for a CPU build
    cxx11_abi: bool = True
    python: str = MISSING  # "3.12"


@dataclass
class ModelConfig:
    """Target model and its DFlash draft model."""

    name: str = MISSING
    target_path: str = MISSING
    draft_path: str = MISSING
    hybrid: bool = MISSING  # attention + recurrent (GDN/Mamba) layers
    draft_block_size: int = 16  # the drafter's trained block size
    context_length: int = 32768


@dataclass
class AlgoConfig:
    """Speculative settings; the tree fields matter for DDTREE only."""

    name: Algo = MISSING
    mode: TreeMode = TreeMode.tree
    block_size: int = 16  # DFlash block; also the verify width
    budget: int = 15  # non-root tree nodes verified per step, <= block_size - 1
    topk: int = 4  # children kept per draft position, <= budget
    allow_hybrid_unsafe: bool = False


@dataclass
class SglangConfig:
    """The SGLang release pinned for a host, and what its CPU staging venv needs."""

    version: str = MISSING
    # Installed beside `sglang==version` (--no-deps) when `action=prepare` builds a staging venv.
    staging_requirements: list[str] = field(default_factory=list)


@dataclass
class HostConfig:
    """Where a host is, how to reach it, and what it is expected to run."""

    name: str = MISSING
    transport: Transport = Transport.ssh
    address: str | None = None
    port: int = 22
    user: str = "root"
    key_file: str | None = None
    connect_timeout_s: float = 10.0
    command_timeout_s: float = 900.0
    sudo: bool = False  # prefix privileged commands with sudo (non-root users)
    gpu_count: int = 0  # GPUs the host must have
    gpu_ids: list[int] = field(default_factory=list)  # which of them the service uses
    sglang_venv: str = MISSING  # the venv SGLang runs from; its bin/python is probed
    state_dir: str = "/var/lib/ddtree-deploy"
    staging: bool = False  # no GPU: reference-only kernels, GPU checks become notes
    systemd: bool = True  # the service is installed and managed; false: rendered and linted only


@dataclass
class ServiceConfig:
    """The systemd service that runs SGLang."""

    unit_name: str = "sglang"
    port: int = 30000
    mem_fraction_static: float = 0.85
    tp_size: int = 8


@dataclass
class ValidationConfig:
    """Gates a deployment must pass before it is promoted."""

    min_speedup: float = 1.05
    acceptance_tolerance: float = 0.02


@dataclass
class RolloutConfig:
    """How a rollout proceeds and where the run's files go."""

    runs_dir: str = "runs"


ACTIONS = ("plan", "facts", "prepare")


@dataclass
class DeployConfig:
    """The whole resolved configuration of one `ddtree-deploy` run."""

    host: HostConfig = MISSING
    gpu: GpuConfig = MISSING
    abi: AbiConfig = MISSING
    model: ModelConfig = MISSING
    algo: AlgoConfig = MISSING
    sglang: SglangConfig = MISSING
    service: ServiceConfig = field(default_factory=ServiceConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    action: str = "plan"
    output: Output = Output.table


def register_configs() -> None:
    """Register the schemas; YAML files name them in their defaults (`base_<group>`)."""
    store = ConfigStore.instance()
    store.store(name="base_config", node=DeployConfig)
    for group, node in (
        ("host", HostConfig),
        ("gpu", GpuConfig),
        ("abi", AbiConfig),
        ("model", ModelConfig),
        ("algo", AlgoConfig),
        ("sglang", SglangConfig),
        ("service", ServiceConfig),
        ("validation", ValidationConfig),
        ("rollout", RolloutConfig),
    ):
        store.store(group=group, name=f"base_{group}", node=node)
