"""`action=status` after a deploy stopped midway on the staging host (no generation there): it
says the run stopped, which steps it got to, and what the next run does. A real SGLang 0.5.11 venv of the test's own (`sglang_venv`) is patched for real.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from ddtree_deploy.rollout.killpoints import KILL_AT_ENV

SCRIPT = shutil.which("ddtree-deploy", path=str(Path(sys.executable).parent))


def _cli(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    assert SCRIPT, "the ddtree-deploy console script is not installed next to this python"
    return subprocess.run(
        [SCRIPT, *args],
        env={**os.environ, "COLUMNS": "400", **env},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def _rows(table: str) -> dict[str, str]:
    """The status table's rows, `what` -> `value` (cells on one line at COLUMNS=400)."""
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip("│ ").split("│")]
        if len(cells) == 2 and cells[0]:
            rows[cells[0]] = cells[1]
    return rows


def test_status_tells_a_staged_deploy_stopped_between_patch_and_kernels(
    sglang_venv: Path, tmp_path: Path
) -> None:
    args = [
        f"host.sglang_venv={sglang_venv}",
        f"host.state_dir={tmp_path / 'state'}",
        f"rollout.runs_dir={tmp_path / 'runs'}",
    ]
    killed = _cli([*args, "action=deploy"], **{KILL_AT_ENV: "patch.done"})
    assert killed.returncode == -9, killed.stderr[-2000:]

    status = _cli([*args, "action=status"])
    assert "Traceback" not in status.stderr
    rows = _rows(status.stdout)
    assert rows["patch set"] == "0.5.11: applied"  # what the stopped run applied
    assert rows["kernels"].startswith("not current;")  # what it did not reach
    assert rows["interrupted run"] == (
        "deploy without a generation (host.systemd=false), stopped before kernels; "
        "steps it got to: patch"
    )
    assert rows["next run"] == (
        "action=deploy checks patch, kernels again and applies what differs; "
        "action=unpatch puts pristine SGLang back."
    )
