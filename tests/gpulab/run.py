"""The GPU lab's matrix, run on the GPU machine: the product drives real SGLang servers.

    python3 tests/gpulab/run.py --bundle .lab --out OUT [--root /tmp/ddtree-lab] [--quick]
        [--size tiny|realistic] [--budgets 15,31,63] [--batched ddtree-15] [--planted-bug]
        | --overhead ROUNDS
        | --tune [--tune-budgets 15,31,63 --tune-concurrency 1,8,32 --tune-wave N]

It installs the carried bundle (tests/gpulab/bundle.py made it, for one release) and this
checkout into one venv that sees the machine's torch, writes the models of `--size` (models.py:
tiny, or realistic: Qwen3-8B's dimensions and a dense Qwen3.5 hybrid, made on the GPU), then runs
`ddtree-deploy` itself on `host=h200_lab`: plan (preflight), patch, audit, build-kernels (CUDA for
the GPU, with its smoke test). For each target (pure attention, hybrid) and algorithm (DFLASH, DDTREE
shadow_linear, DDTREE tree, a tree cell per `--budgets` entry) it starts the server with exactly
the argv and environment `action=render output=json` gives (the machine has no systemd, so the
lab is the service manager), and judges it with `action=validate`, the product's own gates: at
batch 1, then with 8 requests in flight (every cell, or those `--batched` names, DFLASH's
baseline with them). The tree gate judges a divergence from DFLASH by the target's own scores
there, so no cell is re-run; `--deterministic` serves every cell in SGLang's deterministic mode.

`--planted-bug`: one more tree cell (budget 15) whose server has
`tests/standin/plant` first on its PYTHONPATH and `DDTREE_LAB_PLANTED_BUG=wrong_child`, so its
verify walk also takes a child the target did not pick (tests/standin/planted_bug.py). Its
validate must fail; the table says whether it did, and whether the plant was in place.

`--api-key`: every server is deployed with an API key (`service.api_key_env`), started through
the product's launcher as its unit would start it; once healthy, each cell records whether the
key shows on any command line or in any environment of its process group (the server's own
included), in its log, and whether a request without the key is refused (issue 26's check on a
real server).

`--overhead N`: DFLASH, shadow_linear and a tree per `--budgets` entry served side by side on
the attention target (`--targets hybrid`: on the GDN hybrid, its recurrent-state steps too),
their passes interleaved over N rounds at 1, 8 and 32 requests in flight (round 0 the
product's validate, later rounds timed over HTTP with the same requests for every server,
about OVERHEAD_PASS_S each, the order rotating per round, each pass with what the host did
meanwhile: host_counters.py): shadow_linear's cost and each tree's speed over DFLASH, as
medians of paired rounds. A follow-up call whose gates an
earlier one passed buys rounds with `--no-gates` (round 0 one untimed wave per server) and
`--no-batch-1` (only the `--in-flight` levels). `--one-by-one` (with `--overhead 1`) serves
the servers one at a time instead, each its round 0 and `--profile` timeline alone on the GPU:
a 27B shape's DFLASH and tree timed on one 80 GB card, where two do not fit side by side.
`--tune`: `action=tune`'s sweep on the attention target with the lab as service manager
(tune_lab.py judges and tables it with the product's code); `--tune-budgets`, `--tune-topks`
and `--tune-concurrency` replace conf/tune's grid (e.g. the inflated pair over 15,31,63 at 1,8,32);
`--tune-wave N` serves N candidates at once instead of the size's (1: a 27B shape on an H100).
`--gpus N`: on a machine with N GPUs (nvidia-h100-x2 or x4), the servers started together (the
interleaved comparison's, `--together`'s, a tune wave) go to the GPUs in turn, one card each for
the first N: two 27B servers side by side without an H200, a control on a card of its own.

Results: OUT/results.md (the tables), OUT/results.json, OUT/logs.tar.gz (every run folder and
server log). The tables are printed last.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, NoReturn

import host_counters
import httpx
import yaml
from decode_log import overhead_servers_steps
from speed import pass_requests, timed_pass
from tables import SMALL, render_table, summarize
from timeline import read_trace, summarize_trace

REPO = Path(__file__).resolve().parents[2]
ALGOS = ("dflash", "ddtree_shadow", "ddtree")
TARGETS = ("attention", "hybrid")  # the lab's models (models.py), in the matrix's order
IN_FLIGHT = "8"  # the batched passes' requests in flight (--in-flight): 4 passes, 8 at once
LONG_ANSWER = 160  # new tokens every prompt answers (the matrix asks for at least 128)
OVERHEAD_CONCURRENCY = (1, 8, 32)
LAB_KEY_VAR = "DDTREE_LAB_API_KEY"  # --api-key: where the tool reads the key (service.api_key_env)
OVERHEAD_PASS_S = 6.0  # generation per measured pass after round 0 (run 2: 1 s spread 20-30%)
START_TIMEOUT_S = 420
STOP_GRACE_S = 15
PROFILE_STEPS = 40  # decode steps a profiled server records (--profile)
PROFILE_TOKENS = 512  # an answer long enough for those steps at any acceptance
PROFILE_WAIT_S = 240  # for SGLang to export a trace with Python stacks
PROFILE_QUIET_S = 30  # for one server's export to end before the next server records
PROFILE_POLL_S = 2  # between looks at a trace being exported
PROFILE_STOPPED = "Stop profiling"  # SGLang's log line once the steps are recorded (0.5.11-0.5.16)
TUNE_GRID = ("budgets", "topks", "concurrency")  # conf/tune's lists that --tune-KEY replaces
PLANT = REPO / "tests" / "standin" / "plant"  # its sitecustomize plants the bug
PLANTED_BUG = "wrong_child"  # what DDTREE_LAB_PLANTED_BUG names
PLANTED_BUDGET = "algo.budget=15"
# What plant/sitecustomize.py prints (its MARKER) in each process where the bug is in place.
PLANT_MARKER = "ddtree lab: planted bug"


@dataclass(frozen=True)
class Size:
    """What a model size (models.py) changes in the lab's runs."""

    service: str  # the service= option of its servers
    shared_gpu: tuple[str, ...]  # overrides for servers that share the GPU
    batch1: tuple[str, ...]  # the batch-1 pass's overrides
    tune_wave: int = 6  # tune candidates served at once (the default grid in one wave)


SIZES = {
    # Servers that share the GPU (overhead pairs, tune waves, --together) cap their KV pools, so
    # one's start does not see the others' pools as used memory and refuse (SGLang sizes the
    # pool from free memory).
    "tiny": Size("lab", ("service.mem_fraction_static=0.8", "service.max_total_tokens=131072"), ()),
    # service=lab_realistic caps every server already (five share the GPU); one pass at batch 1
    # (each prompt once: about 10 s at 8B) keeps a call within the device's 10 minutes.
    "realistic": Size("lab_realistic", (), ("validation.repeats=1",)),
    # The pair trained on the GPU (trained/train.py): as small as the tiny models to serve; its
    # 16 held-out prompts answer 256 tokens each, so two passes make a batch-1 measurement.
    "trained": Size(
        "lab",
        ("service.mem_fraction_static=0.8", "service.max_total_tokens=131072"),
        ("validation.repeats=2",),
    ),
    # The trained pair inflated to a realistic shape computing the same function
    # (trained/inflate.py): Qwen3-8B's, or a 27B's (two servers fit the H200 beside each other).
    # Tune waves: three 8B servers fit the H100's 80 GB (run 21), two 27B servers the H200's.
    "trained-8b": Size("lab_inflated", (), ("validation.repeats=1",), tune_wave=3),
    "trained-27b": Size("lab_inflated", (), ("validation.repeats=1",), tune_wave=2),
}
INFLATED = {"trained-8b": "8b", "trained-27b": "27b"}  # size -> inflate.py's --shape
TRAINED = Path(__file__).with_name("trained")  # the trained size's pipeline


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


