"""The SSH transport, through Fabric. The only module that imports Fabric or paramiko."""

from __future__ import annotations

import io
import shlex
import socket
import uuid
from collections.abc import Sequence
from pathlib import PurePosixPath

import paramiko
from fabric import Config, Connection
from fabric.runners import Remote
from invoke.exceptions import CommandTimedOut

from ddtree_deploy.errors import HostError, UnreachableHost
from ddtree_deploy.hosts.connection import CommandResult, ShellHost

_CONNECT_ERRORS = (
    socket.gaierror,
    socket.timeout,
    TimeoutError,
    ConnectionError,
    OSError,
    EOFError,
    paramiko.SSHException,
)


class _TimedRemote(Remote):  # type: ignore[misc]  # Fabric ships no types
    """Fabric's runner, but a timed-out command is always reported as timed out.

    Invoke decides "timed out" by asking whether its timer thread has finished; the timer closes
    the channel first and exits after, so a loaded machine can see the closed channel (exit -1)
    while the thread is still alive and report a plain failure. The flag set before the channel
    closes has no such window.
    """

    killed_by_timer = False

    def kill(self) -> None:
        self.killed_by_timer = True
        super().kill()

    @property
    def timed_out(self) -> bool:
        return self.killed_by_timer or super().timed_out


class SshHost(ShellHost):
    """A remote host; connects on first use, reconnects after `close`."""

    def __init__(
        self,
        name: str,
        *,
        address: str,
        port: int = 22,
        user: str = "root",
        key_file: str | None = None,
        connect_timeout_s: float = 10.0,
        default_timeout_s: float = 900.0,
        use_sudo: bool | None = None,
    ) -> None:
        super().__init__(
            name,
            use_sudo=(user != "root") if use_sudo is None else use_sudo,
            default_timeout_s=default_timeout_s,
        )
        self.address = address
        self.port = port
        self.user = user
        connect_kwargs: dict[str, object] = {
            "allow_agent": False,
            "look_for_keys": key_file is None,
        }
        if key_file:
            connect_kwargs["key_filename"] = [key_file]
        self._connection = Connection(
            host=address,
            user=user,
            port=port,
            connect_timeout=connect_timeout_s,
            connect_kwargs=connect_kwargs,
            config=Config(overrides={"runners": {"remote": _TimedRemote}}),
        )
        # Test hosts and freshly installed GPU hosts have no known_hosts entry yet.
        self._connection.client.set_missing_host_key_policy(paramiko.AutoAddPolicy())

    def _execute(self, argv: Sequence[str], stdin: bytes | None, timeout_s: float) -> CommandResult:
        command = shlex.join(argv)
        try:
            result = self._connection.run(
                command,
                hide=True,
                warn=True,
                pty=False,
                timeout=timeout_s,
                in_stream=io.StringIO(stdin.decode()) if stdin is not None else False,
            )
        except CommandTimedOut as err:
            raise HostError(
                f"`{argv[0]}` did not finish within {timeout_s:g} s on {self.name}; "
                "raise host.command_timeout_s if it needs longer."
            ) from err
        except _CONNECT_ERRORS as err:
            raise UnreachableHost(
                f"Cannot reach {self.name} at {self.user}@{self.address}:{self.port} over SSH "
                f"({type(err).__name__}: {err or 'no detail'}); check host.address, the SSH "
                "key and that sshd is running."
            ) from err
        return CommandResult(tuple(argv), result.exited, result.stdout, result.stderr)

    def write_atomic(
        self, path: PurePosixPath, data: bytes | str, *, mode: int = 0o644, sudo: bool = False
    ) -> None:
        """Upload over SFTP to a temp name, then rename over `path` (Invoke's stdin is slow).

        Without sudo the temp file sits beside the target, so the rename is atomic; with sudo it
        is uploaded to /tmp first and moved in by root.
        """
        payload = data.encode() if isinstance(data, str) else data
        needs_root = sudo and self.use_sudo
        staging_dir = PurePosixPath("/tmp") if needs_root else path.parent
        tmp = staging_dir / f".{path.name}.tmp.{uuid.uuid4().hex}"
        self.run(["mkdir", "-p", "--", str(path.parent)], sudo=sudo)
        try:
            self._connection.sftp().putfo(io.BytesIO(payload), str(tmp))
        except _CONNECT_ERRORS as err:
            raise UnreachableHost(
                f"Cannot upload {path} to {self.name} over SFTP ({type(err).__name__}: {err})."
            ) from err
        self.run(
            [
                "sh",
                "-c",
                'chmod "$3" -- "$1" && mv -f -- "$1" "$2" || { rm -f -- "$1"; exit 1; }',
                "sh",
                str(tmp),
                str(path),
                f"{mode:o}",
            ],
            sudo=sudo,
        )

    def close(self) -> None:
        self._connection.close()
