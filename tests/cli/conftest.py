"""A throwaway SGLang 0.5.11 venv for CLI tests that patch or deploy on this machine.

It holds its own `sglang==0.5.11` from PyPI and sees torch through a `.pth` into the staging venv
and its shared layer, so the shared staging venv is never patched.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from staging import require_staging_venv, staging_site_dirs


@pytest.fixture
def sglang_venv(tmp_path: Path) -> Path:
    staging = require_staging_venv("0.5.11")
    venv = tmp_path / "venv"
    subprocess.run([staging / "bin" / "python", "-m", "venv", venv], check=True)
    (site,) = venv.glob("lib/python*/site-packages")
    (site / "staging.pth").write_text("".join(f"{d}\n" for d in staging_site_dirs(staging)))
    subprocess.run(
        [
            venv / "bin" / "python",
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--ignore-installed",
            "sglang==0.5.11",
        ],
        check=True,
        timeout=600,
    )
    # The venv's own copy must win over the staging one, or the test would patch the shared venv.
    assert list(venv.glob("lib/python*/site-packages/sglang/srt/server_args.py"))
    return venv
