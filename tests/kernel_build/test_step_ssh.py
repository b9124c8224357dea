"""The kernels step over real SSH (sshd in a network namespace, sharing this filesystem)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddtree_deploy.hosts.ssh import SshHost
from ddtree_deploy.kernel_build import KernelsStep, PlanStatus, ResultStatus, WheelSource

pytestmark = pytest.mark.sshd


@pytest.fixture
def ssh_host(ssh_connection: SshHost) -> SshHost:
    return ssh_connection


def test_reference_build_over_ssh_installs_and_records_state(
    reference_step: KernelsStep, ssh_host: SshHost
) -> None:
    result = reference_step.apply(ssh_host)
    assert (result.status, result.source) == (ResultStatus.CHANGED, WheelSource.build)
    assert result.smoke.passed
    assert result.smoke.module_file.startswith(str(reference_step.python.parent.parent))
    state = json.loads(Path(reference_step.state_dir, "state.json").read_text())
    assert state["kernels"]["key"] == result.key.slug
    assert reference_step.check(ssh_host).status is PlanStatus.OK
