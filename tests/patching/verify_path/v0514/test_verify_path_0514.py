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


def test_hybrid_backend_follows_the_tree_links_in_tree_mode_only(
    check: Callable[[str], dict],
) -> None:
    # 0.5.14 sets the tree path in MambaAttnBackendBase (0007), not in the worker as 0.5.23 does.
    assert check("hybrid_tree_links") == {
        "ok": True, "ddtree_tree": True, "ddtree_tree_enum": True, "ddtree_shadow": False,
        "dflash": False, "none": False,
    }  # fmt: skip
