"""What run.py serves and asks, checked on CPU: the cells, the planted server's environment,
the prompts' lengths and the configs of each model size."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # run.py imports its sibling `tables`, as a script
from run import (
    LONG_ANSWER,
    PLANT_MARKER,
    PLANTED_BUG,
    SIZES,
    Lab,
    Server,
    StepRun,
    cell_overrides,
    long_answers,
    plan_cells,
    planted_environment,
    run_cells,
)

from ddtree_deploy.config import compose_config

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


def test_every_prompt_of_the_composed_set_answers_long() -> None:
    overrides = [*LAB, "service=lab"]
    answers = long_answers(sys.executable, overrides)
    prompts = compose_config([*overrides, *answers]).validation.prompts
    assert len(answers) == len(prompts) >= 4
    assert {p.max_new_tokens for p in prompts} == {LONG_ANSWER}


@pytest.mark.parametrize("size", sorted(SIZES))
@pytest.mark.parametrize("target", ["attention", "hybrid"])
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

    def __init__(self, root: Path) -> None:
        super().__init__(root, root / "out", "0.5.11", "realistic")
        self.logs.mkdir(parents=True)
        self.environments: dict[str, dict[str, str] | None] = {}
        self.calls: list[tuple[str, tuple[str, ...]]] = []

    def start(
        self, label: str, overrides: list[str], environment: dict[str, str] | None = None
    ) -> Server:
        self.environments[label] = environment
        log = self.logs / f"server-{label}.log"
        log.write_text(f"{PLANT_MARKER} {PLANTED_BUG} installed\n" if environment else "up\n")
        return Server(label, None, 0, log, time.monotonic())  # type: ignore[arg-type]

    def wait(self, server: Server) -> tuple[float | None, str | None]:
        return 1.0, None

    def stop(self, server: Server) -> None:
        pass

    def tool(self, name: str, *overrides: str) -> StepRun:
        self.calls.append((name, overrides))
        return StepRun(name, 0, 0.0, "", time.time())


def test_cells_run_their_passes_and_the_planted_one_its_plant(tmp_path: Path) -> None:
    lab = _Lab(tmp_path)
    specs = plan_cells(ALGOS, ["15", "63"], planted=True, batched={"ddtree-15"})
    cells = list(run_cells(lab, "attention", specs, [], together=True))
    assert [sorted(c.runs) for c in cells] == [
        ["batch1", "batched"], ["batch1"], ["batch1", "batched"], ["batch1"], ["batch1"],
    ]  # fmt: skip
    (first, first_overrides), (second, _) = lab.calls[:2]
    assert (first, second) == (
        "validate-attention-dflash-batch1",
        "validate-attention-dflash-batched",
    )
    assert "validation.repeats=1" in first_overrides  # the realistic size's one pass at batch 1
    planted = lab.environments["attention-planted"]
    assert planted is not None and planted["DDTREE_LAB_PLANTED_BUG"] == PLANTED_BUG
    assert [k for k, v in lab.environments.items() if v] == ["attention-planted"]
    assert [(c.planted, c.plant_seen) for c in cells][-2:] == [(None, None), (PLANTED_BUG, True)]
