"""Assemble the GPU lab's carry bundle: wheels plus a trimmed sglang-kernel, under one size limit.

The GPU machine has no network and no registry: everything SGLang and the ddtree-deploy CLI need
beyond its image travels in a git-ignored folder of the working tree, at most 64 MiB per call
(/work/shared/docs/GPU-LAB.md). This runs here, where PyPI is reachable:

    python3 tests/gpulab/bundle.py [--release 0.5.11] [--out .lab] [--max-mb 60]

It writes <out>/wheels/ (every pin of tests/gpulab/wheels-<release>.txt, downloaded for
cp312 / manylinux x86_64), <out>/sgl_kernel-<ver>-trimmed.tar.gz (the kernel wheel without the
parts the lab never loads) and <out>/MANIFEST.json. Downloads are cached under
~/.cache/ddtree-deploy/gpulab/, so a second run does no network work.
"""

from __future__ import annotations

import argparse
import calendar
import gzip
import hashlib
import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
CACHE = Path.home() / ".cache" / "ddtree-deploy" / "gpulab"

# The GPU machine: Python 3.12.3, glibc 2.39, x86-64 (GPU-LAB.md, "Download them here with ...").
PLATFORM_FLAGS = [
    "--python-version", "3.12", "--implementation", "cp",
    "--platform", "manylinux_2_34_x86_64", "--platform", "manylinux_2_28_x86_64",
    "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64",
]  # fmt: skip
MAX_GLIBC = (2, 34)

# Only these may travel as an sdist, and only when PyPI has no wheel for the pin: pure Python,
# so pip builds them offline with --no-build-isolation from the image's setuptools and wheel.
SDIST_ALLOWED = {"antlr4-python3-runtime"}

# Which sglang-kernel each release pins (its METADATA: Requires-Dist: sglang-kernel==...).
KERNEL_FOR_RELEASE = {"0.5.11": "0.4.2", "0.5.14": "0.4.4", "0.5.15": "0.4.4", "0.5.16": "0.4.5"}

# Inside sgl_kernel/, what the lab never loads: FlashAttention 3 (1.07 GB, only for
# --attention-backend fa3), FlashMLA, the sm100 build, and (0.4.5 on) InfLLM-V2's sparse-attention
# extension (29 MiB, loaded by sgl_kernel/infllm_v2/_loader.py only when that attention runs, and
# built for CPython 3.10 alone). Everything outside sgl_kernel/ and its dist-info (lib/, lib64/,
# include/, deep_gemm/, triton_kernels/, _mscclpp*) is dropped too.
KERNEL_DROP = (
    "sgl_kernel/flash_ops.abi3.so",
    "sgl_kernel/flashmla_ops.abi3.so",
    "sgl_kernel/sm100/",
    "sgl_kernel/infllm_ops.",
)

# Inside other wheels, what the lab never reads: flashinfer's CUTLASS and CCCL headers, which only
# its JIT kernels compile against (the lab serves with the triton attention backend and the
# pytorch sampler; GPU-LAB.md). flashinfer-python 0.6.12 (SGLang 0.5.14's pin) is 12.4 MiB with
# them, 3.8 MiB without. The wheel keeps its file name; its RECORD lists only what it still holds.
WHEEL_DROP = {
    "flashinfer-python": ("flashinfer/data/cutlass/", "flashinfer/data/cccl/"),
    # xgrammar (SGLang 0.5.16 imports it at start) ships its static library beside the Python
    # bindings, which alone are loaded: 44.7 MiB with it, 12.8 without.
    "xgrammar": ("xgrammar/lib/",),
}

# Sizes are in MiB, the carry limit's unit (64 MiB per call, the repo's own files included): the
# figures in GPU-LAB.md (43 + 16) are MiB too.
MB = 1 << 20


class BundleError(Exception):
    """A refusal: its message is one sentence for the user, printed without a traceback."""


@dataclass(frozen=True)
class Pin:
    """One `name==version` line of the carry list."""

    name: str
    version: str

    @property
    def key(self) -> str:
        return canonical(self.name)

    def __str__(self) -> str:
        return f"{self.name}=={self.version}"


def canonical(name: str) -> str:
    """PEP 503 form, so `pydantic_core`, `pydantic-core` and `Pydantic.Core` compare equal."""
    return re.sub(r"[-_.]+", "-", name).lower()


