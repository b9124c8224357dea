"""Derived patch sets (`base:` in series.yaml): what they take from their base, and the manifests
the loader refuses. Synthetic sets over the tiny `eof-and-anchors` case; the shipped derived set
(0.5.15.post1) runs every engine, GNU patch and audit test through `trees.REAL_RELEASES`."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from ddtree_deploy.patching.manifest import (
    Disposition,
    PatchSetError,
    load_patch_set,
    load_patch_sets,
)
from patching.trees import CASES_DIR

TINY = CASES_DIR / "eof-and-anchors" / "series"
GATE = {"file": "sglang/a.py", "function": "f", "text": "if x.is_dflash():"}


def _base(root: Path) -> Path:
    """The tiny set as `root/0.0.1`, with one gate review."""
    base = root / "0.0.1"
    shutil.copytree(TINY, base)
    raw = yaml.safe_load((base / "series.yaml").read_text())
    raw["gates"] = [{**GATE, "disposition": "widened", "reason": "through is_dflash()"}]
    (base / "series.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return base


def _derived(root: Path, **changes: Any) -> Path:
    """`root/0.0.1.post1` derived from the tiny set, its own hashes, `changes` on top."""
    tiny = yaml.safe_load((TINY / "series.yaml").read_text())
    raw: dict[str, Any] = {
        "release": "==0.0.1.post1",
        "package": "sglang",
        "base": "0.0.1",
        "patches": [{"name": p["name"], "files": p["files"]} for p in tiny["patches"]],
        **changes,
    }
    directory = root / "0.0.1.post1"
    directory.mkdir()
    (directory / "series.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return directory


def test_derived_set_takes_the_base_diffs_purposes_and_reviews(tmp_path: Path) -> None:
    base = load_patch_set(_base(tmp_path))
    derived = load_patch_set(_derived(tmp_path))
    assert (derived.name, derived.base, str(derived.release)) == (
        "0.0.1.post1",
        "0.0.1",
        "==0.0.1.post1",
    )
    assert derived.serves("0.0.1.post1") and not derived.serves("0.0.1")
    assert [(p.name, p.purpose, p.diff_path) for p in derived.patches] == [
        (p.name, p.purpose, p.diff_path) for p in base.patches
    ]
    assert derived.gates == base.gates


def test_derived_set_own_diff_and_reviews_come_after_the_base(tmp_path: Path) -> None:
    base_dir = _base(tmp_path)
    own_review = {**GATE, "disposition": "dflash-only", "reason": "changed in the post release"}
    directory = _derived(tmp_path, gates=[own_review])
    shutil.copy(base_dir / "0001-notes.patch", directory / "0001-notes.patch")
    derived = load_patch_set(directory)
    assert derived.patches[0].diff_path == directory / "0001-notes.patch"
    # the audit keys reviews by site, the later one winning: the derived set's own review
    assert [g.disposition for g in derived.gates] == [Disposition.widened, Disposition.dflash_only]


@pytest.mark.parametrize(
    ("changes", "phrase"),
    [
        ({"base": "0.0.9"}, "base '0.0.9' has no series.yaml beside this set"),
        ({"base": "../0.0.1"}, "must name another set's folder beside this one"),
        ({"base": "0.0.1.post1"}, "must name another set's folder beside this one"),
        ({"patches": []}, "must name base '0.0.1''s patches in its order"),
        ({"package": "vllm"}, "differs from base '0.0.1''s 'sglang'"),
        (
            {
                "patches": [
                    {
                        "name": "0001-notes.patch",
                        "files": [
                            {"path": "sglang/other.txt", "sha256_before": "a", "sha256_after": "b"}
                        ],
                    }
                ]
            },
            "must list base '0.0.1''s target files in order",
        ),
        ({"gates": [{**GATE, "disposition": "unreviewed"}]}, "is unreviewed"),
    ],
    ids=[
        "missing-base",
        "base-outside",
        "base-itself",
        "other-patches",
        "other-package",
        "other-files",
        "unreviewed-gate",
    ],
)
def test_derived_set_refusals_name_the_flaw(
    tmp_path: Path, changes: dict[str, Any], phrase: str
) -> None:
    _base(tmp_path)
    with pytest.raises(PatchSetError) as refused:
        load_patch_set(_derived(tmp_path, **changes))
    assert "0.0.1.post1/series.yaml is not a valid patch-set manifest" in str(refused.value)
    assert phrase in str(refused.value)


def test_a_base_that_is_itself_derived_is_refused(tmp_path: Path) -> None:
    """One level only: a chain of bases would hide which diffs a release really runs."""
    _base(tmp_path)
    _derived(tmp_path)
    second = tmp_path / "0.0.1.post2"
    second.mkdir()
    raw = yaml.safe_load((tmp_path / "0.0.1.post1" / "series.yaml").read_text())
    (second / "series.yaml").write_text(
        yaml.safe_dump({**raw, "release": "==0.0.1.post2", "base": "0.0.1.post1"})
    )
    with pytest.raises(
        PatchSetError, match=re.escape("is itself derived from '0.0.1'; name that set")
    ):
        load_patch_set(second)


# A line a set adds that imports the DDTree module (the thin sets' loaders).
_IMPORTS_MODULE = re.compile(r"^\+\s*from ddtree_kernels import sglang\b", re.M)


def test_every_set_that_loads_the_module_calls_the_api_the_shipped_kernels_provide() -> None:
    """A thin set's loader asks for the API its release was written for; the kernels built
    from this checkout must provide it, or every DDTREE start on such a host refuses."""
    from ddtree_kernels.sglang import API_VERSION

    calling = {}
    for patch_set in load_patch_sets():
        loads = any(_IMPORTS_MODULE.search(p.diff_path.read_text()) for p in patch_set.patches)
        assert loads == (patch_set.module_api() is not None), patch_set.name
        if loads:
            calling[patch_set.name] = patch_set.module_api()
    assert {"0.5.11", "0.5.14", "0.5.15.post1"} <= set(calling)  # a derived set: its base's diffs
    assert set(calling.values()) == {API_VERSION}
