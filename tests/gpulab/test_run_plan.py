"""What run.py serves and asks, checked on CPU: the cells, the planted server's environment,
the prompts' lengths and the configs of each model size."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NoReturn

import httpx
import psutil
import pytest

sys.path.insert(0, str(Path(__file__).parent))  # run.py imports its sibling `tables`, as a script
import run
from run import (
    LONG_ANSWER,
    PLANT_MARKER,
    PLANTED_BUG,
    SIZES,
    Cell,
    Lab,
    Server,
    StepRun,
    cell_overrides,
    pass_labels,
    plan_cells,
    planted_environment,
    run_cells,
    trained_validation,
    validation_prompts,
)
from validate.conftest import free_port

from ddtree_deploy.config import compose_config
from ddtree_deploy.service.render import render_service

LAB = ["host=h200_lab", "validation=lab"]
ALGOS = ["dflash", "ddtree_shadow", "ddtree"]


def test_only_the_named_cells_and_dflash_run_batched() -> None:
    specs = plan_cells(ALGOS, ["15", "63"], planted=True, batched={"ddtree-15"})
    assert [(s.key, s.batched) for s in specs] == [
        ("dflash", True), ("ddtree_shadow", False), ("ddtree-15", True), ("ddtree-63", False),
        ("planted", False),
    ]  # fmt: skip
    planted = specs[-1]
    assert (planted.algo, planted.width, planted.planted) == (
        "ddtree",
        ("algo.budget=15",),
        PLANTED_BUG,
    )
    assert all(s.batched for s in plan_cells(ALGOS, [], planted=False, batched=None))
    assert not any(s.batched for s in plan_cells(ALGOS, [], planted=False, batched=set()))
    with pytest.raises(SystemExit, match="ddtree-31"):
        plan_cells(ALGOS, ["15"], planted=False, batched={"ddtree-31"})


def test_the_planted_servers_environment_plants_the_bug() -> None:
    env = planted_environment({"PYTHONPATH": "/elsewhere"}, PLANTED_BUG)
    assert env["PYTHONPATH"].split(os.pathsep)[1:] == ["/elsewhere"]
    started = subprocess.run(
        [sys.executable, "-c", "import ddtree_kernels.ops"], capture_output=True, text=True,
        timeout=300, env={**os.environ, **planted_environment(dict(os.environ), PLANTED_BUG)},
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    assert f"{PLANT_MARKER} {PLANTED_BUG} installed" in started.stderr


def test_every_prompt_of_the_composed_set_answers_long(tmp_path: Path) -> None:
    lab = _Lab(tmp_path, size="tiny")
    lab.venv = Path(sys.executable).parent.parent  # this venv holds ddtree-deploy
    lab.answer_every_prompt()
    prompts = compose_config(lab._argv([])[1:]).validation.prompts
    assert lab.prompts == len(lab.long_answers) == len(prompts) >= 8
    assert {p.max_new_tokens for p in prompts} == {LONG_ANSWER}


def test_the_trained_pairs_prompts_become_its_validation_option_at_their_own_lengths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DDTREE_LAB_ROOT", str(tmp_path))  # the model paths compose_config reads
    held_out = [
        {"name": f"held-out-{i}", "kind": "code", "text": f"def f{i}(x):\n    return {{'k': [x]}}",
         "max_new_tokens": 100 + i, "source": "ignored"}
        for i in range(3)
    ]  # fmt: skip
    lab = _Lab(tmp_path, size="trained")
    option = lab.conf / "validation" / "lab_trained.yaml"
    option.parent.mkdir(parents=True)
    option.write_text(trained_validation(held_out))
    lab.venv = Path(sys.executable).parent.parent
    lab.answer_every_prompt()
    cfg = compose_config(lab._argv(["model=lab_attention_trained"])[1:])
    assert lab.prompts == 3
    assert lab.prompt_set == validation_prompts(sys.executable, lab._argv([])[1:])
    assert lab.prompt_set == [{k: p[k] for k in ("text", "max_new_tokens")} for p in held_out]
    assert lab.long_answers == []  # the trained pair answers within what it was trained on
    assert [(p.name, p.text, p.max_new_tokens) for p in cfg.validation.prompts] == [
        (p["name"], p["text"], p["max_new_tokens"]) for p in held_out
    ]
    assert cfg.validation.min_speedup == 1.05  # the product's own floor, not the lab's 0.01
    assert cfg.model.target_path == f"{tmp_path}/models/trained/attention/target"


@pytest.mark.parametrize(("size", "shown"), [("tiny", False), ("realistic", False),
                                             ("trained", True), ("trained-8b", True)])  # fmt: skip
def test_only_a_call_serving_the_trained_pair_shows_what_training_predicted(
    tmp_path: Path, size: str, shown: bool
) -> None:
    """Run 25 (0.5.14, tiny hybrid on a reused root) printed the trained pair's predicted
    acceptance beside a random model's served one."""
    lab = _Lab(tmp_path, size=size)
    lab.training_record.parent.mkdir(parents=True)
    lab.training_record.write_text(json.dumps({"acceptance": {"mean_accept_len": 3.965}}))
    figures = lab.training_figures()
    assert (figures == {"acceptance": {"mean_accept_len": 3.965}}) if shown else figures is None


