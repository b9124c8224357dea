"""Preflight: compare what a host really has with what its config says, before touching it.

Every mismatch becomes one sentence; any mismatch refuses the deploy. A staging host (no GPU,
no systemd management) gets `staging` verdicts that say which later steps run in staging form.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from packaging.version import InvalidVersion, Version

from ddtree_deploy.config.schema import DeployConfig
from ddtree_deploy.errors import PreflightRefused
from ddtree_deploy.hosts.facts import HostFacts
from ddtree_deploy.patching.manifest import PatchSet, UnsupportedRelease, select_patch_set


class Verdict(StrEnum):
    ok = "ok"
    mismatch = "mismatch"
    staging = "staging"


@dataclass(frozen=True)
class Check:
    """One row of the verdict table; `sentence` explains a mismatch or a staging verdict."""

    name: str
    expected: str
    actual: str
    verdict: Verdict
    sentence: str = ""


@dataclass(frozen=True)
class PreflightReport:
    host: str
    checks: tuple[Check, ...]
    facts: HostFacts  # what was judged; the deploy's later steps use it instead of probing again
    # The set serving the installed release, when there is one: the patch and kernels steps
    # take it from here rather than looking it up again.
    patch_set: PatchSet | None = None

    @property
    def refusals(self) -> list[str]:
        return [c.sentence for c in self.checks if c.verdict is Verdict.mismatch]

    def passed_patch_set(self) -> PatchSet:
        """The set to patch with; raises `PreflightRefused` when preflight refused (a report
        without a set always has: SGLang missing, another release, or one without a set)."""
        self.raise_if_refused()
        assert self.patch_set is not None, "preflight refuses a host whose release has no set"
        return self.patch_set

    def raise_if_refused(self) -> None:
        """Raise `PreflightRefused` with every mismatch sentence; nothing has been touched."""
        if refusals := self.refusals:
            raise PreflightRefused(
                f"Preflight refused {self.host}: " + " ".join(refusals),
                hint="Nothing on the host was changed.",
            )


def run_preflight(cfg: DeployConfig, facts: HostFacts) -> PreflightReport:
    """Compare `facts` with `cfg`; pure, so it is tested on recorded facts."""
    checks: list[Check] = [_python_check(cfg, facts)]
    patch_set = None
    if facts.python_version is not None:
        checks.append(_torch_check(cfg, facts))
        if facts.torch_version is not None:
            checks.append(_cxx11_check(cfg, facts))
        sglang, patch_set = _sglang_check(cfg, facts)
        checks.append(sglang)
    checks += [_gpu_check(cfg, facts), _init_check(cfg, facts)]
    return PreflightReport(cfg.host.name, tuple(checks), facts, patch_set)


def _python_check(cfg: DeployConfig, facts: HostFacts) -> Check:
    expected = f"Python {cfg.abi.python} at {facts.python_path}"
    if facts.python_version is None:
        todo = (
            # The version too: without it, prepare builds the host file's default release.
            f"run `ddtree-deploy host={cfg.host.name} sglang.version={cfg.sglang.version} "
            "action=prepare` to build it"
            if cfg.host.staging
            else "install SGLang's venv there or fix host.sglang_venv"
        )
        return Check(
            "python",
            expected,
            "missing",
            Verdict.mismatch,
            f"There is no Python at {facts.python_path} on {facts.host}; {todo}.",
        )
    minor = ".".join(facts.python_version.split(".")[:2])
    if minor != cfg.abi.python:
        return Check(
            "python",
            expected,
            facts.python_version,
            Verdict.mismatch,
            f"{facts.host} runs Python {facts.python_version} but abi.python={cfg.abi.python}; "
            "fix the host's abi config or rebuild its venv.",
        )
    return Check("python", expected, facts.python_version, Verdict.ok)


def _torch_check(cfg: DeployConfig, facts: HostFacts) -> Check:
    wanted = f"torch {cfg.abi.torch}" + (f"+cu{_cu(cfg.abi.cuda)}" if cfg.abi.cuda else " (CPU)")
    if facts.torch_version is None:
        return Check(
            "torch ABI",
            wanted,
            "missing",
            Verdict.mismatch,
            f"torch does not import in {facts.python_path} on {facts.host} "
            f"({facts.torch_error or 'not installed'}); the config says {wanted}.",
        )
    actual = f"torch {_public(facts.torch_version)}" + (
        f"+cu{_cu(facts.torch_cuda)}" if facts.torch_cuda else " (CPU)"
    )
    if actual != wanted:
        return Check(
            "torch ABI",
            wanted,
            actual,
            Verdict.mismatch,
            f"ABI mismatch on {facts.host}: the config says {wanted} but the host has {actual}; "
            "kernels built for one torch/CUDA pair break on the other, so fix this host's abi= "
            "config or reinstall torch.",
        )
    return Check("torch ABI", wanted, actual, Verdict.ok)


def _cxx11_check(cfg: DeployConfig, facts: HostFacts) -> Check:
    wanted = str(cfg.abi.cxx11_abi)
    actual = str(facts.cxx11_abi)
    if facts.cxx11_abi != cfg.abi.cxx11_abi:
        return Check(
            "cxx11 ABI",
            wanted,
            actual,
            Verdict.mismatch,
            f"torch on {facts.host} was built with _GLIBCXX_USE_CXX11_ABI={actual} but "
            f"abi.cxx11_abi={wanted}; C++ extensions would not load.",
        )
    return Check("cxx11 ABI", wanted, actual, Verdict.ok)


def _sglang_check(cfg: DeployConfig, facts: HostFacts) -> tuple[Check, PatchSet | None]:
    """The sglang row, and the set serving the installed release when it is the one asked for."""
    wanted = f"sglang {cfg.sglang.version} with a patch set"
    if facts.sglang_version is None:
        missing = Check(
            "sglang",
            wanted,
            "missing",
            Verdict.mismatch,
            f"SGLang is not installed in {facts.python_path} on {facts.host}; "
            f"install sglang=={cfg.sglang.version} there.",
        )
        return missing, None
    actual = f"sglang {facts.sglang_version}"
    if not _same_version(facts.sglang_version, cfg.sglang.version):
        other = Check(
            "sglang",
            wanted,
            actual,
            Verdict.mismatch,
            f"{facts.host} runs SGLang {facts.sglang_version} but sglang.version="
            f"{cfg.sglang.version}; pin the release the host runs.",
        )
        return other, None
    try:
        patch_set = select_patch_set(facts.sglang_version)
    except UnsupportedRelease as err:
        return Check("sglang", wanted, actual, Verdict.mismatch, str(err)), None
    return Check("sglang", wanted, f"{actual} (patch set {patch_set.name})", Verdict.ok), patch_set


def _gpu_check(cfg: DeployConfig, facts: HostFacts) -> Check:
    host, gpu = cfg.host, cfg.gpu
    if host.staging and not facts.gpus:
        return Check(
            "gpus",
            "none (staging)",
            "none",
            Verdict.staging,
            "No GPU: kernels install as the reference-only build and no service runs, so the "
            "validation gates are skipped.",
        )
    wanted = f"{host.gpu_count}x {gpu.name} ({gpu.arch})"
    actual = ", ".join(sorted({f"{g.name} ({g.arch})" for g in facts.gpus})) or "none"
    actual = f"{len(facts.gpus)}x {actual}"
    by_index = {g.index: g for g in facts.gpus}
    problems: list[str] = []
    if len(facts.gpus) < host.gpu_count:
        problems.append(f"it has {len(facts.gpus)} GPUs where the config expects {host.gpu_count}")
    wrong = [i for i in host.gpu_ids if i in by_index and by_index[i].arch != gpu.arch]
    if wrong:
        arch = by_index[wrong[0]].arch
        problems.append(f"GPU {wrong[0]} is {arch} where gpu.arch={gpu.arch}")
    missing = [i for i in host.gpu_ids if i not in by_index]
    if missing and len(facts.gpus) >= host.gpu_count:
        problems.append(f"GPUs {missing} of host.gpu_ids do not exist")
    if problems:
        sentence = f"GPU mismatch on {facts.host}: " + "; ".join(problems) + "."
        return Check("gpus", wanted, actual, Verdict.mismatch, sentence)
    return Check("gpus", wanted, actual, Verdict.ok)


def _init_check(cfg: DeployConfig, facts: HostFacts) -> Check:
    actual = "systemd" if facts.systemd_pid1 else "not systemd"
    if not cfg.host.systemd:
        return Check(
            "init",
            "any (host.systemd=false)",
            actual,
            Verdict.staging,
            "Staging: units are rendered and linted, not installed.",
        )
    if not facts.systemd_pid1:
        return Check(
            "init",
            "systemd",
            actual,
            Verdict.mismatch,
            f"systemd is not PID 1 on {facts.host}, so the SGLang unit cannot be managed there.",
        )
    return Check("init", "systemd", actual, Verdict.ok)


def _public(version: str) -> str:
    return version.split("+", 1)[0]


def _cu(cuda: str | None) -> str:
    return (cuda or "").replace(".", "")


def _same_version(left: str, right: str) -> bool:
    try:
        return Version(left) == Version(right)
    except InvalidVersion:
        return left == right
