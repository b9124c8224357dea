"""Reference top-k log-probs: values, ordering, tie rule, dtypes."""

from __future__ import annotations

import pytest
import torch

from ddtree_kernels import reference


def test_topk_logprobs_matches_log_softmax_top_values() -> None:
    logits = torch.randn(4, 5, 300, generator=torch.Generator().manual_seed(0))
    got = reference.topk_logprobs(logits, 8)
    want = torch.log_softmax(logits, dim=-1).topk(8, dim=-1)
    assert got.logp.shape == (4, 5, 8)
    assert got.ids.dtype == torch.int64
    assert torch.equal(got.ids, want.indices)  # random floats: no ties
    torch.testing.assert_close(got.logp, want.values, rtol=1e-6, atol=1e-6)


def test_topk_logprobs_breaks_ties_to_smaller_id() -> None:
    logits = torch.tensor([[0.0, 2.0, 1.0, 2.0, 1.0, 2.0]])
    got = reference.topk_logprobs(logits, 4)
    assert got.ids.tolist() == [[1, 3, 5, 2]]
    log_z = torch.logsumexp(logits, dim=-1)
    torch.testing.assert_close(got.logp, (logits[:, [1, 3, 5, 2]] - log_z))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_topk_logprobs_reads_half_precision_as_exact_fp32(dtype: torch.dtype) -> None:
    logits = torch.randn(3, 1000, generator=torch.Generator().manual_seed(1)).to(dtype)
    got = reference.topk_logprobs(logits, 5)
    want = reference.topk_logprobs(logits.float(), 5)
    assert got.logp.dtype == torch.float32
    assert torch.equal(got.ids, want.ids)
    assert torch.equal(got.logp, want.logp)


def test_topk_logprobs_rejects_k_above_vocab() -> None:
    with pytest.raises(ValueError, match="vocab"):
        reference.topk_logprobs(torch.zeros(1, 3), 4)
