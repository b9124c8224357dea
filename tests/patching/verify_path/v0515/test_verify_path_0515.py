"""What 0.5.15's DDTREE verify path has and 0.5.14's does not (0.5.16's and 0.5.17's have it
too), on CPU against each real patched release.

0.5.15's to 0.5.17's sets are 0.5.14's with the DFlashWorkerV2 hunks rewritten, so their checks
are 0.5.14's (v0514/checks_0514.py, run in each release's staging venv: conftest.SHARED_CHECKS);
the checks they share are tested in ../test_verify_path_worker_v2.py and
../v0514/test_verify_path_0514.py. Here: the two places 0.5.15's worker changed under the patches,
its draft runner built from the target's own server arguments and its greedy draft head folded
into the draft CUDA graph; 0.5.16 and 0.5.17 keep both (how they build the draft runner: ../v0516/).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

RELEASES = ("0.5.15", "0.5.16", "0.5.17")


@pytest.fixture(scope="module", params=RELEASES)
def release(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_draft_runner_keeps_the_block_when_the_tree_is_wider(
    check: Callable[[str], dict],
) -> None:
    """Budget 63: the draft runner gets a copy of the server args sized to the 16-token block
    (its CUDA graphs and buffers size from it), its reservation recomputed; the target keeps
    the 64-token width. DFLASH, shadow_linear and a tree at the block share the target's."""
    got = check("draft_runner_server_args")
    assert got["wide_draft"] == [16, 16]
    assert got["wide_target"] == [64, 64, 64]
    assert got["wide_is_copy"] and got["copy_keeps_backend"]
    assert got["same_object"] == {"dflash": True, "shadow": True, "tree_at_block": True}


def test_tree_mode_builds_no_in_graph_draft_sampler(check: Callable[[str], dict]) -> None:
    """Tree mode drafts top-k log-probs from the hidden states, so no argmax head is folded
    into its draft graph; DFLASH and shadow_linear (DFlash's own chain) keep theirs."""
    assert check("draft_sampler_off_in_tree_mode") == {
        "tree": "NoneType", "shadow": "_DflashDraftSampler", "dflash": "_DflashDraftSampler",
    }  # fmt: skip
