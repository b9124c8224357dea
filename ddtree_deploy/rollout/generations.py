"""Generations: what each deploy or rollback installed, what it replaced, and what is live now.

Built on `hosts.state.HostStateStore`. `state.json` holds the current generation, the lineage
(committed generations whose content is live, oldest first; rollback pops it), the config hash,
the algorithm, unit/env hashes, patch/kernel records, `pending_restart` and `in_progress`.
`generations/N/` holds `meta.json`, the unit and env file N installs (`unit`, `env`, 0600), and
`replaced/` (the unit and env bytes that were on the host before N, or their absence). Every
change is announced in `journal.jsonl` before it happens. A host without a managed service
(`host.systemd=false`) records no generation; a deploy there is marked in `staged_run` while it
runs, so a stopped one is still seen.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import PurePosixPath
from typing import Any

from ddtree_deploy.config.schema import Algo, DeployConfig
from ddtree_deploy.hosts.connection import ShellHost
from ddtree_deploy.hosts.state import HostStateStore
from ddtree_deploy.service.render import sha256_text

STATE_FORMAT = 1
VALIDATION_FILE = "validation.json"  # the promoting validation's record, in its generation's folder


def generation_folder(state_dir: str | PurePosixPath, number: int | None) -> PurePosixPath:
    """Where generation `number` keeps its files (unit, env, meta, validation, baselines); 0
    (or None: before the first generation) holds what was measured on the unmanaged service."""
    return PurePosixPath(state_dir) / "generations" / str(number or 0)


@dataclass(frozen=True)
class ServiceFiles:
    """The unit and env file of one generation (None: the file was absent)."""

    unit_path: str
    unit_text: str | None
    env_path: str
    env_text: str | None


@dataclass(frozen=True)
class GenerationMeta:
    """`generations/N/meta.json`: what generation N is."""

    number: int
    kind: str  # deploy | rollback
    algo: str  # "DFLASH" | "DDTREE"
    summary: str  # "DDTREE tree, budget 15, topk 4"
    config_hash: str
    unit_sha256: str
    env_sha256: str
    created: float


@dataclass(frozen=True)
class InProgress:
    """A generation begun and not yet committed (a killed run left it so, or one runs now)."""

    generation: int
    kind: str  # deploy | rollback


@dataclass(frozen=True)
class PendingRestart:
    """The service owes a restart: what changed under it, for which generation."""

    generation: int
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class StagedRun:
    """A run on a host without a managed service, marked while it changes the host."""

    action: str
    steps: tuple[str, ...]
    done: tuple[str, ...]
    started: float


@dataclass(frozen=True)
class HostState:
    """What `state.json` says about the host's generations (the other rooms' sections of the
    file, `kernels`, `fingerprint` and `watch`, are theirs: `GenerationStore.store` holds them).

    The last five fields are the current generation's, absent before the first commit.
    """

    generation: int | None = None
    lineage: tuple[int, ...] = ()
    last_generation: int = 0
    pending_restart: PendingRestart | None = None
    in_progress: InProgress | None = None
    staged_run: StagedRun | None = None
    config_hash: str | None = None
    algo: str | None = None  # "DFLASH" | "DDTREE"
    summary: str | None = None
    unit_sha256: str | None = None
    env_sha256: str | None = None

    def serves(self, cfg: DeployConfig) -> bool:
        """Whether the host already runs `cfg`: its current generation was deployed from it and
        no run was left unfinished (the one "host already at cfg" rule)."""
        return self.in_progress is None and self.config_hash == cfg.serving_hash

    @property
    def serves_linear(self) -> bool:
        """Whether linear DFlash serves, or what served before the first generation, with no
        run left unfinished."""
        return self.in_progress is None and self.algo in (None, Algo.DFLASH.value)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HostState:
        owed, running, staged = (
            data.get("pending_restart"),
            data.get("in_progress"),
            data.get("staged_run"),
        )
        return cls(
            generation=data.get("generation"),
            lineage=tuple(data.get("lineage", ())),
            last_generation=data.get("last_generation", 0),
            pending_restart=(
                PendingRestart(int(owed["generation"]), tuple(owed["reasons"])) if owed else None
            ),
            in_progress=InProgress(int(running["generation"]), str(running["kind"]))
            if running
            else None,
            staged_run=StagedRun(
                staged["action"], tuple(staged["steps"]), tuple(staged["done"]), staged["started"]
            )
            if staged
            else None,
            config_hash=data.get("config_hash"),
            algo=data.get("algo"),
            summary=data.get("summary"),
            unit_sha256=data.get("unit_sha256"),
            env_sha256=data.get("env_sha256"),
        )

    def to_dict(self) -> dict[str, Any]:
        """The keys this record owns, as `state.json` holds them (a current generation's
        fields only once there is one)."""
        data: dict[str, Any] = {
            "format": STATE_FORMAT,
            "generation": self.generation,
            "lineage": list(self.lineage),
            "last_generation": self.last_generation,
            "pending_restart": {
                "generation": self.pending_restart.generation,
                "reasons": list(self.pending_restart.reasons),
            }
            if self.pending_restart
            else None,
            "in_progress": asdict(self.in_progress) if self.in_progress else None,
            "staged_run": {
                "action": self.staged_run.action,
                "steps": list(self.staged_run.steps),
                "done": list(self.staged_run.done),
                "started": self.staged_run.started,
            }
            if self.staged_run
            else None,
        }
        current = {
            "config_hash": self.config_hash,
            "algo": self.algo,
            "summary": self.summary,
            "unit_sha256": self.unit_sha256,
            "env_sha256": self.env_sha256,
        }
        return data | {key: value for key, value in current.items() if value is not None}


class GenerationStore:
    """The generation records of one host, read and written through its connection."""

    def __init__(self, host: ShellHost, state_dir: PurePosixPath) -> None:
        self.host = host
        self.store = HostStateStore(host, state_dir, sudo=True)
        self._state: HostState | None = None  # as first read, then as this store wrote it

    # -- reading -----------------------------------------------------------------------------

    def state(self) -> HostState:
        """The host's state: read from the host on first use, then kept (this store's own
        writes update it; nothing else writes the state while the run holds the host's lock)."""
        if self._state is None:
            self._state = HostState.from_dict(self.store.load())
        return self._state

    def started_steps(self, number: int) -> list[str]:
        """The steps a run of generation `number` started, in order (journal `step.apply`)."""
        steps = [
            str(r["step"])
            for r in self.store.read_journal()
            if r.get("event") == "step.apply" and r.get("generation") == number
        ]
        return list(dict.fromkeys(steps))

    def meta(self, number: int) -> GenerationMeta | None:
        text = self.host.read_text(self._dir(number) / "meta.json", sudo=True)
        return GenerationMeta(**json.loads(text)) if text else None

    def files(self, number: int) -> ServiceFiles:
        """The unit and env file generation `number` installed."""
        return self._read_files(self._dir(number), "unit", "env")

    def replaced(self, number: int) -> ServiceFiles:
        """The unit and env file that were on the host before generation `number`."""
        return self._read_files(self._dir(number) / "replaced", "unit", "env")

    # -- writing -----------------------------------------------------------------------------

    def begin(
        self, kind: str, files: ServiceFiles, *, algo: str, summary: str, config_hash: str
    ) -> int:
        """Record a new generation (or take over an interrupted one) before the host changes.

        An interrupted generation keeps its number and its `replaced/` backups, which hold the
        host as it was before that generation, not as the killed run left it.
        """
        state = self.state()
        interrupted = state.in_progress
        number = interrupted.generation if interrupted else state.last_generation + 1
        self.store.journal(
            "generation.begin", generation=number, kind=kind, resumed=bool(interrupted)
        )
        gen_dir = self._dir(number)
        if not interrupted:
            self._backup_host_files(gen_dir / "replaced", files)
        self._write_files(gen_dir, files)
        meta = GenerationMeta(
            number=number,
            kind=kind,
            algo=algo,
            summary=summary,
            config_hash=config_hash,
            unit_sha256=sha256_text(files.unit_text or ""),
            env_sha256=sha256_text(files.env_text or ""),
            created=round(time.time(), 3),
        )
        self.host.write_atomic(
            gen_dir / "meta.json",
            json.dumps(asdict(meta), indent=2) + "\n",
            mode=0o600,
            sudo=True,
        )
        self._save(
            replace(
                state,
                in_progress=InProgress(number, kind),
                last_generation=max(state.last_generation, number),
            )
        )
        return number

    def owe_restart(self, number: int, reason: str) -> None:
        """Persist that the service needs a restart, before the change that makes it so."""
        state = self.state()
        reasons = state.pending_restart.reasons if state.pending_restart else ()
        if reason not in reasons:
            reasons = (*reasons, reason)
        self.store.journal("restart.owed", generation=number, reason=reason)
        self._save(replace(state, pending_restart=PendingRestart(number, reasons)))

    def restart_done(self) -> None:
        state = self.state()
        owed = state.to_dict()["pending_restart"]
        self.store.journal("restart.done", owed=owed)
        self._save(replace(state, pending_restart=None))

    def commit(self, number: int, lineage: list[int]) -> None:
        """Make generation `number` current with the given live lineage (its top is `number`)."""
        meta = self.meta(number)
        assert meta is not None, "begin() wrote meta.json"
        state = replace(
            self.state(),
            generation=number,
            lineage=tuple(lineage),
            in_progress=None,
            config_hash=meta.config_hash,
            algo=meta.algo,
            summary=meta.summary,
            unit_sha256=meta.unit_sha256,
            env_sha256=meta.env_sha256,
        )
        self.store.journal("generation.commit", generation=number, lineage=lineage)
        self._save(state)

    def journal(self, event: str, **fields: Any) -> None:
        self.store.journal(event, **fields)

    # -- runs without a generation (host.systemd=false) ---------------------------------------

    def begin_staged(self, action: str, steps: list[str]) -> None:
        """Mark a run that changes the host without a generation, before its first step."""
        self.store.journal("staged.begin", action=action, steps=steps)
        run = StagedRun(action, tuple(steps), (), round(time.time(), 3))
        self._save(replace(self.state(), staged_run=run))

    def staged_step_done(self, step: str) -> None:
        state = self.state()
        self.store.journal("staged.step", step=step)
        if state.staged_run is not None:
            run = replace(state.staged_run, done=(*state.staged_run.done, step))
            self._save(replace(state, staged_run=run))

    def end_staged(self) -> None:
        """The marked run finished: nothing of it is left to tell."""
        state = self.state()
        self.store.journal("staged.end", run=state.to_dict()["staged_run"])
        self._save(replace(state, staged_run=None))

    # -- internals ---------------------------------------------------------------------------

    def _save(self, state: HostState) -> None:
        self.store.update(state.to_dict())
        self._state = state

    def _dir(self, number: int) -> PurePosixPath:
        return generation_folder(self.store.root, number)

    def _backup_host_files(self, where: PurePosixPath, files: ServiceFiles) -> None:
        current = ServiceFiles(
            files.unit_path,
            self.host.read_text(PurePosixPath(files.unit_path), sudo=True),
            files.env_path,
            self.host.read_text(PurePosixPath(files.env_path), sudo=True),
        )
        self._write_files(where, current)

    def _write_files(self, where: PurePosixPath, files: ServiceFiles) -> None:
        paths = {"unit": files.unit_path, "env": files.env_path}
        for name, text in (("unit", files.unit_text), ("env", files.env_text)):
            if text is not None:
                self.host.write_atomic(where / name, text, mode=0o600, sudo=True)
            else:
                self.host.run(["rm", "-f", "--", str(where / name)], sudo=True)
        self.host.write_atomic(
            where / "paths.json", json.dumps(paths) + "\n", mode=0o600, sudo=True
        )

    def _read_files(self, where: PurePosixPath, unit: str, env: str) -> ServiceFiles:
        paths = json.loads(self.host.read_text(where / "paths.json", sudo=True) or "{}")
        return ServiceFiles(
            paths.get("unit", ""),
            self.host.read_text(where / unit, sudo=True),
            paths.get("env", ""),
            self.host.read_text(where / env, sudo=True),
        )
