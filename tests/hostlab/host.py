"""The value a test gets for a reachable host, the `ssh` argv to reach it, and its key pairs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from .proc import run


@dataclass(frozen=True)
class TestHost:
    """A real host reachable over SSH: what the product's Fabric connection is given.

    `known_hosts_path` holds the host's public key under `address` (and port), so a client can
    verify the host instead of trusting it on first use.
    """

    __test__: ClassVar[bool] = False  # a value type, not a pytest test class

    name: str
    address: str
    port: int
    user: str
    key_path: Path
    known_hosts_path: Path | None = None


def ssh_argv(
    host: TestHost, *command: str, verify_host_key: bool = True, connect_timeout_s: int = 5
) -> list[str]:
    """The system `ssh` argv that runs `command` on `host` (an interactive login if empty).

    With `verify_host_key` and a known_hosts file, the host key is checked strictly; otherwise
    it is neither checked nor recorded.
    """
    if verify_host_key and host.known_hosts_path is not None:
        trust = [
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            f"UserKnownHostsFile={host.known_hosts_path}",
        ]
    else:
        trust = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
    return [
        "ssh",
        "-i",
        str(host.key_path),
        "-p",
        str(host.port),
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        f"ConnectTimeout={connect_timeout_s}",
        "-o",
        "LogLevel=ERROR",
        *trust,
        f"{host.user}@{host.address}",
        *command,
    ]


def generate_key(path: Path, comment: str) -> Path:
    """Write a fresh passphrase-less ed25519 key pair at `path` (+ `.pub`); return `path`."""
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", path])
    return path


def write_known_hosts(path: Path, address: str, port: int, host_public_key: str) -> Path:
    """Record `host_public_key` ("TYPE BASE64 [comment]") for `address:port` in known_hosts."""
    key_type, key_data = host_public_key.split()[:2]
    pattern = address if port == 22 else f"[{address}]:{port}"
    path.write_text(f"{pattern} {key_type} {key_data}\n")
    return path
