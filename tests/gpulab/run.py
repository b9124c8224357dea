"""The GPU lab's matrix, run on the GPU machine: the product drives real SGLang servers.

    python3 tests/gpulab/run.py --bundle .lab --out OUT [--root /tmp/ddtree-lab] [--quick]

It installs the carried bundle (tests/gpulab/bundle.py made it) and this checkout into one venv
that sees the machine's torch, writes the tiny models (models.py), then runs `ddtree-deploy`
itself on `host=h200_lab`: plan (preflight), patch, audit, build-kernels (CUDA for the GPU,
with its smoke test). For each target (pure attention, hybrid) and algorithm (DFLASH, DDTREE
shadow_linear, DDTREE tree) it starts the server with exactly the argv and environment
`action=render output=json` gives (the machine has no systemd, so the lab is the service
manager), and judges it with `action=validate`, the product's own gates: at batch 1, then with
several requests in flight. A cell whose tokens differ from DFLASH's is settled by the same
pair in SGLang's deterministic mode (`service.deterministic_inference=true`; sgl-kernel has no
float32 RMSNorm, so an fp32 run cannot start): equal there means a bf16 near-tie between
batch shapes, different means a bug. The attention target's DFLASH and shadow_linear also run at 8 and 32 requests in flight
for the overhead table.

Results: OUT/results.md (the table), OUT/results.json, OUT/logs.tar.gz (every run folder and
server log). The table is printed last.
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
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
RELEASE = "0.5.11"  # the release whose set the lab serves (0.5.12-0.5.17 once they have sets)
ALGOS = ("dflash", "ddtree_shadow", "ddtree")
BATCHED = ("validation.concurrency=8", "validation.repeats=4")  # 16 requests, 8 in flight
# Every prompt of the default set answers 160 new tokens (the matrix asks for at least 128).
LONG_ANSWERS = tuple(f"validation.prompts.{i}.max_new_tokens=160" for i in range(4))
OVERHEAD_CONCURRENCY = (1, 8, 32)
# About ten seconds of generation at batch 1 (run 2's one-second windows spread 20-30%).
OVERHEAD_REPEATS_C1 = 12
START_TIMEOUT_S = 420


@dataclass
class StepRun:
    """One `ddtree-deploy` call: its exit code, time and the end of its output."""

    name: str
    exit_code: int
    wall_s: float
    tail: str


@dataclass
class Cell:
    """One target x algorithm: server start, and each validate run's verdicts and figures."""

    target: str
    algo: str
    start_s: float | None = None
    start_error: str | None = None
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)  # label -> summary


