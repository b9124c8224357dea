"""The kernels step on the local staging host: a real reference-only wheel in a real venv."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
from pathlib import Path, PurePosixPath

import pytest

from ddtree_deploy.hosts.facts import probe_facts
from ddtree_deploy.hosts.local import LocalHost
from ddtree_deploy.kernel_build import (
    KernelBuildFailed,
    KernelSmokeFailed,
    KernelsStep,
    PlanStatus,
    ResultStatus,
    WheelSource,
)


def _import_origin(python: PurePosixPath) -> dict[str, object]:
    code = (
        "import json, ddtree_kernels, ddtree_launch; "
        "print(json.dumps({'file': ddtree_kernels.__file__, 'launcher': ddtree_launch.__file__, "
        "**ddtree_kernels.build_info()}))"
    )
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_reference_build_installs_then_second_apply_changes_nothing(
    reference_step: KernelsStep,
) -> None:
    host = LocalHost()
    plan = reference_step.check(host)
    assert plan.status is PlanStatus.WOULD_CHANGE
    assert plan.source is WheelSource.build
    assert "reference-only: staging host without a GPU" in plan.reason

    first = reference_step.apply(host)
    assert first.status is ResultStatus.CHANGED
    assert first.source is WheelSource.build
    assert first.key.variant == "reference"
    assert first.smoke.passed
    assert set(first.smoke.checks) >= {"topk_logprobs", "build_tree", "verify_walk"}
    venv = str(reference_step.python.parent.parent)
    assert first.smoke.module_file.startswith(venv)
    origin = _import_origin(reference_step.python)
    assert origin["cuda_extension_built"] is False
    assert str(origin["launcher"]).startswith(venv)  # the unit's launcher ships in the wheel

    state = json.loads(Path(reference_step.state_dir, "state.json").read_text())
    assert state["kernels"]["key"] == first.key.slug
    assert state["kernels"]["wheel_sha256"] == first.wheel_sha256
    assert Path(state["kernels"]["wheel"]).is_file()

    assert reference_step.check(host).status is PlanStatus.OK
    second = reference_step.apply(host)
    assert second.status is ResultStatus.OK
    assert second.source is WheelSource.installed
    assert second.smoke.passed
    assert json.loads(Path(reference_step.state_dir, "state.json").read_text()) == state


def test_second_venv_with_same_abi_takes_the_wheel_from_the_cache(
    reference_step: KernelsStep, kernel_venv: Path, tmp_path: Path
) -> None:
    host = LocalHost()
    built = reference_step.apply(host)
    other_venv = tmp_path / "venv2"
    subprocess.run(["cp", "-a", str(kernel_venv.parent.parent), str(other_venv)], check=True)
    subprocess.run([str(other_venv / "bin" / "python"), "-m", "pip", "uninstall", "-y", "-q",
                    "ddtree-kernels"], check=True)  # fmt: skip
    other = dataclasses.replace(
        reference_step,
        python=PurePosixPath(other_venv / "bin" / "python"),
        state_dir=PurePosixPath(tmp_path / "state2"),
    )
    plan = other.check(host)
    assert (plan.status, plan.source) == (PlanStatus.WOULD_CHANGE, WheelSource.cache)
    result = other.apply(host)
    assert (result.status, result.source) == (ResultStatus.CHANGED, WheelSource.cache)
    assert result.wheel_sha256 == built.wheel_sha256
    assert result.smoke.module_file.startswith(str(other_venv))


def test_a_python_only_change_reaches_the_venv_from_the_cache_without_a_build(
    reference_step: KernelsStep,
) -> None:
    host = LocalHost()
    first = reference_step.apply(host)
    state_path = Path(reference_step.state_dir, "state.json")
    first_wheel = Path(json.loads(state_path.read_text())["kernels"]["wheel"])
    module = reference_step.source_dir / "ddtree_kernels" / "sglang.py"
    module.write_text(module.read_text() + "\nPYTHON_ONLY_CHANGE = True\n")

    plan = reference_step.check(host)
    assert (plan.status, plan.source, plan.key) == (
        PlanStatus.WOULD_CHANGE, WheelSource.cache, first.key,
    )  # fmt: skip
    assert f"install the changed package Python in cached wheel {first.key.slug}" in plan.reason
    second = reference_step.apply(host)
    assert (second.status, second.source, second.key) == (
        ResultStatus.CHANGED, WheelSource.cache, first.key,
    )  # fmt: skip
    assert second.wheel_sha256 != first.wheel_sha256
    installed = Path(second.smoke.module_file).with_name("sglang.py")
    assert installed.read_bytes() == module.read_bytes()
    second_wheel = Path(json.loads(state_path.read_text())["kernels"]["wheel"])
    assert second_wheel != first_wheel and first_wheel.is_file()  # each kept for a rollback
    assert reference_step.check(host).status is PlanStatus.OK


def _break_cuda_sources(source: Path) -> None:
    """One tiny .cu file with an undeclared name is the whole extension (a fast, failing compile)."""
    setup = source / "setup.py"
    text = setup.read_text()
    broken = re.sub(r"^SOURCES = \[.*\]$", 'SOURCES = ["csrc/broken.cu"]', text, flags=re.M)
    assert broken != text, "kernels/setup.py no longer lists SOURCES on one line"
    setup.write_text(broken)
    (source / "csrc" / "broken.cu").write_text("int broken() { return undeclared_name; }\n")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc: the CUDA compile cannot run")
def test_cuda_build_failure_keeps_previous_install_and_names_first_error(
    reference_step: KernelsStep, tmp_path: Path
) -> None:
    host = LocalHost()
    reference_step.apply(host)
    state_path = Path(reference_step.state_dir, "state.json")
    state_before = state_path.read_text()
    origin_before = _import_origin(reference_step.python)

    broken_source = tmp_path / "broken-kernels"
    shutil.copytree(reference_step.source_dir, broken_source)
    _break_cuda_sources(broken_source)
    cuda_step = dataclasses.replace(
        reference_step, staging=False, arch="sm_90", source_dir=broken_source
    )
    with pytest.raises(KernelBuildFailed) as caught:
        cuda_step.apply(host)

    message = str(caught.value)
    assert 'kernels/csrc/broken.cu(1): error: identifier "undeclared_name" is undefined' in message
    assert message.endswith("(the SGLang venv keeps its previous install).")
    assert caught.value.exit_code == 7
    key = cuda_step.key(probe_facts(host, cuda_step.python))
    log = Path(reference_step.state_dir, "blobs", f"kernels-build-{key.slug}.log")
    assert "undeclared_name" in log.read_text()
    assert caught.value.hint == f"Full build log: {log} on local."
    assert state_path.read_text() == state_before
    assert _import_origin(reference_step.python) == origin_before


def test_kernels_of_another_module_api_are_refused_before_the_venv_changes(
    reference_step: KernelsStep,
) -> None:
    """A patch set written for another ddtree_kernels.sglang API than these kernels provide
    would refuse DDTREE at every server start: the build refuses it first, in one sentence."""
    from ddtree_kernels.sglang import API_VERSION

    host = LocalHost()
    other = dataclasses.replace(reference_step, module_api=API_VERSION + 1)
    with pytest.raises(KernelSmokeFailed) as caught:
        other.apply(host)
    message = str(caught.value)
    assert (f"provides API {API_VERSION}, but the SGLang patch set calls API {API_VERSION + 1}"
            in message and "the SGLang venv was not changed" in message)  # fmt: skip
    # Nothing was installed into the venv (the staging venv it sees through its .pth may hold
    # kernels of its own, where a build-kernels ran on the staging host).
    (site,) = Path(reference_step.python).parent.parent.glob("lib/python*/site-packages")
    assert not list(site.glob("ddtree_kernels*"))
    held = dataclasses.replace(reference_step, module_api=API_VERSION)
    assert held.apply(host).smoke.passed
