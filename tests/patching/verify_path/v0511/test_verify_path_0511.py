"""The 0.5.11, 0.5.12 and 0.5.13 DDTREE verify-path patches: whole series with GNU patch, gate
audit, and the added functions called from the patched SGLang in the staging venv (see checks.py).

All three run the v1 DFlashWorker with the same dflash_info / dflash_utils structure (0.5.12
renames accept_len -> correct_len, verified_id -> bonus_tokens, accepted_steps ->
last_correct_step_indices), so every check runs against each release's own patched tree.

The staging venvs (real SGLang + torch, CPU) live at
~/.local/share/ddtree-deploy/local/sglang-<release>; without one the SGLang-side tests skip, or
fail when DDTREE_REQUIRE_STAGING=1.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path, PurePosixPath

import pytest
from patching.trees import real_patch_set

from ddtree_deploy.hosts.local import LocalHost
from ddtree_deploy.hosts.state import HostStateStore
from ddtree_deploy.patching.audit import audit
from ddtree_deploy.patching.engine import apply_patch_set

RELEASES = ("0.5.11", "0.5.12", "0.5.13")
CHECKS = Path(__file__).with_name("checks.py")


@pytest.fixture(scope="module", params=RELEASES)
def release(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def checks_script() -> Path:
    return CHECKS


def test_gnu_patch_applies_series_and_reaches_recorded_hashes(
    release: str, patched_root: Path
) -> None:
    import hashlib

    final = {}
    for patch in real_patch_set(release).patches:
        for f in patch.files:
            final[str(f.path)] = f.sha256_after
    assert {"sglang/srt/speculative/dflash_worker.py", "sglang/srt/speculative/dflash_info.py",
            "sglang/srt/speculative/dflash_utils.py",
            "sglang/srt/model_executor/cuda_graph_runner.py"} <= set(final)  # fmt: skip
    got = {p: hashlib.sha256((patched_root / p).read_bytes()).hexdigest() for p in final}
    assert got == final


def test_audit_of_patched_release_has_no_unreviewed_gate(
    release: str, make_tree: Callable[[str], Path], host: LocalHost, state: HostStateStore
) -> None:
    patch_set = real_patch_set(release)
    site = PurePosixPath(make_tree(release))
    apply_patch_set(host, site, patch_set, state)
    report = audit(host, site, patch_set, state)
    assert [f"{g.site.file}:{g.site.line}" for g in report.unreviewed] == []
    assert report.passed


def test_checks_import_the_patched_copy(check: Callable[[str], dict]) -> None:
    # worker_and_server_hunks reads the worker source next to the imported sglang package.
    assert check("worker_and_server_hunks")["tree"]["verify_type"] == "DDTreeVerifyInput"


def test_draft_logprobs_equal_plain_torch_incl_tp_merge(check: Callable[[str], dict]) -> None:
    got = check("draft_logprobs")
    assert set(got["cases"]) == {f"{v}-tp{t}" for v in ("base", "added") for t in (1, 2, 4)}
    for case, res in got["cases"].items():
        assert res["ids_equal"], case
        assert res["max_logp_err"] < 1e-5, case
        assert res["tie_row_ids"] == [0, 1, 2, 3], case  # ties go to the smaller token id
    # shadow_linear's tree: DFlash's chain, each node the previous one's child, at prefix + depth
    assert got["chain_ids"] == [[5, 6, 7], [1, 2, 3]]
    assert got["chain_parents"] == [[-1, 0, 1, 2]] * 2
    assert got["chain_positions"] == [[2, 3, 4, 5], [9, 10, 11, 12]]


@pytest.mark.parametrize("budget", ["budget5", "budget3"])  # full width, and padded to it
def test_tree_arrays_and_mask_match_kernels_and_sglang_layout(
    check: Callable[[str], dict], budget: str
) -> None:
    res = check("tree_arrays")[budget]
    assert res.pop("draft_token_num") == 6
    assert all(res.values()), res


def test_shadow_chain_mask_is_dflash_causal_mask(check: Callable[[str], dict]) -> None:
    got = check("tree_arrays")
    assert got["shadow"] == {
        "tokens": True,
        "positions": True,
        "mask_with_dflash_policy": True,
        "mask_without_dflash_policy": None,  # DFlash builds none for such backends either
    }
    assert got["tree_mask_kept_when_policy_says_none"]


@pytest.mark.parametrize("page", ["page1", "page4"])
def test_accept_commit_path_ordered_kv_and_hidden(check: Callable[[str], dict], page: str) -> None:
    got = check("accept_commit")
    assert all(got[page].values()), got[page]
    # the chosen branch is a deep one through non-first children, so reordering is exercised
    assert max(got[f"path_depth_p{page[4:]}"]) >= 2
    # the worker's Mamba commit: path steps become tree nodes (a tracked -1 stays); DFLASH's not
    assert got["mamba_hunk"] == {"ddtree": [[3, 0], [3, -1]], "dflash": [[2, 0], [2, -1]]}
    assert got["path_rows"] == [0, 3, 5, 1, 2, 4, 6, 7, 8, 9, 10, 11]


@pytest.mark.parametrize("page", ["page1", "page4"])
def test_accept_commit_of_a_64_token_tree(check: Callable[[str], dict], page: str) -> None:
    """Budget 63 over the drafter's 15 positions: walk, KV and hidden compaction at width 64."""
    got = check("accept_commit")["wide"]
    assert all(got[page].values()), got[page]
    assert max(got[f"path_depth_p{page[4:]}"]) >= 2


