"""A hybrid target's rendered command starts speculative decoding on the real SGLang parser.

SGLang 0.5.11, 0.5.12 and 0.5.13 refuse any speculative algorithm on a hybrid (attention + GDN) target while the
radix cache is on; the units rendered for the CT hosts once carried nothing about it, so their
linear-DFlash baseline could never start. 0.5.14 to 0.5.17 (spec-v2 worker) no longer refuse:
with the radix cache on they switch the mamba cache to the extra_buffer strategy, which needs CUDA
(FLA) and is not proven with DFLASH or DDTREE on a GPU yet, so their units keep the radix cache
off too. 0.5.19 to 0.5.21 (FLA again), 0.5.22 and 0.5.23 (their platform's Mamba state snapshots)
pick extra_buffer the same way, so their units keep it off as well (0.5.23's once started with it
on). A pure-attention target keeps the radix cache on every release.
These tests resolve the rendered argv with the release's own `prepare_server_args` (staging venv,
CPU; 0.5.16 serves DFLASH on CUDA only, 0.5.17 and 0.5.19 on CUDA or NPU, 0.5.20 to 0.5.23 on
CUDA, NPU or XPU only, so their argv names CUDA, which resolves on a CPU).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from gpulab.models import write_configs
from patching.sglang_args_probe import resolve_server_args
from staging import require_staging_venv, sglang_option

from ddtree_deploy.config import compose_config
from ddtree_deploy.service.render import server_argv


def _rendered_args(tmp_path: Path, *overrides: str, device: str = "cpu") -> list[str]:
    target, draft = write_configs(tmp_path, "hybrid")
    paths = [f"model.target_path={target}", f"model.draft_path={draft}"]
    cfg = compose_config(["host=ct200", *paths, "model.context_length=2048", *overrides])
    # SGLang's own arguments (after `python -m sglang.launch_server`), resolved on a CPU.
    return [*server_argv(cfg, api_key=False)[3:], "--tp-size", "1", "--device", device]


# What each release does on this CPU without --disable-radix-cache.
WITH_RADIX_CACHE = {
    "0.5.11": "not compatible with radix cache",
    "0.5.12": "not compatible with radix cache",
    "0.5.13": "not compatible with radix cache",
    "0.5.14": "extra_buffer needs CUDA/MUSA/NPU (FLA)",  # the strategy it picks instead
    "0.5.15": "extra_buffer needs CUDA/MUSA/NPU (FLA)",
    "0.5.16": "extra_buffer needs CUDA/MUSA/NPU/ROCm (FLA)",
    "0.5.17": "extra_buffer needs CUDA/MUSA/NPU/ROCm (FLA)",
    "0.5.18": "extra_buffer needs CUDA/MUSA/NPU/ROCm/XPU (FLA)",
    "0.5.19": "extra_buffer needs CUDA/MUSA/NPU/ROCm/XPU (FLA)",
    "0.5.20": "extra_buffer needs CUDA/MUSA/NPU/ROCm/XPU (FLA)",
    "0.5.21": "extra_buffer needs CUDA/MUSA/NPU/ROCm/XPU (FLA)",
    "0.5.22": "extra_buffer requires platform support for Mamba cache state snapshots",
    "0.5.23": "extra_buffer requires platform support for Mamba cache state snapshots",
}
# The device a release's argv names: 0.5.16 to 0.5.23 refuse DFLASH on a CPU.
DEVICE = {
    "0.5.16": "cuda",
    "0.5.17": "cuda",
    "0.5.18": "cuda",
    "0.5.19": "cuda",
    "0.5.20": "cuda",
    "0.5.21": "cuda",
    "0.5.22": "cuda",
    "0.5.23": "cuda",
}


@pytest.mark.parametrize("release", sorted(WITH_RADIX_CACHE))
def test_hybrid_dflash_command_resolves(tmp_path: Path, release: str) -> None:
    python = str(require_staging_venv(release) / "bin" / "python")
    argv = _rendered_args(
        tmp_path,
        "algo=dflash",
        f"sglang={sglang_option(release)}",
        device=DEVICE.get(release, "cpu"),
    )
    assert "--disable-radix-cache" in argv
    resolved = resolve_server_args(python, argv)
    assert resolved.ok, resolved.error
    assert resolved.fields["disable_radix_cache"] is True
    # What the release does without it: the refusal the rendered unit used to hit at start
    # (0.5.14 to 0.5.17, 0.5.19 to 0.5.23: the extra_buffer strategy, which cannot run on this CPU).
    bare = resolve_server_args(python, [a for a in argv if a != "--disable-radix-cache"])
    assert not bare.ok
    assert WITH_RADIX_CACHE[release] in bare.error


@pytest.mark.parametrize("release", sorted(WITH_RADIX_CACHE))
def test_only_hybrid_targets_turn_the_radix_cache_off(release: str) -> None:
    option = f"sglang={sglang_option(release)}"
    for algo in ("dflash", "ddtree_shadow"):
        attention = compose_config(["host=ct200", "model=qwen3_8b", f"algo={algo}", option])
        hybrid = compose_config(["host=ct200", "model=qwen36_27b", f"algo={algo}", option])
        assert "--disable-radix-cache" not in server_argv(attention, api_key=False)
        assert "--disable-radix-cache" in server_argv(hybrid, api_key=False)
