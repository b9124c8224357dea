"""What one DDTREE verify step submits from the host, beside what DFLASH submits in its place.

Issue 22: at batch 1 an 8B target's step is host-bound (GPU lab run 15: 10.8 ms of host work
against 5.3 ms of GPU under the profiler), so the host time of DDTree's hooks is what it costs
there, and GPU lab run 17 still measured shadow_linear 0.3-0.45 ms a step over DFLASH. This
times `ddtree_kernels.sglang`'s step on its own, with no server around it:

- dflash: what DFLASH runs where DDTree's hooks sit: the draft head's greedy chain, and its
  accept (the target's argmax, the longest agreeing prefix, the bonus token), written here from
  DFlash's greedy rule (a stand-in for SGLang's code, which this package does not import).
- shadow_linear: the same greedy chain, then the module's step (`Verifier.step`, the verify
  input's fields, `accept`, `commit`), as the worker-v2 sets call it.
- tree: the module's `propose` (top-k over the head, tree build), then the same step, its commit
  moving the path's KV through a stand-in pool (one index copy where SGLang runs one kernel).

Per step it reports the host time to submit (wall clock; the device is kept busy first, so no
op waits for it and a read-back shows as milliseconds of host time), the ops it dispatches
(every call through torch's dispatcher: aten ops, allocations, views and the kernels' own ops;
host time per dispatched op says whether a cut should remove calls or make them cheaper) and
the device time of the submitted work (CUDA events, the ops queued back to back, so no host gap
inside), median with [p20-p80]. `--device cpu` runs the same calls on the torch reference, to
check the script, not to time or count anything.

Run it with a Python whose ddtree_kernels has the CUDA extension: on the GPU lab, after a
`run.py` call, the venv `action=build-kernels` installed it into (`/tmp/ddtree-lab/venv/bin/python
kernels/benchmarks/bench_host.py`, with `--reuse` on a warm machine).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from types import SimpleNamespace

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ddtree_kernels import _extension
from ddtree_kernels import sglang as S

# Qwen3-8B's head and KV layout, DFlash's block of 16, budget 15 at top-k 4 (the lab's cells).
HIDDEN, VOCAB, BLOCK, BUDGET, TOPK = 4096, 151_936, 16, 15, 4
KV_ROW = 36 * 2 * 8 * 128  # layers x (K, V) x KV heads x head dim, bf16 per slot
PREFIX = 1200  # tokens already in each request's context
BUSY_CYCLES = 20_000_000  # about 10 ms of device spin: longer than any step's host submission


def dflash_accept(chain: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """DFlash's greedy rule: accept drafts while chain[:, 1:] equals the target's choice one
    position earlier; the bonus is the target's token after the last accepted one."""
    agree = (chain[:, 1:] == target[:, :-1]).to(torch.int32)
    accepted = torch.cumprod(agree, dim=1).sum(dim=1)
    return accepted, target.gather(1, accepted.unsqueeze(1).to(torch.int64)).squeeze(1)


class Inputs:
    """One decode step's drafter output, target logits and KV slots, at batch `bs`."""

    def __init__(self, bs: int, device: torch.device, hidden: int, vocab: int) -> None:
        g = torch.Generator(device="cpu").manual_seed(bs)
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        self.bs = bs
        self.draft_hidden = torch.randn(bs, BLOCK, hidden, generator=g).to(device, dtype)
        self.head = SimpleNamespace(
            weight=(torch.randn(vocab, hidden, generator=g) / 30).to(device, dtype)
        )
        self.logits = torch.randn(bs * BLOCK, vocab, generator=g).to(device, dtype)
        self.hidden_rows = torch.randn(bs * BLOCK, hidden, generator=g).to(device, dtype)
        self.prefix = torch.full((bs,), PREFIX, dtype=torch.int64, device=device)
        self.prefix_cpu = self.prefix.cpu()
        self.roots = torch.randint(0, vocab, (bs,), generator=g).to(device)
        slots = PREFIX + BLOCK
        self.req_to_token = torch.arange(bs * slots, device=device).view(bs, slots)
        self.block_cache_loc = self.req_to_token[:, PREFIX:].contiguous()
        self.req_pool_indices = torch.arange(bs, device=device)
        self.pool = torch.zeros(bs * slots, KV_ROW if device.type == "cuda" else 8,
                                dtype=dtype, device=device)  # fmt: skip

    def move_kv_cache(self, target: torch.Tensor, source: torch.Tensor) -> None:
        self.pool[target] = self.pool[source]  # TEST DOUBLE for SGLang's KV pool move

    def greedy_chain(self) -> torch.Tensor:
        """DFLASH's draft: the head's argmax at each drafted position, the root first."""
        rows = self.draft_hidden[:, 1:, :].reshape(-1, self.draft_hidden.shape[-1])
        drafts = torch.argmax(rows @ self.head.weight.T, dim=-1).view(self.bs, BLOCK - 1)
        return torch.cat([self.roots.unsqueeze(1), drafts], dim=1)


