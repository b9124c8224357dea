"""Rollback: put the previous generation's unit and env file back, restart, wait until it runs.

The previous generation is the one below the current in the lineage; an interrupted deploy is
undone back to the last committed generation; an interrupted rollback is finished. When there
is nothing below (the first generation replaced no unit), the linear-DFlash unit is rendered from
the current config instead, since a host must keep serving. Patches stay by default (DFLASH
behaves as before under them); `rollback.revert_patches=true` asks the patch engine to restore
pristine SGLang files. The validation gates call `rollback` directly.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from ddtree_deploy.config.schema import Algo, DeployConfig
from ddtree_deploy.errors import DeployError, ExitCode
from ddtree_deploy.events import emit
from ddtree_deploy.hosts.connection import ShellHost
from ddtree_deploy.patching.step import PatchStep
from ddtree_deploy.rollout.apply import apply_steps
from ddtree_deploy.rollout.generations import GenerationStore, ServiceFiles
from ddtree_deploy.rollout.killpoints import boundary
from ddtree_deploy.rollout.service_steps import service_files, service_steps
from ddtree_deploy.service import systemd
from ddtree_deploy.service.render import render_service
from ddtree_deploy.service.secret import Secret
from ddtree_deploy.steps import Step, StepReport

_ALGO_ARG = re.compile(r"--speculative-algorithm\s+\"?(?P<algo>[A-Z0-9_]+)")


class NothingToRollBack(DeployError):
    """The host has no generation recorded by this toolkit."""

    exit_code = ExitCode.NOTHING_TO_ROLL_BACK


@dataclass(frozen=True)
class RollbackOutcome:
    host: str
    from_generation: int | None
    to_generation: int
    summary: str
    unit_state: str
    steps: tuple[StepReport, ...]

    def sentence(self) -> str:
        """What the rollback did, as a host's run and a fleet's recap both say it."""
        came_from = f" from generation {self.from_generation}" if self.from_generation else ""
        return (
            f"rolled back{came_from} to generation {self.to_generation} ({self.summary}); "
            f"the unit is {self.unit_state}."
        )


@dataclass(frozen=True)
class _Target:
    number: int | None  # an existing generation to make current again; None: a new one
    files: ServiceFiles
    lineage: list[int]  # the lineage below the new current generation
    from_generation: int | None
    algo: str
    summary: str
    config_hash: str = ""  # a new generation's: the config it renders ("" for a unit found)


def rollback(
    cfg: DeployConfig,
    host: ShellHost,
    *,
    api_key: Secret | None,
    to_linear: bool = False,
    to_generation: int | None = None,
    generations: GenerationStore | None = None,
) -> RollbackOutcome:
    """Return `host` to its previous generation and wait until the unit runs steadily.

    `to_linear`: to the newest linear-DFLASH generation below instead, in one restart (each
    promotion stacks a shadow and a tree generation above linear, and each restart of a large
    target takes minutes). With none in the lineage, linear DFLASH is
    rendered from `cfg`. `to_generation`: to the newest generation of the lineage at or below
    that number, in one restart (a fleet's rollback_all returns a host to where a run found it;
    0: to the unit found before the first generation). An interrupted rollback is finished
    first, whatever `to_linear` or `to_generation` say.
    Raises `NothingToRollBack` for a host without generations, `UnitFailedToStart` (with the
    journal) when the target does not come up either. `generations`: the host's record as the
    calling action holds it; a call of its own reads it afresh. `api_key`: the key the calling
    action read once, which the rendered unit takes.
    """
    generations = generations or GenerationStore(host, PurePosixPath(cfg.host.state_dir))
    mask = api_key.mask if api_key else (lambda text: text)
    target = _target(cfg, generations, api_key, to_linear=to_linear, to_generation=to_generation)
    generations.journal(
        "rollback.begin", from_generation=target.from_generation, to_generation=target.number
    )
    number = target.number
    if number is None:
        number = generations.begin(
            "rollback",
            target.files,
            algo=target.algo,
            summary=target.summary,
            config_hash=target.config_hash,
        )
    boundary("rollback.begin")
    emit("rollback.start", from_generation=target.from_generation, to_generation=number)
    steps: list[Step] = []
    if cfg.rollback.revert_patches:  # before the restart step, which then restarts on them
        steps.append(
            PatchStep.for_release(
                cfg.sglang.version,
                cfg.host.sglang_python,
                PurePosixPath(cfg.host.state_dir),
                reverting=True,
            )
        )
    steps += service_steps(cfg, target.files, generations, mask)
    rows = apply_steps(steps, host, generations, number)
    generations.commit(number, [*target.lineage, number])
    state = systemd.unit_state(host, PurePosixPath(target.files.unit_path).name)
    emit("rollback.done", generation=number, unit_state=state.describe())
    return RollbackOutcome(
        cfg.host.name,
        target.from_generation,
        number,
        target.summary,
        state.describe(),
        tuple(rows),
    )


def _target(
    cfg: DeployConfig,
    generations: GenerationStore,
    api_key: Secret | None,
    *,
    to_linear: bool,
    to_generation: int | None,
) -> _Target:
    """Where the rollback goes; a linear unit it renders holds the key the rollback read."""
    state = generations.state()
    lineage = list(state.lineage)
    bottom = lineage[0] if lineage else None  # the generation that replaced the unit found before
    interrupted = state.in_progress
    if interrupted and interrupted.kind == "rollback":  # finish it
        number = interrupted.generation
        meta = generations.meta(number)
        assert meta is not None, "begin() wrote meta.json before marking it in progress"
        return _Target(number, generations.files(number), [], None, meta.algo, meta.summary)
    if interrupted:  # an interrupted deploy: back to the last committed generation
        from_generation = interrupted.generation
    elif lineage:
        from_generation = lineage.pop()
    else:
        raise NothingToRollBack(
            f"{cfg.host.name} has no generation recorded under {cfg.host.state_dir}; there is "
            "nothing to roll back to."
        )
    while to_linear and lineage and _meta_algo(generations, lineage[-1]) != Algo.DFLASH.value:
        lineage.pop()
    while to_generation is not None and lineage and lineage[-1] > to_generation:
        lineage.pop()
    if lineage:
        number = lineage[-1]
        meta = generations.meta(number)
        assert meta is not None, "a committed generation has meta.json"
        return _Target(
            number,
            generations.files(number),
            lineage[:-1],
            from_generation,
            meta.algo,
            meta.summary,
        )
    before = generations.replaced(bottom if bottom is not None else from_generation)
    algo = _algo_of(before.unit_text) if before.unit_text is not None else None
    linear = dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo, name=Algo.DFLASH))
    if algo is not None and (algo == Algo.DFLASH.value or not to_linear):
        # A linear unit found before counts as this config's linear DFlash (the baseline's
        # "already at cfg" then holds for it); any other found unit matches no config.
        found_hash = linear.serving_hash if algo == Algo.DFLASH.value else ""
        summary = f"the unit found before ({algo})"
        return _Target(None, before, [], from_generation, algo, summary, found_hash)
    rendered = render_service(linear, api_key)
    return _Target(
        None,
        service_files(rendered),
        [],
        from_generation,
        Algo.DFLASH.value,
        linear.algo.summary,
        linear.serving_hash,
    )


def _meta_algo(generations: GenerationStore, number: int) -> str:
    meta = generations.meta(number)
    assert meta is not None, "a committed generation has meta.json"
    return meta.algo


def _algo_of(unit_text: str) -> str:
    match = _ALGO_ARG.search(unit_text)
    return match["algo"] if match else "unknown"
