"""The service's deploy steps: install unit + env file, daemon-reload, enable, restart.

Each follows the step contract of `rollout.steps`. The env file may hold the API key, so its
diffs are shown with the secret masked and it is always written 0600.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import ClassVar

from ddtree_deploy.config.schema import DeployConfig
from ddtree_deploy.hosts.connection import ShellHost
from ddtree_deploy.rollout.generations import GenerationStore, ServiceFiles
from ddtree_deploy.rollout.killpoints import boundary
from ddtree_deploy.service import systemd
from ddtree_deploy.service.render import RenderedService
from ddtree_deploy.steps import PlanStatus, Step, StepPlan, StepResult, unified_diff

ENV_MODE = 0o600
UNIT_MODE = 0o644
# Temp names the atomic writes use beside a target (SSH: .NAME.tmp.*, local: NAME.tmp.*);
# a run killed mid-upload can leave one behind.
_TMP_SWEEP = (
    'find "$1" -maxdepth 1 -type f \\( -name ".$2.tmp.*" -o -name "$2.tmp.*" \\) '
    "-delete 2>/dev/null || true"
)


@dataclass(frozen=True)
class UnitFilesStep:
    """Install the rendered unit and its 0600 environment file (restarting is another step)."""

    name: ClassVar[str] = "unit"
    restarts_service: ClassVar[bool] = True
    files: ServiceFiles
    mask: Callable[[str], str]

    def check(self, host: ShellHost) -> StepPlan:
        unit_path, env_path = (
            PurePosixPath(self.files.unit_path),
            PurePosixPath(self.files.env_path),
        )
        unit_now = host.read_text(unit_path, sudo=True)
        env_now = host.read_text(env_path, sudo=True)
        problems, diffs = [], []
        if unit_now != self.files.unit_text:
            problems.append(f"{unit_path} {'differs' if unit_now is not None else 'is missing'}")
            diffs.append(unified_diff(unit_now or "", self.files.unit_text or "", str(unit_path)))
        if env_now != self.files.env_text:
            problems.append(f"{env_path} {'differs' if env_now is not None else 'is missing'}")
            diffs.append(
                unified_diff(
                    self.mask(env_now or ""), self.mask(self.files.env_text or ""), str(env_path)
                )
            )
        elif env_now is not None and _mode(host, env_path) != ENV_MODE:
            problems.append(f"{env_path} is not mode 0600")
        if not problems:
            return StepPlan.ok(f"{unit_path} and {env_path} already match")
        return StepPlan.would_change("; ".join(problems), diff="".join(diffs))

    def apply(self, host: ShellHost) -> StepResult:
        plan = self.check(host)
        if plan.status is PlanStatus.OK:
            return StepResult.ok(plan.reason)
        # The env file first: a unit never points at an env file it does not expect yet.
        _install(host, PurePosixPath(self.files.env_path), self.files.env_text, ENV_MODE)
        boundary("unit.env-written")
        _install(host, PurePosixPath(self.files.unit_path), self.files.unit_text, UNIT_MODE)
        return StepResult.changed(plan.reason)


@dataclass(frozen=True)
class DaemonReloadStep:
    """Make systemd load the installed unit file (daemon-reload)."""

    name: ClassVar[str] = "daemon-reload"
    restarts_service: ClassVar[bool] = False
    unit: str
    unit_path: PurePosixPath
    unit_text: str | None

    def check(self, host: ShellHost) -> StepPlan:
        if host.read_text(self.unit_path, sudo=True) != self.unit_text:
            return StepPlan.would_change("after the unit file changes")
        state = systemd.unit_state(host, self.unit)
        if state.need_daemon_reload:
            return StepPlan.would_change(f"systemd holds an older copy of {self.unit}")
        if state.load_state != "loaded" and self.unit_text is not None:
            return StepPlan.would_change(f"systemd has not loaded {self.unit} ({state.load_state})")
        return StepPlan.ok(f"systemd has the current {self.unit}")

    def apply(self, host: ShellHost) -> StepResult:
        if (plan := self.check(host)).status is PlanStatus.OK:
            return StepResult.ok(plan.reason)
        systemd.daemon_reload(host)
        return StepResult.changed("systemctl daemon-reload")


@dataclass(frozen=True)
class EnableStep:
    """Enable the unit so it starts at boot."""

    name: ClassVar[str] = "enable"
    restarts_service: ClassVar[bool] = False
    unit: str

    def check(self, host: ShellHost) -> StepPlan:
        state = systemd.unit_state(host, self.unit)
        if state.unit_file_state == "enabled":
            return StepPlan.ok(f"{self.unit} is enabled")
        return StepPlan.would_change(f"{self.unit} is {state.unit_file_state or 'not installed'}")

    def apply(self, host: ShellHost) -> StepResult:
        if (plan := self.check(host)).status is PlanStatus.OK:
            return StepResult.ok(plan.reason)
        systemd.enable(host, self.unit)
        return StepResult.changed(f"systemctl enable {self.unit}")


@dataclass(frozen=True)
class RestartStep:
    """Restart the unit when a change owes it one (or it is down), then wait until it runs."""

    name: ClassVar[str] = "restart"
    restarts_service: ClassVar[bool] = False
    unit: str
    files: ServiceFiles
    generations: GenerationStore
    timeout_s: float
    settle_s: float
    journal_lines: int
    mask: Callable[[str], str]

    def check(self, host: ShellHost) -> StepPlan:
        owed = self.generations.state().pending_restart
        if owed:
            return StepPlan.would_change(f"owed by: {', '.join(owed.reasons)}")
        if host.read_text(PurePosixPath(self.files.unit_path), sudo=True) != self.files.unit_text:
            return StepPlan.would_change("after the unit file changes")
        if host.read_text(PurePosixPath(self.files.env_path), sudo=True) != self.files.env_text:
            return StepPlan.would_change("after the env file changes")
        state = systemd.unit_state(host, self.unit)
        if not state.running:
            return StepPlan.would_change(f"{self.unit} is {state.describe()}")
        return StepPlan.ok(f"{self.unit} runs and nothing changed under it")

    def apply(self, host: ShellHost) -> StepResult:
        if (plan := self.check(host)).status is PlanStatus.OK:
            return StepResult.ok(plan.reason)
        systemd.reset_failed(host, self.unit)
        systemd.restart(host, self.unit, mask=self.mask)
        boundary("restart.issued")
        state = systemd.wait_started(
            host,
            self.unit,
            timeout_s=self.timeout_s,
            settle_s=self.settle_s,
            journal_lines=self.journal_lines,
            mask=self.mask,
        )
        self.generations.restart_done()
        return StepResult.changed(
            f"restarted {self.unit} ({plan.reason}); main PID {state.main_pid}"
        )


def service_files(rendered: RenderedService) -> ServiceFiles:
    return ServiceFiles(
        str(rendered.unit_path), rendered.unit_text, str(rendered.env_path), rendered.env_text
    )


def service_steps(
    cfg: DeployConfig,
    files: ServiceFiles,
    generations: GenerationStore,
    mask: Callable[[str], str],
) -> list[Step]:
    """unit -> daemon-reload -> enable -> restart (which waits until the unit runs)."""
    unit = PurePosixPath(files.unit_path).name
    return [
        UnitFilesStep(files, mask),
        DaemonReloadStep(unit, PurePosixPath(files.unit_path), files.unit_text),
        EnableStep(unit),
        RestartStep(
            unit,
            files,
            generations,
            timeout_s=cfg.service.active_wait_s,
            settle_s=cfg.service.settle_s,
            journal_lines=cfg.service.journal_lines,
            mask=mask,
        ),
    ]


def _install(host: ShellHost, path: PurePosixPath, text: str | None, mode: int) -> None:
    """Write `text` atomically, or remove the file when `text` is None."""
    if text is None:
        host.run(["rm", "-f", "--", str(path)], sudo=True)
    else:
        host.write_atomic(path, text, mode=mode, sudo=True)
    host.run(["sh", "-c", _TMP_SWEEP, "sh", str(path.parent), path.name], sudo=True)


def _mode(host: ShellHost, path: PurePosixPath) -> int:
    out = host.run(["stat", "-c", "%a", "--", str(path)], sudo=True).stdout.strip()
    return int(out, 8)
