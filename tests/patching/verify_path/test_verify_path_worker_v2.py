"""The DDTREE verify path every worker-v2 release promises (0.5.14 to 0.5.17, 0.5.19 to 0.5.23),
on CPU.

Each test runs against each release's real patched tree: the checks in its
`v<release>/checks_<release>.py` (0.5.15 to 0.5.17: 0.5.14's; 0.5.19 to 0.5.22: 0.5.23's; the
ones the releases share come from `worker_v2_checks.py`) print JSON under the release's staging
venv (conftest.py here), and the tests assert on it.
A release's worker checks report the same keys, so one assertion holds both; what only one
release has is tested in its own test_verify_path_<release>.py. The backend refusal is checked
through the real argument resolution (`sglang_args_probe`).
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from packaging.version import Version
from patching.sglang_args_probe import base_argv, resolve_server_args, write_tiny_model_dirs
from patching.trees import REAL_RELEASES

# Every release from 0.5.14 (DFlashWorkerV2) but the .post ones, whose worker is their base's.
WORKER_V2_RELEASES = tuple(
    r for r in REAL_RELEASES if Version(r) >= Version("0.5.14") and not Version(r).is_postrelease
)


WORKER = Path("sglang/srt/speculative/dflash_worker_v2.py")
BASE = Path("sglang/srt/speculative/base_spec_worker.py")


@pytest.fixture(scope="module", params=WORKER_V2_RELEASES)
def release(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _self_names(path: Path, cls: str) -> tuple[set[str], set[str]]:
    """The `self.X` names class `cls` reads, and the ones it defines (stores, methods, class
    attributes)."""
    node = next(
        n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef) and n.name == cls
    )
    defined = {n.name for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    for n in node.body:
        targets = n.targets if isinstance(n, ast.Assign) else [getattr(n, "target", None)]
        defined |= {t.id for t in targets if isinstance(t, ast.Name)}
    read: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self":
            (read if isinstance(n.ctx, ast.Load) else defined).add(n.attr)
    return read, defined


def _unset_worker_names(root: Path) -> set[str]:
    """`self.X` names DFlashWorkerV2 reads that neither it nor BaseSpecWorker ever sets."""
    read, defined = _self_names(root / WORKER, "DFlashWorkerV2")
    return read - defined - _self_names(root / BASE, "BaseSpecWorker")[1]


def _undefined_names(file: Path) -> set[str]:
    """Pyflakes' undefined-name findings (ruff F821) in `file`."""
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    argv = [ruff, "check", "--isolated", "--select", "F821", "--output-format", "json", str(file)]
    out = subprocess.run(argv, capture_output=True, text=True, check=False).stdout
    return {finding["message"] for finding in json.loads(out)}


def test_worker_hunks_use_only_names_the_release_has(
    release: str, patched_root: Path, pristine_root: Callable[[str], Path]
) -> None:
    """A hunk that applies cleanly can still name what only another release has: 0.5.23's
    tree-proposal hunk enters `draft_tp_context(self.draft_parallel_layout)`, an attribute
    0.5.22's worker never sets (its flag is `draft_owns_attention`), and 0.5.23's accept call
    passes a `target_predict` local 0.5.22's verify never computes. The CPU checks call the
    worker's methods one by one, so this holds the whole patched worker: no `self` attribute and
    no name it reads is left unset, beyond what the pristine worker already leaves so."""
    pristine = pristine_root(release)
    assert _unset_worker_names(patched_root) <= _unset_worker_names(pristine)
    assert _undefined_names(patched_root / WORKER) <= _undefined_names(pristine / WORKER)


def _scope_calls(path: Path) -> set[tuple[str, int, tuple[str, ...]]]:
    """Every context a `with` in `path` enters through a call: (callee as written, positional
    count, keyword names)."""
    return {
        (ast.unparse(item.context_expr.func), len(item.context_expr.args),
         tuple(sorted(k.arg or "**" for k in item.context_expr.keywords)))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.With | ast.AsyncWith)
        for item in node.items
        if isinstance(item.context_expr, ast.Call)
    }  # fmt: skip


