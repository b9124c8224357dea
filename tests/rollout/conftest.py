"""Lifecycle fixtures: one container host with a prepared SGLang venv bound in read-only.

Preflight runs for real on it: the venv (and the Python and base venv it was made from) are
this machine's staging venv, bound at the same paths, so the facts probe imports the real torch
and reads the real SGLang version. The service runs `sglang_double.py` (a test double, see its
docstring) through `service.launch_module`. Tests share the container; each uses its own unit
name and state dir.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import pytest
from hostlab import Container, boot_container, ensure_rootfs, unavailable_reason
from staging import require_staging_venv

from rollout.lab import DOUBLE_DIR, DOUBLE_MODULE, LabHost, venv_binds


@pytest.fixture(scope="session")
def lab() -> Iterator[LabHost]:
    staging = require_staging_venv("0.5.11")
    reason = unavailable_reason(containers=True)
    if reason is not None:
        if os.environ.get("DDTREE_REQUIRE_HOSTLAB") == "1":
            pytest.fail(f"DDTREE_REQUIRE_HOSTLAB=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    venv, *python = venv_binds(staging)  # the venv is written to: kernels, patches
    container: Container = boot_container(ensure_rootfs(), binds_ro=python, overlays=[venv])
    try:
        lab_host = LabHost(container.host, staging)
        with lab_host.connect() as host:
            host.write_atomic(
                PurePosixPath(DOUBLE_DIR) / f"{DOUBLE_MODULE}.py",
                (Path(__file__).parent / "sglang_double.py").read_text(),
            )
        yield lab_host
    finally:
        container.stop()