class Lab:
    """The lab's folders and the one venv that holds SGLang, its kernels and ddtree-deploy."""

    def __init__(self, root: Path, out: Path) -> None:
        self.root, self.out = root, out
        self.venv = root / "venv"
        self.runs = root / "runs"
        self.logs = root / "logs"
        self.env = {**os.environ, "DDTREE_LAB_ROOT": str(root), "PYTHONUNBUFFERED": "1"}

    # -- setup ---------------------------------------------------------------------------------

    def install(self, bundle: Path, *, reuse: bool) -> None:
        """The bundle's wheels, the trimmed sglang-kernel and this checkout, into one venv.

        `reuse` keeps a root an earlier call on the same (still warm) machine installed.
        """
        done = self.root / "installed"
        if reuse and done.exists():
            return
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

    # -- the product ---------------------------------------------------------------------------

    def _argv(self, overrides: Sequence[str]) -> list[str]:
        """`ddtree-deploy` on the lab host with the lab's options, then `overrides`."""
        lab = ["host=h200_lab", "service=lab", "validation=lab", f"rollout.runs_dir={self.runs}"]
        return [str(self.venv / "bin" / "ddtree-deploy"), *lab, *LONG_ANSWERS, *overrides]

    def tool(self, name: str, *overrides: str) -> StepRun:
        """Run `ddtree-deploy` on the lab host; never raises on a non-zero exit."""
        argv = self._argv(overrides)
        start = time.monotonic()
        proc = subprocess.run(argv, env=self.env, capture_output=True, text=True)
        wall = time.monotonic() - start
        text = proc.stdout + proc.stderr
        (self.logs / f"{name}.log").write_text(" ".join(argv) + "\n" + text)
        print(f"> {name}: exit {proc.returncode} in {wall:.0f} s", flush=True)
        return StepRun(name, proc.returncode, round(wall, 1), text[-1500:])

    def rendered(self, overrides: list[str]) -> dict[str, Any]:
        """The argv and environment the product renders for this config."""
        argv = self._argv([*overrides, "action=render", "output=json"])
        out = subprocess.run(argv, env=self.env, capture_output=True, text=True, check=True)
        data: dict[str, Any] = json.loads(out.stdout)
        return data

    def last_report(self) -> dict[str, Any] | None:
        reports = sorted(self.runs.glob("*-validate*/report.json"), key=lambda p: p.stat().st_mtime)
        return json.loads(reports[-1].read_text()) if reports else None

    # -- one server ----------------------------------------------------------------------------

    @property
    def pgid_file(self) -> Path:
        return self.root / "server.pgid"

    def stop_stale(self) -> None:
        """Kill a server an earlier call left running (cut off by its time limit): it would hold
        the port, and the next cell's gates would judge it instead of the new one."""
        if self.pgid_file.exists():
            pgid = int(self.pgid_file.read_text())
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(pgid, sig)
                except ProcessLookupError:
                    break
                time.sleep(10)
            self.pgid_file.unlink()

    def serve(
        self, label: str, overrides: list[str]
    ) -> tuple[subprocess.Popen[bytes] | None, float | None, str | None]:
        """Start the rendered server; (process, seconds to /health) or (None, None, why)."""
        spec = self.rendered(overrides)
        self.stop_stale()
        log = (self.logs / f"server-{label}.log").open("wb")
        log.write((" ".join(spec["argv"]) + "\n").encode())
        log.flush()
        start = time.monotonic()
        process = subprocess.Popen(
            spec["argv"], env={**self.env, **spec["environment"]}, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        self.pgid_file.write_text(f"{process.pid}\n")
        argv = spec["argv"]
        health = f"http://127.0.0.1:{argv[argv.index('--port') + 1]}/health"
        while time.monotonic() - start < START_TIMEOUT_S:
            if process.poll() is not None:
                return None, None, _log_tail(self.logs / f"server-{label}.log")
            try:
                if httpx.get(health, timeout=2).status_code == 200:
                    return process, round(time.monotonic() - start, 1), None
            except httpx.TransportError:
                pass
            time.sleep(1)
        stop(process)
        return None, None, f"no /health 200 within {START_TIMEOUT_S} s"


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server's process group (scheduler, detokenizer), SIGKILL after 30 s."""
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def summarize(report: dict[str, Any] | None, exit_code: int) -> dict[str, Any]:
    """The figures of one validate run that the table shows."""
    if report is None:
        return {"exit": exit_code, "gates": {}, "sentence": "no report"}
    phase = report["phases"][-1] if report["phases"] else {}
    gates = {g["gate"]: g["outcome"] for g in phase.get("gates", [])}
    divergence = next((g["divergence"] for g in phase.get("gates", []) if "divergence" in g), None)
    measured = phase.get("measurement") or {}
    per = measured.get("per_prompt") or []
    steps = [
        p["accept_length"] / p["tokens_per_s"]
        for p in per
        if p.get("accept_length") and p.get("tokens_per_s")
    ]
    return {
        "exit": exit_code,
        "gates": gates,
        "sentence": report.get("sentence", ""),
        "divergence": divergence,
        "accept_length": measured.get("mean_accept_length"),
        "tokens_per_s": measured.get("tokens_per_s"),
        "tokens": measured.get("tokens"),
        "step_ms": round(1000 * sum(steps) / len(steps), 3) if steps else None,
    }  # fmt: skip


def run_cell(
    lab: Lab, target: str, algo: str, extra: list[str], labels: dict[str, list[str]]
) -> Cell:
    """Start one server and run each validate pass in `labels` (label -> overrides) against it."""
    overrides = [f"model=lab_{target}", f"algo={algo}", *extra]
    if target == "hybrid" and algo == "ddtree":
        overrides.append("algo.allow_hybrid_unsafe=true")  # what the lab is here to prove
    cell = Cell(target, algo)
    name = "-".join([target, algo, *[e.split("=")[-1] for e in extra]])
    process, cell.start_s, cell.start_error = lab.serve(name, overrides)
    if process is None:
        print(
            f"> {name}: server did not start: {cell.start_error[-300:] if cell.start_error else ''}",
            flush=True,
        )
        return cell
    try:
        for label, more in labels.items():
            step = lab.tool(f"validate-{name}-{label}", *overrides, *more, "action=validate")
            cell.runs[label] = summarize(lab.last_report(), step.exit_code)
    finally:
        stop(process)
    return cell


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
    parser.add_argument("--steps", default="plan,patch,audit,build-kernels")
    parser.add_argument("--quick", action="store_true", help="batch 1 only, no overhead table")
    parser.add_argument("--reuse", action="store_true", help="keep an installed --root")
    parser.add_argument(
        "--deterministic",
        action="store_true",
        help="every cell with service.deterministic_inference=true",
    )
    args = parser.parse_args()
    # `timeout` sends SIGTERM: unwind so the running cell stops its server.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    base = ["service.deterministic_inference=true"] if args.deterministic else []
    args.out.mkdir(parents=True, exist_ok=True)
    lab = Lab(args.root, args.out)
    began = time.monotonic()
    print("> installing the bundle and the checkout", flush=True)
    lab.install(args.bundle, reuse=args.reuse)
    steps = [lab.tool(action, f"action={action}") for action in args.steps.split(",")]
    cells: list[Cell] = []

    def save() -> None:
        """After every cell: a call cut short still brings back what ran."""
        results = {
            "release": RELEASE,
            "steps": [asdict(s) for s in steps],
            "cells": [asdict(c) for c in cells],
            "wall_s": round(time.monotonic() - began, 1),
        }
        (args.out / "results.json").write_text(json.dumps(results, indent=1))
        (args.out / "results.md").write_text(render_table(results))
        with tarfile.open(args.out / "logs.tar.gz", "w:gz") as archive:
            archive.add(lab.logs, "logs")
            archive.add(lab.runs, "runs")

    labels = {"batch1": []} if args.quick else {"batch1": [], "batched": list(BATCHED)}
    for target in args.targets.split(","):
        for algo in args.algos.split(","):
            more = dict(labels)
            if target == "attention" and algo != "ddtree" and not args.quick:
                more["c1"] = [f"validation.repeats={OVERHEAD_REPEATS_C1}"]
                for c in OVERHEAD_CONCURRENCY[1:]:
                    more[f"c{c}"] = [f"validation.concurrency={c}", f"validation.repeats={c // 4}"]
            cells.append(run_cell(lab, target, algo, base, more))
            save()
        diverged = [
            c
            for c in cells[-3:]
            if c.algo != "dflash" and any(r.get("divergence") for r in c.runs.values())
        ]
        if diverged and not args.deterministic:  # settle: the same pair in deterministic mode
            cells.append(
                run_cell(
                    lab, target, "dflash", ["service.deterministic_inference=true"], {"batch1": []}
                )
            )
            for cell in diverged:
                cells.append(
                    run_cell(
                        lab,
                        target,
                        cell.algo,
                        ["service.deterministic_inference=true"],
                        {"batch1": []},
                    )
                )
            save()
    save()
    print((args.out / "results.md").read_text())
    return 0


def render_table(results: dict[str, Any]) -> str:
    lines = [f"# GPU lab, SGLang {results['release']} ({results['wall_s']} s)", ""]
    lines += ["| step | exit | s |", "|---|---|---|"]
    lines += [f"| {s['name']} | {s['exit_code']} | {s['wall_s']} |" for s in results["steps"]]
    lines += ["", "| target | algo | run | start s | gates | exit | first divergence | accept | tok/s | step ms |",
              "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for cell in results["cells"]:
        if cell["start_error"]:
            lines.append(
                f"| {cell['target']} | {cell['algo']} | - | failed | {cell['start_error'][-120:]!r} | | | | | |"
            )
            continue
        for label, run in cell["runs"].items():
            gates = " ".join(f"{g}:{o[0]}" for g, o in run["gates"].items())
            div = run.get("divergence")
            where = f"{div['prompt']}@{div['position']}" if div else "none"
            lines.append(
                f"| {cell['target']} | {cell['algo']} | {label} | {cell['start_s']} | {gates} | {run['exit']} "
                f"| {where} | {run.get('accept_length')} | {run.get('tokens_per_s')} | {run.get('step_ms')} |"
            )  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
