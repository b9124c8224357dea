"""Where the stand-in runs: a venv on this machine with patched SGLang, bound into a container.

TEST DOUBLE support. `build_standin_venv()` makes, under `~/.cache/ddtree-deploy/standin/`:

- `patched/sglang/`: a copy of the SGLang package of a prepared SGLang venv (the staging venv
  that `ddtree-deploy host=local action=prepare` builds, or the patching tests' dev venv),
  patched with `patches/sglang/<release>/*.patch` by `patch -p1 --fuzz=0`; the source venv is
  only read, never modified;
- `src/`: copies of the checkout's `tests/standin` and `kernels/ddtree_kernels` (the stand-in
  and the reference ops it decodes with), replaced whenever the checkout's copy differs;
- `venv/`: a venv of the same Python whose `standin.pth` puts, in order, the patched copy,
  `src/` and the source venv's site-packages (torch, transformers...) on `sys.path`.

Nothing the unit runs lies in the checkout: a checkout under /tmp is hidden from the service by
the unit's `PrivateTmp=yes` (kept: the units under test are the production units) and from a
container by its /tmp tmpfs. `binds()` lists what a container needs read-only at the same paths
(systemd-nspawn `--bind-ro`), so the unit's `ExecStart=<venv>/bin/python -m standin` runs
inside it; the cache lives under the home directory, which the unit leaves visible.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from staging import staging_venv

REPO = Path(__file__).resolve().parents[2]
ROOT = Path.home() / ".cache" / "ddtree-deploy" / "standin"
_CANDIDATES = (
    Path(os.environ.get("DDTREE_TEST_SGLANG_VENV", "/nonexistent")),
    staging_venv("0.5.11"),
)
MODEL_DIR = "/opt/standin-models"
LAYOUT = "3"  # bump when what build_standin_venv lays out changes (old roots are rebuilt)


def source_venv() -> Path | None:
    """The first prepared SGLang venv whose Python imports sglang and torch, or None."""
    for venv in _CANDIDATES:
        python = venv / "bin" / "python"
        if python.exists() and _imports(python, "sglang, torch"):
            return venv
    return None


def _imports(python: Path, modules: str) -> bool:
    probe = subprocess.run(
        [str(python), "-c", f"import {modules}"],
        capture_output=True,
        timeout=300,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    return probe.returncode == 0


def _site_dirs(python: Path) -> list[str]:
    out = subprocess.run(
        [str(python), "-c", "import sys; print('\\n'.join(p for p in sys.path if p))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [line for line in out.splitlines() if "site-packages" in line]


def standin_root_for(source: Path, release: str = "0.5.11", checkout: Path = REPO) -> Path:
    """Where `build_standin_venv` puts the root for `source`, `release` and `checkout`.

    The key includes the checkout's path, so two checkouts' test runs never refresh each
    other's `src/` under a running container.
    """
    patch_files = sorted((checkout / "patches" / "sglang" / release).glob("*.patch"))
    parts = [LAYOUT, str(checkout), str(source), *_site_dirs(source / "bin" / "python")]
    text = "".join([*parts, *(p.read_text() for p in patch_files)])
    return ROOT / hashlib.sha256(text.encode()).hexdigest()[:12]


def build_standin_venv(source: Path, release: str = "0.5.11", checkout: Path = REPO) -> Path:
    """Build (or reuse) the stand-in venv for `source` and the project `checkout`; returns its root.

    Test processes running at once (pytest-xdist workers) share a root: one builds while the
    others wait on its lock, and `src/` is replaced only when the checkout's copy differs, so a
    stand-in that a container starts from it never finds it half-replaced.
    """
    root = standin_root_for(source, release, checkout)
    ROOT.mkdir(parents=True, exist_ok=True)
    with (ROOT / f"{root.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / "ready").exists():
            _build(root, source, release, checkout)
        _copy_sources(root, checkout)
    return root


def _build(root: Path, source: Path, release: str, checkout: Path) -> None:
    python = source / "bin" / "python"
    sites = _site_dirs(python)
    sglang_dir = next(Path(s) / "sglang" for s in sites if (Path(s) / "sglang").is_dir())
    patch_files = sorted((checkout / "patches" / "sglang" / release).glob("*.patch"))
    shutil.rmtree(root, ignore_errors=True)
    patched = root / "patched"
    shutil.copytree(sglang_dir, patched / "sglang", ignore=shutil.ignore_patterns("__pycache__"))
    # The deploy's patch step reads the wheel's RECORD beside the package: copy it too. The
    # files it lists are then in the patch set's `applied` state, which the step leaves alone.
    for info in sglang_dir.parent.glob("sglang-*.dist-info"):
        shutil.copytree(info, patched / info.name)
    for patch in patch_files:
        common = ["patch", "-p1", "--fuzz=0", "--force", "-s", "-i", str(patch)]
        applied = subprocess.run([*common, "-R", "--dry-run"], cwd=patched, capture_output=True)
        if applied.returncode != 0:  # the source venv may already carry the patch set
            subprocess.run(common, cwd=patched, check=True)
    base = Path(os.path.realpath(python))
    subprocess.run([str(base), "-m", "venv", "--without-pip", str(root / "venv")], check=True)
    site = next((root / "venv").glob("lib/python*")) / "site-packages"
    lines = [str(patched), str(root / "src"), *sites]
    (site / "standin.pth").write_text("\n".join(lines) + "\n")
    (root / "ready").write_text(str(source) + "\n")


def _copy_sources(root: Path, checkout: Path) -> None:
    """Copy the stand-in and the kernels' reference, as the checkout has them now, into
    `root/src`; left alone when they already match (the caller holds the root's lock)."""
    sources = {
        "standin": checkout / "tests" / "standin",
        "ddtree_kernels": checkout / "kernels" / "ddtree_kernels",
    }
    stamp = _tree_digest(sources)
    done = root / "src" / ".digest"
    if done.is_file() and done.read_text() == stamp:
        return
    fresh = root / "src.new"
    shutil.rmtree(fresh, ignore_errors=True)
    for name, folder in sources.items():
        shutil.copytree(folder, fresh / name, ignore=shutil.ignore_patterns("__pycache__"))
    (fresh / ".digest").write_text(stamp)
    shutil.rmtree(root / "src", ignore_errors=True)
    fresh.rename(root / "src")


def _tree_digest(folders: dict[str, Path]) -> str:
    """One hash over the names and bytes of the files under `folders` (bytecode left out)."""
    digest = hashlib.sha256()
    for name, folder in sorted(folders.items()):
        for file in sorted(folder.rglob("*")):
            if file.is_file() and "__pycache__" not in file.parts:
                digest.update(f"{name}/{file.relative_to(folder)}\0".encode())
                digest.update(file.read_bytes())
    return digest.hexdigest()


def binds(root: Path, source: Path) -> list[Path]:
    """Read-only binds a container needs to run `<root>/venv/bin/python -m standin`."""
    python = source / "bin" / "python"
    wanted = [root, source]
    wanted.append(Path(os.path.realpath(python)).parents[1])  # the Python install itself
    for site in _site_dirs(python):
        venv = next((p for p in Path(site).parents if (p / "pyvenv.cfg").exists()), None)
        if venv is not None:
            wanted.append(venv)
    unique: list[Path] = []
    for path in wanted:
        if not any(path == u or u in path.parents for u in unique):
            unique = [u for u in unique if path not in u.parents] + [path]
    return unique
