"""Render the SGLang unit and its environment file from `templates/` for one config.

The unit holds everything but secrets; the API key goes only into the environment file, which
is installed 0600. With a key, ExecStart runs the launcher `ddtree_launch` (shipped in the
kernels wheel, kernels/ddtree_launch.py), which hands `$SGLANG_API_KEY` to SGLang in-process,
so the key is on no command line. Rendering is pure: the same config gives the same bytes, so an
unchanged config never looks like a change.
"""

from __future__ import annotations

import hashlib
import importlib.resources
from dataclasses import dataclass
from pathlib import PurePosixPath

import jinja2

from ddtree_deploy.config.rules import hybrid_tree_allowed
from ddtree_deploy.config.schema import Algo, DeployConfig, TreeMode
from ddtree_deploy.service.quoting import (
    Quoted,
    env_assignment,
    exec_command,
    path_value,
    unit_value,
)
from ddtree_deploy.service.secret import MASK, Secret

API_KEY_VAR = "SGLANG_API_KEY"
LAUNCHER_MODULE = "ddtree_launch"  # kernels/ddtree_launch.py


def _load_template(name: str) -> str:
    # templates/ ships as the package ddtree_deploy.templates (see pyproject.toml).
    return (importlib.resources.files("ddtree_deploy.templates") / name).read_text()


def _quoted_only(value: object) -> object:
    """Every `{{ }}` of a systemd template shows a number or text `service.quoting` made safe for
    its place; a raw string there is a bug that could let a value write a directive."""
    if isinstance(value, Quoted) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise TypeError(f"a systemd template was given an unquoted {type(value).__name__}: {value!r}")


# For the systemd files under templates/ (units and their environment files).
TEMPLATES = jinja2.Environment(
    loader=jinja2.FunctionLoader(_load_template),
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
    autoescape=False,  # systemd syntax, not HTML; values are quoted by service.quoting
    finalize=_quoted_only,
)


@dataclass(frozen=True)
class RenderedService:
    """The two files a host gets; `env_text` may hold the secret, `env_masked` never does."""

    unit_name: str
    unit_path: PurePosixPath
    unit_text: str
    env_path: PurePosixPath
    env_text: str
    env_masked: str
    argv: tuple[str, ...]  # ExecStart as the program receives it (never the API key)
    environment_masked: dict[str, str]  # the env file's values, the secret masked

    def to_dict(self) -> dict[str, object]:
        """What `action=render output=json` prints: everything but the secret."""
        return {
            "unit_path": str(self.unit_path),
            "unit_text": self.unit_text,
            "env_path": str(self.env_path),
            "env_text": self.env_masked,
            "argv": list(self.argv),
            "environment": self.environment_masked,
        }

    @property
    def unit_file(self) -> str:
        return self.unit_path.name

    @property
    def unit_sha256(self) -> str:
        return sha256_text(self.unit_text)

    @property
    def env_sha256(self) -> str:
        return sha256_text(self.env_text)


def render_template(name: str, values: dict[str, object]) -> str:
    """Any template of `templates/` with `values` (already quoted for where they land)."""
    return TEMPLATES.get_template(name).render(**values)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def unit_paths(cfg: DeployConfig) -> tuple[PurePosixPath, PurePosixPath]:
    """Where the unit and its environment file live on the host."""
    name = cfg.service.unit_name
    return (
        PurePosixPath(cfg.service.unit_dir) / f"{name}.service",
        PurePosixPath(cfg.service.env_dir) / f"{name}.env",
    )