def test_batched_passes_keep_every_level_in_flight_for_at_least_four_passes() -> None:
    labels = pass_labels(["validation.repeats=1"], [8, 32], 16, batched=True)
    assert labels == {
        "batch1": ["validation.repeats=1"],
        "c8": ["validation.concurrency=8", "validation.repeats=4"],
        "c32": ["validation.concurrency=32", "validation.repeats=4"],
    }
    assert pass_labels([], [64], 8, batched=True)["c64"][1] == "validation.repeats=8"
    assert list(pass_labels([], [8, 32], 16, batched=False)) == ["batch1"]


@pytest.mark.parametrize(
    ("size", "target"),
    [(size, target) for size in sorted(SIZES)
     for target in (["attention"] if size.startswith("trained") else ["attention", "hybrid"])],
)  # fmt: skip
def test_every_size_composes_on_the_lab_host(size: str, target: str) -> None:
    service = f"service={SIZES[size].service}"
    overrides = cell_overrides(target, size, "ddtree", ["algo.budget=63"])
    cfg = compose_config([*LAB, service, *overrides, *SIZES[size].shared_gpu, *SIZES[size].batch1])
    assert cfg.model.target_path.endswith(f"/models/{size}/{target}/target")
    assert cfg.model.hybrid == (target == "hybrid")
    assert cfg.service.max_total_tokens is not None  # servers sharing the GPU cap their KV


class _Lab(Lab):
    """The lab with its servers and `ddtree-deploy` calls recorded instead of run; a server
    started with the plant says so in its log, as plant/sitecustomize.py does."""

    def __init__(self, root: Path, size: str = "realistic") -> None:
        super().__init__(root, root / "out", "0.5.11", size)
        self.env["DDTREE_LAB_ROOT"] = str(root)
        self.logs.mkdir(parents=True)
        self.environments: dict[str, dict[str, str] | None] = {}
        self.started: dict[str, list[str]] = {}  # each server's overrides, by label
        self.calls: list[tuple[str, tuple[str, ...]]] = []
        self.baselines: set[tuple[str, ...]] = set()

    def start(
        self, label: str, overrides: list[str], environment: dict[str, str] | None = None
    ) -> Server:
        self.environments[label] = environment
        self.started[label] = overrides
        log = self.logs / f"server-{label}.log"
        log.write_text(f"{PLANT_MARKER} {PLANTED_BUG} installed\n" if environment else "up\n")
        port = next((int(o.split("=")[1]) for o in overrides if o.startswith("service.port=")), 0)
        return Server(label, None, port, log, time.monotonic())  # type: ignore[arg-type]

    def wait(self, server: Server) -> tuple[float | None, str | None]:
        return 1.0, None

    def server_pids(self, server: Server) -> list[int]:
        return [os.getpid()]  # no server runs: the counters watch this test's own process

    def stop(self, *servers: Server) -> None:
        pass

    def tool(self, name: str, *overrides: str) -> StepRun:
        """As the product does, a tree or shadow validate with no stored linear-DFlash baseline
        for its pass (concurrency, repeats) exits 1."""
        self.calls.append((name, overrides))
        shape = tuple(o for o in overrides if o.startswith(("validation.concurrency=",
                                                             "validation.repeats=")))  # fmt: skip
        if "algo=dflash" in overrides:
            self.baselines.add(shape)
        elif "action=validate" in overrides and shape not in self.baselines:
            return StepRun(name, 1, 0.0, "no stored linear-DFlash baseline", time.time())
        return StepRun(name, 0, 0.0, "", time.time())


def test_cells_run_their_passes_and_the_planted_one_its_plant(tmp_path: Path) -> None:
    lab = _Lab(tmp_path)
    lab.prompts = 8
    specs = plan_cells(ALGOS, ["15", "63"], planted=True, batched={"ddtree-15"})
    cells: list[Cell] = []
    run_cells(lab, "attention", specs, [], cells, lambda: None, together=True, in_flight=[8, 32])
    assert [list(c.runs) for c in cells] == [
        ["batch1", "c8", "c32"], ["batch1"], ["batch1", "c8", "c32"], ["batch1"], ["batch1"],
    ]  # fmt: skip
    # Together: every cell at batch 1 first, then every batched cell at each level, DFLASH first.
    names = [name for name, _ in lab.calls]
    assert names[:5] == [f"validate-attention-{key}-batch1" for key in
                         ("dflash", "ddtree_shadow", "ddtree-15", "ddtree-63", "planted")]  # fmt: skip
    assert names[5:] == ["validate-attention-dflash-c8", "validate-attention-ddtree-15-c8",
                         "validate-attention-dflash-c32", "validate-attention-ddtree-15-c32"]  # fmt: skip
    first_overrides = lab.calls[0][1]
    assert "validation.repeats=1" in first_overrides  # the realistic size's one pass at batch 1
    planted = lab.environments["attention-planted"]
    assert planted is not None and planted["DDTREE_LAB_PLANTED_BUG"] == PLANTED_BUG
    assert [k for k, v in lab.environments.items() if v] == ["attention-planted"]
    assert [(c.planted, c.plant_seen) for c in cells][-2:] == [(None, None), (PLANTED_BUG, True)]


