"""The server-args promise of each patch set whose arguments live in server_args.py, on the
release's real parser: the v1 (DFlashWorker) releases, 0.5.14, the first DFlashWorkerV2 one
(its DFLASH dispatch moved into SpeculativeAlgorithm.handle_server_args, the fields are annotated
dataclass fields, the resolution is the same), 0.5.15 (the same layout), 0.5.16 and 0.5.17 (the same
layout; their `_handle_dflash` refuses a CPU device, as 0.5.23's does, so their arguments are
resolved for CUDA with flashinfer, the backend a tree needs, as 0.5.23's are) and 0.5.19 (the
last release with annotated fields in server_args.py, its handlers writing through
declare_resolution; its `_handle_dflash` refuses a CPU device, so it resolves for CUDA too), each
.post release on its own wheel.

For every release listed, the engine applies the shipped set to a real unpack of the wheel, and
`sglang_args_probe.compare` resolves arguments with that release's own `prepare_server_args` in
its staging venv (CPU): the patched modules import, DDTREE gets every setting DFLASH gets, the
`--speculative-ddtree-*` flags are accepted, stored, defaulted and refused as documented, and
DFLASH resolves exactly as it does on the pristine files. Without the staging venv the test
skips (fails under DDTREE_REQUIRE_STAGING=1).

0.5.20's to 0.5.23's server arguments have their own checks (tests/patching/verify_path/v0523/:
the same `compare`, on CUDA with flashinfer, as all four serve DDTREE on CUDA only), so they are
not listed here.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path, PurePosixPath

import pytest
from packaging.version import Version
from staging import require_staging_venv, staging_overrides

from ddtree_deploy.config import compose_config
from ddtree_deploy.config.rules import max_tree_budget
from ddtree_deploy.hosts.local import LocalHost
from ddtree_deploy.hosts.state import HostStateStore
from ddtree_deploy.patching.engine import SetState, apply_patch_set, plan_patch
from patching.sglang_args_probe import (
    ROWS,
    WIDE_ROWS,
    base_argv,
    compare,
    default_backend_resolutions,
    release_device,
    resolve_server_args,
    write_tiny_model_dirs,
)
from patching.trees import REAL_RELEASES, real_patch_set

# Every release with a set up to 0.5.19 (0.5.20 on: v0523's checks, as above), the .post releases
# on their own wheels too: 0.5.12.post1's and 0.5.13.post1's targets are their base's bytes,
# 0.5.15.post1's server_args.py is not (its derived set).
RELEASES = tuple(r for r in REAL_RELEASES if Version(r) < Version("0.5.20"))


@pytest.mark.parametrize("release", RELEASES)
def test_patched_server_args_resolve_ddtree_like_dflash(
    release: str,
    make_tree: Callable[[str], Path],
    pristine_root: Callable[[str], Path],
    host: LocalHost,
    state: HostStateStore,
    tmp_path: Path,
) -> None:
    python = require_staging_venv(release) / "bin" / "python"
    site = make_tree(release)
    patch_set = real_patch_set(release)
    apply_patch_set(host, PurePosixPath(site), patch_set, state)
    assert plan_patch(host, PurePosixPath(site), patch_set).state is SetState.applied
    model_dir, draft_dir = write_tiny_model_dirs(tmp_path / "models")
    # The limit compose time enforces for this release is the one its set must resolve.
    limit = max_tree_budget(compose_config(staging_overrides(release)))
    device, extra_argv = release_device(release)
    rows = compare(
        str(python), model_dir, draft_dir, str(site), str(pristine_root(release)),
        device=device, tree_max_budget=limit, extra_argv=extra_argv,
    )  # fmt: skip
    failed = [(name, detail) for name, ok, detail in rows if not ok]
    assert failed == []
    assert len(rows) == (ROWS if limit == 15 else WIDE_ROWS)


@pytest.fixture
def patched(
    release: str,
    make_tree: Callable[[str], Path],
    host: LocalHost,
    state: HostStateStore,
    tmp_path: Path,
) -> tuple[str, str, Path, Path]:
    """The release's staging Python, a wheel tree with its set applied, and tiny model dirs."""
    python = str(require_staging_venv(release) / "bin" / "python")
    site = make_tree(release)
    apply_patch_set(host, PurePosixPath(site), real_patch_set(release), state)
    return python, str(site), *write_tiny_model_dirs(tmp_path / "models")


@pytest.mark.parametrize("release", ["0.5.17", "0.5.18"])
def test_0517_ddtree_tree_mode_refuses_the_replayssm_chain_commit(
    release: str, patched: tuple[str, str, Path, Path]
) -> None:
    """0.5.17's DFLASH resolves with the ReplaySSM spec-verify (static ragged mode); the 0.5.17
    set refuses it for DDTREE tree mode (the ReplaySSM commit replays a chain) with a sentence,
    while shadow_linear (DFLASH's chain) keeps the flag as DFLASH does; 0.5.18's set, 0.5.17's
    ported, does the same. (Its NPU refusal cannot resolve here, without torch_npu: v0517's
    verify-path checks call it.)"""
    python, site, model_dir, draft_dir = patched
    device, extra_argv = release_device(release)

    def resolved(algorithm: str, *argv: str) -> tuple[bool, str]:
        args = [*base_argv(model_dir, draft_dir, device), *extra_argv]
        got = resolve_server_args(
            python, [*args, "--speculative-algorithm", algorithm, *argv], site
        )
        return got.ok, got.error

    replay = ("--enable-linear-replayssm-spec",)
    assert resolved("DFLASH", *replay)[0]
    tree = resolved("DDTREE", *replay)
    assert not tree[0] and "DDTREE tree mode cannot use --enable-linear-replayssm-spec" in tree[1]
    assert resolved("DDTREE", *replay, "--speculative-ddtree-mode", "shadow_linear")[0]


# The releases that declare their default attention backend while arguments resolve and write it
# when resolution ends (0.5.11 to 0.5.14 write it into the field first: their sets passed as
# they were); 0.5.20's to 0.5.23's case is in verify_path/v0523/ with their other checks.
DECLARED_DEFAULT_BACKEND = tuple(r for r in RELEASES if Version(r) >= Version("0.5.15"))


@pytest.mark.parametrize("release", DECLARED_DEFAULT_BACKEND)
def test_ddtree_tree_mode_starts_on_its_default_attention_backend(
    release: str, patched: tuple[str, str, Path, Path]
) -> None:
    """Tree mode on CUDA with no --attention-backend (what the rendered unit passes) resolves on
    the default the set declares for a tree (flashinfer, else triton), and a backend without a
    tree mask is still refused. The bug: 0.5.15 to 0.5.18 only declare a default backend while
    arguments resolve and write it when resolution ends, and their sets' check (0006) read the
    raw fields, so a tree left on the default was refused as "attention backend None"; it reads
    them through the release's resolution view (_resolved_attention_backends) now."""
    default, fa3 = default_backend_resolutions(*patched)
    assert default.ok, default.error
    assert default.fields["attention_backend"] in ("flashinfer", "triton")
    assert not fa3.ok and "cannot verify with attention backend fa3" in fa3.error
