"""Typed schemas for every config group, registered in Hydra's ConfigStore.

The YAML files under `conf/` carry the values; these dataclasses carry the types, so a wrong type
or an unknown key fails at compose time. Each numeric field declares its range with `ranged`
(checked by `config.ranges`); rules between fields live in `config.rules`.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import PurePosixPath

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from ddtree_deploy.config.ranges import ranged
from ddtree_deploy.config.text import multiline


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
    prometheus = "prometheus"  # action=status: the host's metrics in Prometheus text format


@dataclass
class GpuConfig:
    """One GPU model: what the host's GPUs must report."""

    name: str = MISSING  # product name as nvidia-smi prints it ("none" for a host without GPUs)
    arch: str = MISSING  # "sm_120"; "" when there is no GPU
    memory_gb: int = ranged(at_least=0, why="0 for a host without GPUs")


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
    draft_block_size: int = ranged(16, at_least=1)  # the drafter's trained block size
    context_length: int = ranged(32768, at_least=1, why="tokens")


@dataclass
class AlgoConfig:
    """Speculative settings; the tree fields matter for DDTREE only."""

    name: Algo = MISSING
    mode: TreeMode = TreeMode.tree
    block_size: int = ranged(16, at_least=1)  # the drafter's DFlash block
    # Non-root tree nodes verified per step: 1..block_size - 1, or up to the release's
    # sglang.ddtree_max_budget where its patch set widens the verify to budget + 1 tokens.
    budget: int = ranged(15, at_least=1)
    topk: int = ranged(4, at_least=1)  # children kept per draft position, <= budget
    allow_hybrid_unsafe: bool = False

    @property
    def summary(self) -> str:
        """The algorithm in a few words, as units, reports and sentences name what a host serves."""
        if self.name is Algo.DFLASH:
            return "linear DFLASH"
        if self.mode is TreeMode.shadow_linear:
            return f"DDTREE shadow_linear, budget {self.budget}"
        return f"DDTREE tree, budget {self.budget}, topk {self.topk}"


@dataclass
class SglangConfig:
    """The SGLang release pinned for a host, and what its CPU staging venv needs."""

    version: str = MISSING
    # `action=prepare` on a staging host: `staging_shared_requirements` (conf/staging/shared.yaml,
    # one list for every release) go into a shared layer built once per distinct list; the
    # release's venv holds `sglang==version` (--no-deps) and `staging_requirements`, the release's
    # own pins, which shadow a shared copy of the same package.
    staging_requirements: list[str] = field(default_factory=list)
    staging_shared_requirements: list[str] = field(default_factory=list)
    # Server arguments this release needs to start speculative decoding on a hybrid
    # (attention + recurrent) target; the renderer adds them for hybrid models.
    hybrid_speculative_args: list[str] = field(default_factory=list)
    # True once the GPU lab served this release's set in tree mode on a hybrid target with
    # DFLASH's tokens exactly and sibling branches accepted (tests/gpulab/RESULTS.md); tree mode
    # on hybrid targets then needs no algo.allow_hybrid_unsafe.
    hybrid_tree_proven: bool = False
    # The largest DDTREE tree budget this release's patch set verifies. None: block_size - 1,
    # the set keeps the verify width at the drafter's block size. A number: the set widens the
    # tree verify to budget + 1 tokens (the drafter keeps its block); per-request custom-mask,
    # logits and hybrid recurrent-state buffers then grow with the width.
    ddtree_max_budget: int | None = ranged(None, at_least=1)


@dataclass
class HostConfig:
    """Where a host is, how to reach it, and what it is expected to run."""

    name: str = MISSING
    transport: Transport = Transport.ssh
    address: str | None = None
    port: int = ranged(22, at_least=1, at_most=65535)
    user: str = "root"
    key_file: str | None = None
    connect_timeout_s: float = ranged(10.0, above=0, why="seconds")
    command_timeout_s: float = ranged(900.0, above=0, why="seconds")
    sudo: bool = False  # prefix privileged commands with sudo (non-root users)
    gpu_count: int = ranged(0, at_least=0)  # GPUs the host must have
    gpu_ids: list[int] = ranged(factory=list, at_least=0)  # which of them the service uses
    sglang_venv: str = MISSING  # the venv SGLang runs from; its bin/python is probed
    state_dir: str = "/var/lib/ddtree-deploy"
    staging: bool = False  # no GPU: reference-only kernels, GPU checks become notes
    systemd: bool = True  # the service is installed and managed; false: rendered and linted only

    @property
    def sglang_python(self) -> PurePosixPath:
        """The interpreter of the SGLang venv: what the probe, every build and the unit run."""
        return PurePosixPath(self.sglang_venv) / "bin" / "python"


