"""The facts probe: what a host really has (GPUs, driver, CUDA, torch ABI, Python, SGLang, init).

One shell round trip gathers everything; the Python part runs through the host's configured
interpreter (the SGLang venv's), because that is the interpreter whose torch and SGLang matter.
Values are parsed into `HostFacts`; anything the host lacks is None, never a guess.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import PurePosixPath
from typing import Any

from ddtree_deploy.errors import HostError
from ddtree_deploy.events import emit
from ddtree_deploy.hosts.connection import ShellHost

_PYTHON_PROBE = r"""
import importlib.util, json, os, sys
out = {"python_version": "%d.%d.%d" % sys.version_info[:3]}
try:
    import torch
    out["torch_version"] = torch.__version__
    out["torch_cuda"] = torch.version.cuda
    out["cxx11_abi"] = bool(torch._C._GLIBCXX_USE_CXX11_ABI)
except Exception as err:
    out["torch_error"] = "%s: %s" % (type(err).__name__, err)
try:
    from importlib.metadata import version
    out["sglang_version"] = version("sglang")
    spec = importlib.util.find_spec("sglang")
    out["sglang_path"] = os.path.dirname(spec.origin) if spec and spec.origin else None
except Exception:
    pass
print(json.dumps(out))
"""

# $1 is the interpreter, $2 the Python probe. Sections are marked so one round trip carries
# every fact.
_PROBE_SCRIPT = r"""
echo @@pid1; cat /proc/1/comm 2>/dev/null
echo @@gpus
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,name,compute_cap,memory.total,driver_version \
    --format=csv,noheader,nounits 2>/dev/null
  echo @@cuda
  nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -n 1
fi
echo @@python
if [ -x "$1" ]; then "$1" -c "$2"; fi
"""


@dataclass(frozen=True)
class GpuFact:
    """One GPU as nvidia-smi reports it."""

    index: int
    name: str
    compute_capability: str  # "12.0"
    memory_mib: int

    @property
    def arch(self) -> str:
        """The CUDA arch name, "sm_120" for compute capability 12.0."""
        return "sm_" + self.compute_capability.replace(".", "")


@dataclass(frozen=True)
class HostFacts:
    """Everything preflight compares with the config."""

    host: str
    python_path: str
    python_version: str | None = None
    torch_version: str | None = None
    torch_cuda: str | None = None
    cxx11_abi: bool | None = None
    torch_error: str | None = None
    sglang_version: str | None = None
    sglang_path: str | None = None
    gpus: tuple[GpuFact, ...] = field(default_factory=tuple)
    driver_version: str | None = None
    cuda_driver_version: str | None = None  # the newest CUDA the driver supports
    systemd_pid1: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def probe_facts(host: ShellHost, python: PurePosixPath) -> HostFacts:
    """Run the probe on `host` with `python`; raises `HostError` when the probe itself fails.

    It imports torch there (seconds): a run probes once and hands the facts on."""
    emit("facts.probe", host=host.name, python=str(python))
    result = host.run(
        ["sh", "-c", _PROBE_SCRIPT, "sh", str(python), _PYTHON_PROBE], check=False, timeout_s=120
    )
    if not result.ok:
        raise HostError(
            f"The facts probe failed on {host.name} with exit code {result.exit_code}: "
            f"{result.tail(3)}"
        )
    return parse_probe_output(host.name, str(python), result.stdout)


def parse_probe_output(host_name: str, python_path: str, text: str) -> HostFacts:
    """Parse the sectioned probe output (kept separate so recorded output can be tested)."""
    sections = _sections(text)
    gpus = tuple(_parse_gpu(line) for line in sections.get("gpus", []) if line.strip())
    driver_lines = [line.split(",")[-1].strip() for line in sections.get("gpus", []) if line]
    python_info: dict[str, Any] = {}
    for line in sections.get("python", []):
        if line.startswith("{"):
            python_info = json.loads(line)
    cuda_lines = [line for line in sections.get("cuda", []) if line.strip()]
    return HostFacts(
        host=host_name,
        python_path=python_path,
        python_version=python_info.get("python_version"),
        torch_version=python_info.get("torch_version"),
        torch_cuda=python_info.get("torch_cuda"),
        cxx11_abi=python_info.get("cxx11_abi"),
        torch_error=python_info.get("torch_error"),
        sglang_version=python_info.get("sglang_version"),
        sglang_path=python_info.get("sglang_path"),
        gpus=gpus,
        driver_version=driver_lines[0] if driver_lines else None,
        cuda_driver_version=cuda_lines[0].strip() if cuda_lines else None,
        systemd_pid1=[line.strip() for line in sections.get("pid1", [])] == ["systemd"],
    )


def _sections(text: str) -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("@@"):
            current = sections.setdefault(line[2:].strip(), [])
        elif current is not None:
            current.append(line)
    return sections


def _parse_gpu(line: str) -> GpuFact:
    index, name, capability, memory, _driver = (part.strip() for part in line.split(","))
    return GpuFact(int(index), name, capability, int(float(memory)))
