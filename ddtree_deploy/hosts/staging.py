"""The local staging host's SGLang venv: the pinned release from its PyPI wheel, CPU-only.

`prepare_staging_venv` is idempotent: a marker file inside the venv records what was installed
(release + requirement list); when it matches, nothing runs. A changed pin rebuilds the venv
from scratch in a sibling folder and swaps it in, so a failed or killed prepare never leaves a
half-built venv where the previous one was.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from ddtree_deploy.errors import DeployError
from ddtree_deploy.events import emit
from ddtree_deploy.hosts.connection import ShellHost

MARKER = ".ddtree-staging.json"


@dataclass(frozen=True)
class StagingResult:
    venv: PurePosixPath
    changed: bool
    reason: str


def staging_marker(sglang_version: str, requirements: Sequence[str]) -> dict[str, str]:
    """What the marker must hold for a venv to count as prepared for this pin."""
    digest = hashlib.sha256("\n".join(requirements).encode()).hexdigest()[:16]
    return {"sglang": sglang_version, "requirements": digest}


def prepare_staging_venv(
    host: ShellHost,
    venv: PurePosixPath,
    *,
    base_python: str,
    sglang_version: str,
    requirements: Sequence[str],
) -> StagingResult:
    """Make `venv` hold `sglang==sglang_version` (no deps) plus `requirements`; idempotent."""
    wanted = staging_marker(sglang_version, requirements)
    current = host.read_text(venv / MARKER)
    if current is not None and json.loads(current) == wanted:
        reason = f"{venv} already holds sglang {sglang_version}"
        emit("prepare.unchanged", venv=str(venv))  # no progress line: the CLI prints `reason`
        return StagingResult(venv, False, reason)
    building = venv.parent / f".{venv.name}.building"
    host.run(["rm", "-rf", "--", str(building)])
    try:
        _build(host, building, base_python, sglang_version, requirements, wanted)
    except DeployError:
        host.run(["rm", "-rf", "--", str(building)], check=False)
        raise
    # The finished venv replaces the old one whole; `venv --upgrade` then rewrites the paths
    # the venv recorded at build time (pyvenv.cfg, activate scripts) for its final location.
    host.run(["rm", "-rf", "--", str(venv)])
    host.run(["mv", "--", str(building), str(venv)])
    host.run([base_python, "-m", "venv", "--upgrade", str(venv)])
    emit("prepare.done", venv=str(venv))  # no progress line: the CLI prints the result
    return StagingResult(venv, True, f"built {venv} with sglang {sglang_version}")


def _build(
    host: ShellHost,
    building: PurePosixPath,
    base_python: str,
    sglang_version: str,
    requirements: Sequence[str],
    marker: dict[str, str],
) -> None:
    """Create the venv at `building` and install into it; the marker is written last."""
    # One progress line (a `message`) for the whole build; the stages without one time it in
    # the run's debug.log.
    emit(
        "prepare.stage",
        stage="venv",
        message=f"building the staging venv with {base_python}: sglang=={sglang_version} "
        f"from its PyPI wheel and {len(requirements)} CPU requirements",
    )
    host.run([base_python, "-m", "venv", str(building)])
    pip = [str(building / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-input"]
    if requirements:
        emit("prepare.stage", stage="requirements", count=len(requirements))
        host.run([*pip, *requirements], timeout_s=3600)
    emit("prepare.stage", stage="sglang", version=sglang_version)
    host.run([*pip, "--no-deps", f"sglang=={sglang_version}"], timeout_s=1200)
    host.write_atomic(building / MARKER, json.dumps(marker, sort_keys=True) + "\n")
