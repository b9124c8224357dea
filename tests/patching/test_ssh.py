"""Apply, revert and audit over real SSH (sshd in a network namespace, same filesystem)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path, PurePosixPath

import pytest

from ddtree_deploy.hosts.ssh import SshHost
from ddtree_deploy.hosts.state import HostStateStore
from ddtree_deploy.patching.audit import audit
from ddtree_deploy.patching.engine import (
    SetState,
    apply_patch_set,
    plan_patch,
    revert_patch_set,
)
from ddtree_deploy.patching.manifest import load_patch_set
from patching.trees import CASES_DIR, real_patch_set, tree_bytes

pytestmark = pytest.mark.sshd


@pytest.fixture
def ssh_host(ssh_connection: SshHost) -> SshHost:
    return ssh_connection


def test_ssh_apply_then_revert_round_trips(
    ssh_host: SshHost, make_tree: Callable[[str], Path], tmp_path: Path
) -> None:
    patch_set = real_patch_set("0.5.11")
    site = make_tree("0.5.11")
    pristine = tree_bytes(site)
    state = HostStateStore(ssh_host, PurePosixPath(tmp_path / "ssh-state"), sudo=False)

    applied = apply_patch_set(ssh_host, PurePosixPath(site), patch_set, state)
    assert applied.changed
    assert plan_patch(ssh_host, PurePosixPath(site), patch_set).state is SetState.applied
    assert apply_patch_set(ssh_host, PurePosixPath(site), patch_set, state).changed == ()

    reverted = revert_patch_set(ssh_host, PurePosixPath(site), patch_set, state)
    assert {c.path for c in reverted.changed} == {c.path for c in applied.changed}
    assert tree_bytes(site) == pristine


def test_ssh_audit_streams_the_package(ssh_host: SshHost, tmp_path: Path) -> None:
    site = tmp_path / "site"
    shutil.copytree(CASES_DIR / "eof-and-anchors" / "before", site)
    report = audit(
        ssh_host, PurePosixPath(site), load_patch_set(CASES_DIR / "eof-and-anchors" / "series")
    )
    assert report.modules_scanned == 2
    assert [g.site.text for g in report.unreviewed] == ['LAST = "DFLASH"']
