"""The Python side of the kernels' CUDA path (`ops.py`'s wrappers, and `sglang.py`'s step
through them), run on CPU through the extension's double (cuda_double.py): the buffers the
wrappers hand the extension pass its checks and come back with the reference's values, and
what one DDTREE step dispatches from the host, counted (issue 22: on the GPU lab's machine a
dispatched call costs roughly 9 to 16 µs of host time, GPU lab run 18's bench over these
counts)."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ddtree_kernels import ops, reference


@pytest.mark.parametrize("bs", [1, 3])
def test_the_wrappers_cuda_path_gives_the_references_tree_walk_and_commit(
    cuda_path_on_cpu: TorchDispatchMode, bs: int
) -> None:
    g = torch.Generator().manual_seed(bs)
    logits = torch.randn(bs, 15, 512, generator=g)
    top = ops.topk_logprobs(logits, 4)
    want_top = reference.topk_logprobs(logits, 4)
    assert torch.equal(top.ids, want_top.ids)
    assert torch.allclose(top.logp, want_top.logp)
    roots = torch.randint(0, 512, (bs,), generator=g)
    prefix = torch.randint(5, 40, (bs,), generator=g)
    tree = ops.build_tree(top.logp, top.ids, roots, prefix, 15, int(prefix.sum()))
    want = reference.build_tree(want_top.logp, want_top.ids, roots, prefix, 15, int(prefix.sum()))
    for got, expected in zip(tree, want, strict=True):
        assert torch.equal(got, expected)
    target = torch.randint(0, 512, (bs, 16), generator=g)
    target[:, 0] = tree.tokens[:, 1]  # the root's child agrees: a path longer than the root
    walk = ops.verify_walk(tree.tokens, tree.parents, target, 15)
    for got, expected in zip(walk, reference.verify_walk(tree.tokens, tree.parents, target, 15),
                             strict=True):  # fmt: skip
        assert torch.equal(got, expected)
    rows = ops.path_rows(walk.accept_index, 16)
    assert torch.equal(rows, reference.path_rows(walk.accept_index, 16))
    prefix32 = prefix.int()  # SGLang's seq_lens may be int32: the outputs keep it
    accept = ops.walk_accept(tree.tokens, tree.parents, target, 15, prefix32)
    want_accept = reference.walk_accept(tree.tokens, tree.parents, target, 15, prefix32)
    for got, expected in zip(accept, want_accept, strict=True):
        assert torch.equal(got, expected)
        assert got.dtype == expected.dtype
    cache_loc = torch.arange(bs * 16).view(bs, 16) + 1000
    commit = ops.commit_indices(walk.accept_index, cache_loc, bs * 16 + 3)
    want_commit = reference.commit_indices(walk.accept_index, cache_loc, bs * 16 + 3)
    for got, expected in zip(commit, want_commit, strict=True):
        assert torch.equal(got, expected)


def test_a_dispatch_count_sees_each_kernel_op_once(cuda_path_on_cpu: TorchDispatchMode) -> None:
    logits = torch.randn(2, 5, 64)
    with cuda_path_on_cpu:
        ops.topk_logprobs(logits, 3)
    assert cuda_path_on_cpu.calls.count("ddtree.topk_logprobs") == 1
    assert not any("sort" in call for call in cuda_path_on_cpu.calls)  # the reference's, inside


# What one step dispatches through the CUDA path beyond the DFLASH stand-in's (bench_host.py),
# allocations and views included; negative: fewer. Issue 22: shadow_linear 8 and tree mode 45
# over, first; then 2 and 22 after no-op dtype casts were skipped, the draft head's rows kept
# their shape and outputs shared allocations; then -2 and 0 once each extension op allocated
# its own outputs (one call where an out= schema took one per buffer) and one commit kernel
# gave the KV moves and the hidden-row order (11 calls before); now -6 and -4, the walk's kernel
# writing DFlash's accept outputs (5 calls before). The tree step counts the worker-v2 sets' mask,
# sized from an upper bound of the prefix sum, since the kernel builds it (13 calls more before).
# Counted with grad mode off, as SGLang runs (under inference mode, -6 and -4: a few composite
# ops reach the counter whole there, as their parts under grad mode).
SHADOW_CALLS_OVER_DFLASH = -5
TREE_CALLS_OVER_DFLASH = -3


@pytest.mark.parametrize("bs", [1, 8])
def test_a_step_dispatches_few_calls_beyond_dflash(
    bench: ModuleType, cuda_path_on_cpu: TorchDispatchMode, bs: int
) -> None:
    """Each dispatched call is host time in a host-bound step (9 to 16 µs on the GPU lab's
    machine, run 18), so a change that adds calls to every step shows here first."""
    calls = {}
    with torch.no_grad():  # as SGLang's scheduler runs its loop by default (and bench_host.py)
        runs = bench.steps(bench.Inputs(bs, torch.device("cpu"), 64, 512))
        for name, run in runs.items():
            run()  # the first step builds the per-shape constants
            cuda_path_on_cpu.calls.clear()
            with cuda_path_on_cpu:
                run()
            calls[name] = list(cuda_path_on_cpu.calls)
    kernels = [c for c in calls["tree"] if c.startswith("ddtree.")]
    assert kernels == ["ddtree.topk_logprobs", "ddtree.build_tree", "ddtree.walk_accept",
                       "ddtree.commit_indices"]  # fmt: skip
    dflash = len(calls["dflash"])
    assert len(calls["shadow_linear"]) - dflash <= SHADOW_CALLS_OVER_DFLASH, calls["shadow_linear"]
    assert len(calls["tree"]) - dflash <= TREE_CALLS_OVER_DFLASH, calls["tree"]


def test_as_dtype_dispatches_only_a_real_conversion(cuda_path_on_cpu: TorchDispatchMode) -> None:
    t = torch.arange(3)
    with cuda_path_on_cpu:
        same = ops.as_dtype(t, torch.int64)
        other = ops.as_dtype(t, torch.int32)
    assert same is t
    assert other.dtype == torch.int32
    assert other.tolist() == [0, 1, 2]
    assert len(cuda_path_on_cpu.calls) == 1


def test_the_double_refuses_what_the_extension_refuses(cuda_path_on_cpu: TorchDispatchMode) -> None:
    """Its checks can fail: the extension's schema refuses output buffers (the ops allocate
    their own since issue 22's cut), and its input checks refuse a strided index and a wrong
    dtype, as `check_tensor` refuses them on the GPU."""
    accept_index = torch.tensor([[0, 1, -1]])
    cache_loc = torch.tensor([[5, 6, 7]])
    commit = torch.ops.ddtree.commit_indices(accept_index, cache_loc, 3)
    assert [t.tolist() for t in commit] == [[5, 6, 5], [5, 6, 5], [0, 1, 2]]
    buffers = [torch.empty(3, dtype=torch.int64) for _ in range(3)]
    with pytest.raises(RuntimeError, match="expected at most 3 argument"):
        torch.ops.ddtree.commit_indices(accept_index, cache_loc, 3, *buffers)
    strided = torch.tensor([[0, 9, 1, 9, -1, 9]])[:, ::2]  # [1, 3], every other element
    with pytest.raises(AssertionError, match="non-contiguous"):
        torch.ops.ddtree.commit_indices(strided, cache_loc, 3)
    with pytest.raises(AssertionError, match="dtype"):
        torch.ops.ddtree.commit_indices(accept_index, cache_loc.int(), 3)
