"""Cross-field rules a schema cannot express; each broken rule is one sentence."""

from __future__ import annotations

import re

from packaging.version import InvalidVersion, Version

from ddtree_deploy.config.ranges import range_problems
from ddtree_deploy.config.schema import (
    ACTIONS,
    FLEET_ACTIONS,
    Algo,
    DeployConfig,
    Output,
    Transport,
    TreeMode,
    ValidationConfig,
)
from ddtree_deploy.config.text import text_problems
from ddtree_deploy.errors import ConfigError

_TORCH_VERSION = re.compile(r"^\d+\.\d+\.\d+$")
_CUDA_VERSION = re.compile(r"^\d+\.\d+$")
_PYTHON_VERSION = re.compile(r"^3\.\d+$")
_GPU_ARCH = re.compile(r"^sm_\d+[a-z]?$")
# host.name (and fleet.name) names run folders, state files and journals: a file-name-safe word.
_HOST_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# service.unit_name is a systemd unit name (<name>.service, SyslogIdentifier=), without the
# template `@` and escapes that systemd.unit(5) also allows.
_UNIT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
# service.user is User=: a user name as systemd takes it strictly (systemd.exec(5)) or a UID.
_USER = re.compile(r"^([A-Za-z_][A-Za-z0-9_-]{0,30}\$?|[0-9]{1,10})$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Characters systemd refuses in ExecStart's program path (quotes, backslash) or would not treat
# as in its arguments ($ is not expanded in the path but is in argv[0]).
PROGRAM_UNSAFE = "\"'\\$"


# What the DDTree tree kernel takes per position (ddtree_kernels.reference.check_tree_limits,
# which the patched server calls at start); with the 16-token block every K <= 16 fits its key.
KERNEL_MAX_TOPK = 16
# SGLang's secret arguments: the launcher (kernels/ddtree_launch.py) passes the API key in-process.
_KEY_FLAGS = ("--api-key", "--admin-api-key")
# The server arguments the tool writes itself (service/render.py's server_argv and
# speculative_args, SGLang's aliases included), and the setting each comes from. SGLang's parser
# keeps the last of a repeated flag, so one in service.extra_args (which ExecStart appends) would
# silently replace the setting the gates judged: a port the validation does not ask, another
# algorithm. tests/config/test_extra_args.py renders every config's argv to keep this complete.
TOOL_FLAGS = {
    "--model-path": "model.target_path",
    "--model": "model.target_path",
    "--tp-size": "service.tp_size",
    "--tensor-parallel-size": "service.tp_size",
    "--host": "service.listen_host",
    "--port": "service.port",
    "--mem-fraction-static": "service.mem_fraction_static",
    "--context-length": "model.context_length",
    "--max-total-tokens": "service.max_total_tokens",
    "--enable-deterministic-inference": "service.deterministic_inference",
    "--speculative-algorithm": "algo",
    "--speculative-draft-model-path": "model.draft_path",
    "--speculative-draft-model": "model.draft_path",
    "--speculative-ddtree-budget": "algo.budget",
    "--speculative-ddtree-topk": "algo.topk",
    "--speculative-ddtree-mode": "algo.mode",
    "--speculative-ddtree-allow-hybrid-unsafe": "algo.allow_hybrid_unsafe",
}


def check_config(cfg: DeployConfig) -> None:
    """Raise `ConfigError` for the first broken rule; return quietly when the config is sound.

    Every number (finite, in its field's range: `config.ranges`) and every string (no control
    character: `config.text`) is checked first, so the rules below never compare a nan."""
    for problem in (*range_problems(cfg), *text_problems(cfg)):
        raise ConfigError(problem)
    for problem in _problems(cfg):
        raise ConfigError(problem)


def _problems(cfg: DeployConfig) -> list[str]:
    return [
        *_action_problems(cfg),
        *_abi_problems(cfg),
        *_gpu_problems(cfg),
        *_host_problems(cfg),
        *_runs_dir_problems(cfg),
        *_algo_problems(cfg),
        *_service_problems(cfg),
        *_sglang_problems(cfg),
        *_validation_problems(cfg),
        *_tune_problems(cfg),
        *_fleet_problems(cfg),
        *_watch_problems(cfg),
    ]


def _action_problems(cfg: DeployConfig) -> list[str]:
    if cfg.action not in ACTIONS:
        return [f"action={cfg.action!r} is unknown; choose one of: {', '.join(ACTIONS)}."]
    if cfg.output is not Output.prometheus:
        return []
    if cfg.fleet is not None:
        return [
            f"output=prometheus prints one host's metrics, not fleet {cfg.fleet.name}'s; name "
            "one host with host=, or give output=table."
        ]
    if cfg.action != "status":
        return [
            f"output=prometheus is for action=status alone; give action={cfg.action} "
            "output=table or output=json."
        ]
    return []


def _abi_problems(cfg: DeployConfig) -> list[str]:
    abi = cfg.abi
    problems = []
    if not _TORCH_VERSION.match(abi.torch):
        problems.append(
            f"abi.torch={abi.torch!r} is malformed: give the public torch version as X.Y.Z "
            "(e.g. 2.11.0), without a +cuXXX suffix (that is abi.cuda)."
        )
    if abi.cuda is not None and not _CUDA_VERSION.match(abi.cuda):
        problems.append(
            f"abi.cuda={abi.cuda!r} is malformed: give torch's CUDA version as X.Y (e.g. 12.8), "
            "or null for a CPU build."
        )
    if not _PYTHON_VERSION.match(abi.python):
        problems.append(f"abi.python={abi.python!r} is malformed: give the Python version as 3.Y.")
    return problems


def _gpu_problems(cfg: DeployConfig) -> list[str]:
    gpu = cfg.gpu
    if gpu.name == "none":
        if cfg.host.gpu_count:
            return [
                f"host.gpu_count={cfg.host.gpu_count} but gpu=none; pick the host's GPU model "
                "(gpu=rtx_pro_6000_blackwell or gpu=h200)."
            ]
        return []
    if not _GPU_ARCH.match(gpu.arch):
        return [f"gpu.arch={gpu.arch!r} is malformed: give the CUDA arch as sm_XY (e.g. sm_120)."]
    return []


def _shown(value: str) -> str:
    """`value` quoted for a sentence, cut short when long (a 10,000-character name)."""
    return repr(value) if len(value) <= 60 else f"{value[:40]!r}... ({len(value)} characters)"


# What a Linux file system takes: bytes in one name of a path (NAME_MAX) and in a path (PATH_MAX).
_NAME_MAX, _PATH_MAX = 255, 4095


def _path_problems(key: str, path: str) -> list[str]:
    """A folder the unit names on the host: absolute, and short enough to exist there."""
    if not path.startswith("/"):
        return [f"{key}={_shown(path)} is not an absolute path; give the folder's full path."]
    too_long = len(path.encode()) > _PATH_MAX or any(
        len(part.encode()) > _NAME_MAX for part in path.split("/")
    )
    if too_long:
        return [
            f"{key}={_shown(path)} is too long for a file system: at most {_NAME_MAX} bytes a "
            f"folder name and {_PATH_MAX} in all."
        ]
    return []


def _host_problems(cfg: DeployConfig) -> list[str]:
    host = cfg.host
    problems = []
    if not _HOST_NAME.match(host.name):
        problems.append(
            f"host.name={_shown(host.name)} cannot name the host's run folders and files: give "
            "1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit."
        )
    problems += _path_problems("host.sglang_venv", host.sglang_venv)
    problems += _path_problems("host.state_dir", host.state_dir)
    if unsafe := ", ".join(map(repr, sorted(set(host.sglang_venv) & set(PROGRAM_UNSAFE)))):
        problems.append(
            f"host.sglang_venv={_shown(host.sglang_venv)} holds {unsafe}, which "
            "systemd does not take in the program path of ExecStart=; give the venv a path "
            "without quotes, backslashes or $."
        )
    if host.transport is Transport.ssh and not host.address:
        problems.append(
            f"host.address is missing for host {host.name} (transport ssh); "
            f"set host.address=<name or IP>."
        )
    bad_ids = [i for i in host.gpu_ids if not 0 <= i < host.gpu_count]
    if bad_ids and not host.gpu_count:
        problems.append(
            f"host.gpu_ids={list(host.gpu_ids)} names GPUs on a host with host.gpu_count=0; "
            "give the host's GPU count, or host.gpu_ids=[]."
        )
    elif bad_ids:
        problems.append(
            f"host.gpu_ids={list(host.gpu_ids)} names GPUs outside 0..{host.gpu_count - 1} "
            f"(host.gpu_count={host.gpu_count})."
        )
    if len(set(host.gpu_ids)) != len(host.gpu_ids):
        problems.append(f"host.gpu_ids={list(host.gpu_ids)} lists a GPU twice.")
    if not host.staging and cfg.service.tp_size > len(host.gpu_ids):
        problems.append(
            f"service.tp_size={cfg.service.tp_size} needs more GPUs than host.gpu_ids "
            f"gives ({len(host.gpu_ids)})."
        )
    return problems


def _runs_dir_problems(cfg: DeployConfig) -> list[str]:
    """rollout.runs_dir is on this machine, so a relative folder is fine; an empty one would put
    every run's folder loose in the working directory."""
    if cfg.rollout.runs_dir.strip():
        return []
    return ["rollout.runs_dir is empty; give the folder the run folders go in (default: runs)."]


def _algo_problems(cfg: DeployConfig) -> list[str]:
    algo, model = cfg.algo, cfg.model
    if algo.block_size != model.draft_block_size:
        return [
            f"algo.block_size={algo.block_size} does not match the draft model's block size "
            f"{model.draft_block_size} (model.draft_block_size of {model.name}); "
            f"set algo.block_size={model.draft_block_size}."
        ]
    if algo.name is not Algo.DDTREE:
        return []
    if algo.budget > max_tree_budget(cfg):
        return [f"algo.budget={algo.budget} is out of range: {_budget_range(cfg)}."]
    if algo.topk > min(algo.budget, KERNEL_MAX_TOPK):
        return [
            f"algo.topk={algo.topk} is out of range: it must be between 1 and "
            + (
                f"algo.budget = {algo.budget}."
                if algo.budget <= KERNEL_MAX_TOPK
                else f"{KERNEL_MAX_TOPK} (the DDTree tree kernel takes at most {KERNEL_MAX_TOPK} "
                "candidates per position; the server would refuse it at start)."
            )
        ]
    chain = algo.block_size - 1
    if algo.mode is TreeMode.shadow_linear and (algo.topk != 1 or algo.budget != chain):
        return [
            f"algo.mode=shadow_linear needs the chain: algo.topk=1 and algo.budget={chain} "
            f"(got topk={algo.topk}, budget={algo.budget}); use algo=ddtree_shadow."
        ]
    if algo.mode is TreeMode.tree and model.hybrid and not hybrid_tree_allowed(cfg):
        return [
            f"algo.mode=tree on the hybrid target {model.name} needs "
            f"algo.allow_hybrid_unsafe=true on SGLang {cfg.sglang.version}: the GPU lab has not "
            "proven this release's tree path through recurrent layers (it has for 0.5.11 and "
            "0.5.14: DFLASH's tokens exactly, with sibling branches accepted); use "
            "algo=ddtree_shadow for the safe chain mode."
        ]
    return []


def max_tree_budget(cfg: DeployConfig) -> int:
    """The largest tree budget the release's patch set verifies (sglang.ddtree_max_budget), and
    never less than block_size - 1, which every set verifies within the drafter's block."""
    declared = cfg.sglang.ddtree_max_budget
    chain = cfg.algo.block_size - 1
    return chain if declared is None else max(declared, chain)


def _budget_range(cfg: DeployConfig) -> str:
    """The allowed budgets as the end of a refusal sentence, naming the release and its limit."""
    limit = max_tree_budget(cfg)
    if cfg.sglang.ddtree_max_budget is None:
        return (
            f"SGLang {cfg.sglang.version}'s patch set verifies between 1 and block_size - 1 = "
            f"{limit} tree nodes (the verify width stays the block size)"
        )
    return (
        f"SGLang {cfg.sglang.version}'s patch set verifies between 1 and {limit} tree nodes "
        "(sglang.ddtree_max_budget; the verify width becomes budget + 1)"
    )


def hybrid_tree_allowed(cfg: DeployConfig) -> bool:
    """Tree mode may run on a hybrid target: the release is proven, or the operator opted in."""
    return cfg.algo.allow_hybrid_unsafe or cfg.sglang.hybrid_tree_proven


# Tree mode needs an attention backend that reads a custom mask; every patch set refuses the
# others when the server starts, so composition refuses them first.
TREE_MASK_BACKENDS = ("flashinfer", "triton")
_BACKEND_FLAGS = (
    "--attention-backend",
    "--prefill-attention-backend",
    "--decode-attention-backend",
)


def _unit_problems(cfg: DeployConfig) -> list[str]:
    """What the unit and its environment file are named by and hold verbatim (not quotable)."""
    svc = cfg.service
    problems = []
    if not _UNIT_NAME.match(svc.unit_name):
        problems.append(
            f"service.unit_name={_shown(svc.unit_name)} is not a systemd unit name: give 1 to "
            "128 letters, digits, '.', '_', ':' or '-', starting with a letter or digit."
        )
    elif svc.unit_name.endswith(".service"):
        problems.append(
            f"service.unit_name={_shown(svc.unit_name)} ends in .service, which the unit's "
            f"file name adds; give {_shown(svc.unit_name.removesuffix('.service'))}."
        )
    if not _USER.match(svc.user):
        problems.append(
            f"service.user={_shown(svc.user)} is not a user name systemd's User= takes: give a "
            "name of letters, digits, '_' and '-' (not starting with a digit or '-'), or a UID."
        )
    problems += _path_problems("service.unit_dir", svc.unit_dir)
    problems += _path_problems("service.env_dir", svc.env_dir)
    problems += [
        f"service.environment has the key {_shown(name)}, which is not an environment variable "
        "name: use letters, digits and '_', not starting with a digit."
        for name in svc.environment
        if not _ENV_NAME.match(name)
    ]
    return problems


def _service_problems(cfg: DeployConfig) -> list[str]:
    flags = list(dict.fromkeys(a.split("=", 1)[0] for a in cfg.service.extra_args))
    # A key there would stand in the 0644 unit file and on the server's command line.
    problems = _unit_problems(cfg) + [
        f"service.extra_args holds {flag}, which would put a key in the unit file and on the "
        "server's command line; give the API key through service.api_key_env or "
        "service.api_key_file."
        for flag in flags
        if flag in _KEY_FLAGS
    ]
    problems += [_repeated_flag(flag, owner) for flag in flags if (owner := _flag_owner(cfg, flag))]
    if cfg.algo.name is not Algo.DDTREE or cfg.algo.mode is not TreeMode.tree:
        return problems
    args = cfg.service.extra_args
    chosen = [(flag, args[i + 1]) for i, flag in enumerate(args[:-1]) if flag in _BACKEND_FLAGS]
    return problems + [
        f"service.extra_args sets {flag} {backend}, but DDTREE tree mode needs a backend that "
        f"reads the tree mask ({' or '.join(TREE_MASK_BACKENDS)}); SGLang would refuse it at "
        "start."
        for flag, backend in chosen
        if backend not in TREE_MASK_BACKENDS
    ]


def _flag_owner(cfg: DeployConfig, flag: str) -> str | None:
    """The setting behind a server flag the tool writes itself, where `flag` (from
    service.extra_args) is that flag or an abbreviation SGLang's parser would expand to it (no
    flag of 0.5.11 to 0.5.23 is a strict prefix of one of these, so a prefix can only be one)."""
    if not flag.startswith("--") or flag == "--":
        return None
    hybrid = cfg.sglang.hybrid_speculative_args if cfg.model.hybrid else []  # as render writes
    written = {**TOOL_FLAGS, **dict.fromkeys(
        (a for a in hybrid if a.startswith("--")), "sglang.hybrid_speculative_args")}  # fmt: skip
    if flag in written:
        return written[flag]
    owners = {owner for name, owner in written.items() if name.startswith(flag)}
    return owners.pop() if len(owners) == 1 else None


def _repeated_flag(flag: str, owner: str) -> str:
    return (
        f"service.extra_args holds {flag}, a server argument the tool writes from {owner}; "
        f"set {owner} instead (SGLang keeps the last one given, so it would replace the setting "
        "the gates judge)."
    )


def _sglang_problems(cfg: DeployConfig) -> list[str]:
    try:
        Version(cfg.sglang.version)
    except InvalidVersion:
        return [f"sglang.version={cfg.sglang.version!r} is not a version (e.g. 0.5.11)."]
    return []


def _tie_rule_problems(val: ValidationConfig) -> list[str]:
    """The tree gate's tie rule: a tolerance in nats and how far the noise floor widens it."""
    problems = []
    if val.max_tie_tolerance < val.tie_tolerance:
        problems.append(
            f"validation.max_tie_tolerance={val.max_tie_tolerance} must be at least "
            f"validation.tie_tolerance={val.tie_tolerance}."
        )
    return problems


def _validation_problems(cfg: DeployConfig) -> list[str]:
    val = cfg.validation
    problems = _tie_rule_problems(val)
    if not val.prompts:
        problems.append("validation.prompts is empty; the shadow and tree gates need prompts.")
    names = [p.name for p in val.prompts]
    if len(set(names)) != len(names):
        problems.append("validation.prompts has duplicate names; name each prompt once.")
    return problems


def _tune_problems(cfg: DeployConfig) -> list[str]:
    """The grid of `action=tune` (checked only for that action: other runs ignore it)."""
    if cfg.action != "tune":
        return []
    tune, algo = cfg.tune, cfg.algo
    if algo.name is not Algo.DDTREE or algo.mode is not TreeMode.tree:
        return [
            "action=tune sweeps DDTREE tree candidates against linear DFlash, so it needs "
            f"algo=ddtree (got algo.name={algo.name.value}, algo.mode={algo.mode.value}); the grid "
            "is tune.budgets x tune.topks."
        ]
    for key, values in (
        ("budgets", tune.budgets),
        ("topks", tune.topks),
        ("concurrency", tune.concurrency),
    ):
        if not values:
            return [f"tune.{key} is empty; give at least one value, e.g. tune.{key}=[4]."]
        if len(set(values)) != len(values):
            return [f"tune.{key}={list(values)} lists a value twice; name each once."]
    if bad := [b for b in tune.budgets if b > max_tree_budget(cfg)]:
        return [
            f"tune.budgets={list(tune.budgets)} has {bad[0]} out of range: {_budget_range(cfg)}."
        ]
    if bad := [k for k in tune.topks if k > min(max(tune.budgets), KERNEL_MAX_TOPK)]:
        return [
            f"tune.topks={list(tune.topks)} has {bad[0]} out of range: each top-k must be between "
            f"1 and the largest budget in tune.budgets ({max(tune.budgets)}), or it names no "
            f"candidate, and at most {KERNEL_MAX_TOPK} (what the DDTree tree kernel takes)."
        ]
    return []


def _fleet_problems(cfg: DeployConfig) -> list[str]:
    """The fleet's strategy (each host's own config is checked when it is composed)."""
    fleet = cfg.fleet
    if fleet is None:
        return []
    if not _HOST_NAME.match(fleet.name):  # it names the fleet's run folders and journal
        return [
            f"fleet.name={_shown(fleet.name)} cannot name the fleet's run folders and journal: "
            "give 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit."
        ]
    if cfg.action not in FLEET_ACTIONS:
        return [
            f"action={cfg.action} acts on one host, not on fleet {fleet.name}; a fleet runs "
            f"{', '.join(FLEET_ACTIONS)} (or name one host with host=)."
        ]
    if not fleet.hosts:
        return [
            f"fleet {fleet.name} lists no hosts; add them under hosts:, "
            "e.g. hosts: {ct129: {}}."
        ]
    if unknown := [name for name in fleet.canary if name not in fleet.hosts]:
        return [
            f"fleet {fleet.name}'s canary names {unknown[0]!r}, which is not one of its hosts "
            f"({', '.join(fleet.hosts)}); list it under hosts: or drop it from canary."
        ]
    if len(set(fleet.canary)) != len(fleet.canary):
        return [f"fleet {fleet.name}'s canary {list(fleet.canary)} names a host twice."]
    return []


# systemd.time(7)'s time span units, in seconds; a bare number is seconds. Parsed here, not by
# `systemd-analyze timespan`, since the control machine need not run systemd.
_SPAN_UNITS = {
    **dict.fromkeys(("usec", "us", "µs"), 1e-6),
    **dict.fromkeys(("msec", "ms"), 1e-3),
    **dict.fromkeys(("seconds", "second", "sec", "s", ""), 1.0),
    **dict.fromkeys(("minutes", "minute", "min", "m"), 60.0),
    **dict.fromkeys(("hours", "hour", "hr", "h"), 3600.0),
    **dict.fromkeys(("days", "day", "d"), 86400.0),
    **dict.fromkeys(("weeks", "week", "w"), 604800.0),
    **dict.fromkeys(("months", "month", "M"), 2629800.0),
    **dict.fromkeys(("years", "year", "y"), 31557600.0),
}
_SPAN_PART = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Zµ]*)")


