"""Preflight compares probe output with the config; probe output here is in nvidia-smi's format."""

from __future__ import annotations

import json

import pytest

from ddtree_deploy.config import DeployConfig, compose_config
from ddtree_deploy.errors import PreflightRefused
from ddtree_deploy.hosts.facts import HostFacts, parse_probe_output
from ddtree_deploy.kernel_build import KernelsStep
from ddtree_deploy.patching.step import PatchStep
from ddtree_deploy.rollout.pipeline import kernels_step, software_steps
from ddtree_deploy.rollout.preflight import Verdict, run_preflight

GPU_LINE = "{i}, NVIDIA RTX PRO 6000 Blackwell Workstation Edition, 12.0, 97887, 580.95.05"


def ct_probe_output(*, torch: str, cuda: str, gpus: int = 8, capability: str = "12.0") -> str:
    lines = ["@@pid1", "systemd", "@@gpus"]
    lines += [GPU_LINE.format(i=i).replace(", 12.0,", f", {capability},") for i in range(gpus)]
    lines += ["@@cuda", "13.0", "@@python"]
    lines.append(
        json.dumps(
            {
                "python_version": "3.12.3",
                "torch_version": torch,
                "torch_cuda": cuda,
                "cxx11_abi": True,
                "sglang_version": "0.5.11",
                "sglang_path": "/opt/sglang/venv/lib/python3.12/site-packages/sglang",
            }
        )
    )
    return "\n".join(lines) + "\n"


def ct_facts(**kwargs: object) -> HostFacts:
    return parse_probe_output("ct200", "/opt/sglang/venv/bin/python", ct_probe_output(**kwargs))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def ct200() -> DeployConfig:
    return compose_config(["host=ct200", "algo=ddtree_shadow"])


@pytest.fixture(scope="module")
def ct129() -> DeployConfig:
    return compose_config(["host=ct129", "algo=ddtree_shadow"])


def test_parse_probe_output_reads_every_fact() -> None:
    facts = ct_facts(torch="2.11.0+cu128", cuda="12.8")
    assert len(facts.gpus) == 8 and facts.gpus[3].index == 3
    assert facts.gpus[0].arch == "sm_120" and facts.gpus[0].memory_mib == 97887
    assert (facts.driver_version, facts.cuda_driver_version) == ("580.95.05", "13.0")
    assert (facts.torch_version, facts.torch_cuda, facts.cxx11_abi) == (
        "2.11.0+cu128",
        "12.8",
        True,
    )
    assert facts.sglang_version == "0.5.11" and facts.systemd_pid1


def test_preflight_passes_matching_host(ct200: DeployConfig) -> None:
    report = run_preflight(ct200, ct_facts(torch="2.11.0+cu128", cuda="12.8"))
    assert [c.verdict for c in report.checks if c.name != "sglang"] == [Verdict.ok] * 5
    assert [c.name for c in report.checks] == [
        "python",
        "torch ABI",
        "cxx11 ABI",
        "sglang",
        "gpus",
        "init",
    ]


def test_preflight_refuses_cuda_abi_mismatch_with_that_sentence(ct129: DeployConfig) -> None:
    report = run_preflight(ct129, ct_facts(torch="2.11.0+cu128", cuda="12.8"))
    assert (
        "ABI mismatch on ct200: the config says torch 2.11.0+cu130 but the host has "
        "torch 2.11.0+cu128; kernels built for one torch/CUDA pair break on the other, so fix "
        "this host's abi= config or reinstall torch." in report.refusals
    )
    with pytest.raises(PreflightRefused) as caught:
        report.raise_if_refused()
    assert caught.value.exit_code == 4


def test_preflight_refuses_wrong_gpu_arch_and_count(ct200: DeployConfig) -> None:
    report = run_preflight(
        ct200, ct_facts(torch="2.11.0+cu128", cuda="12.8", gpus=4, capability="9.0")
    )
    gpu = next(c for c in report.checks if c.name == "gpus")
    assert gpu.verdict is Verdict.mismatch
    assert gpu.sentence == (
        "GPU mismatch on ct200: it has 4 GPUs where the config expects 8; "
        "GPU 0 is sm_90 where gpu.arch=sm_120."
    )


