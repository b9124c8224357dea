"""The local transport: commands run on this machine through subprocess (no shell)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence

from ddtree_deploy.errors import HostError
from ddtree_deploy.hosts.connection import CommandResult, ShellHost


class LocalHost(ShellHost):
    """This machine; sudo is used only when not already root."""

    def __init__(self, name: str = "local", *, default_timeout_s: float = 900.0) -> None:
        super().__init__(name, use_sudo=os.geteuid() != 0, default_timeout_s=default_timeout_s)

    def _execute(self, argv: Sequence[str], stdin: bytes | None, timeout_s: float) -> CommandResult:
        try:
            done = subprocess.run(
                list(argv),
                input=stdin if stdin is not None else b"",
                capture_output=True,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as err:
            raise HostError(
                f"`{argv[0]}` did not finish within {timeout_s:g} s on {self.name}; "
                "raise host.command_timeout_s if it needs longer."
            ) from err
        except FileNotFoundError:
            return CommandResult(tuple(argv), 127, "", f"{argv[0]}: command not found")
        return CommandResult(
            tuple(argv),
            done.returncode,
            done.stdout.decode(errors="replace"),
            done.stderr.decode(errors="replace"),
        )

    def close(self) -> None:
        """Nothing to release."""
