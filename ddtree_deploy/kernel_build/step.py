"""The kernels step: make the host's SGLang venv hold ddtree-kernels built for its exact ABI.

`check(host)` says what `apply(host)` would do and changes nothing. `apply(host)`:

1. probes the venv (torch, CUDA, C++11 ABI, Python) and computes the `KernelKey`;
2. returns `ok` when state.json's `kernels` entry has that key and the current package Python
   (`python_sha256`), and the venv's installed ddtree-kernels is still the one recorded (its
   dist-info RECORD hash), after re-running the smoke test on it;
3. otherwise takes the wheel from the control machine's cache (`cache hit`), or ships the
   `kernels/` sources to a temp folder on the host as a tar and builds there with the venv's own
   Python: `pip wheel --no-build-isolation --no-deps` with `TORCH_CUDA_ARCH_LIST` from `gpu.arch`
   and `DDTREE_KERNELS_BUILD_CUDA=1`, or `=0` on a staging host (no GPU: reference-only build);
   a new wheel goes into the control cache;
4. puts the checkout's package Python into that wheel (`repack.with_python`: a change to
   `ddtree_kernels/sglang.py` alone is a cache hit, not a compile) and keeps the result on the
   host at `<state_dir>/kernels/<slug>/py-<python hash>/` (a rollback reinstalls it without the
   control machine), installs it into a scratch `--target` folder and smoke-tests it there, and
   only then `pip install --no-deps --force-reinstall`s it into the venv, smoke-tests the
   installed package and records `kernels` in state.json (`changed`).

A failed build, install or smoke test raises a `KernelBuildError` subclass; the venv keeps its
previous install, because nothing touches it before the wheel is built and has passed the smoke
test. A failed build's full log is kept in the host's state blobs.
"""

from __future__ import annotations

import hashlib
import importlib.resources
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path, PurePosixPath
from typing import ClassVar

from ddtree_deploy.config.schema import DeployConfig
from ddtree_deploy.events import emit
from ddtree_deploy.hosts.connection import ShellHost
from ddtree_deploy.hosts.facts import HostFacts, probe_facts
from ddtree_deploy.hosts.state import HostStateStore
from ddtree_deploy.kernel_build.buildlog import first_error
from ddtree_deploy.kernel_build.cache import WheelCache, default_cache_dir
from ddtree_deploy.kernel_build.errors import (
    KernelBuildError,
    KernelBuildFailed,
    KernelSmokeFailed,
    KernelSourceMissing,
)
from ddtree_deploy.kernel_build.key import (
    KernelKey,
    build_sha256,
    cuda_arch_list,
    python_sha256,
    python_tag,
    source_tarball,
)
from ddtree_deploy.kernel_build.repack import with_python
from ddtree_deploy.kernel_build.smoke import SMOKE_SCRIPT, SmokeReport, parse_smoke_output
from ddtree_deploy.steps import PlanStatus, ResultStatus, StepPlan, StepResult

# Prints the sha256 of the installed ddtree-kernels' RECORD, or nothing when it is not installed.
_RECORD_PROBE = """
import hashlib, importlib.metadata as md
try:
    dist = md.distribution("ddtree-kernels")
except md.PackageNotFoundError:
    raise SystemExit(0)
print(hashlib.sha256((dist.read_text("RECORD") or "").encode()).hexdigest())
"""
# $1 is the log file; the rest is the command, its stdout and stderr interleaved into the log.
_LOGGED = 'log=$1; shift; "$@" >"$log" 2>&1'
_PIP = ("-m", "pip")
_PIP_QUIET = ("--no-input", "--disable-pip-version-check")


def default_source_dir() -> Path:
    """The `kernels/` source shipped with the tool (the checkout folder when installed editable)."""
    return Path(str(importlib.resources.files("ddtree_deploy.kernel_source")))


class WheelSource(StrEnum):
    """Where the installed wheel came from on this run."""

    installed = "installed"  # already in the venv: nothing built or installed
    cache = "cache"  # control-machine cache hit
    build = "build"  # cache miss: built on the host


@dataclass(frozen=True)
class KernelsPlan(StepPlan):
    """What `apply` would do; `reason` is the line `action=plan` prints."""

    key: KernelKey | None = None
    source: WheelSource | None = None


