"""Find DFLASH gate sites in Python source with `ast` (pure: no host, no manifest).

A gate site is one source line holding at least one of these nodes (line = the node's `lineno`):

- a call of `is_dflash()` or `is_dflash_family()`, as a method (`x.is_dflash()`) or a plain name;
- a string constant that is exactly `"DFLASH"`;
- an attribute `X.DFLASH` (e.g. `SpeculativeAlgorithm.DFLASH`);
- a `DFLASH_*` member of `SpecInputType` (e.g. `SpecInputType.DFLASH_VERIFY`).

Each site carries the qualified name of its innermost enclosing `def` or `class` (`Class.method`,
`outer.inner`, `<module>` at top level), which is how the manifest's reviews name it. Matching
sites against reviews is `audit`'s job.
"""

from __future__ import annotations

import ast
import hashlib
import re
import warnings
from dataclasses import dataclass
from enum import StrEnum
from pathlib import PurePosixPath

MODULE_SCOPE = "<module>"


class GatePattern(StrEnum):
    """Which rule made a line a gate site."""

    is_dflash = "is_dflash()"
    is_dflash_family = "is_dflash_family()"
    dflash_literal = '"DFLASH"'
    dflash_attribute = ".DFLASH"
    spec_input_type = "SpecInputType.DFLASH_*"


# Enums whose DFLASH_* members are gates. `SpecTpSyncSite.DFLASH_*` (0.5.19+) only labels TP
# sync points inside the DFlash worker and gates nothing, so a bare `DFLASH_` prefix is too wide.
_GATE_ENUMS = frozenset({"SpecInputType"})

_GATE_CALLS = {
    "is_dflash": GatePattern.is_dflash,
    "is_dflash_family": GatePattern.is_dflash_family,
}


@dataclass(frozen=True)
class GateSite:
    """One source line that gates on DFLASH."""

    file: PurePosixPath  # relative to site-packages, e.g. sglang/srt/server_args.py
    line: int
    function: str
    text: str  # the stripped source line
    patterns: tuple[GatePattern, ...]


def _pattern_of(node: ast.AST) -> GatePattern | None:
    """The gate pattern `node` matches on its own, if any."""
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        return _GATE_CALLS.get(name) if isinstance(name, str) else None
    if isinstance(node, ast.Constant):
        return GatePattern.dflash_literal if node.value == "DFLASH" else None
    if isinstance(node, ast.Attribute):
        if node.attr == "DFLASH":
            return GatePattern.dflash_attribute
        if node.attr.startswith("DFLASH_") and _owner_name(node.value) in _GATE_ENUMS:
            return GatePattern.spec_input_type
    return None


def _owner_name(node: ast.expr) -> str | None:
    """`SpecInputType` for both `SpecInputType` and `spec_info.SpecInputType`."""
    if isinstance(node, ast.Name):
        return node.id
    return node.attr if isinstance(node, ast.Attribute) else None


def _scan(tree: ast.Module) -> dict[int, tuple[str, list[GatePattern]]]:
    """line -> (innermost scope of the first match on that line, patterns in order found).

    An explicit stack instead of `ast.NodeVisitor`, whose method dispatch per node is slower.
    """
    found: dict[int, tuple[str, list[GatePattern]]] = {}
    stack: list[tuple[ast.AST, tuple[str, ...]]] = [(tree, ())]
    while stack:
        node, scope = stack.pop()
        pattern = _pattern_of(node)
        if pattern is not None:
            line = node.lineno  # type: ignore[attr-defined]  # matched nodes are expressions
            _, patterns = found.setdefault(line, (".".join(scope) or MODULE_SCOPE, []))
            if pattern not in patterns:
                patterns.append(pattern)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            scope = (*scope, node.name)
        stack.extend((child, scope) for child in ast.iter_child_nodes(node))
    return found


def find_gate_sites(file: PurePosixPath, source: bytes) -> list[GateSite]:
    """Every gate site of one module, by line; `SyntaxError` when it does not parse.

    Every module is parsed, but only one whose text mentions "dflash" in any case is walked:
    walking all nodes of a few thousand modules doubles an audit's time, and a module that never
    spells the word can hold a gate only as a "DFLASH" literal written with escapes or split
    across implicitly concatenated literals. Results are remembered by content hash, so auditing
    the same release again (before and after patching, or host after host) parses only the
    modules that differ.
    """
    digest = hashlib.sha256(source).hexdigest()
    found = _memo.get(digest)
    if found is None:
        found = _sites_in(file, source)
        if len(_memo) >= _MEMO_SIZE:
            _memo.clear()
        _memo[digest] = found
    return [
        GateSite(file, line, function, text, patterns) for line, function, text, patterns in found
    ]


# sha256 of a module's source -> its sites as (line, function, text, patterns)
_Found = tuple[tuple[int, str, str, tuple[GatePattern, ...]], ...]
_MEMO_SIZE = 20_000  # more modules than two releases hold; cleared when full
_memo: dict[str, _Found] = {}
_LINE_BREAK = re.compile(r"\r\n|\r|\n")  # the line ends Python's tokenizer counts


def _sites_in(file: PurePosixPath, source: bytes) -> _Found:
    with warnings.catch_warnings():  # invalid escapes etc. in the package are not our warnings
        warnings.simplefilter("ignore")
        tree = ast.parse(source, filename=str(file))
    if b"dflash" not in source.lower():
        return ()
    found = _scan(tree)
    lines = _LINE_BREAK.split(source.decode("utf-8", errors="replace"))
    return tuple(
        (line, function, lines[line - 1].strip(), tuple(sorted(patterns)))
        for line, (function, patterns) in sorted(found.items())
    )