def test_models_a_changed_generator_wrote_are_written_again_on_a_reused_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reused root keeps models an earlier call wrote, unless their generator changed since:
    a marker from an older models.py (a Qwen3-Next hybrid) must not serve as today's."""
    calls: list[list[str]] = []
    monkeypatch.setattr(run, "_run", lambda argv, **_: calls.append(argv) or "")
    lab = _Lab(tmp_path, size="realistic")
    lab.write_models(["hybrid"])
    lab.write_models(["hybrid"])  # the same generator: kept
    assert len(calls) == 1
    (tmp_path / "models" / "realistic" / "hybrid.written").write_text("ok\n")  # an older one's
    lab.write_models(["hybrid"])
    assert len(calls) == 2 and calls[-1][-2:] == ["realistic", "hybrid"]
    toy = _Lab(tmp_path / "trained", size="trained")
    assert toy.models_digest() != (setattr(toy, "toy", True) or toy.models_digest())


KEY_PROBE = """
import http.server, logging, multiprocessing, sys, time

class Refuse(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(401)
        self.end_headers()

    def log_message(self, *args):
        pass

def idle():
    time.sleep(60)

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    logging.info("server_args=%s", sys.argv[1:])  # as SGLang logs its arguments at start
    multiprocessing.get_context("spawn").Process(target=idle, daemon=True).start()
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Refuse).serve_forever()
"""


@pytest.mark.parametrize("through_launcher", [True, False], ids=["launcher", "key-in-argv"])
def test_the_key_check_finds_a_key_on_a_command_line_and_passes_the_launchers_server(
    tmp_path: Path, through_launcher: bool
) -> None:
    """key_exposure on real processes: a server group started the way the product's unit starts
    it is clean; the same server given `--api-key` on its command line is caught."""
    key, port = "lab-key-3f9c", free_port()
    (tmp_path / "keyprobe.py").write_text(KEY_PROBE)
    kernels = Path(__file__).resolve().parents[2] / "kernels"
    env = {**os.environ, "PYTHONPATH": f"{kernels}{os.pathsep}{tmp_path}", "LAB_KEY": key}
    head = ["-m", "ddtree_launch", "--api-key-env", "LAB_KEY"] if through_launcher else []
    argv = [sys.executable, *head, "-m" if not head else "", "keyprobe", str(port)]
    argv = [a for a in argv if a] + ([] if through_launcher else ["--api-key", key])
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)  # fmt: skip
    server = Server("probe", process, port, log, time.monotonic())
    try:
        deadline = time.monotonic() + 30
        while "server_args" not in log.read_text() or len(run.group_pids(process.pid)) < 2:
            assert time.monotonic() < deadline and process.poll() is None, log.read_text()
            time.sleep(0.2)
        time.sleep(0.5)  # the HTTP server binds right after the child starts
        verdict = run.key_exposure(server, key)
    finally:
        os.killpg(process.pid, 9)
        process.wait()
    if through_launcher:
        assert verdict.startswith("clean (") and "HTTP 401 without the key" in verdict, verdict
    else:
        assert (
            verdict.startswith("KEY EXPOSED: ")
            and f"process {process.pid}'s command line" in verdict
        )
        assert "the server log" in verdict


def test_an_api_key_lab_server_gets_the_key_only_where_its_unit_would(tmp_path: Path) -> None:
    """Run 12 on the H200 found the key in the environment of the server and its resource
    tracker: the lab had started each server with its own copy (LAB_KEY_VAR) inherited."""
    lab = _Lab(tmp_path)
    lab.require_api_key()
    spec = {
        "argv": ["python", "-m", "ddtree_launch", "--api-key-env", "SGLANG_API_KEY", "sglang"],
        "environment": {"SGLANG_API_KEY": "***", "CUDA_VISIBLE_DEVICES": "0"},
    }
    env = lab.server_environment(spec, {"PLANT": "1"})
    assert [var for var, value in env.items() if value == lab.api_key] == ["SGLANG_API_KEY"]
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["PLANT"] == "1"
    assert env["DDTREE_LAB_ROOT"] == str(tmp_path)


def test_an_api_key_lab_deploys_every_server_with_the_key_the_tool_reads(tmp_path: Path) -> None:
    lab = _Lab(tmp_path)
    lab.require_api_key()
    assert lab.api_key and lab.env[run.LAB_KEY_VAR] == lab.api_key
    overrides = [a for a in lab._argv([]) if "=" in a]
    assert f"service.api_key_env={run.LAB_KEY_VAR}" in overrides
    assert compose_config(overrides).service.api_key_env == run.LAB_KEY_VAR


def test_the_interleaved_comparison_serves_dflash_first_then_shadow_then_each_budget() -> None:
    cells = run.overhead_cells(["15", "63"])
    assert list(cells) == ["dflash", "ddtree_shadow", "ddtree-15", "ddtree-63"]
    assert cells["ddtree-63"] == run.CellSpec("ddtree", ("algo.budget=63",))


