"""What every release's verify-path check script shares (v0511/checks.py, v0514, v0523).

It runs inside a release's staging venv (torch and the standard library only, nothing of
SGLang), found through PYTHONPATH (the conftest puts this folder there): the check registry, one
fork per check with one `@@JSON@@` line each, the TP-group test double and SGLang's conv
kernel along tree links against a by-hand reference.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import traceback
from collections.abc import Callable

import torch

MARK = "@@JSON@@"
CHECKS: dict[str, Callable[[], dict]] = {}


def check(fn: Callable[[], dict]) -> Callable[[], dict]:
    CHECKS[fn.__name__] = fn
    return fn


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(torch.equal(a, b))


class Group:
    """TEST DOUBLE for a TP group: `size` ranks, one thread each; all_gather_into_tensor
    concatenates along dim 0."""

    def __init__(self, size: int) -> None:
        self.world_size = size
        self._barrier = threading.Barrier(size)
        self._parts: list = [None] * size
        self._rank = threading.local()

    def all_gather_into_tensor(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        self._parts[self._rank.value] = inp.clone()
        self._barrier.wait()
        out.copy_(torch.cat(self._parts, dim=0).view_as(out))
        self._barrier.wait()

    def run(self, fn: Callable[[int], object]) -> list:
        """fn(rank) on every rank in its own thread; the per-rank results."""
        results: list = [None] * self.world_size
        errors: list = []

        def body(rank: int) -> None:
            self._rank.value = rank
            try:
                results[rank] = fn(rank)
            except BaseException as e:  # surfaced below
                errors.append(e)
                self._barrier.abort()

        threads = [threading.Thread(target=body, args=(r,)) for r in range(self.world_size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return results


def _ancestor_conv(x, state, weight, parents):
    """Causal conv of every node over its own path (conv state, root ... node), by hand."""
    width = weight.shape[1]
    out = torch.empty_like(x)
    for b in range(x.shape[0]):
        for i in range(x.shape[2]):
            path, j = [], i
            while j != -1:
                path.append(j)
                j = int(parents[b][j])
            seq = torch.cat([state[b], x[b][:, path[::-1]]], dim=1)
            out[b, :, i] = (seq[:, -width:] * weight).sum(1)
    return out


def conv_over_tree_links(conv_update, links, parents: torch.Tensor, nodes: int) -> dict:
    """SGLang's causal conv kernel `conv_update` fed a verify's tree links (`links`: its
    retrieve_next_token / retrieve_next_sibling), against the by-hand conv of every node over
    its ancestors: the parents it found, equal outputs on the `nodes` real nodes, and a tree
    whose answer differs from the chain's (so following the links is what made it equal)."""
    bs, width = parents.shape
    g = torch.Generator().manual_seed(3)
    x = torch.randn(bs, 8, width, generator=g)
    state = torch.randn(bs, 8, 3, generator=g)
    weight = torch.randn(8, 4, generator=g)
    parent_found = torch.empty(bs, width, dtype=torch.int64)
    conv = conv_update(
        x.clone(), state.clone(), weight,
        retrieve_next_token=links.retrieve_next_token,
        retrieve_next_sibling=links.retrieve_next_sibling,
        retrieve_parent_token=parent_found,
    )  # fmt: skip
    rows = parents.tolist()
    real = torch.tensor([[p != -1 or i == 0 for i, p in enumerate(row)] for row in rows])
    want = _ancestor_conv(x, state, weight, rows)
    chain = _ancestor_conv(x, state, weight, [[i - 1 for i in range(width)]] * bs)
    return {
        "parents_found": same(parent_found[:, 1:][real[:, 1:]], parents[:, 1:][real[:, 1:]])
        and int(real.sum()) == bs * nodes,
        "conv_follows_tree": torch.allclose(conv[..., :nodes], want[..., :nodes], atol=1e-5),
        "tree_differs_from_chain": not torch.allclose(
            want[..., :nodes], chain[..., :nodes], atol=1e-5
        ),
    }


def _result(name: str) -> dict:
    try:
        return {"ok": True, **CHECKS[name]()}
    except Exception as e:  # the test prints this
        return {"ok": False, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}


def run_forked(names: list[str]) -> None:
    """Each check in its own fork of this interpreter (SGLang and torch imported once): one
    `@@JSON@@ {"name": ..., "ok": ...}` line per check, even for one whose process dies."""
    for name in names:
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            sys.stdout.write(MARK + json.dumps({"name": name, **_result(name)}) + "\n")
            sys.stdout.flush()
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        if status:
            died = {"name": name, "ok": False, "error": f"the check's process exited {status}"}
            print(MARK + json.dumps(died), flush=True)


def main(argv: list[str]) -> None:
    """`python checks_X.py NAME... | all`."""
    run_forked(sorted(CHECKS) if argv == ["all"] else argv)
