"""The installed package on a host, read and written through its `ShellHost` only.

`read_snapshot` gets, in one command, the package's real path, its wheel RECORD and the bytes,
mode and real path of each target file, so a plan over SSH costs one round trip. Writes go
through `ShellHost.write_atomic` at each file's real path; `drop_bytecode` removes the stale
`__pycache__/<module>.*.pyc` of replaced modules; `read_python_sources` streams every `*.py` of
the package as one tar, for the gate audit. Deciding what to write is `engine`'s job.
"""

from __future__ import annotations

import base64
import io
import tarfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from ddtree_deploy.errors import CommandFailed
from ddtree_deploy.hosts.connection import ShellHost
from ddtree_deploy.patching.errors import PackageNotFound, PathEscape
from ddtree_deploy.patching.record import parse_record

# Prints "ROOT <b64 realpath of the package>", one "RECORD <b64 path> <b64 text>" per dist-info,
# then per target "FILE <b64 realpath> <octal mode> <b64 bytes>" or "MISSING", in argument order.
_SNAPSHOT_SCRIPT = r"""
site=$1; pkg=$2; shift 2
b64() { printf %s "$1" | base64 -w0; }
printf 'ROOT %s\n' "$(b64 "$(realpath -e -- "$site/$pkg" 2>/dev/null)")"
for record in "$site/$pkg"-*.dist-info/RECORD; do
  [ -f "$record" ] && printf 'RECORD %s %s\n' "$(b64 "$record")" "$(base64 -w0 -- "$record")"
done
for rel in "$@"; do
  if [ -f "$site/$rel" ]; then
    printf 'FILE %s %s %s\n' "$(b64 "$(realpath -e -- "$site/$rel")")" \
      "$(stat -L -c %a -- "$site/$rel")" "$(base64 -w0 -- "$site/$rel")"
  else
    printf 'MISSING\n'
  fi
done
"""

_DROP_BYTECODE_SCRIPT = r"""
for f in "$@"; do
  rm -f -- "$(dirname -- "$f")/__pycache__/$(basename -- "$f" .py)".*.pyc
done
"""

_SOURCES_SCRIPT = r"""
set -e
cd -- "$1"
test -d "$2"
find "$2" -name '*.py' -type f -print0 | tar --null -T - -czf - | base64 -w0
"""


@dataclass(frozen=True)
class HostFile:
    """A target file as found on the host."""

    real_path: PurePosixPath  # absolute, symlinks resolved; where writes go
    mode: int
    data: bytes


@dataclass(frozen=True)
class Snapshot:
    """What one read of the package found: its real root, RECORD hashes and target files."""

    package_root: PurePosixPath
    record_path: PurePosixPath
    record: dict[PurePosixPath, str]
    files: dict[PurePosixPath, HostFile | None]


def read_snapshot(
    host: ShellHost,
    site_packages: PurePosixPath,
    package: str,
    paths: Sequence[PurePosixPath],
    *,
    sudo: bool = False,
) -> Snapshot:
    """Read the package root, its RECORD and `paths` (relative to site-packages) in one go.

    Raises `PackageNotFound` without a package folder or with no or several RECORDs, and
    `PathEscape` when a target's real path leaves the package's real folder.
    """
    argv = ["sh", "-c", _SNAPSHOT_SCRIPT, "sh", str(site_packages), package, *map(str, paths)]
    lines = host.run(argv, sudo=sudo).stdout.splitlines()
    root_text = _decode(lines[0].split(" ", 1)[1]) if lines else ""
    if not root_text:
        raise PackageNotFound(
            f"{site_packages}/{package} does not exist on {host.name}; check the site-packages "
            "path (the facts probe reports sglang_path)."
        )
    records = [line.split(" ") for line in lines[1:] if line.startswith("RECORD ")]
    if len(records) != 1:
        raise PackageNotFound(
            f"{site_packages} on {host.name} has {len(records)} {package}-*.dist-info/RECORD "
            "files, not one; reinstall the package with pip so its RECORD is exact."
        )
    package_root = PurePosixPath(root_text)
    file_lines = lines[1 + len(records) :]
    files = {
        path: _host_file(host, package_root, path, line)
        for path, line in zip(paths, file_lines, strict=True)
    }
    return Snapshot(
        package_root=package_root,
        record_path=PurePosixPath(_decode(records[0][1])),
        record=parse_record(_decode(records[0][2])),
        files=files,
    )


def _decode(field: str) -> str:
    return base64.b64decode(field).decode("utf-8", errors="surrogateescape")


def _host_file(
    host: ShellHost, package_root: PurePosixPath, path: PurePosixPath, line: str
) -> HostFile | None:
    if line == "MISSING":
        return None
    _, real, mode, data = line.split(" ")
    real_path = PurePosixPath(_decode(real))
    # `path` starts with the package folder's name; the rest must stay under its real path.
    if real_path != package_root.joinpath(*path.parts[1:]):
        raise PathEscape(
            f"{path} on {host.name} resolves to {real_path}, not to a plain file inside "
            f"{package_root} (a symlink); reinstall the package so the file is its own."
        )
    return HostFile(real_path, int(mode, 8), base64.b64decode(data))


def drop_bytecode(
    host: ShellHost, real_paths: Iterable[PurePosixPath], *, sudo: bool = False
) -> None:
    """Remove each module's cached bytecode so Python recompiles the replaced source."""
    paths = [str(path) for path in real_paths]
    if paths:
        host.run(["sh", "-c", _DROP_BYTECODE_SCRIPT, "sh", *paths], sudo=sudo)


def read_python_sources(
    host: ShellHost, site_packages: PurePosixPath, package: str, *, sudo: bool = False
) -> dict[PurePosixPath, bytes]:
    """Every `*.py` of the package, keyed relative to site-packages, in one round trip."""
    try:
        result = host.run(
            ["sh", "-c", _SOURCES_SCRIPT, "sh", str(site_packages), package], sudo=sudo
        )
    except CommandFailed as err:
        raise PackageNotFound(
            f"Cannot read the {package} sources under {site_packages} on {host.name}: {err}"
        ) from err
    sources: dict[PurePosixPath, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(result.stdout)), mode="r:gz") as tar:
        for member in tar:
            extracted = tar.extractfile(member) if member.isfile() else None
            if extracted is not None:
                sources[PurePosixPath(member.name)] = extracted.read()
    return sources
