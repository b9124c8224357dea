"""Benchmark the DDTree ops on one GPU against a reference-style path and the bandwidth floor.

Run: `PYTHONPATH=kernels python kernels/benchmarks/bench_ops.py` (needs the CUDA extension).
It first checks the CUDA ops against `ddtree_kernels.reference` and exits 1 on any mismatch, then
prints Markdown tables. GPU stages are timed with CUDA events around CUDA-graph replays, each
preceded by a 256 MB write that evicts L2 (cold cache); host-side stages (the reference-style tree
build and walk, which copy to the host) are timed with a wall clock after synchronising. Each cell
is the median with [p20-p80] over the repetitions.
"""

from __future__ import annotations

import argparse
import heapq
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ddtree_kernels import _extension, ops, reference

MAX_DEPTH = 15  # DFlash block size 16
ANCHOR_TOPK_MS = {151_936: (2.43, 1.43), 248_320: (3.80, 2.21)}  # fp32-cast, bf16; batch 48, K 8
ANCHOR_TREE_MS = {64: 4.45, 128: 10.2}  # batch 48, K 8
ANCHOR_FLOOR_MS = {151_936: 0.051, 248_320: 0.084}  # at 4.25 TB/s


@dataclass(frozen=True)
class Stat:
    """Median and 20th/80th percentiles of a timing, in milliseconds."""

    med: float
    p20: float
    p80: float

    @classmethod
    def of(cls, samples: list[float]) -> Stat:
        q = statistics.quantiles(samples, n=10, method="inclusive")
        return cls(statistics.median(samples), q[1], q[7])

    def us(self) -> str:
        return f"{self.med * 1e3:.1f} [{self.p20 * 1e3:.1f}-{self.p80 * 1e3:.1f}]"

    def ms(self) -> str:
        return f"{self.med:.3f} [{self.p20:.3f}-{self.p80:.3f}]"


class Timer:
    """Cold-L2 GPU timing of CUDA-graph replays, and wall-clock timing of host-side paths."""

    def __init__(self, reps: int) -> None:
        self.reps = reps
        self.flush_buf = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")

    def flush(self) -> None:
        self.flush_buf.fill_(1)

    def gpu(self, fn: Callable[[], object]) -> Stat:
        """Capture `fn` in a graph, then time replays (each after an L2 flush) with events."""
        fn()  # warm-up: lazy init and workspace allocation outside capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        for _ in range(3):
            graph.replay()
        samples = []
        for _ in range(self.reps):
            self.flush()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
        return Stat.of(samples)

    def gpu_eager(self, fn: Callable[[], object]) -> Stat:
        """Event timing of eager torch code (cold L2), for the reference-style GPU stages."""
        fn()
        samples = []
        for _ in range(self.reps):
            self.flush()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
        return Stat.of(samples)

    def host(self, fn: Callable[[], object]) -> Stat:
        """Wall-clock timing of a path that synchronises with the host itself."""
        fn()
        samples = []
        for _ in range(self.reps):
            self.flush()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            samples.append((time.perf_counter() - t0) * 1e3)
        return Stat.of(samples)


# ---- the reference-style path (what serving ports do today): host copies and Python heaps ----


