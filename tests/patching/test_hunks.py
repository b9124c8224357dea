"""Fuzz-0 hunk application on small texts, checked against GNU `patch -p1 --fuzz=0`."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from unidiff.patch import PatchSet as DiffSet

from ddtree_deploy.patching.hunks import HunkMismatch, apply_hunks, fit_hunks

# (name, file text, diff of a/f.py -> b/f.py, offsets we expect or None for "refused")
_CASES = [
    (
        "offset-down",
        "zero\none\ntwo\nthree\nfour\n",
        "@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n",
        [1],
    ),
    (
        "context-mismatch",
        "one\ntwo\nthree\n",
        "@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n THREE\n",
        None,
    ),
    (
        "start-anchored-hunk-not-at-start",
        "q\nx\ny\nz\n",
        "@@ -1,3 +1,3 @@\n-x\n+X\n y\n z\n",
        None,
    ),
    (
        "end-anchored-hunk-not-at-end",
        "x\ny\nz\nmore\n",
        "@@ -1,3 +1,3 @@\n x\n y\n-z\n+Z\n",
        None,
    ),
    (
        "nearest-of-two-matches",
        "a\nb\nc\n" + "pad\n" * 5 + "a\nb\nc\n",
        "@@ -7,3 +7,3 @@\n a\n-b\n+B\n c\n",
        [2],
    ),
    (
        "insert-into-empty-range",
        "one\ntwo\n",
        "@@ -1,0 +2,1 @@\n+between\n",
        [0],
    ),
]


def _diff(body: str) -> str:
    return "--- a/f.py\n+++ b/f.py\n" + body


def _gnu(
    tmp_path: Path,
    text: str,
    diff: str,
    *,
    reverse: bool = False,
    fuzz: int = 0,
    partial: bool = False,
) -> str | None:
    if shutil.which("patch") is None:
        pytest.skip("GNU patch is not installed")
    (tmp_path / "f.py").write_text(text)
    (tmp_path / "d.patch").write_text(diff)
    argv = ["patch", "-p1", f"--fuzz={fuzz}", "--no-backup-if-mismatch", "-r", "-", "-i", "d.patch"]
    done = subprocess.run(
        [*argv, *(["-R"] if reverse else [])], cwd=tmp_path, capture_output=True, check=False
    )
    return (tmp_path / "f.py").read_text() if done.returncode == 0 or partial else None


@pytest.mark.parametrize(("name", "text", "body", "offsets"), _CASES, ids=[c[0] for c in _CASES])
def test_hunks_apply_like_gnu_patch(
    name: str, text: str, body: str, offsets: list[int] | None, tmp_path: Path
) -> None:
    diff = _diff(body)
    expected = _gnu(tmp_path, text, diff)
    if offsets is None:
        assert expected is None
        with pytest.raises(HunkMismatch):
            apply_hunks(text, DiffSet(diff)[0], patch=name)
        return
    result, found = apply_hunks(text, DiffSet(diff)[0], patch=name)
    assert result == expected
    assert [h.offset for h in found] == offsets


def test_hunks_reverse_undo_the_forward_result(tmp_path: Path) -> None:
    text = "zero\none\ntwo\nthree\nfour\n"
    diff = _diff("@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n")
    forward, _ = apply_hunks(text, DiffSet(diff)[0], patch="p")
    back, offsets = apply_hunks(forward, DiffSet(diff)[0], patch="p", reverse=True)
    assert back == text == _gnu(tmp_path, forward, diff, reverse=True)
    assert [h.offset for h in offsets] == [1]


_FUZZY_TEXT = "a\nB-changed\nc\nd\ne\nf\ng\nh\ni\nj\nk\nl\n"
# Hunk 1's first context line was "b" (now "B-changed"); hunk 2's removed line is gone.
_FUZZY_DIFF = _diff(
    "@@ -1,7 +1,7 @@\n a\n b\n c\n-d\n+D\n e\n f\n g\n@@ -9,3 +9,3 @@\n i\n-GONE\n+J\n k\n"
)


def test_port_fit_hunks_fuzz_matches_gnu_patch(tmp_path: Path) -> None:
    """Fuzz 2 drops the outer context lines as GNU does; the file keeps its own text there."""
    result, fits = fit_hunks(_FUZZY_TEXT, DiffSet(_FUZZY_DIFF)[0], patch="p", max_fuzz=2)
    assert result == _gnu(tmp_path, _FUZZY_TEXT, _FUZZY_DIFF, fuzz=2, partial=True)
    assert [(f.fuzz, f.mismatch) for f in fits] == [
        (2, None),
        (0, "removed line 'GONE' is not in the file"),
    ]
    assert "B-changed" in result and "D\n" in result and "J" not in result


def test_port_fit_hunks_names_differing_line_without_fuzz() -> None:
    _, fits = fit_hunks(_FUZZY_TEXT, DiffSet(_FUZZY_DIFF)[0], patch="p", max_fuzz=0)
    assert fits[0].mismatch == "context line 'b' is not in the file"


def test_port_fit_hunks_names_line_at_closest_match_when_lines_are_reordered() -> None:
    text = "x\none\nthree\ntwo\ny\n"  # every line of the hunk exists, not in its order
    diff = _diff("@@ -2,3 +2,3 @@\n one\n-two\n+TWO\n three\n")
    _, fits = fit_hunks(text, DiffSet(diff)[0], patch="p", max_fuzz=0)
    assert fits[0].mismatch == (
        "removed line 'two' does not match line 3 ('three') at the closest match (1 of 3 lines)"
    )