def progress(message: str) -> None:
    print(message, flush=True)


def read_pins(path: Path) -> list[Pin]:
    """Parse the carry list; refuse anything but exact pins, since the lab installs --no-deps."""
    if not path.is_file():
        raise BundleError(f"There is no carry list for this release: {path} does not exist.")
    pins: list[Pin] = []
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!-]+)", line)
        if match is None:
            raise BundleError(
                f"{path.name} line {number} is not an exact name==version pin: {line!r}."
            )
        pins.append(Pin(match[1], match[2]))
    seen: set[str] = set()
    for pin in pins:
        if pin.key in seen:
            raise BundleError(f"{path.name} pins {pin.name} twice.")
        seen.add(pin.key)
    return pins


def dist_of(filename: str) -> tuple[str, str] | None:
    """(canonical name, version) of a wheel or sdist file name, None for anything else."""
    if filename.endswith(".whl"):
        parts = filename[:-4].split("-")
        return (canonical(parts[0]), parts[1]) if len(parts) >= 5 else None
    for suffix in (".tar.gz", ".zip"):
        if filename.endswith(suffix):
            name, _, version = filename[: -len(suffix)].rpartition("-")
            return (canonical(name), version) if name else None
    return None


def wheel_fits(filename: str) -> bool:
    """True when a wheel's tags install on cp312 / glibc 2.39 x86-64 (or anywhere)."""
    python_tags, abi_tags, platform_tags = filename[:-4].split("-")[-3:]
    python_ok = any(
        tag in {"py3", "cp312"}
        or re.fullmatch(r"py3\d*", tag) is not None
        or (
            re.fullmatch(r"cp3(\d+)", tag) is not None
            and "abi3" in abi_tags.split(".")
            and int(tag[3:]) <= 12
        )
        for tag in python_tags.split(".")
    )
    abi_ok = any(tag in {"none", "abi3", "cp312"} for tag in abi_tags.split("."))
    return python_ok and abi_ok and any(platform_fits(tag) for tag in platform_tags.split("."))


def platform_fits(tag: str) -> bool:
    if tag == "any":
        return True
    legacy = {
        "manylinux1_x86_64": (2, 5),
        "manylinux2010_x86_64": (2, 12),
        "manylinux2014_x86_64": (2, 17),
    }
    if tag in legacy:
        return legacy[tag] <= MAX_GLIBC
    match = re.fullmatch(r"manylinux_(\d+)_(\d+)_x86_64", tag)
    return match is not None and (int(match[1]), int(match[2])) <= MAX_GLIBC


def cached_file(folder: Path, pin: Pin) -> Path | None:
    """The file already downloaded for this pin, if any (a wheel preferred over an sdist)."""
    if not folder.is_dir():
        return None
    found = sorted(
        (p for p in folder.iterdir() if p.is_file() and dist_of(p.name) == (pin.key, pin.version)),
        key=lambda p: p.suffix != ".whl",
    )
    return found[0] if found else None


def pip_download(pin: Pin, dest: Path, *, sdist: bool) -> Path:
    """Download one file for `pin` into the cache through pip, via a scratch folder so that a
    failed or interrupted download never leaves a partial file where a later run would trust it."""
    dest.mkdir(parents=True, exist_ok=True)
    mode = ["--no-binary=:all:"] if sdist else ["--only-binary=:all:", *PLATFORM_FLAGS]
    with tempfile.TemporaryDirectory(dir=dest, prefix=".download-") as scratch:
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "--quiet",
            *mode,
            "-d",
            scratch,
            str(pin),
        ]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        files = [p for p in Path(scratch).iterdir() if p.is_file()]
        if result.returncode != 0 or len(files) != 1:
            errors = [line for line in result.stderr.splitlines() if line.startswith("ERROR")]
            raise BundleError(errors[-1] if errors else f"pip could not download {pin}.")
        target = dest / files[0].name
        shutil.move(files[0], target)
    return target


def fetch(pin: Pin, cache: Path) -> tuple[Path, str]:
    """The cached file for `pin`, downloading it first if needed; the second item says how."""
    hit = cached_file(cache, pin)
    if hit is not None:
        return hit, "cached"
    try:
        return pip_download(pin, cache, sdist=False), "downloaded"
    except BundleError:
        if pin.key not in SDIST_ALLOWED:
            raise
    return pip_download(pin, cache, sdist=True), "downloaded (sdist: PyPI has no wheel)"


