"""What only 0.5.23's DDTREE verify path has, on CPU against the real patched release.

The checks every worker-v2 release shares are tested in ../test_verify_path_worker_v2.py; the
fixtures (`check`: the JSON one check of checks_0523.py printed) are in ../conftest.py.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

RELEASE = "0.5.23"


@pytest.fixture(scope="module")
def release() -> str:
    return RELEASE


def test_worker_refuses_selector_drafts_and_syncs_the_greedy_accept(
    check: Callable[[str], dict],
) -> None:
    assert "plain DFlash draft" in check("worker_init")["selector"]["error"]
    assert check("worker_accept_tree_greedy")["synced"] == ["DFLASH_ACCEPT_GREEDY"]


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
    """Patch 0006: on CUDA 0.5.23's Mamba pool shares one sliding conv window between a chain's
    verify steps; a tree's nodes need their own, so a tree-mode DDTREE pool keeps the dense
    layout (the bug 0.5.14 showed on the GPU lab, where this layout rule is the same)."""
    got = check("hybrid_conv_window_layout")
    assert got["ddtree_tree"] == {"topk": 2, "dedup_on_cuda": False}
    assert got["ddtree_shadow"] == {"topk": 1, "dedup_on_cuda": True}
    assert got["dflash"] == {"topk": 1, "dedup_on_cuda": True}