def _timespan_seconds(text: str) -> float | None:
    """A systemd time span ("1h", "1h 30min", "90") in seconds; None if systemd would refuse it."""
    total, end = 0.0, 0
    for part in _SPAN_PART.finditer(text):
        if part.start() != end or part.group(2) not in _SPAN_UNITS:
            return None
        total += float(part.group(1)) * _SPAN_UNITS[part.group(2)]
        end = part.end()
    return total if end and text[end:].strip() == "" else None


def _watch_problems(cfg: DeployConfig) -> list[str]:
    """The re-validation timer's ExecStart= runs `watch.command`; its OnUnitActiveSec= and
    AccuracySec= take `interval` and `accuracy` (docs/watch.md)."""
    watch = cfg.watch
    if not watch.enabled:
        return []
    if not watch.command.startswith("/") or set(watch.command) & set(PROGRAM_UNSAFE):
        return [
            f"watch.command={_shown(watch.command)} must be an absolute path without quotes, "
            "backslashes or $ (the timer's ExecStart= runs it); give where ddtree-deploy is "
            "installed on the host, or set watch.enabled=false."
        ]
    for key, span, example in (
        ("interval", watch.interval, "1h, 30min or 1d"),
        ("accuracy", watch.accuracy, "1min or 30s"),
    ):
        if not _timespan_seconds(span):  # 0 would turn the timer off without a word
            return [
                f"watch.{key}={_shown(span)} is not a systemd time span above 0; give one such "
                f"as {example}."
            ]
    if watch.textfile_dir is not None:
        return _path_problems("watch.textfile_dir", watch.textfile_dir)
    return []