@dataclass(frozen=True)
class CellSpec:
    """One server of the matrix: an algorithm, its tree width, whether the bug is planted in it
    and whether it also runs the batched pass."""

    algo: str
    width: tuple[str, ...] = ()  # algo.budget=...
    planted: str | None = None
    batched: bool = True
    size: str | None = None  # its model's size where not the lab's (the small pair beside)

    @property
    def key(self) -> str:
        """How --batched names it: dflash, ddtree_shadow, ddtree-15, planted."""
        if self.planted:
            return "planted"
        return "-".join([self.algo, *[w.split("=")[-1] for w in self.width]])


@dataclass
class Cell:
    """One target x algorithm: server start, and each validate run's verdicts and figures."""

    target: str
    algo: str
    extra: list[str] = field(default_factory=list)  # overrides beyond the algorithm's
    start_s: float | None = None
    start_error: str | None = None
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)  # label -> summary
    planted: str | None = None  # the bug planted in its server
    plant_seen: bool | None = None  # whether the server log says the plant was in place
    key_check: str | None = None  # --api-key: "clean", or where the key showed


class Lab:
    """The lab's folders and the one venv that holds SGLang, its kernels and ddtree-deploy."""

    def __init__(self, root: Path, out: Path, release: str, size: str) -> None:
        self.root, self.out, self.release = root, out, release
        self.size_name, self.size = size, SIZES[size]
        self.venv = root / "venv"
        self.runs = root / "runs"
        self.logs = root / "logs"
        self.env = {**os.environ, "DDTREE_LAB_ROOT": str(root), "PYTHONUNBUFFERED": "1"}
        self.long_answers: list[str] = []  # answer_every_prompt() fills it, once installed
        # The validation set's prompts as the lab asks them (answer_every_prompt): text and
        # max_new_tokens, what the timed passes send.
        self.prompt_set: list[dict[str, Any]] = []
        self.prompts = 0  # how many prompts it holds
        self.toy = False  # the trained pair at train.py's toy sizes (a quick serving check)
        self.api_key: str | None = None  # --api-key: every server requires it
        self.gpus = 1  # --gpus: the machine's GPUs its servers are spread over
        # The trained pair's own prompt set (held-out text): a config option under this folder.
        self.conf = root / "conf"
        self.validation = ["validation=lab"]
        if size.startswith("trained"):
            self.validation = [f"hydra.searchpath=[file://{self.conf}]", "validation=lab_trained"]

    def on_gpu(self, i: int) -> list[str]:
        """The overrides that put the `i`-th of servers started together on a GPU of its own
        where the machine has several (--gpus): the GPUs in turn, so the first --gpus servers
        (the interleaved comparison's realistic ones, a tune wave) never share a card."""
        if self.gpus == 1:
            return []
        return [f"host.gpu_count={self.gpus}", f"host.gpu_ids=[{i % self.gpus}]"]

    def require_api_key(self) -> None:
        """Deploy every server with a fresh API key, which the tool reads from LAB_KEY_VAR."""
        self.api_key = secrets.token_urlsafe(24)
        self.env[LAB_KEY_VAR] = self.api_key

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
        done.write_text("ok\n")
        return False

    def write_models(self, kinds: Sequence[str]) -> None:
        """The models of this size for `kinds`, unless an earlier call on this root wrote them
        (realistic ones on the GPU: a minute for the 8B target; the trained pair: trained here,
        minutes, its prompt set written as a validation option)."""
        models = self.root / "models"
        python = str(self.venv / "bin" / "python")
        written = self.models_digest()
        for kind in kinds:
            done = models / self.size_name / f"{kind}.written"
            if done.exists() and done.read_text() == written:
                continue
            began = time.monotonic()
            if self.size_name.startswith("trained"):
                self.train_pair(kind)
            if self.size_name in INFLATED:
                _run([python, str(TRAINED / "inflate.py"), str(models / "trained" / kind),
                      str(models / self.size_name / kind), "--shape",
                      INFLATED[self.size_name]], stream=True)  # fmt: skip
            elif not self.size_name.startswith("trained"):
                _run([python, str(Path(__file__).with_name("models.py")), str(models),
                      self.size_name, kind])  # fmt: skip
            print(f"> {self.size_name} {kind} models: {time.monotonic() - began:.0f} s", flush=True)
            done.parent.mkdir(parents=True, exist_ok=True)
            done.write_text(written)

    def train_pair(self, kind: str) -> None:
        """The trained pair (train.py, minutes on the GPU) and its prompt set as a validation
        option, unless an earlier call on this root trained it with today's pipeline (an
        inflated size reuses the pair its smaller call trained)."""
        where = self.root / "models" / "trained" / kind
        done = where.parent / f"{kind}.written"
        trained = self.models_digest("trained")
        if not (done.exists() and done.read_text() == trained):
            toy = ["--toy"] if self.toy else []
            _run([str(self.venv / "bin" / "python"), str(TRAINED / "train.py"), str(where), *toy],
                 stream=True)  # fmt: skip
            done.write_text(trained)
        prompts = json.loads((where / "prompts.json").read_text())
        option = self.conf / "validation" / "lab_trained.yaml"
        option.parent.mkdir(parents=True, exist_ok=True)
        option.write_text(trained_validation(prompts))

    def models_digest(self, size: str | None = None) -> str:
        """What wrote this size's models: a digest of its generator's source and options, kept
        in each `.written` marker, so a reused root whose models an older generator wrote (a
        Qwen3-Next where the hybrid is now a Qwen3.5) gets them written again."""
        size = size or self.size_name
        inflate = TRAINED / "inflate.py"
        sources = sorted(p for p in TRAINED.glob("*.py") if p != inflate)
        if size in INFLATED:
            sources.append(inflate)
        elif not size.startswith("trained"):
            sources = [Path(__file__).with_name("models.py")]
        digest = hashlib.sha256(f"{size} toy={self.toy}".encode())
        for source in sources:
            digest.update(source.read_bytes())
        return digest.hexdigest() + "\n"

    @property
    def training_record(self) -> Path:
        """training.json of the trained pair (trained/train.py wrote it)."""
        return self.root / "models" / "trained" / "attention" / "training.json"

    def training_figures(self) -> dict[str, Any] | None:
        """What training measured, for a call that serves the trained pair (a reused root keeps
        an earlier call's record, which says nothing of the random tiny or realistic models)."""
        if not self.size_name.startswith("trained") or not self.training_record.exists():
            return None
        figures: dict[str, Any] = json.loads(self.training_record.read_text())
        return figures

    def answer_every_prompt(self) -> None:
        """LONG_ANSWER new tokens for every prompt of the validation set the lab composes; the
        trained pair's prompts keep their own lengths (within what it was trained on)."""
        python = str(self.venv / "bin" / "python")
        self.prompt_set = validation_prompts(python, self._argv([])[1:])
        self.prompts = len(self.prompt_set)
        if not self.size_name.startswith("trained"):
            self.long_answers = [
                f"validation.prompts.{i}.max_new_tokens={LONG_ANSWER}" for i in range(self.prompts)
            ]
            self.prompt_set = [{**p, "max_new_tokens": LONG_ANSWER} for p in self.prompt_set]

    # -- the product ---------------------------------------------------------------------------

    def _argv(self, overrides: Sequence[str]) -> list[str]:
        """`ddtree-deploy` on the lab host with the lab's options, then `overrides`."""
        lab = ["host=h200_lab", f"service={self.size.service}", *self.validation,
               f"rollout.runs_dir={self.runs}",
               f"sglang=v{self.release.split('.post')[0].replace('.', '_')}",
               f"sglang.version={self.release}",
               *([f"service.api_key_env={LAB_KEY_VAR}"] if self.api_key else [])]  # fmt: skip
        return [str(self.venv / "bin" / "ddtree-deploy"), *lab, *self.long_answers, *overrides]

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

    def start(
        self, label: str, overrides: list[str], environment: dict[str, str] | None = None
    ) -> Server:
        """Start the rendered server (exactly the product's argv and environment, plus
        `environment`)."""
        spec = self.rendered(overrides)
        argv = spec["argv"]
        path = self.logs / f"server-{label}.log"
        with path.open("wb") as log:
            log.write((" ".join(spec["argv"]) + "\n").encode())
            log.flush()
            process = subprocess.Popen(
                argv, env=self.server_environment(spec, environment),
                stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.pgids.mkdir(exist_ok=True)
        (self.pgids / str(process.pid)).touch()
        return Server(label, process, int(argv[argv.index("--port") + 1]), path, time.monotonic())

    def server_environment(
        self, spec: dict[str, Any], environment: dict[str, str] | None
    ) -> dict[str, str]:
        """The lab's environment, the rendered one and `environment`, and the key only where a
        unit's 0600 environment file puts it: in the variable the launcher's --api-key-env
        names (the rendered environment masks it). Not LAB_KEY_VAR, the lab's own copy for the
        tool's gates: a server holding that would show the key in every process's environment."""
        env = {k: v for k, v in self.env.items() if k != LAB_KEY_VAR}
        env.update(spec["environment"])
        if self.api_key:
            argv = spec["argv"]
            env[argv[argv.index("--api-key-env") + 1]] = self.api_key
        return {**env, **(environment or {})}

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

    def server_pids(self, server: Server) -> list[int]:
        """The processes of a started server: its own, its scheduler's and detokenizer's."""
        return group_pids(server.process.pid)

    def stop(self, *servers: Server) -> None:
        """SIGTERM the servers' process groups (scheduler, detokenizer) at once, SIGKILL the
        groups still there after STOP_GRACE_S: stopping five servers one by one at 30 s each
        outlasted a device call (run 13)."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            live = [s for s in servers if s.process.poll() is None]
            for server in live:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(server.process.pid, sig)
            deadline = time.monotonic() + STOP_GRACE_S
            for server in live:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    server.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        for server in servers:
            (self.pgids / str(server.process.pid)).unlink(missing_ok=True)


@dataclass
class Server:
    """One SGLang server the lab started."""

    label: str
    process: subprocess.Popen[bytes]
    port: int
    log: Path
    started: float


def model_option(target: str, size: str) -> str:
    """The conf/model option of the lab's `target` at `size` (lab_attention, lab_hybrid_realistic)."""
    return f"model=lab_{target}" + ("" if size == "tiny" else f"_{size.replace('-', '_')}")


def cell_overrides(target: str, size: str, algo: str, extra: Sequence[str]) -> list[str]:
    overrides = [model_option(target, size), f"algo={algo}", *extra]
    if target == "hybrid" and algo == "ddtree":
        overrides.append("algo.allow_hybrid_unsafe=true")  # what the lab is here to prove
    return overrides


def plan_cells(
    algos: Sequence[str], budgets: Sequence[str], *, planted: bool, batched: set[str] | None
) -> list[CellSpec]:
    """A target's cells in serving order (DFLASH first: its passes store the baselines): each
    algorithm, a tree cell per budget, and the planted tree last. `batched` names the cells that
    also run the batched pass (None: every cell); DFLASH joins them, for their baseline."""
    widths = [(f"algo.budget={b}",) for b in budgets] or [()]
    cells = [CellSpec(algo, width) for algo in algos
             for width in (widths if algo == "ddtree" else [()])]  # fmt: skip
    if planted:
        cells.append(CellSpec("ddtree", (PLANTED_BUDGET,), planted=PLANTED_BUG))
    if batched is None:
        return cells
    unknown = batched - {c.key for c in cells}
    if unknown:
        raise SystemExit(f"--batched names no cell of this run: {', '.join(sorted(unknown))} "
                         f"(cells: {', '.join(c.key for c in cells)})")  # fmt: skip
    chosen = batched | {"dflash"} if batched else batched
    return [replace(c, batched=c.key in chosen) for c in cells]


def group_pids(pgid: int) -> list[int]:
    """The live processes of a process group (a server the lab started and its children)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and os.getpgid(int(proc.name)) == pgid:
                pids.append(int(proc.name))
        except ProcessLookupError:
            continue  # gone meanwhile
    return pids


def key_exposure(server: Server, key: str) -> str:
    """The verdict "clean" when the key is on no command line and in no environment of the
    server's process group (the server's own included: the launcher starts it again without the
    key), not in its log, and a request without it is refused; else what was found."""
    found, pids = [], group_pids(server.process.pid)
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except FileNotFoundError:
            continue  # gone meanwhile
        program = cmdline.replace(b"\0", b" ").decode(errors="replace")[:80].replace(key, "***")
        if key.encode() in cmdline:
            found.append(f"process {pid}'s command line ({program})")
        if key.encode() in environ:
            found.append(f"process {pid}'s environment ({program})")
    if key in server.log.read_text(errors="replace"):
        found.append("the server log")
    status = httpx.get(f"http://127.0.0.1:{server.port}/v1/models", timeout=10).status_code
    if status != 401:
        found.append(f"a request without the key answered HTTP {status}")
    if found:
        return f"KEY EXPOSED: {', '.join(found)} ({len(pids)} processes)"
    return f"clean ({len(pids)} processes; HTTP 401 without the key)"


def planted_environment(env: dict[str, str], bug: str) -> dict[str, str]:
    """The plant folder first on the server's PYTHONPATH (its sitecustomize plants `bug`)."""
    path = [str(PLANT), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
    return {"PYTHONPATH": os.pathsep.join(path), "DDTREE_LAB_PLANTED_BUG": bug}


def validation_prompts(python: str, overrides: Sequence[str]) -> list[dict[str, Any]]:
    """The prompts of the validation set `overrides` compose, each its `text` and
    `max_new_tokens` (the product's own composition, in the venv of `python`)."""
    code = ("import sys, json; from ddtree_deploy.config import compose_config; "
            "print(json.dumps([{'text': p.text, 'max_new_tokens': p.max_new_tokens} "
            "for p in compose_config(sys.argv[1:]).validation.prompts]))")  # fmt: skip
    # -P: not the checkout's ddtree_deploy/ (the cwd), whose conf/ is mapped only when installed.
    return json.loads(_run([python, "-P", "-c", code, *overrides]))


def trained_validation(prompts: list[dict[str, Any]]) -> str:
    """The trained pair's validation option: the lab's gates at the product's own speed floor
    (a trained drafter is what min_speedup is for), on the held-out prompts training wrote."""
    option = {
        "defaults": ["lab", "_self_"],
        "min_speedup": 1.05,
        "prompts": [{k: p[k] for k in ("name", "kind", "text", "max_new_tokens")} for p in prompts],
    }
    return (
        "# Written by tests/gpulab/run.py from the trained pair's prompts.json.\n"
        + yaml.safe_dump(option, sort_keys=False)
    )


def pass_labels(batch1: Sequence[str], in_flight: Sequence[int], prompts: int, *, batched: bool
                ) -> dict[str, list[str]]:  # fmt: skip
    """A cell's validate passes: batch 1, then (when it runs batched) one per level in flight,
    at least 4 passes over the prompts and at least `level` requests each."""
    labels = {"batch1": list(batch1)}
    for level in in_flight if batched else ():
        repeats = max(4, -(-level // prompts))
        labels[f"c{level}"] = [f"validation.concurrency={level}", f"validation.repeats={repeats}"]
    return labels


@dataclass
class TargetCells:
    """One target's cells and what serves and judges each: names, overrides, environments,
    validate passes (label -> overrides), index for index."""

    cells: list[Cell]
    names: list[str]
    overrides: list[list[str]]
    environments: list[dict[str, str] | None]
    labels: list[dict[str, list[str]]]

    def launch(self, lab: Lab, i: int) -> Server:
        return lab.start(self.names[i], self.overrides[i], self.environments[i])

    def wait(self, lab: Lab, i: int, server: Server) -> None:
        cell = self.cells[i]
        cell.start_s, cell.start_error = lab.wait(server)
        if cell.start_error is not None:
            print(f"> {self.names[i]}: server did not start: {cell.start_error[-300:]}", flush=True)
        elif lab.api_key:
            cell.key_check = key_exposure(server, lab.api_key)
            print(f"> {self.names[i]}: API key check: {cell.key_check}", flush=True)

    def judge(self, lab: Lab, i: int, label: str) -> None:
        """One validate pass of cell i against its server, once healthy."""
        cell = self.cells[i]
        if cell.start_error is None:
            name = f"validate-{self.names[i]}-{label}"
            step = lab.tool(name, *self.overrides[i], *self.labels[i][label], "action=validate")
            cell.runs[label] = summarize(step.report(lab.runs), step.exit_code)

    def finish(self, i: int, server: Server) -> None:
        """A planted cell: whether its server log shows the plant in place (a plant that failed
        would pass as a missed bug)."""
        if self.cells[i].planted:
            self.cells[i].plant_seen = PLANT_MARKER in server.log.read_text(errors="replace")


def run_cells(
    lab: Lab,
    target: str,
    specs: list[CellSpec],
    base: list[str],
    cells: list[Cell],
    save: Callable[[], None],
    *,
    together: bool = False,
    in_flight: Sequence[int] = (int(IN_FLIGHT),),
) -> None:
    """Serve each cell and run its validate passes, adding the cells to `cells` (`save` after
    each pass). One server at a time, each cell's passes in turn (DFLASH first: its passes
    store the baselines); or with `together` all at once on their own ports (the size's
    shared-GPU overrides), which saves the starts, and the passes interleaved: every cell at
    batch 1, then every cell at each level in flight, so the speeds compared at one level are
    measured minutes apart at most."""
    size = lab.size_name
    overrides = (shared_gpu_overrides(lab, target, specs, base) if together else
                 [cell_overrides(target, size, spec.algo, [*base, *spec.width]) for spec in specs])  # fmt: skip
    plan = TargetCells(
        cells=[Cell(target, spec.algo, list(spec.width), planted=spec.planted) for spec in specs],
        names=["-".join([target, spec.key]) for spec in specs],
        overrides=overrides,
        environments=[planted_environment(lab.env, s.planted) if s.planted else None for s in specs],
        labels=[pass_labels(lab.size.batch1, in_flight, lab.prompts, batched=s.batched) for s in specs],
    )  # fmt: skip
    cells.extend(plan.cells)
    (serve_together if together else serve_in_turn)(lab, plan, save)
    save()


def shared_gpu_overrides(
    lab: Lab, target: str, specs: Sequence[CellSpec], base: Sequence[str]
) -> list[list[str]]:
    """Each cell's overrides for servers that run at once: its own port (30000 on), the size's
    caps on each server's share of a GPU, and with --gpus its own GPU (`Lab.on_gpu`)."""
    return [[*cell_overrides(target, spec.size or lab.size_name, spec.algo, [*base, *spec.width]),
             *lab.size.shared_gpu, f"service.port={30000 + i}", *lab.on_gpu(i)]
            for i, spec in enumerate(specs)]  # fmt: skip


def serve_in_turn(lab: Lab, plan: TargetCells, save: Callable[[], None]) -> None:
    """Each cell's server on its own, its passes, then the next cell."""
    for i in range(len(plan.cells)):
        server = plan.launch(lab, i)
        try:
            plan.wait(lab, i, server)
            for label in plan.labels[i]:
                plan.judge(lab, i, label)
                save()
            plan.finish(i, server)
        finally:
            lab.stop(server)


def serve_together(lab: Lab, plan: TargetCells, save: Callable[[], None]) -> None:
    """Every cell's server at once (all started, then waited on: true start times), then the
    passes label by label across the cells."""
    servers: list[Server] = []
    try:
        servers = [plan.launch(lab, i) for i in range(len(plan.cells))]
        for i, server in enumerate(servers):
            plan.wait(lab, i, server)
        order = dict.fromkeys(label for labels in plan.labels for label in labels)
        for label in order:
            for i in range(len(plan.cells)):
                if label in plan.labels[i]:
                    plan.judge(lab, i, label)
                    save()
        for i, server in enumerate(servers):
            plan.finish(i, server)
    finally:
        lab.stop(*servers)


def in_flight_repeats(level: int, prompts: int) -> int:
    """The fewest passes over `prompts` prompts that keep `level` requests in flight."""
    return -(-level // prompts)


def validation_overrides(level: int, repeats: int) -> list[str]:
    """`repeats` passes with `level` requests in flight (1: one after another)."""
    return [f"validation.repeats={repeats}"] + (
        [f"validation.concurrency={level}"] if level > 1 else []
    )


def concurrency_overrides(level: int, prompts: int) -> list[str]:
    """`level` requests in flight; at least `level` requests, as passes over `prompts` prompts
    (four passes at batch 1)."""
    return validation_overrides(level, 4 if level == 1 else in_flight_repeats(level, prompts))


CONTROL = "dflash_control"  # --control's second DFLASH server


@dataclass(frozen=True)
class OverheadPlan:
    """What --overhead compares: `rounds` (round 0 the product's validate, later ones timed
    passes of about `pass_s` seconds) at each of `levels` in flight, shadow_linear and a tree
    per budget against DFLASH, and with `control` a second DFLASH server: the ratio two
    identical servers show is the lab's own spread, the floor any other ratio is read against.
    Without `gates`, round 0 is one wave per server over HTTP: it warms each batch shape and
    sizes the later passes as the validate does, in seconds instead of a validate's 16 to 20.
    `target` is the lab model they serve: attention, or hybrid (issue 22's recurrent-state
    steps). Without `shadow` no shadow_linear server (an inflated 27B: two servers fit the GPU).
    With `small` (an inflated size), the trained pair it was grown from is served beside, DFLASH
    and the widest tree, in rounds 0 and 1 only: their acceptance beside the inflated servers',
    which computes the same function, is the check that the inflation kept it in bf16."""

    rounds: int
    budgets: tuple[str, ...] = ()
    levels: tuple[int, ...] = OVERHEAD_CONCURRENCY
    pass_s: float = OVERHEAD_PASS_S
    control: bool = False
    gates: bool = True
    target: str = "attention"
    shadow: bool = True
    small: bool = False
    gate_levels: tuple[int, ...] | None = None  # where round 0 validates (None: every level)
    profile_in_flight: int = 1  # with --profile: the answers each profiled step runs at once
    # --one-by-one: each server alone on the GPU, its round 0 and timeline, then the next (a
    # 27B shape's DFLASH and tree on one 80 GB card); nothing is interleaved, so rounds is 1.
    one_by_one: bool = False

    def gated(self, level: int) -> bool:
        """Whether round 0 at `level` is the product's validate (else one wave over HTTP)."""
        return self.gates and (self.gate_levels is None or level in self.gate_levels)


def overhead_cells(
    budgets: Sequence[str], *, control: bool = False, shadow: bool = True, small: bool = False
) -> dict[str, CellSpec]:
    """The interleaved comparison's servers: DFLASH first (its round-0 pass stores the baseline
    the others are held to), with `control` a second DFLASH, shadow_linear (unless not
    `shadow`), a tree server per budget, and with `small` the trained pair's own DFLASH and
    widest tree."""
    cells = {"dflash": CellSpec("dflash")}
    if control:
        cells[CONTROL] = CellSpec("dflash")
    if shadow:
        cells["ddtree_shadow"] = CellSpec("ddtree_shadow")
    cells.update({f"ddtree-{b}": CellSpec("ddtree", (f"algo.budget={b}",)) for b in budgets})
    if small:
        cells[f"{SMALL}dflash"] = CellSpec("dflash", size="trained")
        if budgets:
            widest = max(budgets, key=int)
            cells[f"{SMALL}ddtree-{widest}"] = CellSpec(
                "ddtree", (f"algo.budget={widest}",), size="trained"
            )
    return cells


def run_overhead(
    lab: Lab,
    plan: OverheadPlan,
    base: list[str],
    passes: list[dict[str, Any]],
    save: Callable[[], None],
    timelines: dict[str, Any] | None = None,
) -> None:
    """DDTree's cost and speed against DFLASH: the servers of `plan` served at once on its
    target, their passes interleaved at each level. Round 0 is the product's
    `action=validate` on each, DFLASH first (the gates, and the baseline the others are held
    to; the control only answers the same requests, so it stores no baseline of its own), or
    without `plan.gates` one wave on each over HTTP; later
    rounds are timed passes straight over HTTP (speed.py), as many requests as DFLASH's round 0
    answered in about `plan.pass_s` seconds, the same for every server, the order rotating per
    round, so drift of the machine falls on all alike. With `plan.one_by_one` each server is
    served alone, its round 0 and timeline, and stopped before the next starts."""
    specs = overhead_cells(plan.budgets, control=plan.control, shadow=plan.shadow, small=plan.small)
    groups = [[name] for name in specs] if plan.one_by_one else [list(specs)]
    for group in groups:
        served = {name: specs[name] for name in group}
        if not serve_overhead(lab, plan, served, base, passes, save, timelines):
            return


def serve_overhead(
    lab: Lab,
    plan: OverheadPlan,
    specs: dict[str, CellSpec],
    base: list[str],
    passes: list[dict[str, Any]],
    save: Callable[[], None],
    timelines: dict[str, Any] | None,
) -> bool:
    """`specs`' servers started at once, their rounds and timelines (run_overhead's whole
    comparison, or with `plan.one_by_one` one server's part); False when one did not start."""
    overrides = shared_gpu_overrides(lab, plan.target, list(specs.values()), base)
    cells = dict(zip(specs, overrides, strict=True))
    servers = {name: lab.start(f"overhead-{name}", o) for name, o in cells.items()}
    headers = {"Authorization": f"Bearer {lab.api_key}"} if lab.api_key else {}
    try:
        for name, server in servers.items():
            start_s, error = lab.wait(server)
            if error is not None:
                passes.append({"algo": name, "start_error": error})
                return False
            check = key_exposure(server, lab.api_key) if lab.api_key else None
            passes.append({"algo": name, "start_s": start_s, "key_check": check})
        pids = {name: lab.server_pids(server) for name, server in servers.items()}
        order = list(cells)
        warm: dict[int, dict[str, Any]] = {}  # DFLASH's round-0 run per level: sizes the rest
        for rnd in range(plan.rounds):
            for level in dict.fromkeys(plan.levels):
                repeats = in_flight_repeats(level, lab.prompts)
                requests = repeats * lab.prompts  # round 0: what a validate pass sends
                if rnd == 0 and not plan.gated(level):
                    requests = level  # one wave: each batch shape's first requests
                if rnd > 0:
                    answer_tokens = statistics.mean(p["max_new_tokens"] for p in lab.prompt_set)
                    requests = pass_requests(level, plan.pass_s, warm[level], answer_tokens)
                for name in round_order(order, rnd):
                    if (
                        rnd == 0
                        and plan.gated(level)
                        and name != CONTROL
                        and not name.startswith(SMALL)
                    ):
                        step = lab.tool(f"overhead-r0-c{level}-{name}", *cells[name],
                                        *validation_overrides(level, repeats), "action=validate")  # fmt: skip
                        run = summarize(step.report(lab.runs), step.exit_code)
                    else:
                        url = f"http://127.0.0.1:{servers[name].port}"
                        before = host_counters.sample(pids[name])
                        try:
                            run = {"gates": {}, **timed_pass(url, lab.prompt_set, level=level,
                                                             requests=requests, headers=headers)}  # fmt: skip
                            run["host"] = host_counters.pass_counters(
                                before, host_counters.sample(pids[name])
                            )
                        except httpx.HTTPError as error:  # a dead server: the others go on
                            run = {"gates": {}, "error": f"{type(error).__name__}: {error}"}
                    if rnd == 0 and name == "dflash":
                        warm[level] = run
                    passes.append({"algo": name, "round": rnd, "concurrency": level,
                                   "repeats": run.get("requests", repeats), **run})  # fmt: skip
            save()
        if timelines is not None:
            profile_servers(lab, servers, timelines, save, in_flight=plan.profile_in_flight)
    finally:
        lab.stop(*servers.values())
    return True


def round_order(servers: Sequence[str], rnd: int) -> list[str]:
    """The servers a round times, in its order: rotated one place a round from round 2 (round 1
    goes DFLASH first, as round 0 did), the small pair's only in rounds 0 and 1 (their acceptance
    is what they are there for)."""
    shift = max(rnd - 1, 0) % len(servers)
    rotated = [*servers[shift:], *servers[:shift]]
    return [name for name in rotated if rnd <= 1 or not name.startswith(SMALL)]


def profile_servers(
    lab: Lab,
    servers: dict[str, Server],
    timelines: dict[str, Any],
    save: Callable[[], None],
    *,
    in_flight: int = 1,
) -> None:
    """Issue 22's timeline of each live server into `timelines` (or why there is none), saved
    as each comes, its steps running `in_flight` answers at once. One server's steps are
    recorded at a time, and none while another exports: SGLang writes the trace inside its
    scheduler, a core busy for seconds (run 18: 3 to 7 s), and a host-bound step recorded
    beside that is not the one being compared. An export that runs past PROFILE_QUIET_S (run 17
    saw about 110 s) is left running, since SGLang answers its requests only after it, and the
    next server's timeline says it was recorded beside it."""
    pool = ThreadPoolExecutor((1 + in_flight) * len(servers))
    try:
        recorded: dict[str, Path | str] = {}
        beside: dict[str, str] = {}
        exporting: list[tuple[str, Path]] = []
        for name, server in servers.items():
            quiet = time.monotonic() + PROFILE_QUIET_S
            exporting = [(n, f) for n, f in exporting if finished_trace(f, quiet) is None]
            if exporting:
                beside[name] = exporting[-1][0]
            recorded[name] = folder = record_profile(lab, name, server, pool, in_flight)
            if isinstance(folder, Path):
                exporting.append((name, folder))
        deadline = time.monotonic() + PROFILE_WAIT_S
        for name, folder in recorded.items():
            timeline = folder if isinstance(folder, str) else collect_profile(folder, deadline)
            if isinstance(timeline, dict) and name in beside:
                timeline["recorded_beside_export_of"] = beside[name]
            timelines[name] = timeline
            save()
    finally:  # a call cut here (SIGTERM) stops the servers next, which ends any request left
        pool.shutdown(wait=False, cancel_futures=True)


def record_profile(
    lab: Lab, name: str, server: Server, pool: ThreadPoolExecutor, in_flight: int = 1
) -> Path | str:
    """SGLang's own /start_profile (CPU and GPU, Python stacks) over PROFILE_STEPS steps of
    `in_flight` answers at once (1: batch 1; 8: where a wide tree's verify starts to cost), the
    requests left running in `pool` once the server logs that the recording stopped; the folder
    the trace is exported to, or why nothing was recorded."""
    folder = lab.root / "profiles" / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    url = f"http://127.0.0.1:{server.port}"
    headers = {"Authorization": f"Bearer {lab.api_key}"} if lab.api_key else {}
    request = {"output_dir": str(folder), "num_steps": PROFILE_STEPS,
               "activities": ["CPU", "GPU"], "with_stack": True}  # fmt: skip
    answer = {"text": "def main(argv):", "sampling_params": {
        "temperature": 0, "max_new_tokens": PROFILE_TOKENS, "ignore_eos": True}}  # fmt: skip
    stops_before = _log_text(server.log).count(PROFILE_STOPPED)
    requests = [pool.submit(httpx.post, f"{url}/start_profile", json=request, headers=headers,
                            timeout=PROFILE_WAIT_S)]  # fmt: skip
    time.sleep(2)
    requests += [pool.submit(httpx.post, f"{url}/generate", json=answer, headers=headers,
                             timeout=PROFILE_WAIT_S) for _ in range(in_flight)]  # fmt: skip
    deadline = time.monotonic() + PROFILE_WAIT_S
    while _log_text(server.log).count(PROFILE_STOPPED) == stops_before:
        failed = [r.exception() for r in requests if r.done() and r.exception() is not None]
        if failed:
            return f"no profile: {type(failed[0]).__name__}"
        if all(r.done() for r in requests) or time.monotonic() > deadline:
            break  # answered without the line (another release's wording): the trace decides
        time.sleep(0.5)
    return folder


def _log_text(log: Path) -> str:
    return log.read_text(errors="replace") if log.exists() else ""


def finished_trace(folder: Path, deadline: float) -> Path | None:
    """The trace a server exports into `folder` once the file stops growing, or None if it
    has not by `deadline` (time.monotonic())."""
    sizes = [-1]
    while time.monotonic() < deadline:
        traces = sorted(folder.glob("*.trace.json.gz"))
        sizes.append(traces[0].stat().st_size if traces else -1)
        if sizes[-1] > 0 and sizes[-1] == sizes[-2]:
            return traces[0]
        time.sleep(PROFILE_POLL_S)
    return None


def collect_profile(folder: Path, deadline: float) -> dict[str, Any] | str:
    """The summary (timeline.py) of the trace a server exports into `folder`, or why there is
    none by `deadline` (time.monotonic())."""
    trace = finished_trace(folder, deadline)
    if trace is None:
        return f"no finished trace within {PROFILE_WAIT_S} s"
    timeline = summarize_trace(read_trace(trace))
    return asdict(timeline) if timeline else "fewer than two steps in the trace"


def run_tune(
    lab: Lab, base: list[str], sweep: list[dict[str, Any]], save: Callable[[], None]
) -> str:
    """`action=tune`'s sweep with the lab as service manager (tune_lab.py says why): baselines
    from linear DFlash at each concurrency, then each candidate served (the size's tune_wave at
    a time) and validated at each concurrency; tune_lab.py judges and tables it as the product
    does. `base` holds the grid's overrides (tune_overrides) where the call names one."""
    shared = [model_option("attention", lab.size_name), *lab.size.shared_gpu, *base]
    wave_size = lab.size.tune_wave
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
                            *concurrency_overrides(level, lab.prompts), "action=validate")  # fmt: skip
            if step.exit_code != 0:
                raise SystemExit(f"the baseline at concurrency {level} failed: {step.tail[-600:]}")
    finally:
        lab.stop(baseline)
    pending = [(int(b), int(k)) for b, k in grid["candidates"]]
    while pending:
        wave, pending = pending[:wave_size], pending[wave_size:]
        served = []
        for i, (budget, topk) in enumerate(wave):
            overrides = [*shared, "algo=ddtree", f"algo.budget={budget}", f"algo.topk={topk}",
                         f"service.port={30001 + i}", *lab.on_gpu(i)]  # fmt: skip
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
                        more = concurrency_overrides(level, lab.prompts)
                        step = lab.tool(f"tune-b{budget}k{topk}-c{level}", *overrides, *more,
                                        "action=validate")  # fmt: skip
                        entry["reports"][str(level)] = step.report(lab.runs)
                sweep.append(entry)
                save()
        finally:
            lab.stop(*(server for *_, server in served))
    (lab.out / "tune-sweep.json").write_text(json.dumps(sweep))
    report = _run([*tune_lab, "report", str(lab.out / "tune-sweep.json"), str(lab.out / "tune"),
                   *lab._argv([*shared, "action=tune"])[1:]])  # fmt: skip
    return report


def _run(argv: list[str], *, stream: bool = False) -> str:
    """Run a setup command; its output, or exit the lab with its error. `stream` passes its
    output through as it comes (a long stage shows progress) and returns none."""
    if stream:
        if subprocess.run(argv).returncode != 0:
            raise SystemExit(f"lab setup failed: {' '.join(argv[:4])}... (its output is above)")
        return ""
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
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny", help="models.py's sizes")
    parser.add_argument("--targets", help="default attention,hybrid; --overhead serves one "
                        "(attention without it), --tune attention")  # fmt: skip
    parser.add_argument("--algos", default=",".join(ALGOS), help="dflash must come first")
    parser.add_argument(
        "--steps", help="default: plan on a reused root, else plan,patch,audit,build-kernels"
    )
    parser.add_argument("--quick", action="store_true", help="batch 1 only, no overhead table")
    parser.add_argument(
        "--batched",
        help="only these cells run the batched pass (and DFLASH, their baseline), e.g. ddtree-15; "
        "cells: dflash, ddtree_shadow, ddtree[-BUDGET], planted",
    )
    parser.add_argument("--reuse", action="store_true", help="keep an installed --root")
    parser.add_argument(
        "--deterministic",
        action="store_true",
        help="every cell with service.deterministic_inference=true",
    )
    parser.add_argument("--budgets", default="", help="tree cells at these budgets, e.g. 15,31,63")
    parser.add_argument(
        "--planted-bug", action="store_true", help="one more tree cell (budget 15), bug planted"
    )
    parser.add_argument("--overhead", type=int, default=0, metavar="ROUNDS",
                        help="only the interleaved table: shadow_linear and the --budgets trees "
                        "against DFLASH")  # fmt: skip
    parser.add_argument("--pass-seconds", type=float, default=OVERHEAD_PASS_S,
                        help="with --overhead: generation per timed pass after round 0 (shorter "
                        "passes buy more rounds in one call)")  # fmt: skip
    parser.add_argument("--control", action="store_true",
                        help="with --overhead: a second DFLASH server, the lab's own spread "
                        "between identical servers (A/A) beside every ratio")  # fmt: skip
    parser.add_argument("--gate-levels", help="with --overhead: round 0 validates at these levels "
                        "only (e.g. 1), one wave at the others")  # fmt: skip
    parser.add_argument("--no-gates", action="store_true",
                        help="with --overhead: round 0 one untimed wave per server instead of the "
                        "product's validate (a follow-up call whose gates an earlier one passed)")  # fmt: skip
    parser.add_argument("--no-shadow", action="store_true",
                        help="with --overhead: no shadow_linear server (room for a 27B pair)")  # fmt: skip
    parser.add_argument("--small-beside", action="store_true",
                        help="with --overhead at an inflated size: the trained pair's own DFLASH "
                        "and widest tree beside, rounds 0 and 1 (their acceptance)")  # fmt: skip
    parser.add_argument("--one-by-one", action="store_true",
                        help="with --overhead 1: each server alone on the GPU, its round 0 and "
                        "--profile timeline, then the next (a 27B shape on an 80 GB card)")  # fmt: skip
    parser.add_argument("--no-batch-1", action="store_true",
                        help="with --overhead: only the --in-flight levels, not batch 1")  # fmt: skip
    parser.add_argument("--profile", nargs="?", const=1, type=count, metavar="N",
                        help="with --overhead: then each server's step timeline from SGLang's "
                        "/start_profile (issue 22), over N answers at once (default 1)")  # fmt: skip
    parser.add_argument("--tune", action="store_true", help="only the tune sweep (attention)")
    for key, example in (("budgets", "15,31,63"), ("topks", "4"), ("concurrency", "1,8,32")):
        parser.add_argument(f"--tune-{key}", metavar="LIST",
                            help=f"with --tune: tune.{key} instead of conf/tune's, e.g. {example}")  # fmt: skip
    parser.add_argument("--gpus", type=count, default=1, metavar="N",
                        help="servers started together go to N GPUs of the machine in turn "
                        "(e.g. 2: a 27B pair side by side on two 80 GB cards)")  # fmt: skip
    parser.add_argument("--tune-wave", type=count, metavar="N",
                        help="with --tune: candidates served at once instead of the size's (1 "
                        "for the 27B shape on an 80 GB card)")  # fmt: skip
    parser.add_argument(
        "--together", default="", help="targets whose cells are served at once, e.g. attention"
    )
    parser.add_argument("--in-flight",
                        help=f"the batched passes' requests in flight, e.g. 8,32 (default "
                        f"{IN_FLIGHT}; with --overhead, batch 1 and these, default "
                        f"{','.join(map(str, OVERHEAD_CONCURRENCY))}; \"\": batch 1 alone)")  # fmt: skip
    parser.add_argument("--toy", action="store_true",
                        help="--size trained at train.py's toy sizes: seconds, to check serving")  # fmt: skip
    parser.add_argument("--api-key", action="store_true",
                        help="serve every cell with an API key and check where it shows")  # fmt: skip
    parser.add_argument("--models-only", action="store_true",
                        help="install, run --steps and write (or train) the models, then stop")  # fmt: skip
    args = parser.parse_args()
    targets = lab_targets(
        args.targets, overhead=bool(args.overhead), tune=args.tune, error=parser.error
    )
    check_flags(args, targets, parser.error)
    if not (args.bundle / "MANIFEST.json").is_file():
        parser.error(f"--bundle {args.bundle} holds no MANIFEST.json: make the bundle with "
                     "tests/gpulab/bundle.py and carry it")  # fmt: skip
    if args.gpus > 1 and (found := visible_gpus()) < args.gpus:
        parser.error(
            f"--gpus {args.gpus}: this machine shows {found} GPU{'' if found == 1 else 's'}; "
            f"give at most {found}"
        )
    # `timeout` sends SIGTERM: unwind so the running cell stops its server.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    base = ["service.deterministic_inference=true"] if args.deterministic else []
    args.out.mkdir(parents=True, exist_ok=True)
    release = json.loads((args.bundle / "MANIFEST.json").read_text())["release"]
    lab = Lab(args.root, args.out, release, args.size)
    if args.tune_wave is not None:
        lab.size = replace(lab.size, tune_wave=args.tune_wave)
    lab.toy = args.toy
    lab.gpus = args.gpus
    if args.api_key:
        lab.require_api_key()
    began = time.monotonic()
    print(f"> installing the bundle (SGLang {release}) and the checkout", flush=True)
    reused = lab.install(args.bundle, reuse=args.reuse)
    lab.stop_stale()
    lab.write_models(targets)  # first: the trained pair's prompt set is part of the config
    lab.answer_every_prompt()
    actions = args.steps or ("plan" if reused else "plan,patch,audit,build-kernels")
    steps = [lab.tool(action, f"action={action}") for action in actions.split(",")]
    results: dict[str, Any] = {"release": release, "size": args.size,
                               "steps": [asdict(s) for s in steps],
                               "cells": [], "overhead": [], "tune": None}  # fmt: skip
    if (training := lab.training_figures()) is not None:  # beside what serving measures
        results["training"] = training
    cells: list[Cell] = []

    def save() -> None:
        """After every cell: a call cut short still brings back what ran."""
        results["cells"] = [asdict(c) for c in cells]
        # The decode log of this call's --overhead servers (none without it): a reused root
        # keeps the logs of servers an earlier call ran.
        overhead_names = list(dict.fromkeys(p["algo"] for p in results["overhead"]))
        results["decode_log"] = overhead_servers_steps(lab.logs, overhead_names)
        results["wall_s"] = round(time.monotonic() - began, 1)
        (args.out / "results.json").write_text(json.dumps(results, indent=1))
        (args.out / "results.md").write_text(render_table(results))
        with tarfile.open(args.out / "logs.tar.gz", "w:gz") as archive:
            archive.add(lab.logs, "logs")
            archive.add(lab.runs, "runs")

    try:  # a call cut at its limit (SIGTERM) still saves what ran, logs included
        if args.models_only:
            pass
        elif args.overhead:
            plan = OverheadPlan(args.overhead, tuple(b for b in args.budgets.split(",") if b),
                                overhead_levels(args.in_flight, batch_1=not args.no_batch_1),
                                args.pass_seconds, args.control, gates=not args.no_gates,
                                target=targets[0], shadow=not args.no_shadow,
                                small=args.small_beside, profile_in_flight=args.profile or 1,
                                one_by_one=args.one_by_one,
                                gate_levels=None if args.gate_levels is None
                                else tuple(in_flight_levels(args.gate_levels)))  # fmt: skip
            results["overhead_target"] = plan.target
            timelines = results.setdefault("timeline", {}) if args.profile else None
            if args.profile:
                results["timeline_in_flight"] = plan.profile_in_flight
            run_overhead(lab, plan, base, results["overhead"], save, timelines)
        elif args.tune:
            results["tune_sweep"] = []
            results["tune"] = run_tune(lab, [*base, *tune_overrides(args)], results["tune_sweep"],
                                       save)  # fmt: skip
        else:
            run_matrix(lab, args, targets, base, cells, save)
    finally:
        save()
    print((args.out / "results.md").read_text())
    return 0


def check_flags(
    args: argparse.Namespace, targets: list[str], error: Callable[[str], NoReturn]
) -> None:
    """Refuse, through `error`, flags that do not go together."""
    if args.size.startswith("trained") and targets != ["attention"]:
        error(f"--size {args.size} has one target: give --targets attention")
    if args.profile and not args.overhead:
        error("--profile profiles the interleaved comparison's servers: add --overhead 1")
    flags = ("control", "no_gates", "no_batch_1", "no_shadow", "small_beside", "gate_levels",
             "one_by_one")  # fmt: skip
    for flag in flags:
        if getattr(args, flag) not in (None, False) and not args.overhead:
            error(f"--{flag.replace('_', '-')} is an option of the interleaved comparison: "
                  "add --overhead ROUNDS")  # fmt: skip
    if args.one_by_one and args.overhead > 1:
        error(f"--one-by-one serves one server at a time, so nothing is interleaved: give "
              f"--overhead 1, not {args.overhead}")  # fmt: skip
    if args.small_beside and args.size not in INFLATED:
        error(f"--small-beside serves the pair an inflated size grew from: give --size "
              f"{' or '.join(INFLATED)}")  # fmt: skip
    if args.no_batch_1 and not overhead_levels(args.in_flight, batch_1=False):
        error("--no-batch-1 leaves no level: name some with --in-flight, e.g. 32")
    if args.tune_wave is not None and not args.tune:
        error("--tune-wave is an option of the tune sweep: add --tune")
    for key in TUNE_GRID:
        option = getattr(args, f"tune_{key}")
        if option is not None and not args.tune:
            error(f"--tune-{key} is an option of the tune sweep: add --tune")
        if option is not None and not re.fullmatch(r"[1-9][0-9]*(,[1-9][0-9]*)*", option):
            error(f"--tune-{key} {option!r} is not a list of positive integers: give e.g. 1,8,32")


def tune_overrides(args: argparse.Namespace) -> list[str]:
    """The tune grid's overrides the call names (--tune-budgets 15,31 -> tune.budgets=[15,31]);
    the product's own range checks judge the values (a budget past the release's widest verify
    is refused by the first `action=tune`, in one sentence)."""
    return [f"tune.{key}=[{option}]" for key in TUNE_GRID
            if (option := getattr(args, f"tune_{key}")) is not None]  # fmt: skip


def count(text: str) -> int:
    """A --gpus or --tune-wave value: a whole number, 1 or more (argparse's refusal otherwise)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count: give 1 or more")
    return int(text)


def visible_gpus() -> int:
    """How many GPUs `nvidia-smi -L` lists (0 where it cannot run)."""
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return 0
    return sum(line.startswith("GPU ") for line in listing.stdout.splitlines())


def in_flight_levels(option: str) -> list[int]:
    """--in-flight's levels: "8,32" -> [8, 32]."""
    return [int(level) for level in option.split(",") if level]


def overhead_levels(option: str | None, *, batch_1: bool = True) -> tuple[int, ...]:
    """The levels --overhead compares at: batch 1 and --in-flight's ("" for batch 1 alone),
    OVERHEAD_CONCURRENCY without it; without `batch_1` (--no-batch-1) the others alone."""
    levels = OVERHEAD_CONCURRENCY if option is None else (1, *in_flight_levels(option))
    return levels if batch_1 else tuple(level for level in levels if level != 1)


def lab_targets(
    option: str | None, *, overhead: bool, tune: bool, error: Callable[[str], NoReturn]
) -> list[str]:
    """The targets --targets names (the matrix: both without it); the interleaved comparison
    serves one (attention without it), the tune sweep attention alone; `error` refuses."""
    targets = option.split(",") if option else ["attention"] if overhead or tune else list(TARGETS)
    unknown = [t for t in targets if t not in TARGETS]
    if unknown:
        error(f"--targets names {', '.join(unknown)}: the lab's targets are {', '.join(TARGETS)}")
    if overhead and len(targets) != 1:
        error("--overhead compares servers on one target: give --targets attention or "
              "--targets hybrid")  # fmt: skip
    if tune and targets != ["attention"]:
        error("--tune sweeps the attention target only: leave out --targets")
    return targets


def run_matrix(
    lab: Lab,
    args: argparse.Namespace,
    targets: list[str],
    base: list[str],
    cells: list[Cell],
    save: Callable[[], None],
) -> None:
    """Every target x algorithm (a tree cell per budget of --budgets, the planted tree with
    --planted-bug), at batch 1 and, for the cells --batched names (all without it), batched."""
    batched = None if args.batched is None else {c for c in args.batched.split(",") if c}
    if args.quick:
        batched = set()
    budgets = [b for b in args.budgets.split(",") if b]
    specs = plan_cells(args.algos.split(","), budgets, planted=args.planted_bug, batched=batched)
    together = set(args.together.split(",")) if args.together else set()
    in_flight = in_flight_levels(args.in_flight or IN_FLIGHT)
    for target in targets:
        run_cells(lab, target, specs, base, cells, save, together=target in together,
                  in_flight=in_flight)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
