"""What only 0.5.14's DDTREE verify path has, on CPU against the real patched release.

The checks every worker-v2 release shares are tested in ../test_verify_path_worker_v2.py; the
fixtures (`check`: the JSON one check of checks_0514.py printed) are in ../conftest.py.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

RELEASE = "0.5.14"


@pytest.fixture(scope="module")
def release() -> str:
    return RELEASE


def test_hybrid_gdn_follows_ddtree_tree_links(check: Callable[[str], dict]) -> None:
    """Patch 0007 (0.5.14 sets the tree path in MambaAttnBackendBase; 0.5.23 in the worker): in
    tree mode the recurrent layers' conv runs along each node's ancestors."""
    got = check("hybrid_tree_links")
    assert got["topk"] == {
        "ddtree_tree": 2, "ddtree_tree_enum": 2, "ddtree_shadow": 0, "dflash": 1,
        "eagle_topk4": 4,
    }  # fmt: skip
    assert got["eager_links"] and got["graph_links"] and got["shadow_links"]
    assert got["parents_found"] and got["conv_follows_tree"] and got["tree_differs_from_chain"]