def test_worker_hunks_enter_scopes_as_the_release_does(
    release: str, patched_root: Path, pristine_root: Callable[[str], Path]
) -> None:
    """A hunk that applies cleanly can still enter another release's scope the other release's
    way: 0.5.22's tree-proposal hunk enters `draft_tp_context(self.draft_owns_attention)`, where
    0.5.21's context takes the draft runner's TP group (through the worker's own
    `self.draft_tp_context(group, owns_attention=...)`); on a GPU the flag would become the group.
    Every scope the patched worker enters is entered as the pristine worker enters it, or is one
    the patches add (the draft runner's spec-bag scope, dflash_utils' `ddtree_draft_spec_scope`,
    called directly or through a worker method that only returns it, as 0.5.17's and 0.5.18's)."""
    added = _scope_calls(patched_root / WORKER) - _scope_calls(pristine_root(release) / WORKER)
    spec_scope = {"ddtree_draft_spec_scope"} | {
        f"self.{name}"
        for name in _methods_returning(patched_root / WORKER, "ddtree_draft_spec_scope")
    }
    assert {callee for callee, _, _ in added} <= spec_scope, added


def _methods_returning(path: Path, callee: str) -> set[str]:
    """The functions in `path` whose last statement returns a call to `callee` (a scope the
    patches wrap in a method)."""
    return {
        node.name
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef)
        and isinstance(last := node.body[-1], ast.Return)
        and isinstance(last.value, ast.Call)
        and ast.unparse(last.value.func) == callee
    }


def test_patched_copy_is_the_one_imported(check: Callable[[str], dict]) -> None:
    r = check("verify_input_type")
    assert r["is_dflash_verify_input"] and r["spec_input_type_dflash_verify"]
    assert r["is_verify_input"] and r["num_tokens"] == 4 and r["topk"] == 1
    assert r["next_token"] == [[1, 2, 3, -1]] and r["positions"] == [5, 6, 7, 8]


def test_patched_modules_import_on_cpu(check: Callable[[str], dict], patched_root: Path) -> None:
    files = check("patched_modules_import")["files"]
    assert len(files) == 8
    assert all(f.startswith(f"{patched_root}/sglang/") for f in files.values()), files


def test_draft_logprobs_single_rank_equal_plain_torch(check: Callable[[str], dict]) -> None:
    r = check("topk_single_rank")
    for dtype in ("torch.float32", "torch.bfloat16"):
        assert r[dtype]["ids_equal"], dtype
        assert r[dtype]["max_abs_diff"] < 1e-5 and r[dtype]["dtype"] == "torch.float32"
    assert r["padding_ignored"]


def test_draft_logprobs_tensor_parallel_merge(check: Callable[[str], dict]) -> None:
    r = check("topk_tensor_parallel")
    assert r["ranks_agree"] and r["ids_equal"]
    assert r["max_abs_diff"] < 1e-5
    t = check("merge_ties_to_smaller_id")
    assert t["ids"] == [[3, 7, 4]] and t["logp_ok"]


def test_tree_at_full_width_is_the_kernels_tree_and_sglang_mask(
    check: Callable[[str], dict],
) -> None:
    r = check("tree_full_width")
    assert r["fields_equal_kernels"] and r["mask_is_sglang_layout"] and r["branching"]
    assert r["helper_mask_equal_kernels"] and r["positions_prefix_plus_depth"]
    assert r["upper_bound_prefix_equal"] and r["upper_bound_tail_true"]
    assert r["upper_bound_tail_len"] == 9 * 8