@pytest.mark.parametrize("target", ["attention", "hybrid"])
def test_the_interleaved_comparison_serves_its_target_each_server_on_its_own_port(
    target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--overhead --targets hybrid: every server on the GDN hybrid (issue 22's recurrent-state
    steps), its tree allowed there as the matrix's hybrid cells are; each composes on the lab
    host with the shared-GPU caps and its own port."""
    monkeypatch.setattr(run, "summarize", lambda report, code: {"exit": code, "gates": {}})
    lab = _Lab(tmp_path)
    lab.prompt_set, lab.prompts = [{"text": "t", "max_new_tokens": 9}] * 16, 16
    plan = run.OverheadPlan(1, ("15",), levels=(1,), target=target)
    run.run_overhead(lab, plan, [], [], lambda: None)
    assert list(lab.started) == ["overhead-dflash", "overhead-ddtree_shadow", "overhead-ddtree-15"]
    for port, (label, overrides) in enumerate(lab.started.items(), start=30000):
        cfg = compose_config([*LAB, "service=lab_realistic", *overrides])
        assert cfg.model.target_path.endswith(f"/models/realistic/{target}/target")
        assert cfg.service.port == port
        assert cfg.service.max_total_tokens is not None  # the servers share the GPU
        if label == "overhead-ddtree-15":
            assert cfg.algo.budget == 15
            assert cfg.algo.allow_hybrid_unsafe == (target == "hybrid")
    # the validate of each server's round 0 judges the same server, on the same target
    assert all(f"model=lab_{target}_realistic" in overrides for _, overrides in lab.calls)


def _overhead_lab(tmp_path: Path) -> _Lab:
    """A lab whose validation set is 16 prompts of 9-token answers (what the timed passes send)."""
    lab = _Lab(tmp_path, size="trained")
    lab.prompt_set = [{"text": "t", "max_new_tokens": 9}] * 16
    lab.prompts = 16
    return lab


def test_the_interleaved_comparison_validates_round_0_then_times_rotated_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Round 0 is the product's validate on each server, DFLASH first, at the fewest passes that
    keep the level in flight; every later round times each server over HTTP, the order rotating
    per round, with the lab's prompts, every server the same requests: as many as DFLASH's round
    0 answered in about OVERHEAD_PASS_S."""
    figures = {"gates": {}, "tokens_per_s": 100.0}
    monkeypatch.setattr(run, "summarize", lambda report, code: {"exit": code, **figures})
    timed: list[tuple[str, int]] = []
    sizes: dict[int, set[int]] = {}

    def timed_pass(url: str, prompts: list[dict[str, object]], **kw: int) -> dict[str, object]:
        assert prompts == lab.prompt_set
        timed.append((url, kw["level"]))
        sizes.setdefault(kw["level"], set()).add(kw["requests"])
        return {"requests": kw["requests"], "tokens": 800, "tokens_per_s": 100.0}

    monkeypatch.setattr(run, "timed_pass", timed_pass)
    lab = _overhead_lab(tmp_path)
    passes: list[dict[str, object]] = []
    run.run_overhead(lab, run.OverheadPlan(3, ("15",)), [], passes, lambda: None)
    names = [name for name, _ in lab.calls]
    assert names[:3] == ["overhead-r0-c1-dflash", "overhead-r0-c1-ddtree_shadow",
                         "overhead-r0-c1-ddtree-15"]  # fmt: skip
    assert len(names) == len(run.OVERHEAD_CONCURRENCY) * 3  # only round 0 runs the product
    repeats = {name: [o for o in overrides if o.startswith("validation.repeats=")]
               for name, overrides in lab.calls}  # fmt: skip
    assert repeats["overhead-r0-c32-ddtree-15"] == ["validation.repeats=2"]
    assert [p["algo"] for p in passes if p.get("exit")] == []
    later = [(p["round"], p["concurrency"], p["algo"]) for p in passes if p.get("round", 0) > 0]
    assert later[:3] == [(1, 1, "dflash"), (1, 1, "ddtree_shadow"), (1, 1, "ddtree-15")]
    assert later[9:12] == [(2, 1, "ddtree_shadow"), (2, 1, "ddtree-15"), (2, 1, "dflash")]
    assert all(p["gates"] == {} for p in passes if p.get("round", 0) > 0)
    # each timed pass with what the host did meanwhile (here: this test's own process)
    assert {p["host"]["hot_process"] for p in passes if p.get("round", 0) > 0} == {
        psutil.Process().name()
    }
    # 9 tokens an answer at DFLASH's 100 tok/s: 6 s is 67 answers at batch 1; at 8 and 32 in
    # flight whole waves of 8 and 32 (0.72 s and 2.88 s each), 8 and 2 of them.
    assert sizes == {1: {67}, 8: {64}, 32: {64}}
    port = {"dflash": 30000, "ddtree_shadow": 30001, "ddtree-15": 30002}  # each server's own
    assert timed == [(f"http://127.0.0.1:{port[name]}", level) for _, level, name in later]


def test_a_server_that_stops_answering_a_timed_pass_leaves_the_others_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run, "summarize", lambda report, code: {"exit": code, "gates": {}})

    def timed_pass(url: str, prompts: object, **kw: int) -> dict[str, object]:
        if url.endswith(":30001"):  # shadow_linear's server
            raise httpx.ConnectError("connection refused")
        return {"requests": kw["requests"], "tokens": 800, "tokens_per_s": 100.0}

    monkeypatch.setattr(run, "timed_pass", timed_pass)
    lab = _overhead_lab(tmp_path)
    passes: list[dict[str, object]] = []
    run.run_overhead(lab, run.OverheadPlan(2, levels=(1,)), [], passes, lambda: None)
    timed = {p["algo"]: p for p in passes if p.get("round") == 1}
    assert timed["ddtree_shadow"]["error"] == "ConnectError: connection refused"
    assert timed["dflash"]["tokens_per_s"] == 100.0


