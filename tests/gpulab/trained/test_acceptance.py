"""The acceptance walk on hand-made drafts: what a DFLASH server commits per verify step."""

from __future__ import annotations

from gpulab.trained.acceptance import PromptAcceptance, summary, walk


def test_walk_commits_accepted_drafts_plus_the_bonus() -> None:
    generated = [10, 11, 12, 13, 14, 15, 16, 17]
    drafts = {
        0: [11, 12, 99],  # anchor 10: accepts 11, 12; bonus 13 -> next anchor 13 (index 3)
        3: [99, 0, 0],  # anchor 13: accepts nothing; bonus 14 -> index 4
        4: [15, 16, 17],  # anchor 14: accepts all three -> index 7, the end
    }
    rows = [drafts.get(index, [0, 0, 0]) for index in range(len(generated))]
    assert walk(rows, generated) == [3, 1, 3]


def test_walk_cuts_the_last_step_at_the_end_of_the_answer() -> None:
    generated = [5, 6, 7]
    rows = [[6, 7, 8], [0, 0, 0], [0, 0, 0]]  # all drafts right, but only two tokens remain
    assert walk(rows, generated) == [2]


def test_summary_pools_tokens_over_steps() -> None:
    results = [PromptAcceptance("a", list(range(9)), 2), PromptAcceptance("b", [1, 2, 3], 2)]
    # (8 + 2) tokens after each prompt's first, over 4 steps
    assert summary(results)["mean_accept_len"] == 2.5
    assert summary(results)["per_prompt"] == {"a": 4.0, "b": 1.0}
