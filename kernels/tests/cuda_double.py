"""TEST DOUBLE for the CUDA extension on a machine without a GPU: `torch.ops.ddtree`'s ops,
registered from the extension's own schemas (read out of csrc/ops.cpp) with CPU kernels that make
the extension's input checks (device, dtype, shape, contiguity: `check_tensor` in
csrc/common.cuh) and return the torch reference's values. So the Python wrappers' CUDA path in
`ops.py` runs, and is counted, on CPU, and a wrapper that passes what the schema does not declare
fails here, as it would on the GPU. It says nothing of the kernels themselves (test_cuda_ops.py
compares those on the GPU).

Each op counts as one dispatched call (bench_host.py's `Dispatched`), as on the GPU, where it is
one custom op: torch runs an op's kernel, here the reference, outside the dispatch mode.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from ddtree_kernels import _extension, ops, reference

OPS_CPP = Path(__file__).resolve().parents[1] / "csrc" / "ops.cpp"


def extension_schemas(source: str) -> dict[str, str]:
    """Each `m.def(...)` of ops.cpp's TORCH_LIBRARY block, by op name: its string literals
    joined, as the C++ compiler joins adjacent ones."""
    schemas = {}
    for call in re.findall(r"m\.def\((.*?)\);", source, flags=re.DOTALL):
        schema = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', call))
        schemas[schema.split("(", 1)[0]] = schema
    return schemas


def _check_tensor(
    t: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...], device: torch.device
) -> None:
    """The extension's `check_tensor` (`device`: the op's first input's)."""
    assert t.device == device, f"extension refuses a tensor on {t.device}, wants {device}"
    assert t.dtype == dtype, f"extension refuses dtype {t.dtype}, wants {dtype}"
    assert tuple(t.shape) == shape, f"extension refuses shape {tuple(t.shape)}, wants {shape}"
    assert t.is_contiguous(), "extension refuses a non-contiguous tensor"


def _topk_logprobs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    assert logits.reshape(-1, logits.shape[-1]).stride(1) == 1, (
        "extension refuses logits whose rows are not contiguous"
    )
    assert 1 <= k <= min(16, logits.shape[-1]), "extension refuses k outside [1, min(16, V)]"
    return tuple(reference.topk_logprobs(logits, k))


def _build_tree(
    logp: torch.Tensor,
    ids: torch.Tensor,
    root_tokens: torch.Tensor,
    prefix_lens: torch.Tensor,
    budget: int,
    mask_numel: int,
) -> tuple[torch.Tensor, ...]:
    assert logp.dim() == 3, "extension refuses logp that is not [B, L, K]"
    _check_tensor(logp, torch.float32, tuple(logp.shape), logp.device)
    _check_tensor(ids, torch.int64, tuple(logp.shape), logp.device)
    batch = logp.shape[0]
    for t in (root_tokens, prefix_lens):
        _check_tensor(t, torch.int64, (batch,), logp.device)
    prefix_sum = None  # the host's sum, or an upper bound, the wrapper sized the mask from
    if mask_numel:
        n = budget + 1
        prefix_sum, rest = divmod(mask_numel - batch * n * n, n)
        assert rest == 0, "mask_numel is no custom_mask_numel"
        assert prefix_sum >= int(prefix_lens.sum()), "mask_numel below the prefix lengths' sum"
    return tuple(reference.build_tree(logp, ids, root_tokens, prefix_lens, budget, prefix_sum))


def _check_walk_inputs(
    tokens: torch.Tensor, parents: torch.Tensor, target: torch.Tensor, width: int
) -> None:
    """The extension's `check_walk_inputs`, which both walk ops make."""
    batch, n = tokens.shape
    for t in (tokens, parents, target):
        _check_tensor(t, torch.int64, (batch, n), tokens.device)
    assert width >= 1, "extension refuses a walk narrower than the root"


def _verify_walk(
    tokens: torch.Tensor, parents: torch.Tensor, target: torch.Tensor, width: int
) -> tuple[torch.Tensor, ...]:
    _check_walk_inputs(tokens, parents, target, width)
    return tuple(reference.verify_walk(tokens, parents, target, width - 1))


def _walk_accept(
    tokens: torch.Tensor,
    parents: torch.Tensor,
    target: torch.Tensor,
    prefix_lens: torch.Tensor,
    width: int,
) -> tuple[torch.Tensor, ...]:
    _check_walk_inputs(tokens, parents, target, width)
    assert prefix_lens.dtype in (torch.int32, torch.int64), "extension refuses prefix_lens' dtype"
    _check_tensor(prefix_lens, prefix_lens.dtype, (tokens.shape[0],), tokens.device)
    return tuple(reference.walk_accept(tokens, parents, target, width - 1, prefix_lens))


def _commit_indices(
    accept_index: torch.Tensor, cache_loc: torch.Tensor, rows: int
) -> tuple[torch.Tensor, ...]:
    _check_tensor(accept_index, torch.int64, tuple(accept_index.shape), accept_index.device)
    _check_tensor(cache_loc, torch.int64, tuple(cache_loc.shape), accept_index.device)
    return tuple(reference.commit_indices(accept_index, cache_loc, rows))


def _path_rows(accept_index: torch.Tensor, width: int) -> torch.Tensor:
    _check_tensor(accept_index, torch.int64, tuple(accept_index.shape), accept_index.device)
    assert accept_index.dim() == 2, "extension refuses accept_index that is not [B, A]"
    assert accept_index.shape[1] <= width, "extension refuses a path wider than the window"
    return reference.path_rows(accept_index, width)


def _sample_tokens(
    logits: torch.Tensor, temperatures: torch.Tensor, uniforms: torch.Tensor
) -> torch.Tensor:
    assert logits.dim() == 2, "extension refuses logits that are not [R, V]"
    assert logits.stride(1) == 1, "extension refuses logits whose rows are not contiguous"
    for t in (temperatures, uniforms):
        _check_tensor(t, torch.float32, (logits.shape[0],), logits.device)
    return reference.sample_tokens(logits, temperatures, uniforms)


OPS: dict[str, Callable[..., object]] = {
    "topk_logprobs": _topk_logprobs,
    "build_tree": _build_tree,
    "verify_walk": _verify_walk,
    "walk_accept": _walk_accept,
    "commit_indices": _commit_indices,
    "path_rows": _path_rows,
    "sample_tokens": _sample_tokens,
}

_library: list[torch.library.Library] = []  # registered once per process, kept alive here


def _register() -> None:
    """Define `torch.ops.ddtree.*` from ops.cpp's schemas, with the double's CPU kernels."""
    if _library:
        return
    schemas = extension_schemas(OPS_CPP.read_text())
    assert set(schemas) == set(OPS), f"ops.cpp defines {sorted(schemas)}, the double {sorted(OPS)}"
    library = torch.library.Library("ddtree", "DEF")
    for name, kernel in OPS.items():
        library.define(schemas[name])
        library.impl(name, kernel, "CPU")
    _library.append(library)


def install(monkeypatch: pytest.MonkeyPatch) -> None:
    """Route `ops`' CUDA path for every tensor through the double (the routing undone with
    `monkeypatch`); skip where the real extension is built, whose `ddtree` library the double's
    would collide with (its ops are test_cuda_ops.py's there)."""
    if _extension.is_built():
        pytest.skip("the CUDA extension is built here: test_cuda_ops.py runs its ops")
    _register()
    monkeypatch.setattr(ops, "backend_for", lambda tensor: ops.Backend.CUDA)
