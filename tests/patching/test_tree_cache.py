"""The unzipped wheel trees the patching tests share (conftest.py's `pristine_root`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from patching.conftest import _matches_record


@pytest.mark.parametrize("release", ["0.5.11", "0.5.18"])  # with `tools/` in RECORD, and without
def test_a_cached_tree_passes_its_own_check(
    pristine_root: Callable[[str], Path], release: str
) -> None:
    """A sound cached tree must match its RECORD, or every session unzips it again and moves
    the old one aside while another xdist worker is copying from it (a copy error, seen on
    0.5.11 to 0.5.17, whose RECORD lists `tools/get_version_tag.py`, which is not unzipped)."""
    assert _matches_record(pristine_root(release), release)