def check_file(path: Path, pin: Pin) -> None:
    """Refuse a file the GPU machine could not install: a foreign wheel or an unexpected sdist."""
    if path.suffix == ".whl":
        if not wheel_fits(path.name):
            raise BundleError(f"{path.name} does not fit cp312 / manylinux x86-64 (glibc <= 2.34).")
    elif pin.key not in SDIST_ALLOWED:
        raise BundleError(f"{pin} came as an sdist ({path.name}), which only {SDIST_ALLOWED} may.")


def place(source: Path, folder: Path) -> Path:
    """Copy into the bundle unless an identical-sized copy is already there (idempotent reruns)."""
    target = folder / source.name
    if not (target.is_file() and target.stat().st_size == source.stat().st_size):
        tmp = target.with_name(f".{target.name}.part")
        shutil.copyfile(source, tmp)
        tmp.replace(target)
    return target


def place_trimmed(source: Path, folder: Path, drop: tuple[str, ...]) -> Path:
    """Write `source` into `folder` without the members under `drop`, atomically."""
    target = folder / source.name
    tmp = target.with_name(f".{target.name}.part")
    with zipfile.ZipFile(source) as wheel:
        kept = [i for i in wheel.infolist() if not i.filename.startswith(drop)]
        names = {i.filename for i in kept}
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as trimmed:
            for info in kept:
                if info.filename.endswith(".dist-info/RECORD"):
                    trimmed.writestr(info, trimmed_record(wheel, info.filename, names))
                else:
                    trimmed.writestr(info, wheel.read(info))
    tmp.replace(target)
    return target


def bundle_wheels(pins: list[Pin], out: Path) -> list[Path]:
    """Every pin's file in <out>/wheels, and nothing else there (a stale version would be
    installed alongside the pinned one)."""
    folder = out / "wheels"
    folder.mkdir(parents=True, exist_ok=True)
    placed: list[Path] = []
    for index, pin in enumerate(pins, start=1):
        source, how = fetch(pin, CACHE / "wheels")
        check_file(source, pin)
        drop = WHEEL_DROP.get(pin.key)
        placed.append(place_trimmed(source, folder, drop) if drop else place(source, folder))
        size = f"{source.stat().st_size / MB:.2f} MiB"
        if drop:
            size += f", {placed[-1].stat().st_size / MB:.2f} MiB trimmed"
        progress(f"[{index}/{len(pins)}] {pin}: {how} {source.name} ({size})")
    wanted = {p.name for p in placed}
    for stray in sorted(folder.iterdir()):
        if stray.name not in wanted:
            progress(f"removing {stray.name} from {folder} (not in the carry list)")
            if stray.is_dir():
                shutil.rmtree(stray)
            else:
                stray.unlink()
    return placed


def kernel_members(wheel: zipfile.ZipFile, dist_info: str) -> Iterator[zipfile.ZipInfo]:
    """The wheel entries the lab keeps: sgl_kernel/ minus KERNEL_DROP, plus the dist-info."""
    for info in wheel.infolist():
        name = info.filename
        if info.is_dir():
            continue
        if name.startswith(dist_info) or (
            name.startswith("sgl_kernel/") and not name.startswith(KERNEL_DROP)
        ):
            yield info


def trimmed_record(wheel: zipfile.ZipFile, record: str, kept: set[str]) -> bytes:
    """RECORD listing only the files that travel, so pip sees a consistent installed dist."""
    lines = wheel.read(record).decode().splitlines()
    return ("\n".join(line for line in lines if line.split(",", 1)[0] in kept) + "\n").encode()


def write_kernel_tarball(wheel_path: Path, target: Path, dist_info: str) -> None:
    """Write the trimmed tarball atomically and reproducibly (fixed gzip mtime, sorted members)."""
    tmp = target.with_name(f".{target.name}.part")
    with zipfile.ZipFile(wheel_path) as wheel:
        members = sorted(kernel_members(wheel, dist_info), key=lambda i: i.filename)
        kept = {info.filename for info in members}
        record = f"{dist_info}RECORD"
        with (
            tmp.open("wb") as raw,
            gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz,
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
        ):
            for info in members:
                entry = tarfile.TarInfo(info.filename)
                mode = (info.external_attr >> 16) & 0o777
                entry.mode = mode or 0o644
                entry.mtime = calendar.timegm((*info.date_time, 0, 0, 0))
                if info.filename == record:
                    data = trimmed_record(wheel, record, kept)
                    entry.size = len(data)
                    tar.addfile(entry, fileobj=io.BytesIO(data))
                else:
                    entry.size = info.file_size
                    with wheel.open(info) as stream:
                        tar.addfile(entry, fileobj=stream)
    tmp.replace(target)