def server_argv(cfg: DeployConfig, *, api_key: bool) -> list[str]:
    """ExecStart's argv: the venv's python, the launch module, then SGLang's arguments.

    With `api_key`, the launcher runs the launch module and adds `--api-key` from the
    environment file in-process (`ddtree_launch`'s docstring says how)."""
    svc, model = cfg.service, cfg.model
    python = str(cfg.host.sglang_python)
    launcher = ["-m", LAUNCHER_MODULE, "--api-key-env", API_KEY_VAR] if api_key else ["-m"]
    argv = [
        python,
        *launcher,
        svc.launch_module,
        "--model-path",
        model.target_path,
        "--tp-size",
        str(svc.tp_size),
        "--host",
        svc.listen_host,
        "--port",
        str(svc.port),
        "--mem-fraction-static",
        f"{svc.mem_fraction_static:g}",
        "--context-length",
        str(model.context_length),
        *speculative_args(cfg),
    ]
    if svc.max_total_tokens is not None:
        argv += ["--max-total-tokens", str(svc.max_total_tokens)]
    if svc.deterministic_inference:
        argv.append("--enable-deterministic-inference")
    return argv + list(svc.extra_args)


def speculative_args(cfg: DeployConfig) -> list[str]:
    """The arguments of the chosen algorithm (block size comes from the draft), with what the
    release needs to speculate on a hybrid target (`sglang.hybrid_speculative_args`)."""
    algo = cfg.algo
    args = [
        "--speculative-algorithm",
        algo.name.value,
        "--speculative-draft-model-path",
        cfg.model.draft_path,
    ]
    if algo.name is Algo.DDTREE:
        args += [
            "--speculative-ddtree-budget",
            str(algo.budget),
            "--speculative-ddtree-topk",
            str(algo.topk),
            "--speculative-ddtree-mode",
            algo.mode.value,
        ]
        # The patched server keeps its own hybrid gate; a proven release opens it for the operator.
        hybrid_tree = cfg.model.hybrid and algo.mode is TreeMode.tree
        if algo.allow_hybrid_unsafe or (hybrid_tree and hybrid_tree_allowed(cfg)):
            args.append("--speculative-ddtree-allow-hybrid-unsafe")
    if cfg.model.hybrid:
        args += cfg.sglang.hybrid_speculative_args
    return args


def render_service(cfg: DeployConfig, api_key: Secret | None) -> RenderedService:
    """Render both files; raises `jinja2` errors only for a broken template (a bug)."""
    unit_path, env_path = unit_paths(cfg)
    argv = server_argv(cfg, api_key=api_key is not None)
    unit_text = TEMPLATES.get_template("sglang.service.j2").render(
        serves=unit_value(f"{cfg.model.name} with {cfg.algo.summary}"),
        description=unit_value(f"SGLang server ({cfg.model.name}, {cfg.algo.summary})"),
        syslog_identifier=unit_value(cfg.service.unit_name),
        user=unit_value(cfg.service.user),
        env_path=path_value(str(env_path)),
        exec_start=exec_command(argv),
        restart_delay_s=cfg.service.restart_delay_s,
        start_timeout_s=cfg.service.start_timeout_s,
        stop_timeout_s=cfg.service.stop_timeout_s,
        limit_nofile=cfg.service.limit_nofile,
    )
    return RenderedService(
        unit_name=cfg.service.unit_name,
        unit_path=unit_path,
        unit_text=unit_text,
        env_path=env_path,
        env_text=_render_env(_env_values(cfg, api_key.reveal() if api_key else None)),
        env_masked=_render_env(_env_values(cfg, MASK if api_key else None)),
        argv=tuple(argv),
        environment_masked=_env_values(cfg, MASK if api_key else None),
    )


def _env_values(cfg: DeployConfig, api_key: str | None) -> dict[str, str]:
    values = {
        "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in cfg.host.gpu_ids),
        "PYTHONUNBUFFERED": "1",
        **cfg.service.environment,
    }
    if api_key is not None:
        values[API_KEY_VAR] = api_key
    return values


def _render_env(values: dict[str, str]) -> str:
    lines = [env_assignment(key, value) for key, value in values.items()]
    return TEMPLATES.get_template("sglang.env.j2").render(assignments=lines)
