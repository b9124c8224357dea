"""The local staging host's SGLang venvs: pinned releases from their PyPI wheels, CPU-only.

Layout (all siblings in the staging root, the folder that holds `host.sglang_venv`):

- `shared-<digest>/`: the shared layer, a venv holding what every release needs and no release
  pins differently (torch, torchvision, triton, numpy, the light packages: about 5.5 GB, almost
  all of it torch's CUDA libraries). `<digest>` covers the base Python and the shared list, so
  releases with the same list share one layer, built once.
- `sglang-<release>/` (`host.sglang_venv`): the release's venv, created without pip, holding
  `sglang==<release>` installed with `--no-deps` (its RECORD is the wheel's own, which the patch
  engine verifies) and the release's own pins (transformers...). A `.pth` file in its
  site-packages puts the shared layer's site-packages on `sys.path` after its own, so a release
  pin shadows a shared copy of the same package, and `python -m pip` runs the layer's pip, which
  installs into the release venv and never uninstalls from the layer (pip leaves alone what lies
  outside the running environment).

Both are idempotent: a marker file inside each records what was installed (the release's marker
also names its layer, so a venv built by the earlier one-venv layout, or against another layer,
is rebuilt, never mixed). A change rebuilds from scratch in a sibling folder that is swapped in
whole, so a failed or killed prepare never leaves a half-built layer or venv where the previous
one was.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from ddtree_deploy.errors import ConfigError, DeployError
from ddtree_deploy.events import emit
from ddtree_deploy.hosts.connection import ShellHost

MARKER = ".ddtree-staging.json"
SHARED_PTH = "ddtree-staging-shared.pth"
_PURELIB = "import sysconfig; print(sysconfig.get_path('purelib'))"


@dataclass(frozen=True)
class StagingResult:
    venv: PurePosixPath
    changed: bool
    reason: str
    shared: PurePosixPath | None = None  # the shared layer the venv sees
    shared_changed: bool = False  # this run built the layer


def _digest(lines: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def shared_layer_path(
    venv: PurePosixPath, base_python: str, shared_requirements: Sequence[str]
) -> PurePosixPath:
    """Where the shared layer for this base Python and shared list lives: beside `venv`."""
    return venv.parent / f"shared-{_digest([base_python, *shared_requirements])}"


def shared_marker(base_python: str, shared_requirements: Sequence[str]) -> dict[str, str]:
    """What the marker must hold for a shared layer to count as built for this list."""
    return {"layer": "shared", "python": base_python, "requirements": _digest(shared_requirements)}


def staging_marker(
    sglang_version: str, requirements: Sequence[str], shared: PurePosixPath
) -> dict[str, str]:
    """What the marker must hold for a release venv to count as prepared for this pin."""
    return {"sglang": sglang_version, "requirements": _digest(requirements), "shared": str(shared)}


def prepare_staging_venv(
    host: ShellHost,
    venv: PurePosixPath,
    *,
    base_python: str,
    sglang_version: str,
    requirements: Sequence[str],
    shared_requirements: Sequence[str] = (),
) -> StagingResult:
    """Make `venv` hold `sglang==sglang_version` (no deps) plus `requirements`, on top of the
    shared layer of `shared_requirements` (built first where missing); idempotent."""
    shared = shared_layer_path(venv, base_python, shared_requirements)
    if str(shared).startswith(str(venv)):
        # pip treats what lies under the running venv's prefix as its own and would uninstall
        # shared packages that a release pin replaces.
        raise ConfigError(
            f"the shared staging layer {shared} would lie under the venv path {venv}; "
            "choose a host.sglang_venv whose name is not a prefix of 'shared-'."
        )
    shared_changed = _prepare_shared(host, shared, base_python, shared_requirements)
    wanted = staging_marker(sglang_version, requirements, shared)
    current = host.read_text(venv / MARKER)
    if current is not None and json.loads(current) == wanted:
        reason = f"{venv} already holds sglang {sglang_version} (shared layer {shared.name})"
        emit("prepare.unchanged", venv=str(venv))  # no progress line: the CLI prints `reason`
        return StagingResult(venv, False, reason, shared, shared_changed)
    building = venv.parent / f".{venv.name}.building"
    host.run(["rm", "-rf", "--", str(building)])
    try:
        _build_release(host, building, base_python, sglang_version, requirements, shared, wanted)
    except DeployError:
        host.run(["rm", "-rf", "--", str(building)], check=False)
        raise
    _swap(host, building, venv, [base_python, "-m", "venv", "--upgrade", "--without-pip"])
    emit("prepare.done", venv=str(venv))  # no progress line: the CLI prints the result
    layer = f"{'built' if shared_changed else 'reused'} shared layer {shared.name}"
    reason = f"built {venv} with sglang {sglang_version} and {len(requirements)} pins ({layer})"
    return StagingResult(venv, True, reason, shared, shared_changed)


def _prepare_shared(
    host: ShellHost, layer: PurePosixPath, base_python: str, requirements: Sequence[str]
) -> bool:
    """Build the shared layer where its marker does not match; True when it was built."""
    wanted = shared_marker(base_python, requirements)
    current = host.read_text(layer / MARKER)
    if current is not None and json.loads(current) == wanted:
        emit("prepare.shared.unchanged", layer=str(layer))
        return False
    building = layer.parent / f".{layer.name}.building"
    host.run(["rm", "-rf", "--", str(building)])
    try:
        emit(
            "prepare.stage",
            stage="shared",
            message=f"building the shared staging layer {layer.name} with {base_python}: "
            f"{len(requirements)} CPU requirements for every release",
        )
        host.run([base_python, "-m", "venv", str(building)])
        if requirements:
            host.run([*_pip(building), *requirements], timeout_s=3600)
        host.write_atomic(building / MARKER, json.dumps(wanted, sort_keys=True) + "\n")
    except DeployError:
        host.run(["rm", "-rf", "--", str(building)], check=False)
        raise
    _swap(host, building, layer, [base_python, "-m", "venv", "--upgrade", "--without-pip"])
    return True


def _build_release(
    host: ShellHost,
    building: PurePosixPath,
    base_python: str,
    sglang_version: str,
    requirements: Sequence[str],
    shared: PurePosixPath,
    marker: dict[str, str],
) -> None:
    """Create the release venv at `building` on top of `shared`; the marker is written last."""
    # One progress line (a `message`) for the release venv; the stages without one time it in
    # the run's debug.log.
    emit(
        "prepare.stage",
        stage="venv",
        message=f"building the staging venv with {base_python}: sglang=={sglang_version} "
        f"from its PyPI wheel and {len(requirements)} release pins on {shared.name}",
    )
    # No pip of its own: the layer's pip (and setuptools) come through the .pth file, so the
    # venv's bundled copies cannot shadow the layer's newer ones.
    host.run([base_python, "-m", "venv", "--without-pip", str(building)])
    shared_site = host.run([str(shared / "bin" / "python"), "-c", _PURELIB]).stdout.strip()
    site = host.run([str(building / "bin" / "python"), "-c", _PURELIB]).stdout.strip()
    host.write_atomic(PurePosixPath(site) / SHARED_PTH, shared_site + "\n")
    if requirements:
        emit("prepare.stage", stage="requirements", count=len(requirements))
        host.run([*_pip(building), *requirements], timeout_s=3600)
    emit("prepare.stage", stage="sglang", version=sglang_version)
    host.run([*_pip(building), "--no-deps", f"sglang=={sglang_version}"], timeout_s=1200)
    host.write_atomic(building / MARKER, json.dumps(marker, sort_keys=True) + "\n")


def _pip(venv: PurePosixPath) -> list[str]:
    return [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-input"]


def _swap(
    host: ShellHost, building: PurePosixPath, final: PurePosixPath, upgrade: list[str]
) -> None:
    """Replace `final` whole with the finished `building`; `venv --upgrade --without-pip` then
    rewrites the paths the venv recorded at build time (pyvenv.cfg, activate scripts) for its
    final place, and leaves the installed pip and setuptools as they are (with pip, it would run
    ensurepip, and into a release venv put a bundled setuptools that shadows the layer's)."""
    host.run(["rm", "-rf", "--", str(final)])
    host.run(["mv", "--", str(building), str(final)])
    host.run([*upgrade, str(final)])
