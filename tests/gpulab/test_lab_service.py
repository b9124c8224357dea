"""The lab's servers, as the product renders them, start on each GPU-served release's parser.

Checked with the release's own `prepare_server_args` in its staging venv (CPU), so a lab flag a
release does not know fails here, not after two minutes of a device call.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from patching.sglang_args_probe import resolve_server_args
from staging import require_staging_venv, sglang_option

from ddtree_deploy.config import compose_config
from ddtree_deploy.service.render import server_argv
from gpulab.models import write_configs

LAB_RELEASES = ("0.5.11", "0.5.14", "0.5.15", "0.5.16")  # what the GPU lab serves
CPU_REFUSED = {"0.5.16"}  # DFLASH on CUDA only: the argv names CUDA, which resolves on a CPU


@pytest.mark.parametrize("service", ["lab", "lab_realistic"])
@pytest.mark.parametrize("release", LAB_RELEASES)
def test_idle_lab_servers_sleep_so_the_one_timed_has_the_host(
    tmp_path: Path, release: str, service: str
) -> None:
    """The overhead table times one server while the others wait; an idle scheduler without
    --sleep-on-idle polls in a loop, a core at 100%, beside a host-bound batch-1 step."""
    python = str(require_staging_venv(release) / "bin" / "python")
    target, draft = write_configs(tmp_path, "attention")
    cfg = compose_config(["host=h200_lab", f"service={service}", "validation=lab", "algo=dflash",
                          f"sglang={sglang_option(release)}", f"model.target_path={target}",
                          f"model.draft_path={draft}", "model.context_length=2048"])  # fmt: skip
    device = "cuda" if release in CPU_REFUSED else "cpu"
    argv = [*server_argv(cfg, api_key=False)[3:], "--device", device]
    resolved = resolve_server_args(python, argv)
    assert resolved.ok, resolved.error
    assert resolved.fields["sleep_on_idle"] is True
