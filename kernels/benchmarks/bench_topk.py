"""Sweep the fused top-k + log-sum-exp over rows, vocabularies, K and dtypes on one GPU.

Run: `PYTHONPATH=kernels python kernels/benchmarks/bench_topk.py` (needs the CUDA extension).
Rows are batch x 15 draft positions: 1, 4, 16 and 48 requests. Every shape is first checked
against `ddtree_kernels.reference` (exit 1 on a mismatch), then timed the way bench_ops.py times
its stages (CUDA-graph replays after an L2 flush, median [p20-p80]). Beside ours: the bandwidth
floor (one read of the logits at the measured copy bandwidth), the reference-style path measured
on the same input (torch.topk and logsumexp, no cast), and DDTREE.md's anchor where the shape is
the anchor's (48 requests, K 8, bf16).
"""

from __future__ import annotations

import argparse
import sys

import torch
from bench_ops import ANCHOR_TOPK_MS, Timer, measure_bandwidth, style_topk

from ddtree_kernels import _extension, ops, reference

ROWS = (15, 60, 240, 720)
VOCABS = (151_936, 248_320)
KS = (4, 8, 16)


def matches_reference(logits: torch.Tensor, k: int) -> bool:
    ours = ops.topk_logprobs(logits, k)
    ref = reference.topk_logprobs(logits, k)
    return bool(
        torch.equal(ours.ids, ref.ids) and torch.allclose(ours.logp, ref.logp, rtol=1e-5, atol=1e-5)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--dtypes", default="bfloat16,float16,float32")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() or not _extension.is_loaded():
        print(f"needs a GPU and the CUDA extension: {_extension.load_error()}", file=sys.stderr)
        return 2
    bw = measure_bandwidth()
    timer = Timer(args.reps)
    gen = torch.Generator(device="cuda").manual_seed(0)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, copy bandwidth "
          f"{bw / 1e12:.2f} TB/s (read+write)\n")  # fmt: skip
    print("| dtype | rows | vocab | K | floor µs | ours µs | ours/floor "
          "| ref-style µs (torch, same dtype) | anchor (DDTREE.md) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        for rows in ROWS:
            for vocab in VOCABS:
                logits = (torch.randn(rows, vocab, generator=gen, device="cuda") * 4).to(dtype)
                floor_us = logits.numel() * logits.element_size() / bw * 1e6
                for k in KS:
                    if not matches_reference(logits, k):
                        print(f"MISMATCH: {dtype_name} {rows}x{vocab} K {k}", file=sys.stderr)
                        return 1
                    ours = timer.gpu(lambda: ops.topk_logprobs(logits, k))  # noqa: B023
                    ref = timer.gpu_eager(lambda: style_topk(logits, k, cast=False))  # noqa: B023
                    anchor = (
                        f"{ANCHOR_TOPK_MS[vocab][1]:.2f} ms bf16"
                        if (rows, k, dtype) == (720, 8, torch.bfloat16)
                        else ""
                    )
                    print(
                        f"| {dtype_name} | {rows} | {vocab} | {k} | {floor_us:.1f} | {ours.us()} "
                        f"| {ours.med * 1e3 / floor_us:.2f}x | {ref.med * 1e3:.1f} | {anchor} |",
                        flush=True,
                    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
