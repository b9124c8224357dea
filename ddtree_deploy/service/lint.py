"""Lint a rendered unit on the control machine with `systemd-analyze` (verify + security).

`verify` checks that ExecStart's binary exists and is executable, and the host's venv is not on
this machine, so the unit is verified inside a throwaway root (`--root=`): the unit under
`etc/systemd/system/`, a stub executable at the venv's `bin/python`, and a copy of this
machine's system units so that default dependencies (`sysinit.target`, ...) resolve. Any line
verify prints (an unknown key, a bad value) counts as a finding. `security --offline=yes` gives
the exposure score, which must stay at or below `service.max_exposure`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ddtree_deploy.errors import DeployError, ExitCode
from ddtree_deploy.service.render import RenderedService

_EXPOSURE = re.compile(r"Overall exposure level for \S+: (?P<score>\d+(\.\d+)?) (?P<word>\w+)")
_SYSTEM_UNIT_DIRS = (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system"))
_TIMEOUT_S = 60


class UnitLintFailed(DeployError):
    """A rendered unit failed `systemd-analyze verify` or exceeds the exposure threshold."""

    exit_code = ExitCode.DRIFTED_FILE


@dataclass(frozen=True)
class LintReport:
    """What systemd-analyze said about one unit; `available` False when it is not installed."""

    unit: str
    available: bool
    verify_findings: tuple[str, ...] = ()
    exposure: float | None = None
    exposure_rating: str = ""
    max_exposure: float = 0.0

    @property
    def ok(self) -> bool:
        if not self.available:
            return True  # nothing to hold against the unit; the report says lint was skipped
        return (
            not self.verify_findings
            and self.exposure is not None
            and (self.exposure <= self.max_exposure)
        )

    def summary(self) -> str:
        if not self.available:
            return "systemd-analyze is not installed here; lint skipped"
        verify = (
            "verify ok"
            if not self.verify_findings
            else (f"verify: {len(self.verify_findings)} finding(s)")
        )
        return (
            f"{verify}; exposure {self.exposure} {self.exposure_rating} (max {self.max_exposure:g})"
        )

    def raise_if_failed(self) -> None:
        if self.ok:
            return
        if self.verify_findings:
            raise UnitLintFailed(
                f"systemd-analyze verify rejects the rendered {self.unit}: "
                f"{self.verify_findings[0]}",
                hint="\n".join(self.verify_findings[1:]) or None,
            )
        raise UnitLintFailed(
            f"The rendered {self.unit} has exposure {self.exposure} "
            f"(systemd-analyze security), above service.max_exposure={self.max_exposure:g}; "
            "add hardening to templates/sglang.service.j2 or raise the threshold on purpose."
        )


def lint_unit(rendered: RenderedService, max_exposure: float) -> LintReport:
    """Run verify and security on `rendered` in a throwaway root; never touches a host."""
    tool = shutil.which("systemd-analyze")
    if tool is None:
        return LintReport(rendered.unit_file, available=False, max_exposure=max_exposure)
    with tempfile.TemporaryDirectory(prefix="ddtree-lint-") as tmp:
        root = Path(tmp)
        _build_root(root, rendered)
        verify = _analyze(tool, root, "verify", "--man=no", rendered.unit_file)
        findings = [line.strip() for line in verify.splitlines() if line.strip()]
        security = _analyze(tool, root, "security", "--offline=yes", rendered.unit_file)
    match = _EXPOSURE.search(security)
    if match is None:
        findings.append(f"systemd-analyze security gave no exposure score: {security[-300:]}")
    return LintReport(
        rendered.unit_file,
        available=True,
        verify_findings=tuple(f.replace(tmp, "") for f in findings),
        exposure=float(match["score"]) if match else None,
        exposure_rating=match["word"] if match else "",
        max_exposure=max_exposure,
    )


def _build_root(root: Path, rendered: RenderedService) -> None:
    unit = _inside(root, rendered.unit_path)
    unit.parent.mkdir(parents=True)
    unit.write_text(rendered.unit_text)
    # The binary ExecStart names must exist and be executable (verify checks it).
    python = _inside(root, PurePosixPath(rendered.argv[0]))
    python.parent.mkdir(parents=True, exist_ok=True)
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    for system_dir in _SYSTEM_UNIT_DIRS:
        if system_dir.is_dir() and not system_dir.is_symlink():
            shutil.copytree(
                system_dir, _inside(root, PurePosixPath(str(system_dir))), symlinks=True
            )
            break


def _inside(root: Path, path: PurePosixPath) -> Path:
    return root / str(path).lstrip("/")


def _analyze(tool: str, root: Path, *args: str) -> str:
    """stdout+stderr of one systemd-analyze call (its exit code is judged by the caller's parse)."""
    done = subprocess.run(
        [tool, *args[:-1], f"--root={root}", args[-1]],
        capture_output=True,
        text=True,
        timeout=_TIMEOUT_S,
        check=False,
    )
    output = (done.stderr + done.stdout) if args[0] == "security" else done.stderr
    if args[0] == "verify" and done.returncode != 0 and not output.strip():
        output = f"systemd-analyze verify exited {done.returncode} without a message"
    return output