def test_small_budget_tree_is_padded_to_the_block_width(check: Callable[[str], dict]) -> None:
    r = check("tree_padded_to_width")
    assert r["shape"] == [2, 8]
    assert r["head_equal_kernels"] and r["ancestor_head_equal"]
    assert r["pad_tokens_zero"] and r["pad_parents_none"] and r["pad_links_none"]
    assert r["pad_positions_prefix"] and r["pad_rows_only_self"]
    assert r["retrieve_index"] == [[0, 1, 2, 3, 4, -1, -1, -1], [8, 9, 10, 11, 12, -1, -1, -1]]
    assert r["mask_is_sglang_layout"]


def test_accept_and_commit_in_path_order(check: Callable[[str], dict]) -> None:
    r = check("accept_and_commit")
    assert r["accept_index"] == [[0, 2, 3, 5, -1, -1]]
    assert r["drafts"] == [3] and r["commit_lens"] == [4] and r["commit_dtype"] == "torch.int32"
    assert r["bonus"] == [77] and r["out_tokens"] == [[11, 20, 31, 77, 0, 0]]
    assert r["new_seq_lens"] == [44]
    # The accepted nodes' KV (slots 100, 102, 103, 105) now leads the window.
    assert r["kv_after_move"][:4] == [100.0, 102.0, 103.0, 105.0] and r["v_matches_k"]
    # Hidden rows in path order; rows past the path and the 2 padding rows keep theirs.
    assert r["hidden_after"] == [0.0, 20.0, 30.0, 50.0, 40.0, 50.0, 60.0, 70.0]


def test_sampled_walk_outputs_match_the_greedy_walk_layout(check: Callable[[str], dict]) -> None:
    r = check("sampling_walk_outputs")
    assert r["local"] == [[0, 2, 3, 5, -1, -1], [0, -1, -1, -1, -1, -1]]
    assert r["accept_len"] == [4, 1] and r["bonus"] == [77, 55]
    assert r["tokens"][1] == [55, -1, -1, -1, -1, -1] and r["row0_equals_walk"]


def test_recurrent_state_steps_follow_the_tree(check: Callable[[str], dict]) -> None:
    r = check("mamba_steps")
    assert r["last"] == [5, 0] and r["tracked"] == [3, -1]
    assert r["chain_equals_commit_minus_one"]
    w = check("worker_mamba_commit")
    assert w["tree_steps"] == [5, 0] and w["dflash_steps"] == [3, 0]


def test_shadow_linear_equals_dflash_verify(check: Callable[[str], dict]) -> None:
    r = check("shadow_linear_equals_dflash")
    assert r["tie_row_token"] == 5  # DFlash's own argmax decided the tie
    assert r["draft_chain_is_dflash"] and r["causal_chain"] and r["positions_consecutive"]
    assert r["accept_len_equal"] and r["commit_lens_equal"] and r["bonus_equal"]
    assert r["committed_tokens_equal"] and r["new_seq_lens_equal"] and r["commit_is_identity"]
    assert r["accept_lens"] == [1, 2, 4, 8, 3, 6]  # every accept length 1..B exercised


def test_worker_startup_checks(check: Callable[[str], dict]) -> None:
    r = check("worker_init")
    assert r["tree"] == {"mode": "tree", "budget": 7, "topk": 3, "ops_loaded": True}
    assert r["shadow"]["mode"] == "shadow_linear" and r["hybrid_shadow"]["mode"] == "shadow_linear"
    assert r["hybrid_tree_allowed"]["mode"] == "tree"
    assert "shadow_linear" in r["hybrid_tree"]["error"]
    assert "allow-hybrid-unsafe" in r["hybrid_tree"]["error"]
    assert "budget 8" in r["budget_too_big"]["error"]
    assert "ddtree_kernels" in r["no_kernels"]["error"]
    assert r["no_kernels"]["error"].startswith("RuntimeError")
    h = check("hybrid_refusal")
    assert "shadow_linear" in h["tree_hybrid"]
    assert h["tree_hybrid_allowed"] == h["shadow_hybrid"] == h["tree_dense"] == ""