def style_topk(logits: torch.Tensor, k: int, cast: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.topk + torch.logsumexp, with the fp32 cast (or straight on bf16)."""
    x = logits.float() if cast else logits
    top = torch.topk(x, k, dim=-1)
    return top.values.float() - torch.logsumexp(x, dim=-1, keepdim=True).float(), top.indices


def style_tree(
    logp: torch.Tensor, ids: torch.Tensor, roots: torch.Tensor, prefix: torch.Tensor, budget: int
) -> tuple[torch.Tensor, ...]:
    """Copy top-k to the host, run a heapq best-first per request, build masks, copy back."""
    lp, tok, root_list = logp.cpu().tolist(), ids.cpu().tolist(), roots.cpu().tolist()
    batch, n = len(lp), budget + 1
    tokens = [[0] * n for _ in range(batch)]
    positions = [[0] * n for _ in range(batch)]
    vis = [[[False] * n for _ in range(n)] for _ in range(batch)]
    pre = prefix.cpu().tolist()
    for b in range(batch):
        tokens[b][0] = root_list[b]
        positions[b][0] = pre[b]
        vis[b][0][0] = True
        heap = [(-lp[b][0][0], (0,), 0, 1, 0)]
        scores = [0.0] * n
        count = 1
        while heap and count <= budget:
            neg, path, parent, depth, rank = heapq.heappop(heap)
            i = count
            count += 1
            scores[i] = -neg
            tokens[b][i] = tok[b][depth - 1][rank]
            positions[b][i] = pre[b] + depth
            row = vis[b][i]
            row[:i] = vis[b][parent][:i]
            row[i] = True
            if rank + 1 < len(lp[b][0]):
                sib = scores[parent] + lp[b][depth - 1][rank + 1]
                heapq.heappush(heap, (-sib, (*path[:-1], rank + 1), parent, depth, rank + 1))
            if depth < len(lp[b]):
                heapq.heappush(heap, (-(scores[i] + lp[b][depth][0]), (*path, 0), i, depth + 1, 0))
    dev = logp.device
    return (
        torch.tensor(tokens).to(dev),
        torch.tensor(positions).to(dev),
        torch.tensor(vis).to(dev),
    )


def style_walk_commit(
    tokens: torch.Tensor, parents: torch.Tensor, target: torch.Tensor, cache_loc: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """Copy the tree and the target's tokens to the host, walk child maps in Python, copy back."""
    tok, par, tgt = tokens.cpu().tolist(), parents.cpu().tolist(), target.cpu().tolist()
    paths = []
    for b in range(len(tok)):
        children: dict[tuple[int, int], int] = {}
        for i in range(1, len(tok[b])):
            if par[b][i] >= 0:
                children.setdefault((par[b][i], tok[b][i]), i)
        cur, path = 0, [0]
        while (cur, tgt[b][cur]) in children:
            cur = children[(cur, tgt[b][cur])]
            path.append(cur)
        paths.append(path + [-1] * (MAX_DEPTH + 1 - len(path)))
    accept = torch.tensor(paths, device=tokens.device)
    keep = accept >= 0
    src = torch.where(keep, cache_loc.gather(1, accept.clamp(min=0)), -1)
    return accept, src


# ---- the benchmark ----


def make_target(
    tree_tokens: torch.Tensor, next_token: torch.Tensor, gen: torch.Generator
) -> torch.Tensor:
    """Target tokens that follow the draft's best child 70% of the time (realistic acceptance)."""
    follow = torch.rand(next_token.shape, device="cuda", generator=gen) < 0.7
    child_tok = tree_tokens.gather(1, next_token.clamp(min=0))
    return torch.where(follow & (next_token >= 0), child_tok, 10**6)


def check_against_reference(gen: torch.Generator) -> list[str]:
    """CUDA vs reference on one production-sized step; returns the mismatching outputs."""
    batch, vocab, k, budget = 48, 151_936, 8, 64
    logits = torch.randn(batch, MAX_DEPTH, vocab, device="cuda", generator=gen).bfloat16() * 4
    bad = []
    got, want = ops.topk_logprobs(logits, k), reference.topk_logprobs(logits, k)
    if not torch.equal(got.ids, want.ids):
        bad.append("topk ids")
    if not torch.allclose(got.logp, want.logp, rtol=1e-5, atol=2e-5):
        bad.append("topk logp")
    roots = torch.randint(0, vocab, (batch,), device="cuda", generator=gen)
    prefix = torch.randint(512, 2048, (batch,), device="cuda", generator=gen)
    total = int(prefix.sum())
    tree = ops.build_tree(want.logp, want.ids, roots, prefix, budget, total)
    ref_tree = reference.build_tree(want.logp, want.ids, roots, prefix, budget, total)
    bad += [f"tree {f}" for f, a, b in zip(tree._fields, tree, ref_tree, strict=True)
            if not torch.equal(a, b)]  # fmt: skip
    target = make_target(tree.tokens, tree.retrieve_next_token, gen)
    walk = ops.verify_walk(tree.tokens, tree.parents, target, MAX_DEPTH)
    ref_walk = reference.verify_walk(tree.tokens, tree.parents, target, MAX_DEPTH)
    bad += [f"walk {f}" for f, a, b in zip(walk._fields, walk, ref_walk, strict=True)
            if not torch.equal(a, b)]  # fmt: skip
    cache_loc = torch.arange(batch * (budget + 1), device="cuda").view(batch, -1)
    commit = ops.commit_indices(walk.accept_index, cache_loc, cache_loc.numel())
    ref_commit = reference.commit_indices(ref_walk.accept_index, cache_loc, cache_loc.numel())
    bad += [f"commit {f}" for f, a, b in zip(commit._fields, commit, ref_commit, strict=True)
            if not torch.equal(a, b)]  # fmt: skip
    return bad


@dataclass(frozen=True)
class StepInputs:
    """One decode step's drafter output and request state."""

    logits: torch.Tensor  # [B, L, V] bf16
    roots: torch.Tensor
    prefix: torch.Tensor
    prefix_sum: int

    @classmethod
    def random(cls, batch: int, vocab: int, gen: torch.Generator) -> StepInputs:
        logits = torch.randn(batch, MAX_DEPTH, vocab, device="cuda", generator=gen)
        prefix = torch.randint(512, 2048, (batch,), device="cuda", generator=gen)
        return cls(
            logits=(logits * 4).bfloat16(),
            roots=torch.randint(0, vocab, (batch,), device="cuda", generator=gen),
            prefix=prefix,
            prefix_sum=int(prefix.sum()),
        )


def bench_topk(timer: Timer, logits: torch.Tensor, k: int) -> tuple[Stat, Stat, Stat]:
    """Reference-style top-k + logZ (fp32 cast, bf16) and ours."""
    return (
        timer.gpu_eager(lambda: style_topk(logits, k, cast=True)),
        timer.gpu_eager(lambda: style_topk(logits, k, cast=False)),
        timer.gpu(lambda: ops.topk_logprobs(logits, k)),
    )


def bench_step(
    timer: Timer, host_timer: Timer, x: StepInputs, k: int, budget: int, gen: torch.Generator
) -> tuple[tuple[Stat, Stat, Stat], tuple[Stat, Stat]]:
    """Ours: tree, walk + commit, whole step (graphs); reference-style: tree, walk + commit."""
    batch = x.logits.shape[0]
    topk = ops.topk_logprobs(x.logits, k)
    tree = ops.build_tree(topk.logp, topk.ids, x.roots, x.prefix, budget, x.prefix_sum)
    target = make_target(tree.tokens, tree.retrieve_next_token, gen)
    cache_loc = torch.arange(batch * (budget + 1), device="cuda").view(batch, -1)

    def ours_walk() -> object:
        walk = ops.verify_walk(tree.tokens, tree.parents, target, MAX_DEPTH)
        return ops.commit_indices(walk.accept_index, cache_loc, cache_loc.numel())

    def ours_step() -> object:
        tk = ops.topk_logprobs(x.logits, k)
        t = ops.build_tree(tk.logp, tk.ids, x.roots, x.prefix, budget, x.prefix_sum)
        walk = ops.verify_walk(t.tokens, t.parents, target, MAX_DEPTH)
        return ops.commit_indices(walk.accept_index, cache_loc, cache_loc.numel())

    ours = (
        timer.gpu(lambda: ops.build_tree(topk.logp, topk.ids, x.roots, x.prefix, budget,
                                         x.prefix_sum)),
        timer.gpu(ours_walk),
        timer.gpu(ours_step),
    )  # fmt: skip
    ref = (
        host_timer.host(lambda: style_tree(topk.logp, topk.ids, x.roots, x.prefix, budget)),
        host_timer.host(lambda: style_walk_commit(tree.tokens, tree.parents, target, cache_loc)),
    )
    return ours, ref


def measure_bandwidth() -> float:
    """Device copy bandwidth in bytes/s (bytes read plus written), median of 20 copies."""
    src = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    samples = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3)
    return 2 * src.numel() / statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--host-reps", type=int, default=10)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() or not _extension.is_loaded():
        print(f"needs a GPU and the CUDA extension: {_extension.load_error()}", file=sys.stderr)
        return 2
    gen = torch.Generator(device="cuda").manual_seed(0)
    bad = check_against_reference(gen)
    if bad:
        print(f"MISMATCH against the reference: {', '.join(bad)}", file=sys.stderr)
        return 1
    print("verified: CUDA ops equal the reference (batch 48, V 151936, K 8, budget 64)\n")

    bw = measure_bandwidth()
    timer, host_timer = Timer(args.reps), Timer(args.host_reps)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, copy bandwidth "
          f"{bw / 1e12:.2f} TB/s (read+write)\n")  # fmt: skip
    header = (
        "| batch | vocab | K | budget | top-k+logZ ref fp32-cast ms | ref bf16 ms | ours µs "
        "| floor µs | ours/floor | tree ref-style ms | tree ours µs | walk+commit ref-style ms "
        "| walk+commit ours µs | step ref-style ms | step ours µs | speedup |"
    )
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    summary: dict[tuple[int, int, int, int], tuple[float, ...]] = {}
    for batch in (1, 48):
        for vocab in (151_936, 248_320):
            inputs = StepInputs.random(batch, vocab, gen)
            floor_ms = inputs.logits.numel() * inputs.logits.element_size() / bw * 1e3
            for k in (4, 8):
                topk_stats = bench_topk(timer, inputs.logits, k)
                for budget in (15, 32, 64, 128):
                    ours, ref = bench_step(timer, host_timer, inputs, k, budget, gen)
                    step_ref = topk_stats[0].med + ref[0].med + ref[1].med
                    summary[(batch, vocab, k, budget)] = (
                        topk_stats[2].med, floor_ms, ours[0].med, ours[1].med, ours[2].med, step_ref
                    )  # fmt: skip
                    print(
                        f"| {batch} | {vocab} | {k} | {budget} | {topk_stats[0].ms()} "
                        f"| {topk_stats[1].ms()} | {topk_stats[2].us()} | {floor_ms * 1e3:.1f} "
                        f"| {topk_stats[2].med / floor_ms:.2f}x | {ref[0].ms()} | {ours[0].us()} "
                        f"| {ref[1].ms()} | {ours[1].us()} | {step_ref:.3f} | {ours[2].us()} "
                        f"| {step_ref / ours[2].med:.0f}x |",
                        flush=True,
                    )
    print_targets(summary)
    return 0


