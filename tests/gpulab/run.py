"""The GPU lab's matrix, run on the GPU machine: the product drives real SGLang servers.

    python3 tests/gpulab/run.py --bundle .lab --out OUT [--root /tmp/ddtree-lab] [--quick]
        [--budgets 15,31,63] | --overhead ROUNDS | --tune

It installs the carried bundle (tests/gpulab/bundle.py made it, for one release) and this
checkout into one venv that sees the machine's torch, writes the tiny models (models.py), then
runs `ddtree-deploy` itself on `host=h200_lab`: plan (preflight), patch, audit, build-kernels
(CUDA for the GPU, with its smoke test). For each target (pure attention, hybrid) and algorithm
(DFLASH, DDTREE shadow_linear, DDTREE tree, a tree cell per `--budgets` entry) it starts the
server with exactly the argv and environment `action=render output=json` gives (the machine has
no systemd, so the lab is the service manager), and judges it with `action=validate`, the
product's own gates: at batch 1, then with several requests in flight. A cell whose tokens
differ from DFLASH's is settled by the same pair in SGLang's deterministic mode
(`service.deterministic_inference=true`; sgl-kernel has no float32 RMSNorm, so an fp32 run
cannot start): equal there means a bf16 near-tie between batch shapes, different means a bug.

`--overhead N`: DFLASH and shadow_linear served side by side on the attention target, their
passes interleaved over N rounds at 1, 8 and 32 requests in flight (shadow_linear's cost).
`--tune`: `action=tune`'s sweep on the attention target with the lab as service manager
(tune_lab.py judges and tables it with the product's code).

Results: OUT/results.md (the tables), OUT/results.json, OUT/logs.tar.gz (every run folder and
server log). The tables are printed last.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from tables import render_table, summarize

REPO = Path(__file__).resolve().parents[2]
ALGOS = ("dflash", "ddtree_shadow", "ddtree")
BATCHED = ("validation.concurrency=8", "validation.repeats=4")  # 16 requests, 8 in flight
# Every prompt of the default set answers 160 new tokens (the matrix asks for at least 128).
LONG_ANSWERS = tuple(f"validation.prompts.{i}.max_new_tokens=160" for i in range(4))
OVERHEAD_CONCURRENCY = (1, 8, 32)
# About 14 s of generation per pass at batch 1 (run 2's one-second windows spread 20-30%).
OVERHEAD_REPEATS_C1 = 8
START_TIMEOUT_S = 420
# Servers that share the GPU (overhead pairs, tune waves): each caps its KV pool, so one's start
# does not see the others' pools as used memory and refuse (SGLang sizes the pool from free memory).
SHARED_GPU = ("service.mem_fraction_static=0.8", "service.max_total_tokens=131072")
TUNE_WAVE = 6  # tune candidates served at once (the default grid in one wave)


@dataclass
class StepRun:
    """One `ddtree-deploy` call: its exit code, time and the end of its output."""

    name: str
    exit_code: int
    wall_s: float
    tail: str
    began: float  # time.time() at its start

    def report(self, runs: Path) -> dict[str, Any] | None:
        """The run report this call wrote (None when it wrote none)."""
        reports = [p for p in runs.glob("*/report.json") if p.stat().st_mtime >= self.began]
        newest = max(reports, key=lambda p: p.stat().st_mtime, default=None)
        return json.loads(newest.read_text()) if newest else None


@dataclass
class Cell:
    """One target x algorithm: server start, and each validate run's verdicts and figures."""

    target: str
    algo: str
    extra: list[str] = field(default_factory=list)  # overrides beyond the algorithm's
    start_s: float | None = None
    start_error: str | None = None
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)  # label -> summary


