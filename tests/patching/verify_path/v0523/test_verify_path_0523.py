"""What only 0.5.19's to 0.5.23's DDTREE verify paths have, on CPU against the real patched
releases.

0.5.22's set is 0.5.23's ported back, 0.5.21's is 0.5.22's, 0.5.20's is 0.5.21's and 0.5.19's is
0.5.20's, so all five run checks_0523.py (in their own staging venvs: conftest.SHARED_CHECKS) and
are held to the same promises here. 0.5.19's server arguments, annotated in server_args.py as up
to 0.5.16, are checked in ../test_server_args_resolution.py with theirs. The checks every
worker-v2 release shares are tested in ../test_verify_path_worker_v2.py; the fixtures (`check`:
the JSON one check of checks_0523.py printed) are in ../conftest.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from patching.sglang_args_probe import (
    WIDE_ROWS,
    compare,
    default_backend_resolutions,
    write_tiny_model_dirs,
)

from ddtree_deploy.config import compose_config
from ddtree_deploy.config.rules import max_tree_budget

RELEASES = ("0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")
# The release whose server arguments are annotated in server_args.py, checked elsewhere.
ANNOTATED = "0.5.19"


@pytest.fixture(scope="module", params=RELEASES)
def release(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_worker_refuses_selector_drafts_and_syncs_the_greedy_accept(
    check: Callable[[str], dict],
) -> None:
    assert "plain DFlash draft" in check("worker_init")["selector"]["error"]
    assert check("worker_accept_tree_greedy")["synced"] == ["DFLASH_ACCEPT_GREEDY"]


def test_worker_syncs_the_sampled_accept_before_walking_it(check: Callable[[str], dict]) -> None:
    got = check("worker_accept_tree_sampled")
    assert got["synced"] == ["DFLASH_ACCEPT_SAMPLE"] * 3
    assert got["synced_outputs"] and got["equal_greedy"]


def test_worker_attention_backends_and_sampler(check: Callable[[str], dict]) -> None:
    r = check("worker_attention_and_sampler")
    # The tree path is switched on where SGLang reads it: the linear-attention sub-backend.
    assert r["tree_hybrid"] == {"topk": 2, "outer_topk": False, "mamba_commit": True}
    assert r["shadow_hybrid"] == {"topk": 0, "outer_topk": False, "mamba_commit": True}
    assert r["dflash_hybrid"] == {"topk": 0, "outer_topk": False, "mamba_commit": True}
    assert r["tree_dense"] == {"topk": 0, "outer_topk": False, "mamba_commit": False}
    assert "KDA fused-accept" in r["tree_kda_pool"]["error"]
    assert r["tree_sampler"] == "None"


def test_hybrid_tree_keeps_one_conv_window_per_node(check: Callable[[str], dict]) -> None:
    """Patch 0006: on CUDA 0.5.20's to 0.5.23's Mamba pools share one sliding conv window between
    a chain's verify steps; a tree's nodes need their own, so a tree-mode DDTREE pool keeps the
    dense layout (the bug 0.5.14 showed on the GPU lab, where this layout rule is the same)."""
    got = check("hybrid_conv_window_layout")
    assert got["ddtree_tree"] == {"topk": 2, "dedup_on_cuda": False}
    assert got["ddtree_shadow"] == {"topk": 1, "dedup_on_cuda": True}
    assert got["dflash"] == {"topk": 1, "dedup_on_cuda": True}


def test_draft_runner_keeps_the_block_while_the_target_verifies_the_width(
    check: Callable[[str], dict],
) -> None:
    """0.5.20's to 0.5.23's runners read their width from the spec bag: in tree mode the draft
    runner's attention backends and CUDA graphs are set up at the drafter's 16-token block, the
    target's at the 64-token verify width; shadow_linear and DFLASH keep their one width."""
    got = check("wide_draft_runner_width")
    assert got["tree"] == {"backends": [16, 16], "graphs": [16, 16], "target": 64}
    for chain in ("shadow", "dflash"):
        assert got[chain] == {"backends": [16, 16], "graphs": [16, 16], "target": 16}, chain
    assert got["block_rows_untouched"]


def test_server_args_widen_the_tree_verify(
    release: str,
    staging_python: str,
    patched_root: Path,
    pristine_root: Callable[[str], Path],
    tmp_path: Path,
) -> None:
    """The release's arguments on its real parser (`sglang_args_probe.compare`, on CUDA with
    flashinfer: 0.5.20 to 0.5.23 serve DDTREE on CUDA only, tree mode on a tree-mask backend):
    budgets 31 and 63 resolve to verify widths (and reservations) 32 and 64 with the drafter's
    block 16, shadow_linear keeps 16, DFLASH resolves as on the pristine files, budget 64 is
    refused with its sentence. The limit is the one compose time enforces for the release."""
    if release == ANNOTATED:
        pytest.skip("0.5.19's server arguments: ../../test_server_args_resolution.py")
    limit = max_tree_budget(compose_config([f"sglang=v{release.replace('.', '_')}"]))
    model, draft = write_tiny_model_dirs(tmp_path)
    rows = compare(
        staging_python, model, draft, str(patched_root), str(pristine_root(release)),
        device="cuda", tree_max_budget=limit, extra_argv=("--attention-backend", "flashinfer"),
    )  # fmt: skip
    assert [(name, detail) for name, ok, detail in rows if not ok] == []
    assert limit == 63 and len(rows) == WIDE_ROWS


def test_ddtree_tree_mode_starts_on_its_default_attention_backend(
    release: str, staging_python: str, patched_root: Path, tmp_path: Path
) -> None:
    """Tree mode on CUDA with no --attention-backend (what the rendered unit passes) resolves on
    the default 0005 declares for a tree (flashinfer, else triton), and a backend without a tree
    mask is still refused: 0005 reads the backends through resolved_view, where a declared
    default is seen before resolution ends (0.5.15's to 0.5.18's sets read the raw fields and
    refused such a tree as "attention backend None")."""
    if release == ANNOTATED:
        pytest.skip("0.5.19's server arguments: ../../test_server_args_resolution.py")
    model, draft = write_tiny_model_dirs(tmp_path)
    default, fa3 = default_backend_resolutions(staging_python, str(patched_root), model, draft)
    assert default.ok, default.error
    assert default.fields["attention_backend"] in ("flashinfer", "triton")
    assert not fa3.ok and "cannot verify with attention backend fa3" in fa3.error


def test_scoring_and_logprob_requests_are_served(check: Callable[[str], dict]) -> None:
    """0.5.19 to 0.5.23 serve log-prob requests on DDTREE as on DFLASH (the worker gathers the
    accepted path's rows into the chain layout before reading log-probs), so nothing is
    patched for the tree gate's scoring request (return_logprob, max_new_tokens 0): DFLASH and
    DDTREE admit it and a generating log-prob request alike, and the worker has no log-prob
    guard."""
    got = check("scoring_requests")
    assert got["scheduler_gate"] == {"DFLASH": True, "DDTREE": True}
    admitted = {"scoring": "admitted", "generating": "admitted"}
    assert got["validation"] == {"DFLASH": admitted, "DDTREE": admitted}
    assert set(got["worker"].values()) == {"passed"}