@dataclass
class ServiceConfig:
    """The systemd service that runs SGLang (rendered from templates/sglang.*.j2)."""

    unit_name: str = "sglang"
    port: int = ranged(30000, at_least=1, at_most=65535)
    listen_host: str = "127.0.0.1"  # SGLang's --host
    mem_fraction_static: float = ranged(0.85, above=0, at_most=1)
    # --max-total-tokens: caps the KV pool below what mem_fraction_static would give, so that
    # several servers can share one GPU (each sizes its pool from the memory free at start).
    max_total_tokens: int | None = ranged(None, at_least=1, why="tokens; null for no cap")
    # GPUs the server splits the model over; 0 only for a stand-in server without GPUs (tests).
    tp_size: int = ranged(8, at_least=0)
    # The module `python -m` runs from the host's SGLang venv; tests point it at a stand-in.
    launch_module: str = "sglang.launch_server"
    extra_args: list[str] = field(default_factory=list)  # appended to ExecStart, each quoted
    # --enable-deterministic-inference: batch-invariant kernels, so greedy tokens do not depend
    # on what else is in the batch (slower; tells a bf16 near-tie from a verify bug).
    deterministic_inference: bool = False
    environment: dict[str, str] = field(default_factory=dict)  # extra env-file entries
    user: str = "root"
    unit_dir: str = "/etc/systemd/system"
    env_dir: str = "/etc/ddtree-deploy"  # the 0600 environment file lives here
    # The server's API key, read on the control machine: an env var name, or a file path. It
    # reaches the host only in the 0600 env file (docs/security.md).
    api_key_env: str | None = None
    api_key_file: str | None = None
    # TimeoutStartSec: loading a 27B model and its draft
    start_timeout_s: int = ranged(1800, above=0, why="seconds")
    stop_timeout_s: int = ranged(120, above=0, why="seconds")
    restart_delay_s: int = ranged(10, at_least=0, why="seconds")  # RestartSec
    limit_nofile: int = ranged(1048576, at_least=1)
    # How long deploy waits for the unit to become active.
    active_wait_s: float = ranged(600.0, above=0, why="seconds")
    # Active with the same main PID this long counts as started.
    settle_s: float = ranged(10.0, at_least=0, why="seconds")
    # Journal lines reported when the unit fails to start.
    journal_lines: int = ranged(30, at_least=0)
    # `systemd-analyze security` exposure (0 to 10) must stay at or below this.
    max_exposure: float = ranged(6.0, at_least=0, at_most=10)


class InconclusivePolicy(StrEnum):
    """What a gate that could not judge does to the deployment."""

    rollback = "rollback"  # treat it as a failure
    pause = "pause"  # leave the new generation serving, unpromoted, and exit non-zero
    promote = "promote"  # treat it as a pass (recorded as inconclusive in the report)


class GateAccess(StrEnum):
    """How the gates reach the service's HTTP port on the host."""

    ssh_tunnel = "ssh_tunnel"  # a direct-tcpip channel of the SSH connection to listen_host:port
    direct = "direct"  # plain TCP from the control machine to host.address:port


@dataclass
class GateTimingConfig:
    """When a gate starts, how often it polls, and when it gives up (seconds)."""

    timeout_s: float = ranged(60.0, above=0, why="seconds")
    interval_s: float = ranged(1.0, above=0, why="seconds")
    initial_delay_s: float = ranged(0.0, at_least=0, why="seconds")


@dataclass
class PromptConfig:
    """One prompt of the validation set, answered at temperature 0."""

    name: str = MISSING
    kind: str = MISSING  # chat | code | math | json | long: what the prompt exercises
    text: str = multiline()  # may span lines: it travels only inside a JSON request
    max_new_tokens: int = ranged(64, at_least=1)


