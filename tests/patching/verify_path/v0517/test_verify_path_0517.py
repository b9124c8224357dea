"""What 0.5.17's DDTREE verify path adds (0.5.18's too), on CPU against the real patched release.

0.5.17's set (0.5.18's too) is on ddtree_kernels.sglang (docs/ddtree-module.md: its DDTREE logic
is the module's). Its checks are 0.5.14's (v0514/checks_0514.py,
run in the 0.5.17 staging venv: conftest.SHARED_CHECKS; test_thin_sets.py holds its API
refusal), where the places its worker differs follow the release (its config bags, its read-only
server args); the checks it shares are tested in ../test_verify_path_worker_v2.py and ../v0514/
to ../v0516/. Here: what 0.5.17 changed under the worker. Its runners size themselves from the
spec bag, so the draft runner must set up its backend and graphs at the drafter's block; its
DFLASH serves grammar-constrained requests and a simulated acceptance length, neither of which a
DDTree's accepted path follows.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

# 0.5.18's set is 0.5.17's ported: its draft runner and these refusals are the same
# (test_verify_path_0518.py: what 0.5.18 adds).
RELEASES = ("0.5.17", "0.5.18")


@pytest.fixture(scope="module", params=RELEASES)
def release(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_draft_runner_sets_up_its_backend_and_graphs_at_the_block(
    check: Callable[[str], dict],
) -> None:
    """Budget 63 (width 64) over a 16-token block: the draft worker's attention backends and
    CUDA graphs are set up while the spec bag holds the block, and the target's width is back
    afterwards. DFLASH and shadow_linear (width = block) see their own width, untouched."""
    got = check("draft_runner_set_up_at_the_block")
    assert got["wide_tree"] == {"draft": [16, 16], "target_after": 64}
    for name in ("shadow", "dflash"):
        assert got[name] == {"draft": [16, 16], "target_after": 16}, name


def test_ddtree_refuses_grammar_requests_simulated_acceptance_and_npu(
    check: Callable[[str], dict],
) -> None:
    """A grammar-constrained DDTREE request is refused with a sentence; a plain one and 0.5.17's
    DFLASH grammar request pass; SGLANG_SIMULATE_ACC_LEN stops the DDTree worker at start, and an
    NPU device the server-args handler."""
    got = check("requests_refused_for_ddtree")
    assert got["ddtree_grammar"] == (
        "DDTREE speculative decoding does not support grammar-constrained decoding yet."
    )
    assert got["ddtree_plain"] is None and got["dflash_grammar"] is None
    assert got["simulated_acceptance"]["error"].startswith(
        "ValueError: DDTREE does not support SGLANG_SIMULATE_ACC_LEN"
    )
    assert got["plain_init"]["mode"] == "tree"
    assert got["npu"].startswith("DDTREE needs a CUDA device")
