"""The cached Debian bookworm root filesystem that container hosts boot from.

Owns building it once per machine (debootstrap from the mirror apt is configured with) and
finding it again; leaves per-host copies to `nspawn`.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

from .proc import HostlabError, run

SUITE = "bookworm"
PACKAGES: tuple[str, ...] = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "python3",
    "python3-venv",
    "iproute2",
    "patch",
    "sudo",
)
CACHE_DIR = Path.home() / ".cache" / "ddtree-deploy" / "rootfs"
APT_SOURCES = Path("/etc/apt")
_COMPLETE = ".ddtree-rootfs-complete"


def rootfs_path() -> Path:
    """Where the rootfs for the current package list lives; a new list means a new directory."""
    key = hashlib.sha256(" ".join((SUITE, "minbase", *PACKAGES)).encode()).hexdigest()[:12]
    return CACHE_DIR / f"{SUITE}-{key}"


def cached_rootfs() -> Path | None:
    """The finished cached rootfs, or None if it was never built on this machine."""
    path = rootfs_path()
    return path if (path / _COMPLETE).is_file() else None


def debian_mirror(apt_dir: Path = APT_SOURCES) -> str:
    """The Debian mirror apt uses for `SUITE`, read from one-line and deb822 source files."""
    files = [
        apt_dir / "sources.list",
        *sorted((apt_dir / "sources.list.d").glob("*.list")),
        *sorted((apt_dir / "sources.list.d").glob("*.sources")),
    ]
    for path in files:
        if not path.is_file():
            continue
        text = path.read_text()
        entries = _deb822_entries(text) if path.suffix == ".sources" else _one_line_entries(text)
        for uri, suites in entries:
            if SUITE in suites:
                return uri
    raise HostlabError(
        f"No apt source for Debian {SUITE} under {apt_dir}; debootstrap needs a mirror."
    )


def _one_line_entries(text: str) -> list[tuple[str, list[str]]]:
    """(URI, [suite]) of each `deb [options] URI suite components` line."""
    entries = []
    for line in text.splitlines():
        words = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
        if len(words) >= 3 and words[0] == "deb":
            entries.append((words[1], [words[2]]))
    return entries


def _deb822_entries(text: str) -> list[tuple[str, list[str]]]:
    """(URI, suites) of each enabled `Types: deb` stanza of a deb822 `.sources` file."""
    entries = []
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line or line[:1].isspace():
                continue
            name, value = line.split(":", 1)
            fields[name.strip().lower()] = value.strip()
        if "deb" in fields.get("types", "").split() and fields.get("enabled", "yes") != "no":
            uris = fields.get("uris", "").split()
            if uris:
                entries.append((uris[0], fields.get("suites", "").split()))
    return entries


def ensure_rootfs(*, timeout_s: float = 900.0) -> Path:
    """Return the cached rootfs, building it first if missing.

    The build goes into a temporary sibling directory that is renamed into place only once
    debootstrap succeeded, so a killed build leaves no half rootfs under the cache name. Two
    concurrent builders each build; the loser's rename fails and its copy is removed.
    """
    if (done := cached_rootfs()) is not None:
        return done
    target = rootfs_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_builds(target.parent)
    build = Path(tempfile.mkdtemp(prefix=f".build-{os.getpid()}-", dir=target.parent))
    try:
        build.chmod(0o755)  # it becomes the containers' `/`; mkdtemp made it 0700
        run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(PACKAGES)}",
                SUITE,
                build,
                debian_mirror(),
            ],
            timeout_s=timeout_s,
        )
        (build / _COMPLETE).write_text(f"built {time.strftime('%Y-%m-%dT%H:%M:%S')}\n")
        try:
            build.rename(target)
        except OSError:
            if cached_rootfs() is None:
                raise
    finally:
        if build.exists():
            shutil.rmtree(build, ignore_errors=True)
    return target


def _remove_stale_builds(cache: Path) -> None:
    """Delete `.build-PID-*` directories whose builder process is gone (a killed earlier build)."""
    for leftover in cache.glob(".build-*"):
        pid = leftover.name.split("-")[1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(leftover, ignore_errors=True)
