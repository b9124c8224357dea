"""timeline.py on a real torch profiler trace of a worker-shaped loop (CPU: the profiler's
Python tracer is the same one SGLang's /start_profile turns on). A CPU run records no GPU
events, so each step gets two overlapping kernels and a synchronising copy added to the trace
(the shapes Kineto writes on a GPU): the only part of the trace that is not recorded."""

from __future__ import annotations

import gzip
import http.server
import importlib.util
import json
import sys
import threading
import time
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from gpulab.tables import render_table
from gpulab.timeline import read_trace, summarize_trace

sys.path.insert(0, str(Path(__file__).parent))  # run.py imports its siblings, as a script
import run

WORKER = """
import time
import torch

class Target:
    def forward_batch_generation(self, x):
        return x @ x

class Worker:
    def __init__(self):
        self.target = Target()

    def forward_batch_generation(self, x):
        self._ddtree_propose()
        self._cheap()
        return self.target.forward_batch_generation(x)

    def _ddtree_propose(self):
        time.sleep(0.004)

    def _cheap(self):
        return None
"""
STEPS = 5


def _worker_module(root: Path) -> object:
    """The loop's worker, imported from a file under sglang/srt/speculative/ (SOURCES)."""
    path = root / "sglang" / "srt" / "speculative" / "fake_worker.py"
    path.parent.mkdir(parents=True)
    path.write_text(WORKER)
    spec = importlib.util.spec_from_file_location("fake_worker", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["fake_worker"] = module
    spec.loader.exec_module(module)
    return module


def test_a_profiled_loop_gives_each_step_its_host_gpu_and_functions(tmp_path: Path) -> None:
    worker = _worker_module(tmp_path).Worker()  # type: ignore[attr-defined]
    x = torch.randn(32, 32)
    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        for _ in range(STEPS):
            worker.forward_batch_generation(x)
            # The scheduler's own work between steps: long beside the host step's jitter, since
            # step_ms (median of 4 gaps) and host_ms (median of 5 steps) are medians of different
            # sets; at 2 ms a loaded machine's jitter flipped them.
            time.sleep(0.02)
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    events = read_trace(tmp_path / "trace.json")
    steps = sorted((e for e in events if e["name"].endswith("): forward_batch_generation")
                    and "Worker" not in e["name"]), key=lambda e: e["ts"])  # fmt: skip
    outer = [e for e in steps if "fake_worker.py(13)" in e["name"]]
    assert len(outer) == STEPS
    gemm = "void at::native::(anonymous namespace)::gemm_kernel<bf16>(Params)"
    for i, step in enumerate(outer):  # GPU work: 10-110 and 50-160 us (150 us busy), a 50 us
        ts = float(step["ts"])  # blocking copy; every other step replays a captured graph
        events += [
            {"ph": "X", "cat": "kernel", "name": gemm, "ts": ts + 10, "dur": 100},
            {"ph": "X", "cat": "kernel", "name": "topk_kernel", "ts": ts + 50, "dur": 110},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "ts": ts + 200, "dur": 50},
        ]  # fmt: skip
        if i % 2 == 0:
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch",
                           "ts": ts + 5, "dur": 4})  # fmt: skip

    timeline = summarize_trace(events)

    assert timeline is not None
    assert timeline.steps == STEPS  # the target's nested step is not a step of its own
    assert timeline.gpu_ms == 0.15 and timeline.sync_ms == 0.05 and timeline.syncs == 1.0
    # each kernel by its name before the template arguments, the longer one first, per step
    assert timeline.kernels == [("topk_kernel", 0.11), ("at::native::gemm_kernel", 0.1)]
    assert timeline.graph_launches == 0.6  # 3 of the 5 steps
    assert timeline.host_ms >= 4.0  # the proposal's sleep is inside the step
    assert timeline.step_ms > timeline.host_ms  # and the scheduler's is between steps
    names = [name for name, _ in timeline.functions]
    assert names[0] == "speculative/fake_worker.py:forward_batch_generation"
    assert names.index("speculative/fake_worker.py:_ddtree_propose") < names.index(
        "speculative/fake_worker.py:_cheap"
    )
    assert not any("profiler" in name for name in names)  # only SOURCES' functions


