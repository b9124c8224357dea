"""What only 0.5.18's DDTREE verify path has, on CPU against the real patched release.

0.5.18's set is on ddtree_kernels.sglang (docs/ddtree-module.md: its DDTREE logic is the
module's), 0.5.17's fat set ported with the hunks 0.5.18's code moved rewritten and then thinned.
Its checks
are 0.5.14's (v0514/checks_0514.py, run in the 0.5.18 staging venv: conftest.SHARED_CHECKS;
test_thin_sets.py holds its API refusal); what it shares with 0.5.17 is tested in ../v0517/
and before. Here: what 0.5.18's DFLASH newly serves and a
DDTree cannot follow. Log-prob requests and the target's routed-expert (indexer top-k) captures
are read from the chain's verify rows, so DDTREE's request validation refuses them; a target LM
head without a dense weight (GGUF) runs through the layer's own kernel, so the DDTree worker
refuses a tree on it, whose log-probs it drafts from the weight.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

RELEASE = "0.5.18"


@pytest.fixture(scope="module")
def release() -> str:
    return RELEASE


def test_ddtree_refuses_logprob_and_capture_requests_dflash_serves_them(
    check: Callable[[str], dict],
) -> None:
    """0.5.18's DFLASH takes a log-prob request (0.5.17 refused it) and returns the target's
    routed-expert captures of its verify rows; DDTREE's requests for either are refused with a
    sentence, by the same validation the scheduler calls."""
    got = check("requests_refused_for_ddtree")
    assert got["dflash_logprob"] is None and got["dflash_routed_experts"] is None
    assert got["ddtree_logprob"] == (
        "DDTREE speculative decoding does not support return_logprob yet."
    )
    assert got["ddtree_routed_experts"] == (
        "DDTREE speculative decoding does not support return_routed_experts "
        "or return_indexer_topk yet."
    )


def test_tree_mode_refuses_a_target_head_without_a_dense_weight(
    check: Callable[[str], dict],
) -> None:
    """A GGUF-like head (no `weight`) stops the DDTree worker at start in tree mode, naming the
    ways out; shadow_linear, whose chain DFlash drafts with the release's own greedy head, starts."""
    got = check("requests_refused_for_ddtree")
    assert got["tree_on_gguf_head"]["error"].startswith(
        "ValueError: DDTREE tree mode needs a target lm_head with a dense"
    )
    assert "shadow_linear" in got["tree_on_gguf_head"]["error"]
    assert got["shadow_on_gguf_head"]["mode"] == "shadow_linear"
