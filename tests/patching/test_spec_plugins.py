"""What is new around DFLASH in SGLang 0.5.13 to 0.5.17, on the patched real release (staging
venv, CPU).

- Plugin registration (`SpeculativeAlgorithm.register`, 0.5.12+) still works on the patched tree.
  From 0.5.13 `register_algorithm` runs `_assert_custom_spec_algo_conforms`: every `is_*` /
  `supports_*` method of the enum must exist on the plugin class, so the enum's new `is_ddtree`
  needs `CustomSpecAlgo.is_ddtree` (0001); without it every registration raises `TypeError`.
  DDTREE is a reserved plugin name (0.5.12: 0001 adds it to the frozenset; 0.5.13 on
  derive the reserved names from the enum). 0.5.16 adds `is_dflash_family()` (DFLASH or DSPARK),
  which most runtime gates ask: DDTREE is in the family through the widened `is_dflash()`, while
  DSPARK's own predicates (`is_dspark()`, `supports_ragged_verify()`) stay False for it.
- The DFLASH dispatch moved to `arg_groups/speculative_hook.py` in 0.5.13 (0.5.14 to 0.5.17:
  `SpeculativeAlgorithm.handle_server_args`), beside a new "--speculative-draft-window-size has
  no effect" warning that DDTREE must not get (its DFlash worker honours the window). The
  dispatch itself is held by `test_server_args_resolution.py`.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath

import pytest
from packaging.version import Version
from staging import require_staging_venv

from ddtree_deploy.hosts.local import LocalHost
from ddtree_deploy.hosts.state import HostStateStore
from ddtree_deploy.patching.engine import apply_patch_set
from patching.sglang_args_probe import (
    base_argv,
    release_device,
    resolve_server_args,
    write_tiny_model_dirs,
)
from patching.trees import REAL_RELEASES, real_patch_set

# Every release with a set and the plugin registry (0.5.12 on), .post releases on their own wheels.
REGISTRY_RELEASES = tuple(r for r in REAL_RELEASES if Version(r) >= Version("0.5.12"))

# 0.5.16 on ([DDTREE, a plugin] per predicate the release has): DDTREE is in the DFlash family
# through the widened is_dflash() and outside DSPARK's own predicates; a plugin is in neither.
FAMILY = {
    "is_dflash_family": [True, False],
    "is_dspark": [False, False],
    "supports_ragged_verify": [False, False],
    "dflash_in_family": True,
}


def _family_release(release: str) -> bool:
    """Whether `release` has is_dflash_family() (0.5.16 on)."""
    return Version(release) >= Version("0.5.16")


_REGISTER = r"""
import json
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_registry import CustomSpecAlgo, register_algorithm
out = {}
SpeculativeAlgorithm.register("MY_PLUGIN")(lambda server_args: object)
algo = SpeculativeAlgorithm.from_string("MY_PLUGIN")
out["plugin"] = [type(algo).__name__, algo.is_ddtree(), algo.is_dflash()]
ddtree = SpeculativeAlgorithm.from_string("DDTREE")
out["ddtree"] = [ddtree.name, ddtree.is_ddtree(), ddtree.is_dflash()]
out["family"] = None
if hasattr(SpeculativeAlgorithm, "is_dflash_family"):  # 0.5.16 on
    out["family"] = {
        name: [getattr(ddtree, name)(), getattr(algo, name)()]
        for name in ("is_dflash_family", "is_dspark", "supports_ragged_verify")
        if hasattr(SpeculativeAlgorithm, name)
    }
    out["family"]["dflash_in_family"] = SpeculativeAlgorithm.DFLASH.is_dflash_family()
try:
    SpeculativeAlgorithm.register("DDTREE")(lambda server_args: object)
    out["reserved"] = None
except ValueError as e:
    out["reserved"] = str(e)
# The conformance check, where the release has one: a plugin class without is_ddtree.
del CustomSpecAlgo.is_ddtree
try:
    register_algorithm("STALE_PLUGIN")(lambda server_args: object)
    out["stale"] = None
except TypeError as e:
    out["stale"] = str(e)
print("@@RESULT@@" + json.dumps(out))
"""


def _child(python: Path, code: str, site: Path, *args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(site), CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(
        [str(python), "-c", code, *args], capture_output=True, text=True, env=env,
        cwd=tempfile.gettempdir(), timeout=600,
    )  # fmt: skip
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("@@RESULT@@")]
    assert lines, proc.stderr[-3000:]
    result: dict = json.loads(lines[-1][len("@@RESULT@@") :])
    return result


@pytest.mark.parametrize("release", REGISTRY_RELEASES)
def test_plugin_registration_works_on_the_patched_release(
    release: str, make_tree: Callable[[str], Path], host: LocalHost, state: HostStateStore
) -> None:
    python = require_staging_venv(release) / "bin" / "python"
    site = make_tree(release)
    apply_patch_set(host, PurePosixPath(site), real_patch_set(release), state)
    got = _child(python, _REGISTER, site)
    assert got["plugin"] == ["CustomSpecAlgo", False, False]
    assert got["ddtree"] == ["DDTREE", True, True]
    assert "'DDTREE' is a reserved speculative algorithm name" in got["reserved"]
    # 0.5.16 on: in the DFlash family, out of DSPARK's own predicates; a plugin stays outside.
    assert got["family"] == (FAMILY if _family_release(release) else None)
    if release.startswith("0.5.12"):  # no conformance check yet
        assert got["stale"] is None
    else:
        assert "missing duck-typed methods" in got["stale"] and "is_ddtree" in got["stale"]


@pytest.mark.parametrize("release", ["0.5.13", "0.5.14", "0.5.15", "0.5.16", "0.5.17"])
def test_draft_window_is_honoured_for_ddtree_without_the_no_effect_warning(
    release: str,
    make_tree: Callable[[str], Path],
    host: LocalHost,
    state: HostStateStore,
    tmp_path: Path,
) -> None:
    python = require_staging_venv(release) / "bin" / "python"
    site = make_tree(release)
    apply_patch_set(host, PurePosixPath(site), real_patch_set(release), state)
    model_dir, draft_dir = write_tiny_model_dirs(tmp_path / "models")
    device, extra_argv = release_device(release)
    base = [*base_argv(model_dir, draft_dir, device), *extra_argv]
    for algorithm in ("DFLASH", "DDTREE"):
        argv = [
            *base,
            "--speculative-algorithm",
            algorithm,
            "--speculative-draft-window-size",
            "32",
        ]
        got = resolve_server_args(str(python), argv, str(site))
        assert got.ok and got.fields["speculative_draft_window_size"] == 32, algorithm
        # The log is captured: _handle_dflash's own warning is in it, the no-effect one is not.
        assert any("Max running requests is reset to 48" in m for m in got.log), algorithm
        assert not [m for m in got.log if "has no effect" in m], (algorithm, got.log)