def steps(x: Inputs) -> dict[str, Callable[[], object]]:
    """Each server's step over `x`, from the drafter's hidden states to the committed path."""
    shadow = S.Verifier(S.Settings("shadow_linear", BLOCK - 1, 1, BLOCK), BLOCK)
    tree = S.Verifier(S.Settings("tree", BUDGET, TOPK, BLOCK), BLOCK)
    # The worker-v2 sets' host sum under overlap scheduling: the committed lengths plus a block,
    # an upper bound that sizes the tree's mask.
    host_sum = S.host_prefix_sum(x.prefix, (x.prefix_cpu, int(x.prefix_cpu.sum()) + x.bs * BLOCK))

    def dflash() -> object:
        chain = x.greedy_chain()
        target = torch.argmax(x.logits, dim=-1).view(x.bs, BLOCK)
        return dflash_accept(chain, target)

    def through(verifier: S.Verifier, proposed: S.Tree | None, chain: torch.Tensor) -> object:
        step = verifier.step(tree=proposed, draft_tokens=chain, prefix_lens=x.prefix,
                             block_cache_loc=x.block_cache_loc, req_to_token=x.req_to_token,
                             req_pool_indices=x.req_pool_indices)  # fmt: skip
        step.verify_input(SimpleNamespace)
        accepted = step.accept(x.logits)
        step.commit(x.move_kv_cache, x.hidden_rows)
        return accepted

    def shadow_linear() -> object:
        return through(shadow, None, x.greedy_chain())

    def tree_mode() -> object:
        proposed = tree.propose(draft_hidden=x.draft_hidden, lm_head=x.head, root_tokens=x.roots,
                                prefix_lens=x.prefix, host_sum=host_sum, tp_group=None)  # fmt: skip
        return through(tree, proposed, proposed.tokens)

    return {"dflash": dflash, "shadow_linear": shadow_linear, "tree": tree_mode}


def quantiles(samples: list[float]) -> str:
    """Median [p20-p80] of `samples` (microseconds)."""
    if len(samples) < 2:
        return f"{samples[0]:.1f}"
    q = statistics.quantiles(samples, n=10, method="inclusive")
    return f"{statistics.median(samples):.1f} [{q[1]:.1f}-{q[7]:.1f}]"


class Dispatched(TorchDispatchMode):
    """The calls that reach torch's dispatcher, by name: each is host work in the step (an
    extension op is one call; what its kernel does inside is not dispatched)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        self.calls.append(str(func).removesuffix(".default"))
        return func(*args, **(kwargs or {}))


def dispatched_ops(run: Callable[[], object]) -> int:
    """The ops one step of `run` dispatches, after a step that builds its per-shape constants."""
    run()
    with Dispatched() as counter:
        run()
    return len(counter.calls)


def time_step(run: Callable[[], object], reps: int, cuda: bool) -> tuple[list[float], list[float]]:
    """Host and device microseconds of `reps` steps, after two warm-up steps (the module builds
    its per-shape constants on the first)."""
    host, device = [], []
    for rep in range(reps + 2):
        if cuda:
            torch.cuda.synchronize()
            torch.cuda._sleep(BUSY_CYCLES)  # the device busy: nothing below waits for it
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        began = time.perf_counter()
        run()
        took = (time.perf_counter() - began) * 1e6
        if cuda:
            end.record()
            end.synchronize()
        if rep >= 2:
            host.append(took)
            if cuda:
                device.append(start.elapsed_time(end) * 1e3)
    return host, device


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--hidden", type=int, default=HIDDEN)
    parser.add_argument("--vocab", type=int, default=VOCAB)
    args = parser.parse_args(argv)
    cuda = args.device == "cuda"
    if cuda and not (torch.cuda.is_available() and _extension.is_loaded()):
        print("bench_host: no CUDA device with the ddtree extension here; "
              "run it on the GPU machine, or give --device cpu to check the script.")  # fmt: skip
        return 2
    device = torch.device(args.device)
    where = torch.cuda.get_device_name() if cuda else "CPU (reference ops: not a timing)"
    print(f"{where}, torch {torch.__version__}, hidden {args.hidden}, vocab {args.vocab}, "
          f"block {BLOCK}, budget {BUDGET}, top-k {TOPK}, {args.reps} steps each\n")  # fmt: skip
    print("| batch | server | host µs to submit | over DFLASH µs | ops dispatched | device µs |")
    print("|---|---|---|---|---|---|")
    # Grad mode off, not inference mode: SGLang's scheduler runs its loop under DynamicGradMode,
    # which is torch.no_grad unless SGLANG_ENABLE_TORCH_INFERENCE_MODE is set (it is off by
    # default in every release served), so each op pays autograd's dispatch layer there too.
    with torch.no_grad():
        for bs in (int(b) for b in args.batches.split(",") if b):
            runs = steps(Inputs(bs, device, args.hidden, args.vocab))
            timed = {name: time_step(run, args.reps, cuda) for name, run in runs.items()}
            counted = {name: dispatched_ops(run) for name, run in runs.items()}
            base = statistics.median(timed["dflash"][0])
            for name, (host, dev) in timed.items():
                over = statistics.median(host) - base
                print(f"| {bs} | {name} | {quantiles(host)} | {over:+.1f} | {counted[name]} "
                      f"| {quantiles(dev) if dev else '-'} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
