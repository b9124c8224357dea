"""Where the local staging host's SGLang venvs are, for tests that run real SGLang code on CPU.

`scripts/test` builds them with `ddtree-deploy action=prepare sglang=v0_5_XX` (the product's own
code); this module finds them through the same config, so tests and product agree on the path.
Without one, tests skip with the reason, or fail when `DDTREE_REQUIRE_STAGING=1` (CI sets it).

A release's venv holds sglang and the release's pins; torch and the rest come from the shared
layer beside it, through a `.pth` file (ddtree_deploy/hosts/staging.py). A throwaway venv that
borrows the staging packages lists `staging_site_dirs(venv)` in its own `.pth`: a `.pth` line
adds a folder to `sys.path` but does not read the `.pth` files inside it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from packaging.version import Version

from ddtree_deploy.config import compose_config


def sglang_option(release: str) -> str:
    """The conf/sglang option of SGLang `release`: its base release's ("0.5.15.post1" -> v0_5_15)."""
    return "v" + Version(release).base_version.replace(".", "_")


def staging_overrides(release: str) -> list[str]:
    """The `host=local` overrides that stage SGLang `release`: its `sglang=` option, and
    `sglang.version=` for a .post release."""
    return [f"sglang={sglang_option(release)}", f"sglang.version={release}"]


def staging_venv(release: str) -> Path:
    """The staging venv of SGLang `release` ("0.5.11"), as `host=local` configures it."""
    return Path(compose_config(staging_overrides(release)).host.sglang_venv)


def require_staging_venv(release: str) -> Path:
    """The venv, or skip (fail under DDTREE_REQUIRE_STAGING=1) when it was never prepared."""
    venv = staging_venv(release)
    if not (venv / "bin" / "python").exists():
        reason = (
            f"no staging venv for SGLang {release} at {venv}; run "
            f"`ddtree-deploy action=prepare {' '.join(staging_overrides(release))}`"
        )
        if os.environ.get("DDTREE_REQUIRE_STAGING") == "1":
            pytest.fail(f"DDTREE_REQUIRE_STAGING=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    return venv


def staging_site_dirs(venv: Path) -> list[Path]:
    """The site-packages folders `venv`'s Python reads, in order: its own, then the shared layer's."""
    code = "import sys; print('\\n'.join(p for p in sys.path if p.endswith('site-packages')))"
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True
    ).stdout
    return [Path(line) for line in out.splitlines()]