def test_a_trace_without_two_steps_has_no_timeline() -> None:
    one = {"ph": "X", "cat": "python_function", "ts": 0, "dur": 5,
           "name": "sglang/srt/speculative/w.py(1): forward_batch_generation"}  # fmt: skip
    assert summarize_trace([one]) is None


def _profiled(
    worker: object, export_after: threading.Event | None, log: Path, export_s: float = 0.0
) -> type:
    """SGLang's two endpoints as the lab uses them, for one server, as 0.5.11 runs them: the
    steps of /generate are recorded through the worker-shaped loop above, then the scheduler
    logs "Stop profiling...", exports the trace where /start_profile said (once `export_after`
    is set; None: at once), taking `export_s`, and only then answers both requests."""

    class Profiled(http.server.BaseHTTPRequestHandler):
        requests: ClassVar[list[tuple[str, dict[str, object]]]] = []
        asked_at: ClassVar[list[float]] = []  # time.monotonic() of each request's arrival
        exported_at: ClassVar[list[float]] = []  # and of the trace's being written
        profiling = threading.Event()
        exported = threading.Event()
        generated = threading.Event()

        def do_POST(self) -> None:
            self.asked_at.append(time.monotonic())
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self.requests.append((self.path, body))
            if self.path == "/generate":
                self.generated.set()
                assert self.profiling.wait(10)
                x = torch.randn(8, 8)
                with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
                    for _ in range(3):
                        worker.forward_batch_generation(x)  # type: ignore[attr-defined]
                with log.open("a") as out:
                    out.write("[2026-12-04 16:46:12] Stop profiling...\n")
                if export_after is None or export_after.wait(5):  # < PROFILE_WAIT_S below
                    time.sleep(export_s)
                    folder = Path(str(dict(self.requests)["/start_profile"]["output_dir"]))
                    trace = folder / "1-TP-0.trace.json"
                    prof.export_chrome_trace(str(trace))
                    trace.with_suffix(".json.gz").write_bytes(gzip.compress(trace.read_bytes()))
                    self.exported_at.append(time.monotonic())
                self.exported.set()
            else:
                self.profiling.set()
                self.exported.wait(60)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    return Profiled


def _serve(handler: type) -> http.server.ThreadingHTTPServer:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def _profile_both(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    handlers: tuple[type, type],
    logs: dict[str, Path],
    *,
    quiet_s: float,
    saved: list[list[str]] | None = None,
) -> dict[str, object]:
    """The lab's `profile_servers` over two served `handlers` (dflash, then ddtree_shadow), its
    waits shortened (PROFILE_WAIT_S 10 s, PROFILE_QUIET_S `quiet_s`); the timelines it kept,
    and in `saved` what each save held."""
    servers = {
        name: _serve(h) for name, h in zip(("dflash", "ddtree_shadow"), handlers, strict=True)
    }
    real_sleep = time.sleep
    monkeypatch.setattr(run.time, "sleep", lambda s: real_sleep(min(s, 0.2)))
    monkeypatch.setattr(run, "PROFILE_WAIT_S", 10)
    monkeypatch.setattr(run, "PROFILE_QUIET_S", quiet_s)
    lab = run.Lab(tmp_path / "lab", tmp_path / "out", "0.5.11", "tiny")
    lab.api_key = "k"
    live = {name: run.Server(name, None, httpd.server_address[1], logs[name], 0.0)  # type: ignore[arg-type]
            for name, httpd in servers.items()}  # fmt: skip
    timelines: dict[str, object] = {}
    record = saved if saved is not None else []
    try:
        run.profile_servers(lab, live, timelines, lambda: record.append(list(timelines)))
    finally:
        for httpd in servers.values():
            httpd.shutdown()
    return timelines


