"""Released SGLang wheels on the control machine: the one download cache and reading a wheel.

`fetch_wheel(release)` runs `pip download --no-deps package==release` into the cache once
(`~/.cache/ddtree-deploy/wheels`, shared with the tests, which reach it through
`tests/patching/trees.py`) and returns the cached file. `WheelFiles` reads a wheel without
unpacking it: its RECORD (the pristine hashes) and the package's files, which is all a port
needs to patch a scratch copy in memory and scan its gates. Nothing here touches a host.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ddtree_deploy.errors import CommandFailed
from ddtree_deploy.patching.record import parse_record

WHEEL_CACHE = Path.home() / ".cache" / "ddtree-deploy" / "wheels"
DOWNLOAD_TIMEOUT_S = 600.0


def cached_wheel(release: str, package: str = "sglang", cache: Path = WHEEL_CACHE) -> Path | None:
    """The cached wheel of `package==release`, if one was downloaded before."""
    # `sglang-0.5.12-*` never matches 0.5.12.post1's `sglang-0.5.12.post1-*`.
    found = sorted(cache.glob(f"{package}-{release}-*.whl"))
    return found[-1] if found else None


def fetch_wheel(release: str, package: str = "sglang", cache: Path = WHEEL_CACHE) -> Path:
    """The wheel a host would install for `package==release`, downloaded once into `cache`.

    Raises `CommandFailed` (one sentence with pip's last words) when pip cannot get it: an
    unknown release, no network, or no wheel for this Python.
    """
    found = cached_wheel(release, package, cache)
    if found is not None:
        return found
    cache.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(cache),
               f"{package}=={release}"]  # fmt: skip
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, check=False, timeout=DOWNLOAD_TIMEOUT_S
        )
        tail = done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]
    except subprocess.TimeoutExpired:
        tail = [f"no answer within {DOWNLOAD_TIMEOUT_S:.0f} s"]
    found = cached_wheel(release, package, cache)
    if found is None:
        raise CommandFailed(
            f"pip download --no-deps {package}=={release} got no wheel ({tail[0].strip()}); "
            "check that the release exists and the package index is reachable."
        )
    return found


@dataclass(frozen=True)
class WheelFiles:
    """One wheel's package files and RECORD, read straight from the zip."""

    wheel: Path
    package: str
    release: str

    @property
    def record_name(self) -> str:
        return f"{self.package}-{self.release}.dist-info/RECORD"

    def record(self) -> dict[PurePosixPath, str]:
        """RECORD's sha256 (hex) of every file, keyed relative to site-packages."""
        with zipfile.ZipFile(self.wheel) as archive:
            return parse_record(archive.read(self.record_name).decode("utf-8"))

    def read(self, path: PurePosixPath) -> bytes | None:
        """One file's bytes, or None when the wheel does not hold it."""
        with zipfile.ZipFile(self.wheel) as archive:
            try:
                return archive.read(str(path))
            except KeyError:
                return None

    def python_sources(self) -> dict[PurePosixPath, bytes]:
        """Every `*.py` of the package, as `tree.read_python_sources` returns a host's."""
        with zipfile.ZipFile(self.wheel) as archive:
            return {
                PurePosixPath(name): archive.read(name)
                for name in archive.namelist()
                if name.startswith(f"{self.package}/") and name.endswith(".py")
            }