def test_worker_proposes_the_tree_through_the_lm_head(check: Callable[[str], dict]) -> None:
    r = check("worker_propose_tree")
    assert r["tp1_tokens_equal"] and r["tp1_mask_equal"] and r["tp1_positions_equal"]
    assert r["tp_ranks_agree"] and r["tp_tokens_equal"]
    assert r["overlap_mask_prefix_equal"] and r["overlap_mask_longer"]
    assert "added vocabulary" in r["added_vocab_error"]


def test_worker_greedy_tree_accept(check: Callable[[str], dict]) -> None:
    r = check("worker_accept_tree_greedy")
    assert r["drafts"] == [3] and r["commit"] == [4] and r["bonus"] == [77]
    assert r["out_tokens"] == [[11, 20, 31, 77, 0, 0]] and r["new_seq_lens"] == [44]
    assert r["accept_index"] == [[0, 2, 3, 5, -1, -1]]


def test_worker_config_takes_the_verify_width(check: Callable[[str], dict]) -> None:
    """Budget 63: the worker verifies 64 tokens, keeps the drafter's 16-token block apart from
    the width, and refuses a budget past the width and a top-k the CUDA tree build refuses."""
    got = check("wide_worker_init")
    assert got["tree"] == {"width": 64, "budget": 63, "block": 16}
    assert got["budget_over_width"] == (
        "ValueError: DDTREE budget 63 does not fit the verify width 16 (budget + 1 <= width)."
    )
    assert (
        got["topk_over_kernel"] == "ValueError: ddtree: the tree build needs 1 <= K <= 16; got 17"
    )
    assert got["draft_block"] == [16, 8, 16]  # tree: the block; DFLASH, shadow: the width


def test_worker_proposes_a_64_token_tree_from_a_16_token_block(
    check: Callable[[str], dict],
) -> None:
    got = check("wide_propose_tree")
    assert got["shape"] == [3, 64] and got["fields_equal_kernels"]
    assert got["mask_numel"] == 64 * (4 + 9 + 2) + 3 * 64 * 64
    assert got["max_depth"] >= 2  # a real tree, not a padded chain


def test_accept_commit_of_a_64_token_tree(check: Callable[[str], dict]) -> None:
    """Greedy and sampled accept over a 64-node tree give the drafter's 16-token layout; the
    verify writes the window's first 64 slots, and the path's KV and hidden rows lead it."""
    got = check("wide_accept_and_commit")
    assert got.pop("out_width") == [2, 16] and min(got.pop("path_depth")) >= 2
    assert all(got.values()), got


def test_capture_mask_only_for_tree_mode(check: Callable[[str], dict]) -> None:
    assert check("capture_mask_predicate") == {
        "ddtree_tree": True, "ddtree_shadow": False, "dflash": False,
    }  # fmt: skip


def test_tree_mode_refuses_backends_without_a_tree_mask(
    staging_python: str, patched_root: Path, tmp_path: Path
) -> None:
    model, draft = write_tiny_model_dirs(tmp_path)
    argv = [*base_argv(model, draft, "cuda"), "--speculative-algorithm", "DDTREE"]

    def resolve(*extra: str):
        return resolve_server_args(
            staging_python, argv + list(extra), sglang_root=str(patched_root)
        )

    fa3 = resolve("--attention-backend", "fa3")
    assert not fa3.ok and "fa3" in fa3.error
    assert "flashinfer or triton" in fa3.error and "shadow_linear" in fa3.error
    flashinfer = resolve("--attention-backend", "flashinfer")
    assert flashinfer.ok, flashinfer.error
    assert flashinfer.fields["speculative_ddtree_mode"] == "tree"
    shadow = resolve("--attention-backend", "fa3", "--speculative-ddtree-mode", "shadow_linear")
    assert shadow.ok, shadow.error
