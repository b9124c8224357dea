"""The corpus split: by file, by a hash of its path, the same on every run and disjoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulab.trained.corpus import CorpusError, is_held_out, load_corpus, source_files
from gpulab.trained.sizes import DEFAULT, TOY, Sizes


def _tree(root: Path, files: int, size: int) -> None:
    for index in range(files):
        path = root / f"pkg{index % 3}" / f"mod{index}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {index}\n" + "x = 1\n" * (size // 6))
    for skipped in ("test/t.py", "idlelib/i.py", "site-packages/s.py", "pkg0/tests/t.py"):
        (root / skipped).parent.mkdir(parents=True, exist_ok=True)
        (root / skipped).write_text("skipped = True\n")


def test_split_is_deterministic_disjoint_and_skips_tests(tmp_path: Path) -> None:
    _tree(tmp_path, files=200, size=600)
    first = load_corpus(tmp_path, min_bytes=1000)
    second = load_corpus(tmp_path, min_bytes=1000)
    assert first == second
    train = {doc.name for doc in first.train}
    held = {doc.name for doc in first.held_out}
    assert train.isdisjoint(held) and held and train
    assert train | held == set(source_files(tmp_path))
    assert all(is_held_out(name) for name in held)
    assert not any(
        "test" in name or "site-packages" in name or "idlelib" in name for name in train | held
    )


def test_too_little_source_fails_with_one_sentence(tmp_path: Path) -> None:
    _tree(tmp_path, files=3, size=60)
    with pytest.raises(CorpusError, match=r"^Only [\d,]+ bytes of Python source under .*needed"):
        load_corpus(tmp_path, min_bytes=5_000_000)


@pytest.mark.parametrize("preset", [DEFAULT, TOY], ids=["default", "toy"])
def test_presets_keep_prompt_and_answer_within_the_trained_length(preset: Sizes) -> None:
    assert preset.prompt_tokens[1] + preset.max_new_tokens <= preset.seq_len
    assert preset.greedy_prompt_len + preset.block_size < preset.seq_len
    assert list(preset.target_layer_ids) == sorted(set(preset.target_layer_ids))
    assert preset.target_layer_ids[-1] <= preset.num_layers - 2
