"""`action=status`: a host's generation, algorithm, unit state, patch set, kernels, drift, lock.

Drift is anything changed outside the tool since the current generation was committed: the unit
or env file's bytes or mode, a unit file systemd has not reloaded, a disabled unit, a patched
SGLang file that matches neither its pristine nor its patched hash, and any part of the
fingerprint the last passed validation recorded (driver, CUDA, torch, SGLang files, model and
drafter, kernels) that changed since. On a host without systemd management
(`host.systemd=false`, a staging host) no unit exists to ask about, so the status holds the
rest. A run that stopped midway (killed, interrupted, lost its connection) is told with the
steps it had started and what the next run will do about it. It reads the host only; it never
changes it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from ddtree_deploy.config.schema import DeployConfig
from ddtree_deploy.errors import DeployError
from ddtree_deploy.events import emit
from ddtree_deploy.hosts.connection import ShellHost
from ddtree_deploy.hosts.facts import HostFacts, probe_facts
from ddtree_deploy.hosts.lock import lock_holder
from ddtree_deploy.kernel_build import KernelsStep
from ddtree_deploy.patching import FileState
from ddtree_deploy.patching.step import PatchStep
from ddtree_deploy.rollout.generations import GenerationStore, HostState
from ddtree_deploy.rollout.watch_record import fingerprint_drift
from ddtree_deploy.service import systemd
from ddtree_deploy.service.render import sha256_text, unit_paths
from ddtree_deploy.steps import PlanStatus


@dataclass(frozen=True)
class InterruptedRun:
    """A run that stopped before it finished, as the host's state records it."""

    what: str  # "deploy of generation 3", "deploy without a generation (host.systemd=false)"
    started: tuple[str, ...]  # the steps it had started (generation) or finished (staged), in order
    next_run: str  # what the next deploy or rollback does about it

    def describe(self) -> str:
        done = ", ".join(self.started) if self.started else "none"
        return f"{self.what}; steps it got to: {done}"


@dataclass(frozen=True)
class HostStatus:
    host: str
    service_managed: bool  # host.systemd; false: no unit, unit_state and enabled say so
    generation: int | None
    lineage: tuple[int, ...]
    algo: str
    summary: str
    unit: str
    unit_state: str
    enabled: str
    interrupted: InterruptedRun | None  # a run that stopped before it finished
    pending_restart: tuple[str, ...]
    patch_set: str  # "0.5.11: applied", or why the installed SGLang could not be read
    patch_files: tuple[tuple[str, str], ...]  # (path, pristine | applied | drifted)
    kernels: str
    drift: tuple[str, ...]
    locked_by: str | None  # the run holding the host's lock, if any
    # The parts of the last passed validation's fingerprint that changed since (also in drift).
    fingerprint_drift: tuple[str, ...] = ()
    # The last validation's verdict and time ("passed 2026-12-07 04:00 UTC"), and the
    # acceptance it measured (tokens per verify step); None before any (watch.metrics).
    last_verdict: str | None = None
    acceptance: float | None = None


def installed_patch_step(cfg: DeployConfig, facts: HostFacts) -> PatchStep:
    """The patch step for the release the host has installed (the configured one if unknown)."""
    return PatchStep.for_release(
        facts.sglang_version or cfg.sglang.version,
        cfg.host.sglang_python,
        PurePosixPath(cfg.host.state_dir),
    )


def host_status(
    cfg: DeployConfig, host: ShellHost, generations: GenerationStore | None = None
) -> HostStatus:
    """The host's status, read through `generations` (the action's record of the host; a call
    of its own reads it afresh)."""
    generations = generations or GenerationStore(host, PurePosixPath(cfg.host.state_dir))
    state = generations.state()
    unit_path = unit_paths(cfg)[0]
    drift: list[str] = []
    if cfg.host.systemd:
        unit = systemd.unit_state(host, unit_path.name)
        unit_state, enabled = unit.describe(), unit.unit_file_state or "not installed"
        if state.generation is not None:
            drift += _service_drift(cfg, host, state, unit)
    else:
        unit_state, enabled = "not managed", "host.systemd=false"
    facts = probe_facts(host, cfg.host.sglang_python)
    patch_set, patch_files = _patch_state(cfg, facts, host)
    drift += [
        f"{path} matches neither the pristine nor the patched file of its patch set"
        for path, file_state in patch_files
        if file_state == FileState.drifted
    ]
    changed_parts = fingerprint_drift(cfg, host, facts, generations)
    drift += changed_parts
    owed = state.pending_restart
    sections = generations.store.load()  # the other rooms' parts of state.json
    status = HostStatus(
        host=cfg.host.name,
        service_managed=cfg.host.systemd,
        generation=state.generation,
        lineage=state.lineage,
        algo=state.algo or "none",
        summary=state.summary or "no generation recorded",
        unit=unit_path.name,
        unit_state=unit_state,
        enabled=enabled,
        interrupted=interrupted_run(generations, state),
        pending_restart=owed.reasons if owed else (),
        patch_set=patch_set,
        patch_files=patch_files,
        kernels=_kernels_state(cfg, facts, host, generations),
        drift=tuple(drift),
        locked_by=lock_holder(host, PurePosixPath(cfg.host.state_dir)),
        fingerprint_drift=tuple(changed_parts),
        last_verdict=_last_verdict(sections),
        acceptance=(sections.get("watch") or {}).get("figures", {}).get("acceptance_length"),
    )
    emit(
        "status",
        generation=status.generation,
        algo=status.algo,
        drift=list(status.drift),
        unit_state=status.unit_state,
        service_managed=status.service_managed,
        patch_set=status.patch_set,
        kernels=status.kernels,
    )
    return status


