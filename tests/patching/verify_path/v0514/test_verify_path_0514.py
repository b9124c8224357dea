"""What 0.5.14's to 0.5.17's DDTREE verify paths have and 0.5.23's does not, on CPU against each
real patched release (0.5.15's to 0.5.17's sets are 0.5.14's with the worker hunks rewritten;
checks_0514.py serves the four).

The checks every worker-v2 release shares are tested in ../test_verify_path_worker_v2.py, what
only 0.5.15 to 0.5.17 have in ../v0515/ to ../v0517/; the fixtures (`check`: the JSON one
check of checks_0514.py printed) are in ../conftest.py.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

RELEASES = ("0.5.14", "0.5.15", "0.5.16", "0.5.17", "0.5.18")


@pytest.fixture(scope="module", params=RELEASES)
def release(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_hybrid_gdn_follows_ddtree_tree_links(check: Callable[[str], dict]) -> None:
    """Patch 0007 (0.5.14 to 0.5.16 set the tree path in MambaAttnBackendBase; 0.5.23 the
    worker): in tree mode the recurrent layers' conv runs along each node's ancestors."""
    got = check("hybrid_tree_links")
    assert got["topk"] == {
        "ddtree_tree": 2, "ddtree_tree_enum": 2, "ddtree_shadow": 0, "dflash": 1,
        "eagle_topk4": 4,
    }  # fmt: skip
    assert got["eager_links"] and got["graph_links"] and got["shadow_links"]
    assert got["parents_found"] and got["conv_follows_tree"] and got["tree_differs_from_chain"]


def test_hybrid_tree_keeps_one_conv_window_per_node(check: Callable[[str], dict]) -> None:
    """Patch 0007: on CUDA, 0.5.14's (0.5.15's, 0.5.16's) Mamba pool shares one sliding conv
    window of a chain's verify steps; a tree's nodes need their own (each convolves its
    ancestors), so the pool a tree-mode DDTREE runner builds keeps the dense layout. Without it
    the GPU lab's hybrid tree diverged from DFLASH at token 3 in deterministic mode."""
    got = check("hybrid_conv_window_layout")
    assert got["ddtree_tree"] == {"topk": 2, "dedup_on_cuda": False}
    assert got["ddtree_tree_enum"] == {"topk": 2, "dedup_on_cuda": False}
    # The chains keep the release's deduplicated layout: shadow_linear is DFlash's own chain.
    assert got["ddtree_shadow"] == {"topk": 1, "dedup_on_cuda": True}
    assert got["dflash"] == {"topk": 1, "dedup_on_cuda": True}


DFLASH_LOGPROB = "DFLASH speculative decoding does not support return_logprob yet."
DDTREE_LOGPROB = "DDTREE speculative decoding does not support return_logprob yet."


def test_scoring_requests_are_admitted(release: str, check: Callable[[str], dict]) -> None:
    """The tree gate scores the target's log-probs of a prompt and its continuation by a request
    with return_logprob and max_new_tokens 0, served by the target's plain prefill: DFLASH and
    DDTREE admit it (0004), and the worker's guard (0.5.14 to 0.5.17, 0003) lets a prefill
    through and a decode step a scoring request rides under overlap. A log-prob request that
    generates keeps the release's answer: refused for both up to 0.5.17, for DDTREE on 0.5.18,
    whose DFLASH reads log-probs from its verify chain; the guard still refuses its decode."""
    got = check("scoring_requests")
    assert got["scheduler_gate"] == {"DFLASH": True, "DDTREE": True}
    refusal = {"DFLASH": "admitted", "DDTREE": DDTREE_LOGPROB} if release == "0.5.18" else {
        "DFLASH": DFLASH_LOGPROB, "DDTREE": DFLASH_LOGPROB,
    }  # fmt: skip
    assert got["validation"] == {
        a: {"scoring": "admitted", "generating": refusal[a]} for a in ("DFLASH", "DDTREE")
    }
    guarded_decode = "passed" if release == "0.5.18" else DFLASH_LOGPROB
    assert got["worker"] == {
        "prefill_scoring": "passed", "prefill_generating": "passed", "decode_scoring": "passed",
        "decode_generating": guarded_decode,
    }  # fmt: skip


def test_decode_after_a_scoring_request_carries_no_logprobs(check: Callable[[str], dict]) -> None:
    """0004: the one decode step a finished scoring request rides under overlap has the batch's
    return_logprob set and no log-probs (DFlash's verify computes none up to 0.5.17, DDTREE's
    on 0.5.18); the result processor takes it as such (it read `None.tolist()` before) and still
    reads a step's own log-probs."""
    got = check("decode_after_scoring_request")
    assert got["without_logprobs"] == {"ids": [[5, 6]], "logprobs": None}
    assert got["with_logprobs"] == {"ids": [[5, 6]], "logprobs": [-0.5, -1.5]}