def test_preflight_refuses_missing_python_with_what_to_do() -> None:
    cfg = compose_config([])
    facts = HostFacts(host="local", python_path="/nowhere/bin/python")
    report = run_preflight(cfg, facts)
    assert report.refusals == [
        "There is no Python at /nowhere/bin/python on local; run "
        f"`ddtree-deploy host=local sglang.version={cfg.sglang.version} action=prepare` to "
        "build it."
    ]


def test_missing_staging_venv_hint_names_the_release_asked_for() -> None:
    """Without the version the hint's prepare would build the host's default release instead."""
    cfg = compose_config(["sglang.version=0.9.99"])
    facts = HostFacts(host="local", python_path="/nowhere/bin/python")
    (refusal,) = run_preflight(cfg, facts).refusals
    assert "`ddtree-deploy host=local sglang.version=0.9.99 action=prepare`" in refusal


def test_preflight_refuses_release_without_patch_set(ct200: DeployConfig) -> None:
    output = ct_probe_output(torch="2.11.0+cu128", cuda="12.8").replace('"0.5.11"', '"0.5.2"')
    facts = parse_probe_output("ct200", "/opt/sglang/venv/bin/python", output)
    cfg = compose_config(["host=ct200", "algo=ddtree_shadow", "sglang.version=0.5.2"])
    sglang = next(c for c in run_preflight(cfg, facts).checks if c.name == "sglang")
    assert sglang.verdict is Verdict.mismatch
    assert sglang.sentence.startswith("SGLang 0.5.2 has no patch set (supported: ")


def test_preflight_refuses_host_without_systemd(ct200: DeployConfig) -> None:
    output = ct_probe_output(torch="2.11.0+cu128", cuda="12.8").replace("systemd\n", "bash\n", 1)
    report = run_preflight(ct200, parse_probe_output("ct200", "/p", output))
    assert (
        "systemd is not PID 1 on ct200, so the SGLang unit cannot be managed there."
        in report.refusals
    )


def test_preflight_marks_staging_host_gpu_and_init_as_staging() -> None:
    cfg = compose_config([])
    facts = HostFacts(
        host="local",
        python_path="/p",
        python_version="3.11.7",
        torch_version="2.14.1+cu130",
        torch_cuda="13.0",
        cxx11_abi=True,
    )
    verdicts = {c.name: c.verdict for c in run_preflight(cfg, facts).checks}
    assert verdicts["gpus"] is Verdict.staging and verdicts["init"] is Verdict.staging


def test_the_patch_and_kernels_steps_come_from_the_set_preflight_found(ct200: DeployConfig) -> None:
    """Preflight looks the set up once; the kernels step holds to that set's module API, and
    a report without a set (its release has none) refuses before any step is built."""
    from ddtree_kernels.sglang import API_VERSION

    found = run_preflight(ct200, ct_facts(torch="2.11.0+cu128", cuda="12.8"))
    assert found.patch_set is not None and found.patch_set.name == "0.5.11"
    patch, kernels = software_steps(ct200, found)
    assert isinstance(patch, PatchStep) and patch.patch_set is found.patch_set
    assert isinstance(kernels, KernelsStep) and kernels.module_api == API_VERSION

    output = ct_probe_output(torch="2.11.0+cu128", cuda="12.8").replace('"0.5.11"', '"0.5.2"')
    cfg = compose_config(["host=ct200", "algo=ddtree_shadow", "sglang.version=0.5.2"])
    unsupported = run_preflight(cfg, parse_probe_output("ct200", "/p", output))
    assert unsupported.patch_set is None
    assert kernels_step(cfg, unsupported).module_api is None
    with pytest.raises(PreflightRefused, match="has no patch set"):
        software_steps(cfg, unsupported)
