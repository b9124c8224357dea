"""Validation fixtures: the stand-in SGLang server locally, and a container host that runs it.

`standin_source` finds a prepared SGLang venv (skip without one). `local_standin` runs the
stand-in as a child process on this machine. `standin_lab` boots one systemd container with the
stand-in venv bound in read-only; its tests deploy real units that run `python -m standin`.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import httpx
import pytest
from hostlab import Container, TestHost, boot_container, ensure_rootfs, unavailable_reason
from product_hosts import connect, ssh_host_overrides
from standin.lab import MODEL_DIR, binds, build_standin_venv, source_venv
from standin.models import model_configs

from ddtree_deploy.config import DeployConfig, compose_config
from ddtree_deploy.hosts.ssh import SshHost

API_KEY = "standin-test-key-7f3a"
STANDIN_CONF = Path(__file__).resolve().parent / "conf"  # the validation=standin option


def _skip_or_fail(reason: str) -> None:
    if os.environ.get("DDTREE_REQUIRE_HOSTLAB") == "1":
        pytest.fail(f"DDTREE_REQUIRE_HOSTLAB=1 but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def standin_root() -> tuple[Path, Path]:
    """(stand-in venv root, the SGLang venv it was built from)."""
    source = source_venv()
    if source is None:
        _skip_or_fail(
            "no prepared SGLang venv (run `ddtree-deploy host=local action=prepare`, or set "
            "DDTREE_TEST_SGLANG_VENV)"
        )
        raise AssertionError("unreachable")
    return build_standin_venv(source), source


@dataclass(frozen=True)
class LocalStandin:
    """A stand-in server on this machine: its URL and the process."""

    url: str
    process: subprocess.Popen[bytes]


def free_port() -> int:
    """A free port below 55536: SGLang refuses ports whose derived gRPC port (+10000) overflows."""
    for port in random.sample(range(20000, 50000), 200):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port between 20000 and 50000")


def start_local_standin(
    root: Path, models: Path, *extra: str, env: dict[str, str] | None = None
) -> LocalStandin:
    """Start `python -m standin` on a free port and wait for /health (up to 120 s)."""
    for relative, text in model_configs().items():
        (models / relative).parent.mkdir(parents=True, exist_ok=True)
        (models / relative).write_text(text)
    port = free_port()
    argv = [
        str(root / "venv" / "bin" / "python"),
        "-m",
        "standin",
        "--model-path",
        str(models / "target"),
        "--speculative-draft-model-path",
        str(models / "draft"),
        "--device",
        "cpu",
        "--port",
        str(port),
        "--api-key",
        API_KEY,
        *extra,
    ]
    log = (models / "standin.log").open("wb")
    # 0.06 s per pass: the toy's own compute is about 30 ms a pass here (more under load), and
    # the modelled time must stay above it or the tree gate judges CPU load, not acceptance.
    process = subprocess.Popen(
        argv,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "STANDIN_STEP_S": "0.06", **(env or {})},
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError((models / "standin.log").read_text()[-2000:])
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return LocalStandin(url, process)
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    process.terminate()
    raise RuntimeError("the stand-in did not answer /health within 120 s")


@pytest.fixture(scope="module")
def local_standin(
    standin_root: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalStandin]:
    """A DDTREE tree-mode stand-in on this machine, API key set."""
    models = tmp_path_factory.mktemp("standin-models")
    server = start_local_standin(
        standin_root[0],
        models,
        "--speculative-algorithm",
        "DDTREE",
        "--speculative-ddtree-topk",
        "4",
    )
    try:
        yield server
    finally:
        server.process.terminate()
        server.process.wait(timeout=30)


@dataclass(frozen=True)
class StandinLab:
    """A container that runs the stand-in as its SGLang unit; `overrides` point a config at it."""

    host: TestHost
    venv: Path

    def overrides(self, name: str, runs_dir: Path, key_file: Path, port: int) -> list[str]:
        return [
            *ssh_host_overrides(self.host),
            f"host.sglang_venv={self.venv}",
            f"host.state_dir=/var/lib/ddtree-test/{name}",
            "host.systemd=true",
            f"model.target_path={MODEL_DIR}/target",
            f"model.draft_path={MODEL_DIR}/draft",
            f"service.unit_name={name}",
            f"service.port={port}",
            "service.launch_module=standin",
            "service.tp_size=1",
            "service.extra_args=[--device,cpu]",
            "service.settle_s=1",
            "service.active_wait_s=120",
            "service.restart_delay_s=1",
            f"service.api_key_file={key_file}",
            "+service.environment.STANDIN_STEP_S=0.05",
            "validation.unit_active={timeout_s: 60, interval_s: 0.5, initial_delay_s: 0}",
            "validation.health={timeout_s: 120, interval_s: 0.5, initial_delay_s: 0}",
            "validation.server_info={timeout_s: 30, interval_s: 0.5, initial_delay_s: 0}",
            "validation.health_generate={timeout_s: 30, interval_s: 0.5, initial_delay_s: 0}",
            f"rollout.runs_dir={runs_dir}",
            # The stand-in tests' shorter prompt set (conf/validation/standin.yaml says why).
            f"hydra.searchpath=[file://{STANDIN_CONF}]",
            "validation=standin",
        ]

    def config(self, name: str, tmp_path: Path, port: int, *extra: str) -> DeployConfig:
        return compose_config([*self.overrides(name, tmp_path, key_file(tmp_path), port), *extra])

    def connect(self) -> SshHost:
        return connect(self.host)


def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "api-key"
    path.write_text(API_KEY + "\n")
    path.chmod(0o600)  # load_api_key refuses a key file its group or others can read
    return path


def boot_standin_lab(standin_root: tuple[Path, Path]) -> tuple[Container, StandinLab]:
    """A new container that can run the stand-in (skips where containers cannot run)."""
    reason = unavailable_reason(containers=True)
    if reason is not None:
        _skip_or_fail(reason)
    root, source = standin_root
    read_only = [path for path in binds(root, source) if path != root]
    # The stand-in's venv under `root` is written to by the deploy (kernels, patches); each
    # container writes to its own upper layer.
    container: Container = boot_container(ensure_rootfs(), binds_ro=read_only, overlays=[root])
    try:
        lab = StandinLab(container.host, root / "venv")
        with lab.connect() as host:
            for relative, text in model_configs().items():
                host.write_atomic(PurePosixPath(MODEL_DIR) / relative, text)
    except BaseException:
        container.stop()
        raise
    return container, lab


@pytest.fixture(scope="session")
def standin_lab(standin_root: tuple[Path, Path]) -> Iterator[StandinLab]:
    container, lab = boot_standin_lab(standin_root)
    try:
        yield lab
    finally:
        container.stop()
