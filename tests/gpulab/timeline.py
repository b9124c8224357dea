"""Where a speculative server's step time goes, from the torch profiler trace that SGLang's own
`/start_profile` writes (CPU and GPU activities, Python stacks): issue 22's timeline.

A step is one outermost call of the worker's `forward_batch_generation` (the scheduler calls it
once per decode step, in every release the lab serves). Per step the summary gives the time
from one step's start to the next, the worker's host time, the GPU's busy time (kernels,
copies, memsets merged where they overlap), the time the host sat in calls that wait for the
GPU, the speculative code's own functions by their inclusive time, the GPU's kernels by their
time (what a server's extra GPU time is made of), and the CUDA graphs launched (whether its
verify forward replayed a captured graph or ran eagerly). The profiler's Python
tracer slows the host, so these figures attribute time; the interleaved passes measure it.

Pure functions of the trace's JSON, tested on CPU with a real torch profiler trace
(test_timeline.py).
"""

from __future__ import annotations

import gzip
import itertools
import json
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

STEP_FUNCTION = "forward_batch_generation"
GPU_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
# CUDA runtime calls that block the host until the GPU has caught up (a device-to-host copy
# from pageable memory waits as cudaMemcpyAsync).
SYNC_CALLS = frozenset({"cudaStreamSynchronize", "cudaDeviceSynchronize",
                        "cudaEventSynchronize", "cudaMemcpyAsync", "cudaMemcpy"})  # fmt: skip
GRAPH_LAUNCH = "cudaGraphLaunch"
KERNEL_NAME_CHARS = 60  # a kernel's name up to its template arguments, cut to this
# Whose functions the summary lists: SGLang's speculative decoding and the DDTree module.
SOURCES = ("sglang/srt/speculative/", "ddtree_kernels/")
_PYTHON_NAME = re.compile(r"^(?P<path>.+?)\((?P<line>\d+)\): (?P<function>.+)$")


@dataclass(frozen=True)
class Timeline:
    """One server's profiled steps, medians per step (milliseconds)."""

    steps: int
    step_ms: float  # one step's start to the next's
    host_ms: float  # the worker's step function, start to return
    gpu_ms: float  # the GPU busy within the step
    sync_ms: float  # the host blocked in SYNC_CALLS within the step
    syncs: float  # SYNC_CALLS per step (mean)
    functions: list[tuple[str, float]]  # ("file.py:function", mean inclusive ms per step)
    kernels: list[tuple[str, float]]  # (kernel name, mean GPU ms per step), the longest first
    graph_launches: float  # cudaGraphLaunch calls per step (mean)


def read_trace(path: Path) -> list[dict[str, Any]]:
    """The events of a Chrome trace as torch's profiler exports it (.json or .json.gz)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as handle:
        data = json.load(handle)
    events: list[dict[str, Any]] = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in events if e.get("ph") == "X" and "dur" in e]


def summarize_trace(events: list[dict[str, Any]], *, top: int = 12) -> Timeline | None:
    """The timeline of the trace's steps, or None where it holds fewer than two."""
    steps = _outermost([e for e in events if e.get("cat") == "python_function"
                        and e["name"].endswith(f": {STEP_FUNCTION}")])  # fmt: skip
    if len(steps) < 2:
        return None
    starts = [float(s["ts"]) for s in steps]
    # Each step's window runs to the next one's start; the last one's to its own return.
    windows = list(itertools.pairwise(starts))
    windows.append((starts[-1], starts[-1] + float(steps[-1]["dur"])))
    gpu = [e for e in events if e.get("cat") in GPU_CATEGORIES]
    syncs = [e for e in events if e.get("cat") == "cuda_runtime" and e["name"] in SYNC_CALLS]
    first, end = windows[0][0], windows[-1][1]  # the windows tile this span
    functions: dict[str, float] = defaultdict(float)
    kernels: dict[str, float] = defaultdict(float)
    for event in events:
        if not first <= float(event["ts"]) < end:
            continue
        if event.get("cat") == "python_function" and (name := _source_function(event)):
            functions[name] += float(event["dur"])
        elif event.get("cat") in GPU_CATEGORIES:
            kernels[_kernel_name(event["name"])] += float(event["dur"])
    n = len(windows)
    in_span = [
        e for e in events if e.get("cat") == "cuda_runtime" and first <= float(e["ts"]) < end
    ]
    return Timeline(
        steps=n,
        step_ms=_ms(statistics.median(b - a for a, b in windows[:-1])),
        host_ms=_ms(statistics.median(float(s["dur"]) for s in steps)),
        gpu_ms=_ms(statistics.median(_busy(gpu, a, b) for a, b in windows)),
        sync_ms=_ms(statistics.median(_busy(syncs, a, b) for a, b in windows)),
        syncs=round(sum(e["name"] in SYNC_CALLS for e in in_span) / n, 1),
        functions=_ranked(functions, n, top),
        kernels=_ranked(kernels, n, top),
        graph_launches=round(sum(e["name"] == GRAPH_LAUNCH for e in in_span) / n, 1),
    )


def _ranked(totals: dict[str, float], steps: int, top: int) -> list[tuple[str, float]]:
    """The `top` largest of `totals` (microseconds over the trace) as ms per step."""
    ranked = sorted(totals.items(), key=lambda item: -item[1])[:top]
    return [(name, _ms(total / steps)) for name, total in ranked]


def _kernel_name(name: str) -> str:
    """A kernel's name without its template and call arguments, e.g. "void
    flashinfer::BatchPrefillWithPagedKVCacheKernel<...>(...)" is listed by what precedes "<"
    (an anonymous namespace is dropped first: its "(" is not an argument list)."""
    name = name.replace("(anonymous namespace)::", "")
    cut = min((i for i in (name.find("<"), name.find("(")) if i > 0), default=len(name))
    return name[:cut].removeprefix("void ").strip()[:KERNEL_NAME_CHARS]


def _outermost(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events not inside an earlier one (a worker's step calls the target worker's)."""
    kept: list[dict[str, Any]] = []
    for event in sorted(events, key=lambda e: float(e["ts"])):
        if kept and float(event["ts"]) < float(kept[-1]["ts"]) + float(kept[-1]["dur"]):
            continue
        kept.append(event)
    return kept


def _busy(events: list[dict[str, Any]], start: float, end: float) -> float:
    """Microseconds within [start, end) covered by at least one of `events`."""
    spans = []
    for event in events:
        begin = float(event["ts"])
        finish = begin + float(event["dur"])
        if begin < end and finish > start:
            spans.append((max(begin, start), min(finish, end)))
    total, reach = 0.0, start
    for a, b in sorted(spans):
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


def _source_function(event: dict[str, Any]) -> str | None:
    """The name a function of SOURCES is listed by, e.g.
    "speculative/dflash_worker.py:forward_batch_generation"; None for any other."""
    match = _PYTHON_NAME.match(event["name"])
    if match is None or not any(source in match["path"] for source in SOURCES):
        return None
    folder_and_file = "/".join(PurePosixPath(match["path"]).parts[-2:])
    return f"{folder_and_file}:{match['function']}"


def _ms(microseconds: float) -> float:
    return round(microseconds / 1000, 3)
