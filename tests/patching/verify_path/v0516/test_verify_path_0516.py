"""What 0.5.16's DDTREE verify path has (0.5.17's too), on CPU against the real patched release.

0.5.16's set is 0.5.15's with the hunks 0.5.16's code moved rewritten, so its checks are 0.5.14's
(v0514/checks_0514.py, run in the 0.5.16 staging venv: conftest.SHARED_CHECKS), where the places
its worker differs follow the release (ParallelState, hybrid detection from the model config, the
Mamba commit flag, the pools built by the KV-cache configurator); the checks it shares are tested
in ../test_verify_path_worker_v2.py, ../v0514/ and ../v0515/. Here: how 0.5.16 builds its draft
runner, through `build_draft_tp_worker`, which the patched worker must hand the block-sized copy;
0.5.17 builds it the same way (what it adds: ../v0517/).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

RELEASES = ("0.5.16", "0.5.17")


@pytest.fixture(scope="module", params=RELEASES)
def release(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_draft_runner_is_built_at_the_block_through_the_shared_builder(
    check: Callable[[str], dict],
) -> None:
    """Budget 63 (width 64): `build_draft_tp_worker` gets a copy sized to the 16-token block, the
    target keeps its 64; DFLASH and shadow_linear (width = block) hand it the target's own server
    args, as the unpatched release does. The rest of the call is the release's (pipeline rank 0,
    the DFLASH label of the draft runner's backend fallback)."""
    got = check("draft_runner_built_at_the_block")
    assert got["wide_tree"] == {
        "draft_tokens": 16, "target_tokens": 64, "same_object": False, "pp_rank": 0,
        "algo_label": "DFLASH",
    }  # fmt: skip
    for name in ("shadow", "dflash"):
        assert got[name] == {
            "draft_tokens": 16, "target_tokens": 16, "same_object": True, "pp_rank": 0,
            "algo_label": "DFLASH",
        }, name  # fmt: skip