def test_the_interleaved_comparison_runs_only_the_levels_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run, "summarize", lambda report, code: {"exit": code, "gates": {}})
    lab = _overhead_lab(tmp_path)
    run.run_overhead(lab, run.OverheadPlan(1, ("15",), levels=(1, 32, 32)), [], [], lambda: None)
    assert sorted({name.split("-")[2] for name, _ in lab.calls}) == ["c1", "c32"]
    assert len(lab.calls) == 2 * 3


IGNORES_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"


def test_stopping_servers_signals_every_group_before_waiting_on_any(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Servers that ignore SIGTERM: each gets SIGTERM, then (one grace later) SIGKILL, and
    each group is gone; one at a time, five servers' grace periods outlasted a device call."""
    lab = Lab(tmp_path, tmp_path / "out", "0.5.11", "tiny")
    lab.pgids.mkdir(parents=True)
    servers = []
    for i in range(2):
        process = subprocess.Popen([sys.executable, "-c", IGNORES_TERM], start_new_session=True)
        (lab.pgids / str(process.pid)).touch()
        servers.append(Server(f"s{i}", process, 0, tmp_path / "log", time.monotonic()))
    time.sleep(0.5)  # the handlers are in place
    sent: list[tuple[int, int]] = []
    real_killpg = os.killpg
    monkeypatch.setattr(run.os, "killpg", lambda pgid, sig: (sent.append((pgid, sig)),
                                                            real_killpg(pgid, sig)))  # fmt: skip
    monkeypatch.setattr(run, "STOP_GRACE_S", 1)
    lab.stop(*servers)
    a, b = (s.process.pid for s in servers)
    term, kill = signal.SIGTERM, signal.SIGKILL
    assert sent == [(a, term), (b, term), (a, kill), (b, kill)]
    assert all(s.process.poll() is not None for s in servers)
    assert list(lab.pgids.iterdir()) == []


def test_the_interleaved_comparison_sizes_its_passes_by_the_seconds_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--pass-seconds 3: half the default's requests (9-token answers at DFLASH's 100 tok/s)."""
    monkeypatch.setattr(run, "summarize", lambda report, code: {"exit": code, "gates": {},
                                                                "tokens_per_s": 100.0})  # fmt: skip
    sizes: list[int] = []

    def timed_pass(url: str, prompts: object, **kw: int) -> dict[str, object]:
        sizes.append(kw["requests"])
        return {"requests": kw["requests"], "tokens": 800, "tokens_per_s": 100.0}

    monkeypatch.setattr(run, "timed_pass", timed_pass)
    run.run_overhead(_overhead_lab(tmp_path), run.OverheadPlan(2, levels=(1,), pass_s=3.0), [], [],
                     lambda: None)  # fmt: skip
    assert sizes == [33, 33]


def test_the_interleaved_comparison_levels_come_from_in_flight() -> None:
    assert run.overhead_levels(None) == run.OVERHEAD_CONCURRENCY
    assert run.overhead_levels("32") == (1, 32)
    assert run.overhead_levels("") == (1,)  # run 17 asked for batch 1 alone and got all three
    assert run.overhead_levels("32", batch_1=False) == (32,)
    assert run.overhead_levels(None, batch_1=False) == (8, 32)


def test_without_gates_round_0_is_one_wave_per_server_that_sizes_the_timed_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--no-gates: the product runs nothing; round 0 sends each server one wave over HTTP (the
    batch shapes' first requests, left out of the ratios), and DFLASH's wave sizes the rest."""
    timed: list[tuple[str, int, int, int]] = []

    def timed_pass(url: str, prompts: object, **kw: int) -> dict[str, object]:
        timed.append((url.rsplit(":", 1)[1], len(timed) // 3, kw["level"], kw["requests"]))
        return {"requests": kw["requests"], "tokens": 800, "tokens_per_s": 50.0}

    monkeypatch.setattr(run, "timed_pass", timed_pass)
    lab = _overhead_lab(tmp_path)
    passes: list[dict[str, object]] = []
    plan = run.OverheadPlan(2, levels=(32,), control=True, gates=False)
    run.run_overhead(lab, plan, [], passes, lambda: None)
    assert lab.calls == []
    # Round 0: 32 requests on each server (one wave); round 1: 9-token answers at DFLASH's
    # 50 tok/s make a wave of 32 take 5.76 s, so 6 s is one wave again.
    assert timed == [
        (port, i // 3, 32, 32) for i, port in enumerate(["30000", "30001", "30002"] * 2)
    ]
    assert [(p["round"], p["algo"]) for p in passes if "round" in p][:3] == [
        (0, "dflash"), (0, run.CONTROL), (0, "ddtree_shadow")]  # fmt: skip
    assert all(p["gates"] == {} for p in passes if "round" in p)


def test_the_control_is_a_second_dflash_timed_like_the_others_that_stores_no_baseline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--control: DFLASH twice, so the table shows what two identical servers differ by. Only
    the first validates (stores the baseline); the control answers the same requests over HTTP
    in round 0 too, and is timed in every later round."""
    monkeypatch.setattr(run, "summarize", lambda report, code: {"exit": code, "gates": {},
                                                                "tokens_per_s": 100.0})  # fmt: skip
    timed: list[tuple[str, int, int]] = []

    def timed_pass(url: str, prompts: object, **kw: int) -> dict[str, object]:
        timed.append((url.rsplit(":", 1)[1], kw["level"], kw["requests"]))
        return {"requests": kw["requests"], "tokens": 800, "tokens_per_s": 100.0}

    monkeypatch.setattr(run, "timed_pass", timed_pass)
    lab = _overhead_lab(tmp_path)
    passes: list[dict[str, object]] = []
    run.run_overhead(lab, run.OverheadPlan(2, levels=(1, 32), control=True), [], passes,
                     lambda: None)  # fmt: skip
    assert run.overhead_cells([], control=True)[run.CONTROL] == run.CellSpec("dflash")
    assert [name for name, _ in lab.calls] == [
        "overhead-r0-c1-dflash", "overhead-r0-c1-ddtree_shadow",
        "overhead-r0-c32-dflash", "overhead-r0-c32-ddtree_shadow",
    ]  # fmt: skip
    # Port 30001 is the control: round 0 sends what a validate pass would (16 prompts, then
    # two passes of them at 32 in flight), and it is timed with the others in round 1.
    assert [t for t in timed if t[0] == "30001"] == [("30001", 1, 16), ("30001", 32, 32),
                                                     ("30001", 1, 67), ("30001", 32, 64)]  # fmt: skip
    assert {p["algo"] for p in passes if p.get("round") == 1} == {"dflash", run.CONTROL,
                                                                 "ddtree_shadow"}  # fmt: skip


def test_an_inflated_size_serves_its_pair_beside_the_small_pair_it_grew_from_in_rounds_0_and_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--size trained-8b --small-beside --no-shadow: DFLASH and the trees on the inflated pair,
    the trained pair's own DFLASH and widest tree beside them (their acceptance is the check
    that the inflation kept it), timed in rounds 0 and 1 only and never validated; no
    shadow_linear server."""
    monkeypatch.setattr(run, "summarize", lambda report, code: {"exit": code, "gates": {},
                                                                "tokens_per_s": 100.0})  # fmt: skip
    timed: list[tuple[str, int]] = []

    def timed_pass(url: str, prompts: object, **kw: int) -> dict[str, object]:
        timed.append((url.rsplit(":", 1)[1], kw["level"]))
        return {"requests": kw["requests"], "tokens": 800, "tokens_per_s": 100.0}

    monkeypatch.setattr(run, "timed_pass", timed_pass)
    lab = _overhead_lab(tmp_path)
    lab.size_name, lab.size = "trained-8b", run.SIZES["trained-8b"]
    plan = run.OverheadPlan(3, ("15", "63"), levels=(1, 8), shadow=False, small=True,
                            gate_levels=(1,))  # fmt: skip
    run.run_overhead(lab, plan, [], [], lambda: None)
    assert list(lab.started) == ["overhead-dflash", "overhead-ddtree-15", "overhead-ddtree-63",
                                 "overhead-small-dflash", "overhead-small-ddtree-63"]  # fmt: skip
    paths = {label: compose_config([*LAB, "service=lab_inflated", *o]).model.target_path
             for label, o in lab.started.items()}  # fmt: skip
    assert paths["overhead-ddtree-63"].endswith("/models/trained-8b/attention/target")
    assert paths["overhead-small-ddtree-63"].endswith("/models/trained/attention/target")
    assert [name for name, _ in lab.calls] == ["overhead-r0-c1-dflash", "overhead-r0-c1-ddtree-15",
                                               "overhead-r0-c1-ddtree-63"]  # fmt: skip
    small_ports = {"30003", "30004"}
    assert sorted(t for t in timed if t[0] in small_ports) == [
        ("30003", 1), ("30003", 1), ("30003", 8), ("30003", 8),
        ("30004", 1), ("30004", 1), ("30004", 8), ("30004", 8),
    ]  # fmt: skip
    # DFLASH: validated at batch 1 in round 0 (--gate-levels 1), a wave at 8, then rounds 1, 2
    assert sorted(t for t in timed if t[0] == "30000") == [("30000", 1), ("30000", 1),
                                                            ("30000", 8), ("30000", 8), ("30000", 8)]  # fmt: skip


def test_with_gpus_a_27b_pair_and_its_small_pair_each_take_the_next_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--gpus 2 (two 80 GB cards, no H200): the 27B DFLASH and tree each on a card of their own,
    the small pair beside them on the cards in turn; each server's rendered environment names
    its card, and the config still passes the product's checks (gpu_ids within gpu_count)."""
    monkeypatch.setattr(run, "summarize", lambda report, code: {"exit": code, "gates": {}})
    monkeypatch.setattr(run, "timed_pass", lambda url, prompts, **kw: {"requests": kw["requests"],
                                                                       "tokens": 8})  # fmt: skip
    lab = _overhead_lab(tmp_path)
    lab.size_name, lab.size = "trained-27b", run.SIZES["trained-27b"]
    lab.gpus = 2
    plan = run.OverheadPlan(1, ("63",), levels=(1,), shadow=False, small=True)
    run.run_overhead(lab, plan, [], [], lambda: None)
    cards = {
        label: render_service(
            compose_config([*LAB, "service=lab_inflated", *o]), None
        ).environment_masked["CUDA_VISIBLE_DEVICES"]
        for label, o in lab.started.items()
    }
    assert cards == {"overhead-dflash": "0", "overhead-ddtree-63": "1",
                     "overhead-small-dflash": "0", "overhead-small-ddtree-63": "1"}  # fmt: skip
    lab.gpus = 1  # one card: every server on it, as before --gpus
    assert lab.on_gpu(3) == []


def test_one_by_one_serves_each_server_alone_its_round_0_then_its_timeline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--one-by-one (a 27B shape's DFLASH and tree on one 80 GB card): a server is started only
    once the one before it stopped, each on the first port, judged and profiled while alone."""
    events: list[str] = []

    def wave(url: str, prompts: object, **kw: int) -> dict[str, object]:
        events.append(f"wave of {kw['requests']} at {url.rsplit(':', 1)[1]}")
        return {"requests": kw["requests"], "tokens": 8}

    monkeypatch.setattr(run, "timed_pass", wave)
    lab = _overhead_lab(tmp_path)
    lab.size_name, lab.size = "trained-27b", run.SIZES["trained-27b"]
    start, stop = lab.start, lab.stop

    def started(label: str, overrides: list[str], environment: object = None) -> Server:
        events.append(f"start {label}")
        return start(label, overrides)

    def stopped(*servers: Server) -> None:
        events.extend(f"stop {s.label}" for s in servers)
        stop(*servers)

    def profiled(lab_: Lab, servers: dict[str, Server], timelines: dict[str, object],
                 save: object, *, in_flight: int) -> None:  # fmt: skip
        events.extend(f"profile {name} at {in_flight}" for name in servers)

    monkeypatch.setattr(lab, "start", started)
    monkeypatch.setattr(lab, "stop", stopped)
    monkeypatch.setattr(run, "profile_servers", profiled)
    plan = run.OverheadPlan(1, ("31",), levels=(8,), shadow=False, gates=False,
                            profile_in_flight=8, one_by_one=True)  # fmt: skip
    passes: list[dict[str, object]] = []
    run.run_overhead(lab, plan, [], passes, lambda: None, timelines={})
    assert events == [
        "start overhead-dflash", "wave of 8 at 30000", "profile dflash at 8",
        "stop overhead-dflash",
        "start overhead-ddtree-31", "wave of 8 at 30000", "profile ddtree-31 at 8",
        "stop overhead-ddtree-31",
    ]  # fmt: skip
    assert all("service.port=30000" in o for o in lab.started.values())
    assert [(p["algo"], p.get("round")) for p in passes] == [
        ("dflash", None), ("dflash", 0), ("ddtree-31", None), ("ddtree-31", 0)
    ]  # fmt: skip


def _refusal(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    *flags: str,
) -> str:
    """run.py's refusal of `flags`: exit 2 before anything is installed or written, and what it
    said."""
    out = tmp_path / "out"
    monkeypatch.setattr(sys, "argv", ["run.py", "--out", str(out), *flags])
    with pytest.raises(SystemExit) as exited:
        run.main()
    assert exited.value.code == 2
    assert not out.exists()
    return capsys.readouterr().err


def test_more_gpus_than_the_machine_shows_are_refused_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "MANIFEST.json").write_text('{"release": "0.5.11"}')
    monkeypatch.setattr(run, "visible_gpus", lambda: 1)
    said = _refusal(tmp_path, monkeypatch, capsys, "--bundle", str(bundle), "--gpus", "2")
    assert "error: --gpus 2: this machine shows 1 GPU; give at most 1" in said


@pytest.mark.parametrize(
    "flag",
    [
        "--control",
        "--profile",
        "--no-gates",
        "--no-batch-1",
        "--no-shadow",
        "--small-beside",
        "--one-by-one",
    ],
)
def test_a_flag_of_the_interleaved_comparison_without_it_is_refused_in_one_sentence(
    flag: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert f"error: {flag.split('=')[0]} " in _refusal(tmp_path, monkeypatch, capsys, flag)


@pytest.mark.parametrize(
    ("argv", "sentence"),
    [(["--overhead", "2", "--targets", "attention,hybrid"],
      "error: --overhead compares servers on one target"),
     (["--tune", "--targets", "hybrid"], "error: --tune sweeps the attention target only"),
     (["--targets", "hybird"], "error: --targets names hybird: the lab's targets are"),
     (["--tune-budgets", "15,31"], "error: --tune-budgets is an option of the tune sweep: add --tune"),
     (["--tune", "--tune-concurrency", "1,eight"],
      "error: --tune-concurrency '1,eight' is not a list of positive integers"),
     (["--tune", "--tune-topks", "0"], "error: --tune-topks '0' is not a list of positive integers"),
     (["--tune-wave", "1"], "error: --tune-wave is an option of the tune sweep: add --tune"),
     (["--tune", "--tune-wave", "0"], "error: argument --tune-wave: '0' is not a count: give 1"),
     (["--gpus", "none"], "error: argument --gpus: 'none' is not a count: give 1 or more"),
     (["--bundle", "/nonexistent"], "error: --bundle /nonexistent holds no MANIFEST.json"),
     (["--overhead", "2", "--size", "trained", "--small-beside"],
      "error: --small-beside serves the pair an inflated size grew from"),
     (["--overhead", "2", "--no-batch-1", "--in-flight", ""],
      "error: --no-batch-1 leaves no level"),
     (["--overhead", "3", "--one-by-one"],
      "error: --one-by-one serves one server at a time, so nothing is interleaved: give "
      "--overhead 1, not 3")],
)  # fmt: skip
def test_flags_the_run_cannot_serve_are_refused_in_one_sentence(
    argv: list[str],
    sentence: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--overhead and --tune once served the attention target whatever --targets said."""
    assert sentence in _refusal(tmp_path, monkeypatch, capsys, *argv)


def test_the_targets_default_to_both_for_the_matrix_and_attention_for_a_comparison() -> None:
    def refuse(sentence: str) -> NoReturn:
        raise AssertionError(sentence)

    both = ["attention", "hybrid"]
    assert run.lab_targets(None, overhead=False, tune=False, error=refuse) == both
    assert run.lab_targets(None, overhead=True, tune=False, error=refuse) == ["attention"]
    assert run.lab_targets(None, overhead=False, tune=True, error=refuse) == ["attention"]
    assert run.lab_targets("hybrid", overhead=True, tune=False, error=refuse) == ["hybrid"]


def test_the_tune_grid_flags_become_the_products_own_grid(tmp_path: Path) -> None:
    """--tune-budgets/--tune-topks/--tune-concurrency reach `action=tune` as conf/tune's lists;
    the grid tune_lab.py serves is the product's `candidates` over them."""
    import tune_lab

    args = run.argparse.Namespace(tune_budgets="15,31,63", tune_topks="4", tune_concurrency=None)
    overrides = run.tune_overrides(args)
    assert overrides == ["tune.budgets=[15,31,63]", "tune.topks=[4]"]
    cfg = compose_config([*LAB, "service=lab_inflated", "model=lab_attention_trained_8b",
                          "action=tune", *overrides])  # fmt: skip
    assert tune_lab.grid(cfg) == {"candidates": [[15, 4], [31, 4], [63, 4]],
                                  "concurrency": [1, 32]}  # fmt: skip


def test_tune_wave_replaces_the_sizes_wave_for_the_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 27B shape serves two candidates at once on the H200; an 80 GB card holds one."""
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "MANIFEST.json").write_text(json.dumps({"release": "0.5.11"}))
    waves: list[int] = []

    def install(lab: run.Lab, bundle: Path, *, reuse: bool) -> bool:
        waves.append(lab.size.tune_wave)
        raise SystemExit(0)

    monkeypatch.setattr(run.Lab, "install", install)
    for extra in ([], ["--tune-wave", "1"]):
        argv = ["run.py", "--bundle", str(bundle), "--out", str(tmp_path / "out"),
                "--root", str(tmp_path / "root"), "--size", "trained-27b", "--targets",
                "attention", "--tune", *extra]  # fmt: skip
        monkeypatch.setattr(sys, "argv", argv)
        with pytest.raises(SystemExit):
            run.main()
    assert waves == [2, 1]
    assert run.SIZES["trained-27b"].tune_wave == 2  # the size itself is left as it was


@pytest.mark.parametrize(("size", "wave"), [("trained", 6), ("trained-8b", 3), ("trained-27b", 2)])
def test_the_tune_sweep_serves_at_most_its_sizes_wave_at_once(
    size: str, wave: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seven candidates: the tiny sizes serve six at once, an inflated size as many as fit the
    GPU beside each other (three 8B servers on run 22's H100, two 27B on the H200)."""
    grid = {"candidates": [[b, 4] for b in (4, 8, 15, 16, 31, 32, 63)], "concurrency": [1]}
    monkeypatch.setattr(run, "_run", lambda argv, **_: json.dumps(grid) if "grid" in argv else "")

    class _Counting(_Lab):
        """Counts the servers up at once."""

        def __init__(self, root: Path) -> None:
            super().__init__(root, size="trained")
            self.up: set[str] = set()
            self.most = 0

        def start(
            self, label: str, overrides: list[str], environment: dict[str, str] | None = None
        ) -> Server:
            self.up.add(label)
            self.most = max(self.most, len(self.up))
            return super().start(label, overrides, environment)

        def stop(self, *servers: Server) -> None:
            self.up -= {s.label for s in servers}

    lab = _Counting(tmp_path)
    lab.out.mkdir()
    lab.size_name, lab.size = size, run.SIZES[size]
    sweep: list[dict[str, object]] = []
    run.run_tune(lab, [], sweep, lambda: None)
    assert len(sweep) == 7
    assert lab.most == wave