class Lab:
    """The lab's folders and the one venv that holds SGLang, its kernels and ddtree-deploy."""

    def __init__(self, root: Path, out: Path, release: str) -> None:
        self.root, self.out, self.release = root, out, release
        self.venv = root / "venv"
        self.runs = root / "runs"
        self.logs = root / "logs"
        self.env = {**os.environ, "DDTREE_LAB_ROOT": str(root), "PYTHONUNBUFFERED": "1"}

    # -- setup ---------------------------------------------------------------------------------

    def install(self, bundle: Path, *, reuse: bool) -> bool:
        """The bundle's wheels, the trimmed sglang-kernel and this checkout, into one venv.

        `reuse` keeps a root an earlier call on the same (still warm) machine installed; True
        when it did.
        """
        done = self.root / "installed"
        if reuse and done.exists():
            return True
        if self.root.exists():
            shutil.rmtree(self.root)
        for path in (self.runs, self.logs):
            path.mkdir(parents=True)
        _run([sys.executable, "-m", "venv", "--system-site-packages", str(self.venv)])
        pip = [str(self.venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index"]
        wheels = sorted(str(p) for p in (bundle / "wheels").iterdir())
        _run([*pip, "--no-deps", "--no-build-isolation", "--no-compile", *wheels])
        site = Path(
            _run([str(self.venv / "bin" / "python"), "-c", "import site; print(site.getsitepackages()[0])"])
        )  # fmt: skip
        # The machine's python3 may itself be a venv (torch lives in its site-packages, which
        # --system-site-packages does not reach): list them after the lab venv's own.
        parents = [p for p in sys.path if p.endswith("-packages") and Path(p).is_dir()]
        (Path(site) / "lab-parent.pth").write_text("\n".join(parents) + "\n")
        for tarball in bundle.glob("sgl_kernel-*.tar.gz"):
            with tarfile.open(tarball) as archive:
                archive.extractall(site, filter="data")
        _run([*pip, "--no-deps", "--no-build-isolation", str(REPO)])
        _run([str(self.venv / "bin" / "python"), str(Path(__file__).with_name("models.py")),
              str(self.root / "models")])  # fmt: skip
        done.write_text("ok\n")
        return False

    # -- the product ---------------------------------------------------------------------------

    def _argv(self, overrides: Sequence[str]) -> list[str]:
        """`ddtree-deploy` on the lab host with the lab's options, then `overrides`."""
        lab = ["host=h200_lab", "service=lab", "validation=lab", f"rollout.runs_dir={self.runs}",
               f"sglang=v{self.release.split('.post')[0].replace('.', '_')}",
               f"sglang.version={self.release}"]  # fmt: skip
        return [str(self.venv / "bin" / "ddtree-deploy"), *lab, *LONG_ANSWERS, *overrides]

    def tool(self, name: str, *overrides: str) -> StepRun:
        """Run `ddtree-deploy` on the lab host; never raises on a non-zero exit."""
        argv = self._argv(overrides)
        began, start = time.time(), time.monotonic()
        proc = subprocess.run(argv, env=self.env, capture_output=True, text=True)
        wall = time.monotonic() - start
        text = proc.stdout + proc.stderr
        (self.logs / f"{name}.log").write_text(" ".join(argv) + "\n" + text)
        print(f"> {name}: exit {proc.returncode} in {wall:.0f} s", flush=True)
        return StepRun(name, proc.returncode, round(wall, 1), text[-1500:], began)

    def rendered(self, overrides: list[str]) -> dict[str, Any]:
        """The argv and environment the product renders for this config."""
        argv = self._argv([*overrides, "action=render", "output=json"])
        out = subprocess.run(argv, env=self.env, capture_output=True, text=True, check=True)
        data: dict[str, Any] = json.loads(out.stdout)
        return data

    # -- servers -------------------------------------------------------------------------------

    @property
    def pgids(self) -> Path:
        return self.root / "servers"

    def stop_stale(self) -> None:
        """Kill servers an earlier call left running (cut off by its time limit): they would
        hold the ports, and the next cell's gates would judge them instead of the new ones."""
        for pgid_file in sorted(self.pgids.glob("*")):
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(int(pgid_file.name), sig)
                except ProcessLookupError:
                    break
                time.sleep(10)
            pgid_file.unlink()

    def start(self, label: str, overrides: list[str]) -> Server:
        """Start the rendered server (exactly the product's argv and environment)."""
        spec = self.rendered(overrides)
        path = self.logs / f"server-{label}.log"
        with path.open("wb") as log:
            log.write((" ".join(spec["argv"]) + "\n").encode())
            log.flush()
            process = subprocess.Popen(
                spec["argv"], env={**self.env, **spec["environment"]}, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.pgids.mkdir(exist_ok=True)
        (self.pgids / str(process.pid)).touch()
        argv = spec["argv"]
        return Server(label, process, int(argv[argv.index("--port") + 1]), path, time.monotonic())

    def wait(self, server: Server) -> tuple[float | None, str | None]:
        """Seconds from start to /health 200, or (None, why); a server that fails is stopped."""
        health = f"http://127.0.0.1:{server.port}/health"
        while time.monotonic() - server.started < START_TIMEOUT_S:
            if server.process.poll() is not None:
                self.stop(server)
                return None, _log_tail(server.log)
            try:
                if httpx.get(health, timeout=2).status_code == 200:
                    return round(time.monotonic() - server.started, 1), None
            except httpx.TransportError:
                pass
            time.sleep(1)
        self.stop(server)
        return None, f"no /health 200 within {START_TIMEOUT_S} s"

    def stop(self, server: Server) -> None:
        """SIGTERM the server's process group (scheduler, detokenizer), SIGKILL after 30 s."""
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(server.process.pid, sig)
            except ProcessLookupError:
                break
            try:
                server.process.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        (self.pgids / str(server.process.pid)).unlink(missing_ok=True)


@dataclass
class Server:
    """One SGLang server the lab started."""

    label: str
    process: subprocess.Popen[bytes]
    port: int
    log: Path
    started: float


def cell_overrides(target: str, algo: str, extra: list[str]) -> list[str]:
    overrides = [f"model=lab_{target}", f"algo={algo}", *extra]
    if target == "hybrid" and algo == "ddtree":
        overrides.append("algo.allow_hybrid_unsafe=true")  # what the lab is here to prove
    return overrides


def run_cells(
    lab: Lab,
    target: str,
    specs: list[tuple[str, list[str]]],
    labels: dict[str, list[str]],
    *,
    together: bool = False,
) -> Iterator[Cell]:
    """Serve each (algo, extra overrides) and run each validate pass in `labels` (label ->
    overrides) against it, in order (DFLASH first: its pass stores the baseline). One server at
    a time, or with `together` all at once on their own ports (SHARED_GPU), which saves the
    starts; the passes still run one after another."""
    cells = [Cell(target, algo, [e for e in extra if not e.startswith("service.deterministic")])
             for algo, extra in specs]  # fmt: skip
    overrides = [cell_overrides(target, algo, extra) for algo, extra in specs]
    if together:
        overrides = [
            [*o, *SHARED_GPU, f"service.port={30000 + i}"] for i, o in enumerate(overrides)
        ]
    names = ["-".join([target, algo, *[e.split("=")[-1] for e in extra]]) for algo, extra in specs]
    started: dict[int, Server] = {}
    try:
        if together:
            started = {
                i: lab.start(name, o)
                for i, (name, o) in enumerate(zip(names, overrides, strict=True))
            }
            for i, cell in enumerate(cells):  # all healthy first: true start times
                cell.start_s, cell.start_error = lab.wait(started[i])
        for i, cell in enumerate(cells):
            if not together:
                started[i] = lab.start(names[i], overrides[i])
                cell.start_s, cell.start_error = lab.wait(started[i])
            if cell.start_error is not None:
                print(f"> {names[i]}: server did not start: {cell.start_error[-300:]}", flush=True)
            else:
                for label, more in labels.items():
                    step = lab.tool(
                        f"validate-{names[i]}-{label}", *overrides[i], *more, "action=validate"
                    )
                    cell.runs[label] = summarize(step.report(lab.runs), step.exit_code)
            if not together:
                lab.stop(started.pop(i))
            yield cell
    finally:
        for server in started.values():
            lab.stop(server)


def concurrency_overrides(level: int, *, c1_repeats: int = 4) -> list[str]:
    """`level` requests in flight; at least `level` requests (the default set has 4 prompts)."""
    if level == 1:
        return [f"validation.repeats={c1_repeats}"]
    return [f"validation.concurrency={level}", f"validation.repeats={max(1, level // 4)}"]


def run_overhead(
    lab: Lab, rounds: int, base: list[str], passes: list[dict[str, Any]], save: Callable[[], None]
) -> None:
    """shadow_linear's cost over DFLASH: both served at once on the attention target, their
    validate passes interleaved (order alternating per round) at each concurrency, so drift of
    the machine between passes falls on both alike."""
    shared = ["model=lab_attention", *SHARED_GPU, *base]
    pair = {algo: [*shared, f"algo={algo}", f"service.port={30000 + i}"]
            for i, algo in enumerate(("dflash", "ddtree_shadow"))}  # fmt: skip
    servers = {algo: lab.start(f"overhead-{algo}", o) for algo, o in pair.items()}
    try:
        for algo, server in servers.items():
            start_s, error = lab.wait(server)
            if error is not None:
                passes.append({"algo": algo, "start_error": error})
                return
            passes.append({"algo": algo, "start_s": start_s})
        for rnd in range(rounds):
            for level in OVERHEAD_CONCURRENCY:
                # DFLASH first in round 0: its pass stores the baseline shadow_linear is held to.
                order = ["dflash", "ddtree_shadow"][:: 1 if rnd % 2 == 0 else -1]
                for algo in order:
                    more = concurrency_overrides(level, c1_repeats=OVERHEAD_REPEATS_C1)
                    name = f"overhead-r{rnd}-c{level}-{algo}"
                    step = lab.tool(name, *pair[algo], *more, "action=validate")
                    run = summarize(step.report(lab.runs), step.exit_code)
                    passes.append({"algo": algo, "round": rnd, "concurrency": level, **run})
            save()
    finally:
        for server in servers.values():
            lab.stop(server)


def run_tune(
    lab: Lab, base: list[str], sweep: list[dict[str, Any]], save: Callable[[], None]
) -> str:
    """`action=tune`'s sweep with the lab as service manager (tune_lab.py says why): baselines
    from linear DFlash at each concurrency, then each candidate served (TUNE_WAVE at a time)
    and validated at each concurrency; tune_lab.py judges and tables it as the product does."""
    shared = ["model=lab_attention", *SHARED_GPU, *base]
    tune_lab = [str(lab.venv / "bin" / "python"), str(Path(__file__).with_name("tune_lab.py"))]
    grid = json.loads(_run([*tune_lab, "grid", *lab._argv([*shared, "action=tune"])[1:]]))
    levels: list[int] = grid["concurrency"]
    baseline = lab.start("tune-dflash", [*shared, "algo=dflash"])
    try:
        _, error = lab.wait(baseline)
        if error is not None:
            raise SystemExit(f"the linear-DFlash baseline server did not start: {error[-600:]}")
        for level in levels:
            step = lab.tool(f"tune-baseline-c{level}", *shared, "algo=dflash",
                            *concurrency_overrides(level), "action=validate")  # fmt: skip
            if step.exit_code != 0:
                raise SystemExit(f"the baseline at concurrency {level} failed: {step.tail[-600:]}")
    finally:
        lab.stop(baseline)
    pending = [(int(b), int(k)) for b, k in grid["candidates"]]
    while pending:
        wave, pending = pending[:TUNE_WAVE], pending[TUNE_WAVE:]
        served = []
        for i, (budget, topk) in enumerate(wave):
            overrides = [*shared, "algo=ddtree", f"algo.budget={budget}", f"algo.topk={topk}",
                         f"service.port={30001 + i}"]  # fmt: skip
            served.append((budget, topk, overrides, lab.start(f"tune-b{budget}k{topk}", overrides)))
        try:
            entries = []
            for budget, topk, _, server in served:  # all healthy first: true start times
                start_s, start_error = lab.wait(server)
                entries.append({"budget": budget, "topk": topk, "start_s": start_s,
                                "start_error": start_error, "reports": {}})  # fmt: skip
            for entry, (budget, topk, overrides, _) in zip(entries, served, strict=True):
                if entry["start_error"] is None:
                    for level in levels:
                        step = lab.tool(f"tune-b{budget}k{topk}-c{level}", *overrides,
                                        *concurrency_overrides(level), "action=validate")  # fmt: skip
                        entry["reports"][str(level)] = step.report(lab.runs)
                sweep.append(entry)
                save()
        finally:
            for *_, server in served:
                lab.stop(server)
    (lab.out / "tune-sweep.json").write_text(json.dumps(sweep))
    report = _run([*tune_lab, "report", str(lab.out / "tune-sweep.json"), str(lab.out / "tune"),
                   *lab._argv([*shared, "action=tune"])[1:]])  # fmt: skip
    return report


def _run(argv: list[str]) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"lab setup failed: {' '.join(argv[:4])}...: {proc.stderr[-2000:]}")
    return proc.stdout.strip()


def _log_tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--bundle", type=Path, default=REPO / ".lab")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--root", type=Path, default=Path("/tmp/ddtree-lab"))
    parser.add_argument("--targets", default="attention,hybrid")
    parser.add_argument("--algos", default=",".join(ALGOS), help="dflash must come first")
    parser.add_argument(
        "--steps", help="default: plan on a reused root, else plan,patch,audit,build-kernels"
    )
    parser.add_argument("--quick", action="store_true", help="batch 1 only, no overhead table")
    parser.add_argument("--reuse", action="store_true", help="keep an installed --root")
    parser.add_argument(
        "--deterministic",
        action="store_true",
        help="every cell with service.deterministic_inference=true",
    )
    parser.add_argument("--budgets", default="", help="tree cells at these budgets, e.g. 15,31,63")
    parser.add_argument("--overhead", type=int, default=0, metavar="ROUNDS",
                        help="only the interleaved shadow_linear-vs-DFLASH overhead table")  # fmt: skip
    parser.add_argument("--tune", action="store_true", help="only the tune sweep (attention)")
    parser.add_argument(
        "--together", default="", help="targets whose cells are served at once, e.g. attention"
    )
    args = parser.parse_args()
    # `timeout` sends SIGTERM: unwind so the running cell stops its server.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    base = ["service.deterministic_inference=true"] if args.deterministic else []
    args.out.mkdir(parents=True, exist_ok=True)
    release = json.loads((args.bundle / "MANIFEST.json").read_text())["release"]
    lab = Lab(args.root, args.out, release)
    began = time.monotonic()
    print(f"> installing the bundle (SGLang {release}) and the checkout", flush=True)
    reused = lab.install(args.bundle, reuse=args.reuse)
    lab.stop_stale()
    actions = args.steps or ("plan" if reused else "plan,patch,audit,build-kernels")
    steps = [lab.tool(action, f"action={action}") for action in actions.split(",")]
    results: dict[str, Any] = {"release": release, "steps": [asdict(s) for s in steps],
                               "cells": [], "overhead": [], "tune": None}  # fmt: skip
    cells: list[Cell] = []

    def save() -> None:
        """After every cell: a call cut short still brings back what ran."""
        results["cells"] = [asdict(c) for c in cells]
        results["wall_s"] = round(time.monotonic() - began, 1)
        (args.out / "results.json").write_text(json.dumps(results, indent=1))
        (args.out / "results.md").write_text(render_table(results))
        with tarfile.open(args.out / "logs.tar.gz", "w:gz") as archive:
            archive.add(lab.logs, "logs")
            archive.add(lab.runs, "runs")

    if args.overhead:
        run_overhead(lab, args.overhead, base, results["overhead"], save)
    elif args.tune:
        results["tune_sweep"] = []
        results["tune"] = run_tune(lab, base, results["tune_sweep"], save)
    else:
        run_matrix(lab, args, base, cells, save)
    save()
    print((args.out / "results.md").read_text())
    return 0


def run_matrix(
    lab: Lab, args: argparse.Namespace, base: list[str], cells: list[Cell], save: Callable[[], None]
) -> None:
    """Every target x algorithm (a tree cell per budget of --budgets), batch 1 and batched; a
    cell whose tokens differ from DFLASH's is settled by the same pair in deterministic mode."""
    labels = {"batch1": []} if args.quick else {"batch1": [], "batched": list(BATCHED)}
    budgets = [[f"algo.budget={b}"] for b in args.budgets.split(",") if b] or [[]]
    together = set(args.together.split(",")) if args.together else set()
    for target in args.targets.split(","):
        first = len(cells)
        specs = [(algo, [*base, *width]) for algo in args.algos.split(",")
                 for width in (budgets if algo == "ddtree" else [[]])]  # fmt: skip
        for cell in run_cells(lab, target, specs, dict(labels), together=target in together):
            cells.append(cell)
            save()
        diverged = [
            c
            for c in cells[first:]
            if c.algo != "dflash" and any(r.get("divergence") for r in c.runs.values())
        ]
        if diverged and not args.deterministic:
            strict = ["service.deterministic_inference=true"]
            settle = [("dflash", strict), *[(c.algo, [*strict, *c.extra]) for c in diverged]]
            cells.extend(run_cells(lab, target, settle, {"batch1": []}))
            save()


if __name__ == "__main__":
    sys.exit(main())