def print_targets(summary: dict[tuple[int, int, int, int], tuple[float, ...]]) -> None:
    """Anchors beside ours, and the issue's targets at batch 48 / V 151936 / budget 64."""
    print("\n| anchor (reference-style, H200, 2026-11-30) | anchor | ours (same config) |")
    print("|---|---|---|")
    for vocab, (a32, a16) in ANCHOR_TOPK_MS.items():
        ours = summary[(48, vocab, 8, 64)][0]
        print(f"| top-k+logZ, batch 48, V {vocab}, K 8 | {a32} ms fp32-cast / {a16} ms bf16 "
              f"| {ours * 1e3:.1f} µs |")  # fmt: skip
        print(f"| floor, V {vocab} (4.25 TB/s) | {ANCHOR_FLOOR_MS[vocab]} ms "
              f"| {summary[(48, vocab, 8, 64)][1]:.3f} ms at measured bandwidth |")  # fmt: skip
    for budget, anchor in ANCHOR_TREE_MS.items():
        ours = summary[(48, 151_936, 8, budget)][2]
        print(f"| tree build + mask, batch 48, K 8, budget {budget} | {anchor} ms "
              f"| {ours * 1e3:.1f} µs |")  # fmt: skip
    topk, floor, tree, walk, step, ref_step = summary[(48, 151_936, 8, 64)]
    print("\nTargets at batch 48 / V 151936 / K 8 / budget 64:")
    print(f"- top-k+logZ within 2x of floor: {topk / floor:.2f}x -> {_ok(topk <= 2 * floor)}")
    print(f"- tree build with all outputs < 50 µs: {tree * 1e3:.1f} µs -> {_ok(tree < 0.05)}")
    print(f"- walk + commit < 20 µs: {walk * 1e3:.1f} µs -> {_ok(walk < 0.02)}")
    print(f"- per-step overhead >= 40x below reference-style: {ref_step / step:.0f}x "
          f"-> {_ok(ref_step / step >= 40)}")  # fmt: skip


def _ok(passed: bool) -> str:
    return "met" if passed else "MISSED"


if __name__ == "__main__":
    sys.exit(main())