@dataclass
class ValidationConfig:
    """Gates a deployment must pass before it is promoted (ddtree_deploy.validate)."""

    min_speedup: float = ranged(1.05, above=0, why="tree tokens/s over linear DFlash's")
    acceptance_tolerance: float = ranged(0.02, at_least=0, below=1)
    # Shadow acceptance below this fraction of the baseline's is a collapse (missing hidden states).
    collapse_ratio: float = ranged(0.6, above=0, at_most=1)
    # A throughput measurement with fewer completion tokens cannot judge a speedup.
    min_measured_tokens: int = ranged(64, at_least=0)
    repeats: int = ranged(1, at_least=1)  # passes over the prompt set per measurement
    # Seconds of generation a measurement lasts at least: more passes until then, so a fast
    # model's tokens/s (a sub-second pass at 32 in flight) is not timer noise.
    min_pass_s: float = ranged(0.0, at_least=0, why="seconds")
    # Requests in flight while measuring: 1 is batch 1; above it, all passes go out at once.
    concurrency: int = ranged(1, at_least=1)
    on_inconclusive: InconclusivePolicy = InconclusivePolicy.rollback
    # Nats of log-probability (= logits at one position) an emitted tree token may sit below the
    # target's top-1 in its prefill scores: a bf16 near-tie between verify shapes, not a bug.
    tie_tolerance: float = ranged(
        0.5, at_least=0, why="nats; 0 asks every tree token to be the target's top-1"
    )
    # Where linear DFlash's own tokens sit further off the prefill (the target's measured noise
    # floor), the tolerance widens to this many times that worst gap, up to max_tie_tolerance;
    # beyond it the prefill cannot judge (inconclusive).
    tie_noise_factor: float = ranged(
        2.0, at_least=1, why="a tree is allowed at least linear DFlash's own worst gap"
    )
    max_tie_tolerance: float = ranged(2.0, at_least=0, why="nats")
    access: GateAccess = GateAccess.ssh_tunnel
    request_timeout_s: float = ranged(300.0, above=0, why="seconds")
    unit_active: GateTimingConfig = field(default_factory=GateTimingConfig)
    health: GateTimingConfig = field(default_factory=GateTimingConfig)
    server_info: GateTimingConfig = field(default_factory=GateTimingConfig)
    health_generate: GateTimingConfig = field(default_factory=GateTimingConfig)
    baseline: GateTimingConfig = field(default_factory=GateTimingConfig)
    shadow_linear: GateTimingConfig = field(default_factory=GateTimingConfig)
    tree: GateTimingConfig = field(default_factory=GateTimingConfig)
    prompts: list[PromptConfig] = field(default_factory=list)


@dataclass
class RolloutConfig:
    """How a rollout proceeds and where the run's files go."""

    runs_dir: str = "runs"
    # A deploy that fails after it changed the host rolls back to the previous generation.
    rollback_on_failure: bool = True


@dataclass
class RollbackConfig:
    """What `action=rollback` (and an automatic rollback) restores."""

    # Also restore pristine SGLang files through the patch engine; by default the patches stay,
    # since linear DFLASH behaves as before under them.
    revert_patches: bool = False
    # action=rollback straight to the newest linear-DFLASH generation, in one restart, past any
    # DDTREE generations between (an automatic rollback after a failed gate always does this).
    to_linear: bool = False


@dataclass
class PortConfig:
    """Where `action=port` reads reviewed sets from and writes its candidate set."""

    out: str | None = None  # a folder that must not exist yet; default the run folder
    sets: str | None = None  # a folder of reviewed sets; default the shipped patches/sglang


@dataclass
class TuneConfig:
    """The grid `action=tune` sweeps on the live service (conf/tune/): every (budget, top-k)
    pair with topk <= budget is one candidate, judged at every named concurrency."""

    budgets: list[int] = ranged(factory=lambda: [4, 8, 15], at_least=1)
    topks: list[int] = ranged(factory=lambda: [2, 4], at_least=1)
    # Requests in flight while measuring; each cell sends at least this many requests.
    concurrency: list[int] = ranged(factory=lambda: [1, 32], at_least=1)


class OnFailure(StrEnum):
    """What a fleet rollout does once more hosts failed than `max_failures` allows."""

    halt = "halt"  # start no new batch; failed hosts rolled back by themselves, others stay
    rollback_all = (
        "rollback_all"  # also return every host this run changed to its generation before
    )


@dataclass
class FleetHostConfig:
    """One host of a fleet: its `host/` option and the overrides that apply to it alone."""

    option: str | None = None  # the conf/host/ option; None: the entry's own name
    overrides: list[str] = field(default_factory=list)  # Hydra overrides, e.g. sglang=v0_5_14