@dataclass(frozen=True)
class KernelsResult(StepResult):
    """What `apply` did (`detail`): the key, where the wheel came from, the path ops take, the
    smoke test."""

    key: KernelKey
    source: WheelSource
    wheel_sha256: str
    smoke: SmokeReport
    staging: bool  # reference-only because the host has no GPU


@dataclass(frozen=True)
class KernelsStep:
    """Build (or reuse) and install ddtree-kernels for the host's ABI, then smoke-test it."""

    name: ClassVar[str] = "kernels"
    restarts_service: ClassVar[bool] = True  # SGLang imports the kernels only at start
    host_name: str
    python: PurePosixPath  # the SGLang venv's interpreter
    state_dir: PurePosixPath
    arch: str  # gpu.arch, "sm_90"; ignored on a staging host
    staging: bool
    source_dir: Path = field(default_factory=default_source_dir)
    cache_dir: Path = field(default_factory=default_cache_dir)
    build_timeout_s: float = 3600.0
    # The ddtree_kernels.sglang API the host's patch set calls (None: a set that carries
    # DDTree's logic itself): the smoke test refuses a build that provides another.
    module_api: int | None = None
    # The state store of the run this step is part of (a deploy's), so the run's copy of
    # state.json holds the kernels entry this step writes; None: each use reads the host's.
    store: HostStateStore | None = field(default=None, compare=False)
    # The host's probe where the run has one (preflight's: each probe imports torch on the
    # host); None: `check` and `apply` probe the venv themselves.
    facts: HostFacts | None = field(default=None, compare=False)

    @classmethod
    def from_config(
        cls,
        cfg: DeployConfig,
        *,
        cache_dir: Path | None = None,
        module_api: int | None = None,
        store: HostStateStore | None = None,
        facts: HostFacts | None = None,
    ) -> KernelsStep:
        return cls(
            host_name=cfg.host.name,
            python=cfg.host.sglang_python,
            state_dir=PurePosixPath(cfg.host.state_dir),
            arch=cfg.gpu.arch,
            staging=cfg.host.staging,
            cache_dir=cache_dir or default_cache_dir(),
            module_api=module_api,
            store=store,
            facts=facts,
        )

    @property
    def arch_list(self) -> str:
        """TORCH_CUDA_ARCH_LIST; "" selects the reference-only build."""
        return "" if self.staging else cuda_arch_list(self.arch)

    def key(self, facts: HostFacts) -> KernelKey:
        """The ABI key for this venv as probed, with the arch and sources of this step."""
        if facts.python_version is None or facts.torch_version is None:
            raise KernelBuildError(
                f"Cannot build kernels for {facts.host}: {facts.python_path} has "
                f"{'no working Python' if facts.python_version is None else 'no importable torch'}"
                f" ({facts.torch_error or 'not installed'}); fix the SGLang venv first."
            )
        if not (self.source_dir / "setup.py").is_file():
            raise KernelSourceMissing(
                f"The kernels source is not at {self.source_dir}; run ddtree-deploy from a "
                "checkout of the repository (an editable install)."
            )
        return KernelKey(
            torch_version=facts.torch_version,
            torch_cuda=facts.torch_cuda,
            cxx11_abi=bool(facts.cxx11_abi),
            python_tag=python_tag(facts.python_version),
            arch_list=self.arch_list,
            build_sha256=build_sha256(self.source_dir),
        )

    def check(self, host: ShellHost) -> KernelsPlan:
        """Install kernels built for the host's torch/CUDA/Python/arch into its SGLang venv."""
        try:
            key = self.key(self.facts or probe_facts(host, self.python))
        except KernelBuildError as err:
            return KernelsPlan(PlanStatus.UNKNOWN, str(err))
        if self._installed(host, key):
            return KernelsPlan(
                PlanStatus.OK,
                f"kernels {key.slug} already installed",
                key=key,
                source=WheelSource.installed,
            )
        flavour = self._flavour(key)
        if WheelCache(self.cache_dir).get(key) is not None:
            entry = self._store(host).load().get("kernels")
            python_only = isinstance(entry, dict) and entry.get("digest") == key.digest
            what = "the changed package Python in " if python_only else ""
            reason = f"install {what}cached wheel {key.slug} ({flavour})"
            return KernelsPlan(PlanStatus.WOULD_CHANGE, reason, key=key, source=WheelSource.cache)
        reason = f"build {key.slug} on {host.name} ({flavour}), then install it"
        return KernelsPlan(PlanStatus.WOULD_CHANGE, reason, key=key, source=WheelSource.build)

    def apply(self, host: ShellHost) -> KernelsResult:
        """Bring the venv to the key's wheel; `ok` (smoke-tested) when it already has it."""
        key = self.key(self.facts or probe_facts(host, self.python))
        emit("kernels.key", host=host.name, python_sha256=self._python_sha256(), **key.to_dict())
        if self._installed(host, key):
            smoke = self._smoke(host, key, pythonpath=None)
            entry = self._store(host).load()["kernels"]
            reason = f"kernels {key.slug} already installed; {smoke.summary}"
            emit("kernels.unchanged", host=host.name, key=key.slug, message=reason)
            return KernelsResult(
                ResultStatus.OK, reason, key, WheelSource.installed,
                entry["wheel_sha256"], smoke, self.staging,
            )  # fmt: skip
        workdir = PurePosixPath(
            host.run(["mktemp", "-d", "-t", "ddtree-kernels.XXXXXX"]).stdout.strip()
        )
        try:
            return self._install_new(host, key, workdir)
        finally:
            host.run(["rm", "-rf", "--", str(workdir)], check=False)

    def _install_new(
        self, host: ShellHost, key: KernelKey, workdir: PurePosixPath
    ) -> KernelsResult:
        cache = WheelCache(self.cache_dir)
        with cache.building(key):  # another host of this ABI may be building it right now
            cached = cache.get(key)
            source = WheelSource.cache if cached is not None else WheelSource.build
            emit("kernels.cache", host=host.name, key=key.slug, hit=cached is not None)
            if cached is None:
                built, data = self._build(host, key, workdir)
                cached = cache.put(key, built.name, data, built_on=host.name)
        python = self._python_sha256()
        wheel = with_python(cached.path.read_bytes(), self.source_dir)
        wheel_sha256 = hashlib.sha256(wheel).hexdigest()
        kept = self.state_dir / "kernels" / key.slug / f"py-{python[:12]}" / cached.path.name
        host.write_atomic(kept, wheel, mode=0o644, sudo=True)
        stage = workdir / "stage"
        self._pip(host, "install", "--no-deps", "--no-index", "--target", str(stage), str(kept))
        self._smoke(host, key, pythonpath=stage)  # before the venv is touched
        store = self._store(host)
        store.journal("kernels.install", host=host.name, key=key.slug, wheel=str(kept))
        emit("kernels.install", host=host.name, key=key.slug, message=f"installing {kept.name}")
        self._pip(
            host, "install", "--no-deps", "--no-index", "--force-reinstall", str(kept), sudo=True
        )
        smoke = self._smoke(host, key, pythonpath=None)
        state = store.load()
        state["kernels"] = {
            "key": key.slug,
            "digest": key.digest,
            "variant": key.variant,
            "python_sha256": python,
            "wheel": str(kept),
            "wheel_sha256": wheel_sha256,
            "record_sha256": self._record_sha256(host),
        }
        store.save(state)
        store.journal("kernels.installed", host=host.name, key=key.slug)
        how = "from the control cache" if source is WheelSource.cache else "built on the host"
        reason = f"installed kernels {key.slug} ({how}); {smoke.summary}"
        emit("kernels.done", host=host.name, key=key.slug, source=source.value, message=reason)
        return KernelsResult(
            ResultStatus.CHANGED, reason, key, source, wheel_sha256, smoke, self.staging
        )

    def _build(
        self, host: ShellHost, key: KernelKey, workdir: PurePosixPath
    ) -> tuple[PurePosixPath, bytes]:
        """Ship the sources, run `pip wheel` on the host; the wheel's path there and its bytes."""
        src, out, log = workdir / "src", workdir / "wheel", workdir / "build.log"
        host.write_atomic(workdir / "src.tar", source_tarball(self.source_dir))
        host.run(["mkdir", "-p", "--", str(src), str(out)])
        host.run(["tar", "-xf", str(workdir / "src.tar"), "-C", str(src)])
        env = {"DDTREE_KERNELS_BUILD_CUDA": "1" if key.arch_list else "0"}
        if key.arch_list:
            env["TORCH_CUDA_ARCH_LIST"] = key.arch_list
        emit("kernels.build", host=host.name, key=key.slug, message=f"building {key.slug}")
        wheel_cmd = [str(self.python), *_PIP, "wheel", *_PIP_QUIET, "-v", "--no-build-isolation"]
        wheel_cmd += ["--no-deps", "--no-index", "-w", str(out), str(src)]
        result = host.run(
            ["sh", "-c", _LOGGED, "sh", str(log), *wheel_cmd],
            env=env,
            check=False,
            timeout_s=self.build_timeout_s,
        )
        wheels = host.run(["find", str(out), "-name", "*.whl"], check=False).stdout.split()
        if not result.ok or len(wheels) != 1:
            text = host.read_text(log) or result.tail(20)
            saved = self._store(host).put_blob(f"kernels-build-{key.slug}.log", text)
            # Paths inside the deleted temp folder read better relative to kernels/.
            first = first_error(text).replace(f"{src}/", "kernels/") or f"exit {result.exit_code}"
            emit("kernels.build.failed", host=host.name, key=key.slug, error=first, log=str(saved))
            raise KernelBuildFailed(
                f"Building kernels {key.slug} failed on {host.name}: {first} "
                "(the SGLang venv keeps its previous install).",
                hint=f"Full build log: {saved} on {host.name}.",
            )
        wheel = PurePosixPath(wheels[0])
        data = host.read_bytes(wheel)
        assert data is not None, "find just listed the wheel"
        emit("kernels.built", host=host.name, key=key.slug, bytes=len(data))
        return wheel, data

    def _smoke(
        self, host: ShellHost, key: KernelKey, *, pythonpath: PurePosixPath | None
    ) -> SmokeReport:
        env = {"PYTHONPATH": str(pythonpath)} if pythonpath is not None else None
        result = host.run(
            [str(self.python), "-c", SMOKE_SCRIPT, key.variant, str(self.module_api or "-")],
            env=env,
            check=False,
            timeout_s=600,
        )
        report = parse_smoke_output(key.variant, result.stdout)
        where = "the staged wheel" if pythonpath is not None else str(self.python.parent.parent)
        emit(
            "kernels.smoke",
            host=host.name,
            key=key.slug,
            where=where,
            passed=bool(report and report.passed),
            failures=list(report.failures) if report else [result.tail(3)],
        )
        if report is None or not report.passed or not result.ok:
            why = report.failures[0] if report and report.failures else result.tail(1)
            untouched = "; the SGLang venv was not changed" if pythonpath is not None else ""
            raise KernelSmokeFailed(
                f"The {key.variant} smoke test of kernels {key.slug} failed in {where} on "
                f"{host.name}: {why}{untouched}.",
                hint=result.tail(10),
            )
        return report

    def _pip(self, host: ShellHost, *args: str, sudo: bool = False) -> None:
        host.run([str(self.python), *_PIP, *args[:1], *_PIP_QUIET, *args[1:]], sudo=sudo)

    def _installed(self, host: ShellHost, key: KernelKey) -> bool:
        """Whether state.json records this key and Python, and the venv still holds that very
        install."""
        entry = self._store(host).load().get("kernels")
        if not isinstance(entry, dict) or entry.get("digest") != key.digest:
            return False
        if entry.get("python_sha256") != self._python_sha256():
            return False
        return bool(entry.get("record_sha256")) and entry["record_sha256"] == self._record_sha256(
            host
        )

    def _record_sha256(self, host: ShellHost) -> str:
        return host.run([str(self.python), "-c", _RECORD_PROBE]).stdout.strip()

    def _python_sha256(self) -> str:
        return python_sha256(self.source_dir)

    def _store(self, host: ShellHost) -> HostStateStore:
        return self.store or HostStateStore(host, self.state_dir)

    def _flavour(self, key: KernelKey) -> str:
        if key.arch_list:
            return f"CUDA extension, TORCH_CUDA_ARCH_LIST={key.arch_list}"
        return "reference-only: staging host without a GPU" if self.staging else "reference-only"