def _last_verdict(state: dict[str, Any]) -> str | None:
    """The last validation's verdict and when it ended, from the state's metrics."""
    last = (state.get("watch") or {}).get("last")
    if not last:
        return None
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(float(last["timestamp"])))
    return f"{'passed' if last['passed'] else 'failed'} {when}"


def interrupted_run(generations: GenerationStore, state: HostState) -> InterruptedRun | None:
    """The run `state` says stopped midway, if any: a generation left in progress, or a deploy
    without a generation (host.systemd=false) that never marked its end."""
    if (in_progress := state.in_progress) is not None:
        number, kind = in_progress.generation, in_progress.kind
        started = tuple(generations.started_steps(number))
        if kind == "rollback":
            return InterruptedRun(
                f"rollback (generation {number})",
                started,
                f"action=rollback finishes it; action=deploy takes generation {number} over "
                "for what it deploys.",
            )
        lineage = [g for g in state.lineage if g != number]
        back = f"generation {lineage[-1]}" if lineage else "the unit found before generation 1"
        return InterruptedRun(
            f"deploy of generation {number}",
            started,
            f"action=deploy finishes generation {number} (every step checked again, what "
            f"differs applied, then the gates); action=rollback undoes it, back to {back}.",
        )
    if (staged := state.staged_run) is not None:
        left = [step for step in staged.steps if step not in staged.done]
        return InterruptedRun(
            f"{staged.action} without a generation (host.systemd=false), stopped before "
            + (", ".join(left) or "it marked its end"),
            staged.done,
            f"action={staged.action} checks {', '.join(staged.steps)} again and applies "
            "what differs; action=unpatch puts pristine SGLang back.",
        )
    return None


def _service_drift(
    cfg: DeployConfig, host: ShellHost, state: HostState, unit: systemd.UnitState
) -> list[str]:
    """How the installed unit and env file differ from what the current generation wrote."""
    unit_path, env_path = unit_paths(cfg)
    drift: list[str] = []
    for path, recorded in ((unit_path, state.unit_sha256), (env_path, state.env_sha256)):
        text = host.read_text(path, sudo=True)
        if text is None:
            drift.append(f"{path} was removed")
        elif sha256_text(text) != recorded:
            drift.append(f"{path} was changed outside ddtree-deploy")
    mode = host.run(["stat", "-c", "%a", "--", str(env_path)], sudo=True, check=False)
    if mode.ok and mode.stdout.strip() != "600":
        drift.append(f"{env_path} is mode {mode.stdout.strip()}, not 600")
    if unit.need_daemon_reload:
        drift.append(f"systemd runs an older copy of {unit_path.name} (daemon-reload pending)")
    if unit.unit_file_state not in ("enabled", ""):
        drift.append(f"{unit_path.name} is {unit.unit_file_state}")
    return drift


def _patch_state(
    cfg: DeployConfig, facts: HostFacts, host: ShellHost
) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The installed release's patch set state and each file's, or why it cannot be read."""
    try:
        plan = installed_patch_step(cfg, facts).plan(host)
    except DeployError as err:  # no SGLang, no patch set for it: the sentence says which
        return str(err), ()
    return (
        f"{plan.patch_set}: {plan.state.value}",
        tuple((str(f.path), f.state.value) for f in plan.files),
    )


def _kernels_state(
    cfg: DeployConfig, facts: HostFacts, host: ShellHost, generations: GenerationStore
) -> str:
    """Whether the SGLang venv holds the kernels build its ABI needs (what build-kernels does)."""
    plan = KernelsStep.from_config(cfg, store=generations.store, facts=facts).check(host)
    if plan.status is PlanStatus.OK and plan.key is not None:
        return f"{plan.key.slug} installed"
    if plan.status is PlanStatus.WOULD_CHANGE:
        return f"not current; action=build-kernels would {plan.reason}"
    return plan.reason
