"""DFlash's training blocks, checked by hand: which keys a block sees, which labels it gets.

The rules are the ones SpecForge had wrong before its fixes (research doc, section 2): context by
position (strictly before the anchor), never by block index; same-position labels; and the mask
must make the training forward equal to SGLang-style single-block drafting.
"""

from __future__ import annotations

import pytest
import torch

from gpulab.trained.blocks import block_attention_mask, build_blocks, decay_weights, sample_anchors
from gpulab.trained.drafter import DraftConfig, Drafter

MASK_ID = 1


def test_block_mask_sees_context_before_its_anchor_and_its_own_block() -> None:
    anchors = torch.tensor([[3, 4]])  # overlapping blocks of 4: positions 3..6 and 4..7
    mask = block_attention_mask(anchors, context_len=8, block_size=4)[0]
    assert mask.shape == (8, 8 + 8)
    for query in range(8):
        block, anchor = query // 4, anchors[0, query // 4].item()
        context = [key for key in range(8) if mask[query, key]]
        own = [key - 8 for key in range(8, 16) if mask[query, key]]
        assert context == list(range(anchor)), (query, context)
        assert own == list(range(4 * block, 4 * block + 4)), (query, own)


def test_blocks_label_each_position_with_its_own_token() -> None:
    tokens = torch.arange(10, 30)[None]  # token at position p is 10 + p
    blocks = build_blocks(tokens, torch.tensor([[2, 17]]), block_size=4, mask_id=MASK_ID)
    assert blocks.ids.tolist() == [[12, MASK_ID, MASK_ID, MASK_ID, 27, MASK_ID, MASK_ID, MASK_ID]]
    assert blocks.positions.tolist() == [[2, 3, 4, 5, 17, 18, 19, 20]]
    assert blocks.labels[0, :7].tolist() == [12, 13, 14, 15, 27, 28, 29]
    # offset 0 has no label; position 20 lies past the sequence (length 20)
    assert blocks.weights.tolist() == [[0, 1, 1, 1, 0, 1, 1, 0]]


def test_blocks_weigh_labels_by_loss_mask_and_decay() -> None:
    tokens = torch.arange(12)[None]
    loss_mask = torch.tensor([[False] * 6 + [True] * 6])
    decay = decay_weights(4, gamma=2.0)
    blocks = build_blocks(tokens, torch.tensor([[4]]), 4, MASK_ID, loss_mask, decay)
    assert decay[0] == 0 and decay[1] == 1
    assert blocks.weights[0].tolist() == pytest.approx([0.0, 0.0, decay[2].item(), decay[3].item()])


def test_anchors_are_distinct_sorted_supervised_and_leave_room_for_a_block() -> None:
    loss_mask = torch.zeros(3, 40, dtype=torch.bool)
    loss_mask[:, 10:] = True
    generator = torch.Generator().manual_seed(0)
    anchors = sample_anchors(loss_mask, count=12, block_size=16, generator=generator)
    assert anchors.shape == (3, 12)
    for row in anchors.tolist():
        assert row == sorted(set(row))
        assert all(10 <= a <= 40 - 16 for a in row)


def test_anchors_fail_when_a_sequence_has_too_few_positions() -> None:
    loss_mask = torch.ones(1, 20, dtype=torch.bool)
    with pytest.raises(ValueError, match="5 anchor positions"):
        sample_anchors(loss_mask, count=6, block_size=16, generator=torch.Generator())


def test_training_forward_equals_single_block_drafting() -> None:
    """Blocks trained together must see what SGLang's one block sees: context < anchor only."""
    torch.manual_seed(0)
    config = DraftConfig(
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        intermediate_size=48,
        target_layer_ids=(1, 2),
        num_target_layers=4,
        block_size=4,
        mask_token_id=MASK_ID,
        vocab_size=50,
    )
    drafter = Drafter(config)
    drafter.init_weights(std=0.2)
    length = 20
    tokens = torch.randint(2, 50, (1, length))
    features, embed = torch.randn(1, length, 64), torch.randn(50, 32)
    anchors = torch.tensor([[5, 7, 12]])
    blocks = build_blocks(tokens, anchors, 4, MASK_ID)
    together = drafter(
        features, torch.arange(length)[None], embed[blocks.ids], blocks.positions, blocks.mask
    )
    for index, anchor in enumerate(anchors[0].tolist()):
        ids = torch.tensor([tokens[0, anchor].item(), MASK_ID, MASK_ID, MASK_ID])
        alone = drafter(
            features[:, :anchor],
            torch.arange(anchor)[None],
            embed[ids][None],
            torch.arange(anchor, anchor + 4)[None],
            torch.ones(1, 4, anchor + 4, dtype=torch.bool),
        )
        torch.testing.assert_close(together[0, 4 * index : 4 * index + 4], alone[0])