def test_the_lab_profiles_live_servers_and_keeps_their_timelines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each server exports while the next records (an export with stacks takes minutes on the
    GPU machine, and SGLang answers only after it): here the first exports only once the second
    has been asked for its answer, so profiling them one after the other, export included,
    would find no trace (run 17 lost all three servers' timelines so)."""
    worker = _worker_module(tmp_path).Worker()  # type: ignore[attr-defined]
    logs = {name: tmp_path / f"{name}.log" for name in ("dflash", "ddtree_shadow")}
    second = _profiled(worker, None, logs["ddtree_shadow"])
    first = _profiled(worker, second.generated, logs["dflash"])
    saved: list[list[str]] = []
    timelines = _profile_both(tmp_path, monkeypatch, (first, second), logs, quiet_s=1, saved=saved)
    for handler in (first, second):
        assert [path for path, _ in handler.requests] == ["/start_profile", "/generate"]
        start = handler.requests[0][1]
        assert start["with_stack"] is True and start["num_steps"] == run.PROFILE_STEPS
        assert str(start["output_dir"]).startswith(str(tmp_path / "lab" / "profiles"))
    timeline = timelines["dflash"]
    assert isinstance(timeline, dict) and timeline["steps"] == 3
    assert isinstance(timelines["ddtree_shadow"], dict)
    assert saved == [["dflash"], ["dflash", "ddtree_shadow"]]  # each kept as it comes
    # the first's export outlasted PROFILE_QUIET_S: the second was recorded beside it, and says so
    assert timelines["ddtree_shadow"]["recorded_beside_export_of"] == "dflash"  # type: ignore[index]
    assert "recorded_beside_export_of" not in timeline
    assert "speculative/fake_worker.py:_ddtree_propose" in dict(timeline["functions"])
    table = render_table({"release": "0.5.11", "steps": [], "cells": [], "timeline": {
        "dflash": timeline, "ddtree_shadow": "no finished trace within 240 s"}})  # fmt: skip
    propose = dict(timeline["functions"])["speculative/fake_worker.py:_ddtree_propose"]
    assert f"| `speculative/fake_worker.py:_ddtree_propose` | {propose} |" in table
    assert f"| dflash | 3 | {timeline['step_ms']} |" in table
    assert "| GPU kernel (ms per step) | dflash |" not in table  # a CPU trace has no kernels
    assert "| ddtree_shadow | no finished trace within 240 s |" in table


def test_a_server_is_not_recorded_while_the_one_before_exports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An export that ends within PROFILE_QUIET_S is waited for: the next server's recording
    starts only once the trace before it is written (run 18's servers each recorded while the
    previous one exported, a core busy beside a host-bound step)."""
    worker = _worker_module(tmp_path).Worker()  # type: ignore[attr-defined]
    logs = {name: tmp_path / f"{name}.log" for name in ("dflash", "ddtree_shadow")}
    first = _profiled(worker, None, logs["dflash"], export_s=1.0)
    second = _profiled(worker, None, logs["ddtree_shadow"])
    timelines = _profile_both(tmp_path, monkeypatch, (first, second), logs, quiet_s=8)
    assert first.exported_at and second.asked_at  # type: ignore[attr-defined]
    assert first.exported_at[0] < min(second.asked_at)  # type: ignore[attr-defined]
    shadow = timelines["ddtree_shadow"]
    assert isinstance(shadow, dict) and "recorded_beside_export_of" not in shadow


def test_a_profile_at_8_in_flight_records_steps_of_8_answers_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--profile 8` (issue 45: where the 27B tree's verify costs more than its arithmetic): the
    recorded steps run eight answers at once, so all eight are asked for while SGLang records,
    and the table says at how many the timelines were taken."""
    log = tmp_path / "server.log"
    asked: list[str] = []
    all_asked = threading.Event()

    class Recording(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            asked.append(self.path)
            if asked.count("/generate") == 8:
                all_asked.set()
            if self.path == "/generate" and all_asked.wait(5):
                with log.open("a") as out:
                    out.write(f"{run.PROFILE_STOPPED}...\n")
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    httpd = _serve(Recording)
    real_sleep = time.sleep
    monkeypatch.setattr(run.time, "sleep", lambda s: real_sleep(min(s, 0.2)))
    lab = run.Lab(tmp_path / "lab", tmp_path / "out", "0.5.11", "tiny")
    server = run.Server("dflash", None, httpd.server_address[1], log, 0.0)  # type: ignore[arg-type]
    pool = run.ThreadPoolExecutor(9)
    try:
        folder = run.record_profile(lab, "dflash", server, pool, in_flight=8)
    finally:
        pool.shutdown(wait=True)
        httpd.shutdown()
    assert folder == tmp_path / "lab" / "profiles" / "dflash"
    assert asked[0] == "/start_profile" and asked.count("/generate") == 8
    table = render_table({"release": "0.5.11", "steps": [], "cells": [],
                          "timeline": {"dflash": "no finished trace within 240 s"},
                          "timeline_in_flight": 8})  # fmt: skip
    assert "Step timelines, 8 answers at once:" in table
