"""DDTree's rules are written once, in ddtree_kernels.sglang, not in the patch sets.

A set keeps its release's plumbing (hooks, names, sync sites) and calls the module for every
decision DDTree makes (docs/ddtree-module.md). Each rule below is recognised by the code that
writes it out (its markers, read from the lines a set's diffs add); a marker in two sets, or twice
in one, is a rule copied instead of called. No staging venv or wheel tree: the diffs are read
as text.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from ddtree_deploy.patching.manifest import load_patch_sets, patch_sets_root

# rule -> what writing it out looks like in an added line
RULES = {
    "tree-mode predicate": r'[!=]=\s*"(tree|shadow_linear)"|"(tree|shadow_linear)"\s*[!=]=',
    "hybrid needs top-k >= 2": r"max\([^()]*(\([^()]*\))?[^()]*,\s*2\)",
    "accept/commit branching": (
        r"is_all_greedy|accept_index is not None|_ddtree\.mamba_steps\("
        r"|\.path_rows\(|\.commit_path\(|\.walk_tree\("
    ),
    "tree-verify sampling": r"\.sampler\(|sample_target_tokens|for t in \(out\[",
    "wide-tree KV plan": r"read_extent=|\.width > block_size",
    "a tree's default attention backend": r'"flashinfer" if is_flashinfer_available\(\)',
    "the drafter's block size": r"int\(\w+\.speculative_dflash_block_size\)",
}


MODULE = Path(__file__).parents[2] / "kernels" / "ddtree_kernels" / "sglang.py"


def _module_api() -> set[str]:
    """The module's public names (its `__all__`), read from its source (it imports torch)."""
    for node in ast.parse(MODULE.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return set(ast.literal_eval(node.value))
    raise AssertionError(f"{MODULE} has no __all__")


def _added_lines(directory: Path) -> list[str]:
    """The lines a set's own diffs add (a derived set has none of its own)."""
    return [
        line[1:]
        for diff in sorted(directory.glob("*.patch"))
        for line in diff.read_text().splitlines()
        if line.startswith("+") and not line.startswith("+++")
    ]


def _markers(lines: list[str]) -> dict[str, int]:
    """How often each rule is written out in `lines`."""
    return {rule: sum(len(re.findall(rx, line)) for line in lines) for rule, rx in RULES.items()}


ADDED = {
    patch_set.directory.name: _added_lines(patch_set.directory)
    for patch_set in load_patch_sets(patch_sets_root())
}
SETS = {name: _markers(lines) for name, lines in ADDED.items()}


@pytest.mark.parametrize("rule", sorted(RULES))
def test_no_rule_is_written_in_two_sets_or_twice_in_one(rule: str) -> None:
    written = {name: counts[rule] for name, counts in SETS.items() if counts[rule]}
    assert sum(written.values()) <= 1, f"{rule} is written out in {written}"


def test_the_markers_find_the_rules_where_they_were_written() -> None:
    """Each marker matches the rule as the sets wrote it before moving onto the module."""
    before = {
        "tree-mode predicate": [
            'and getattr(server_args, "speculative_ddtree_mode", "tree") == "tree"'
        ],
        "hybrid needs top-k >= 2": ["linear.topk = max(int(linear.topk), 2)"],
        "accept/commit branching": [
            "if accept_index is not None:",
            "rows = ddtree.path_rows(w, 6)",
        ],
        "tree-verify sampling": ["sample = step.sampler(", "for t in (out[0], out[2], out[3]):"],
        "wide-tree KV plan": ["read_extent=ddtree_step.width,"],
        "a tree's default attention backend": [
            'return "flashinfer" if is_flashinfer_available() else "triton"'
        ],
        "the drafter's block size": ["return int(spec.speculative_dflash_block_size)"],
    }
    assert sorted(before) == sorted(RULES)
    assert all(_markers(lines)[rule] == len(lines) for rule, lines in before.items())


def test_every_set_calls_the_module_through_one_interface() -> None:
    """The loaded module is asked only for its public names, and a worker holds a Verifier
    (`self._ddtree`), never the module itself (API 1's free functions for the older sets)."""
    api = _module_api()
    for name, lines in ADDED.items():
        text = "\n".join(lines)
        called = set(re.findall(r"load_ddtree\(\)\.(\w+)", text))
        called |= set(re.findall(r"\bddtree\.(\w+)\(", text))
        assert called <= api, f"{name} calls {sorted(called - api)} outside the module's API"
        assert not re.search(r"self\._ddtree = load_ddtree\(\)\s*$", text, re.MULTILINE), name