@dataclass
class FleetConfig:
    """A fleet (conf/fleet/): its hosts in rollout order and the strategy that walks them."""

    name: str = MISSING
    hosts: dict[str, FleetHostConfig] = field(default_factory=dict)
    canary: list[str] = field(default_factory=list)  # go first, alone, before any batch
    batch_size: int = ranged(1, at_least=1, why="hosts at once after the canary")
    # Hosts that may fail before the rollout stops.
    max_failures: int = ranged(0, at_least=0, why="hosts; 0 stops at the first failure")
    on_failure: OnFailure = OnFailure.halt
    # Run every host again, even those a killed or halted run of this command already finished.
    restart: bool = False


class WatchPolicy(StrEnum):
    """What a failed re-validation does to the service (ddtree_deploy.rollout.revalidate)."""

    rollback = "rollback"  # back to linear DFlash, proven healthy, as a failed deploy does
    alert = "alert"  # change nothing: exit non-zero, a journal line, the metrics say failed
    pause = "pause"  # change nothing and stop the watch's timer until the operator acts


@dataclass
class WatchConfig:
    """The re-validation timer installed beside the unit (conf/watch/; docs/watch.md)."""

    # Install the timer with the unit (host.systemd=true) where `command` exists on the host.
    enabled: bool = True
    interval: str = "1h"  # systemd time span between runs (OnUnitActiveSec)
    accuracy: str = "1min"  # AccuracySec: how late systemd may start a run
    # Prompts of validation.prompts (the first ones) a routine run sends; a changed fingerprint
    # re-validates in full, the whole set through linear DFlash, shadow and tree.
    prompt_sample: int = ranged(2, at_least=1, why="prompts")
    policy: WatchPolicy = WatchPolicy.rollback
    # A routine run judges speed against the stored linear-DFlash baseline only while it is
    # younger than this; an older one is measured again by a full re-validation (restarts).
    baseline_max_age_h: float | None = ranged(
        168.0, above=0, why="hours; null keeps the deploy's baseline for good"
    )
    # The newest action=revalidate run folders kept in rollout.runs_dir; older ones are removed.
    keep_runs: int = ranged(48, at_least=1, why="run folders")
    command: str = "/opt/ddtree-deploy/bin/ddtree-deploy"  # the tool, installed on the host
    # node_exporter's textfile collector folder (`--collector.textfile.directory`); each
    # validation also writes `ddtree_<host>.prom` there. None: the state folder's copy only.
    textfile_dir: str | None = None


# Actions a fleet runs on each of its hosts (the others act on one host or none).
FLEET_ACTIONS = ("plan", "deploy", "status", "rollback", "validate", "audit", "tune")

ACTIONS = (
    "plan",
    "facts",
    "prepare",
    "render",
    "deploy",
    "rollback",
    "status",
    "build-kernels",
    "patch",
    "unpatch",
    "audit",
    "validate",
    "port",
    "tune",
    "revalidate",
)


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
    rollback: RollbackConfig = field(default_factory=RollbackConfig)
    port: PortConfig = field(default_factory=PortConfig)
    tune: TuneConfig = field(default_factory=TuneConfig)
    watch: WatchConfig = field(default_factory=WatchConfig)
    fleet: FleetConfig | None = None  # fleet=<name>: the action runs on each of its hosts
    action: str = "plan"
    output: Output = Output.table

    @property
    def serving_hash(self) -> str:
        """Hash of everything that decides what a host runs (not run-time knobs like runs_dir):
        a generation records it, and a host whose current generation holds it already runs this."""
        subset = {
            "host": asdict(self.host),
            "model": asdict(self.model),
            "algo": asdict(self.algo),
            "sglang": asdict(self.sglang),
            "service": asdict(self.service),
        }
        return hashlib.sha256(json.dumps(subset, sort_keys=True, default=str).encode()).hexdigest()


@functools.cache
def register_configs() -> None:
    """Register the schemas; YAML files name them in their defaults (`base_<group>`).

    Once a process: storing them builds a structured config of each (about 20 ms, an eighth
    of a compose), and every compose asks for them."""
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
        ("tune", TuneConfig),
        ("watch", WatchConfig),
        ("fleet", FleetConfig),
    ):
        store.store(group=group, name=f"base_{group}", node=node)