def test_shadow_linear_equals_dflash_verify(check: Callable[[str], dict]) -> None:
    got = check("shadow_equals_dflash")
    assert got.pop("reorders") == 0, "a chain's accepted path is already in window order"
    # nor does it keep one: on a hybrid target the Mamba commit is then DFlash's own (issue 22)
    assert got.pop("kept_paths") == 0
    assert len(got) == 8
    for case, res in got.items():
        assert res["equal"], (case, res["diff"])
    assert got["p1-greedy-max99"]["accepted"] == [2, 5, 0]
    assert got["p1-greedy-max2"]["accepted"] == [2, 1, 0]  # a request finishing mid-block


def test_helpers_config_and_target_tokens(check: Callable[[str], dict]) -> None:
    got = check("helpers")
    assert got["mask_policy"] == [True, False, True, False, True]
    cfg = got["config"]
    assert cfg["plain"] == {"ok": True, "shadow": False, "budget": 15, "topk": 8, "width": 16}
    assert not cfg["hybrid_tree"]["ok"] and "shadow_linear" in cfg["hybrid_tree"]["error"]
    assert "--speculative-ddtree-allow-hybrid-unsafe" in cfg["hybrid_tree"]["error"]
    assert cfg["hybrid_tree_allowed"]["ok"] and cfg["hybrid_shadow"]["ok"]
    assert not cfg["budget_too_big"]["ok"]
    assert "does not fit the verify width" in cfg["budget_too_big"]["error"]
    assert not cfg["kernels_missing"]["ok"]
    assert "needs the ddtree_kernels package" in cfg["kernels_missing"]["error"]
    assert got["top_k1_is_argmax"]
    assert got["sampled_tokens"]["got"] == got["sampled_tokens"]["want"]


def test_worker_config_takes_the_verify_width(check: Callable[[str], dict]) -> None:
    """The worker runs a 64-token verify, refuses a budget past the width and a top-k the CUDA
    tree build refuses, and keeps the drafter's block (16) apart from the width."""
    wide = check("helpers")["wide"]
    assert wide["config"] == {"ok": True, "shadow": False, "budget": 63, "topk": 8, "width": 64}
    assert wide["budget_over_width"] == {
        "ok": False,
        "error": "DDTREE budget 63 does not fit the verify width 16 (budget + 1 <= width).",
    }
    assert wide["topk_over_kernel"]["error"] == "ddtree: the tree build needs 1 <= K <= 16; got 17"
    assert wide["draft_block"] == [16, 8, 16]  # tree: the block; DFLASH, shadow: the width


def test_worker_hunk_builds_tree_verify_input(check: Callable[[str], dict]) -> None:
    got = check("worker_and_server_hunks")
    for mode in ("tree", "shadow_linear"):
        res = got[mode]
        assert res["verify_type"] == "DDTreeVerifyInput"
        assert res["target_verify"] and res["tokens"] and res["positions"] and res["req_to_token"]
    assert got["tree"]["has_mask"]  # a tree always carries its mask
    assert not got["shadow_linear"]["has_mask"]  # DFlash's FlashInfer policy: no mask
    assert got["argmax_calls"] == ["argmax"]  # shadow uses DFlash's own argmax head, once


def test_worker_hunk_builds_a_64_token_verify_from_a_16_token_block(
    check: Callable[[str], dict],
) -> None:
    wide = check("worker_and_server_hunks")["wide"]
    assert wide.pop("draft_token_num") == 64
    assert wide.pop("mask_numel") == (3 + 6) * 64 + 2 * 64 * 64
    assert wide.pop("kv_slots") == [True, True]
    assert wide.pop("max_depth") >= 2  # a real tree, not a padded chain
    assert all(wide.values()), wide


def test_attention_backend_refusal_and_default(check: Callable[[str], dict]) -> None:
    got = check("worker_and_server_hunks")
    refusals = got["refusals"]
    for backend in ("fa3", "trtllm_mha", "mixed"):
        assert "only flashinfer and triton" in refusals[backend], backend
    assert refusals["flashinfer"] is None and refusals["triton"] is None
    assert refusals["shadow_fa3"] is None and refusals["cpu"] is None
    assert got["default_backend_tree"] in ("flashinfer", "triton")


def test_hybrid_gdn_follows_ddtree_tree_links(check: Callable[[str], dict]) -> None:
    """Patch 0007: in tree mode the recurrent layers' conv runs along each node's ancestors."""
    got = check("hybrid_tree_links")
    assert got["topk"] == {"ddtree_tree": 2, "ddtree_shadow": 0, "dflash": 1, "eagle_topk4": 4}
    assert got["eager_links"] and got["graph_links"] and got["shadow_links"]
    assert got["parents_found"] and got["conv_follows_tree"] and got["tree_differs_from_chain"]
    assert got["graph_buffer_width"] == [3, 6]


def test_hybrid_gdn_follows_a_64_token_tree(check: Callable[[str], dict]) -> None:
    """The recurrent conv along the links of a budget-63 tree; graph buffers 64 wide."""
    got = check("hybrid_tree_links")["wide"]
    assert got["graph_buffer_width"] == [3, 64]
    assert got["verify_query_starts"] == [0, 64, 128, 192]
    assert got["eager_links"] and got["graph_links"] and got["shadow_links"]
    assert got["parents_found"] and got["conv_follows_tree"] and got["tree_differs_from_chain"]