def tarball_current(wheel_path: Path, target: Path, dist_info: str) -> bool:
    """True when `target` holds exactly the members the trim rules keep now, so a rerun reuses
    it, while a damaged tarball or one cut by older rules is rewritten."""
    if not target.is_file():
        return False
    with zipfile.ZipFile(wheel_path) as wheel:
        wanted = sorted(info.filename for info in kernel_members(wheel, dist_info))
    try:
        with tarfile.open(target, "r:gz") as tar:
            return sorted(tar.getnames()) == wanted
    except (tarfile.TarError, OSError, EOFError):
        return False


def bundle_kernel(version: str, out: Path) -> Path:
    """The trimmed sglang-kernel tarball in <out>; the 311 MiB wheel is downloaded once, cached."""
    pin = Pin("sglang-kernel", version)
    wheel, how = fetch(pin, CACHE / "kernel")
    check_file(wheel, pin)
    progress(f"kernel {pin}: {how} {wheel.name} ({wheel.stat().st_size / MB:.0f} MiB)")
    target = out / f"sgl_kernel-{version}-trimmed.tar.gz"
    for stale in sorted(out.glob("sgl_kernel-*-trimmed.tar.gz")):  # another release's: 16 MiB
        if stale != target:
            progress(f"removing {stale.name} from {out} (another release's kernel)")
            stale.unlink()
    dist_info = f"sglang_kernel-{version}.dist-info/"
    if tarball_current(wheel, target, dist_info):
        progress(f"kernel {target.name}: already there")
        return target
    write_kernel_tarball(wheel, target, dist_info)
    progress(f"kernel {target.name}: written ({target.stat().st_size / MB:.2f} MiB)")
    return target


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(release: str, files: list[Path], out: Path) -> int:
    """MANIFEST.json: what the bundle holds, so the lab can check it arrived whole. Returns bytes."""
    entries = [
        {
            "name": path.relative_to(out).as_posix(),
            "size": path.stat().st_size,
            "sha256": sha256(path),
        }
        for path in files
    ]
    total = sum(path.stat().st_size for path in files)
    manifest = {"release": release, "total_bytes": total, "files": entries}
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return total


def build(release: str, out: Path, max_mb: float) -> int:
    """Assemble the bundle for `release` in `out`; returns the total size in bytes."""
    kernel = KERNEL_FOR_RELEASE.get(release)
    if kernel is None:
        known = ", ".join(sorted(KERNEL_FOR_RELEASE))
        raise BundleError(f"No carry bundle is defined for SGLang {release} (known: {known}).")
    pins = read_pins(HERE / f"wheels-{release}.txt")
    progress(f"bundle for SGLang {release}: {len(pins)} pins + sglang-kernel {kernel} into {out}")
    out.mkdir(parents=True, exist_ok=True)
    files = [*bundle_wheels(pins, out), bundle_kernel(kernel, out)]
    total = write_manifest(release, files, out)
    if total > max_mb * MB:
        raise BundleError(
            f"The bundle in {out} is {total / MB:.1f} MiB, over the {max_mb:g} MiB limit (--max-mb), "
            "so it would leave too little of the 64 MiB carry for the repository itself."
        )
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--release", default="0.5.11", help="SGLang release (default 0.5.11)")
    parser.add_argument(
        "--out",
        type=Path,
        default=REPO_ROOT / ".lab",
        help="bundle folder (default: .lab at the repo root)",
    )
    parser.add_argument("--max-mb", type=float, default=60.0, help="size limit in MiB (default 60)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        total = build(args.release, args.out, args.max_mb)
    except BundleError as refusal:
        print(refusal, file=sys.stderr)
        return 2
    progress(
        f"total {total / MB:.1f} MiB ({total / 1e6:.1f} MB) in {args.out} ({time.monotonic() - started:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
