"""The fingerprint of what a validation proved: driver, CUDA, torch, SGLang and the files its
patch set touched, the model and drafter, the kernels install.

A passed validation records it in `state.json` (`fingerprint`); `action=status` and the
re-validation timer read it again and name each part that changed since (drift), because any of
them can make tree mode wrong or slower without a deploy. Everything beyond the facts probe the
caller already made comes from one remote command (`_READ_SCRIPT`, run by the SGLang venv's
Python; it imports neither torch nor SGLang).

A fingerprint is a flat mapping `part -> value` (None: absent), so comparing two is one loop and
a part's name is what the operator reads.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from ddtree_deploy.config.schema import DeployConfig
from ddtree_deploy.errors import HostError
from ddtree_deploy.events import emit
from ddtree_deploy.hosts.connection import ShellHost
from ddtree_deploy.hosts.facts import HostFacts
from ddtree_deploy.patching.manifest import UnsupportedRelease, select_patch_set

# argv[1]: JSON {"files": [...], "dirs": [...]}. Prints JSON: each file's sha256 (None when
# unreadable), each model folder's resolved path and config.json sha256, the installed
# ddtree-kernels' version and RECORD sha256.
_READ_SCRIPT = r"""
import hashlib, json, os, sys
want = json.loads(sys.argv[1])
def sha(path):
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except OSError:
        return None
out = {"files": {p: sha(p) for p in want["files"]}, "dirs": {}}
for d in want["dirs"]:
    found = os.path.isdir(d)
    out["dirs"][d] = {
        "resolved": os.path.realpath(d) if found else None,
        "config": sha(os.path.join(d, "config.json")) if found else None,
    }
try:
    import importlib.metadata as md
    dist = md.distribution("ddtree-kernels")
    record = (dist.read_text("RECORD") or "").encode()
    out["kernels"] = "%s, RECORD %s" % (dist.version, hashlib.sha256(record).hexdigest()[:16])
except Exception:
    out["kernels"] = None
print(json.dumps(out))
"""

Fingerprint = dict[str, str | None]


@dataclass(frozen=True)
class RecordedFingerprint:
    """A fingerprint as `state.json` keeps it: the parts, and the validation that proved them."""

    parts: Fingerprint
    generation: int | None
    recorded: float  # Unix time of the validation

    def to_dict(self) -> dict[str, Any]:
        return {"parts": self.parts, "generation": self.generation, "recorded": self.recorded}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> RecordedFingerprint | None:
        """The fingerprint `state.json` holds, or None (never recorded, or a malformed entry)."""
        entry = state.get("fingerprint")
        if not isinstance(entry, dict) or not isinstance(entry.get("parts"), dict):
            return None
        return cls(dict(entry["parts"]), entry.get("generation"), float(entry.get("recorded", 0)))


def patched_files(facts: HostFacts) -> list[PurePosixPath]:
    """The SGLang files the installed release's patch set touches, as absolute paths (none when
    the host's SGLang is unknown or has no set: the `SGLang` part then tells the change)."""
    if facts.sglang_version is None or facts.sglang_path is None:
        return []
    with contextlib.suppress(UnsupportedRelease):
        patch_set = select_patch_set(facts.sglang_version)
        site = PurePosixPath(facts.sglang_path).parent
        paths = {site / f.path for patch in patch_set.patches for f in patch.files}
        return sorted(paths)
    return []


def read_fingerprint(
    cfg: DeployConfig, host: ShellHost, facts: HostFacts, python: PurePosixPath
) -> Fingerprint:
    """The host's fingerprint now: `facts` (already probed) plus one remote read by `python`."""
    files = patched_files(facts)
    site = PurePosixPath(facts.sglang_path).parent if facts.sglang_path else None
    models = {"model": cfg.model.target_path, "drafter": cfg.model.draft_path}
    request = json.dumps({"files": [str(p) for p in files], "dirs": list(models.values())})
    result = host.run([str(python), "-c", _READ_SCRIPT, request], sudo=True, check=False)
    if not result.ok:
        raise HostError(
            f"Reading the fingerprint on {host.name} failed with exit code {result.exit_code}: "
            f"{result.tail(3)}"
        )
    read: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    torch = f"{facts.torch_version} (CUDA {facts.torch_cuda})" if facts.torch_version else None
    parts: Fingerprint = {
        "NVIDIA driver": facts.driver_version,
        "CUDA (driver)": facts.cuda_driver_version,
        "torch": torch,
        "SGLang": facts.sglang_version,
        "kernels": read.get("kernels"),
    }
    for path in files:
        name = path.relative_to(site) if site is not None else path
        parts[f"SGLang file {name}"] = read["files"].get(str(path))
    for role, folder in models.items():
        seen = read["dirs"].get(folder) or {}
        parts[f"{role} path"] = seen.get("resolved")
        parts[f"{role} config.json"] = seen.get("config")
    emit("fingerprint.read", host=host.name, parts=len(parts))
    return parts


def drift(recorded: Fingerprint, now: Fingerprint) -> list[str]:
    """One line per part that differs, in the recorded order, then parts new since."""
    lines = []
    for part in [*recorded, *(p for p in now if p not in recorded)]:
        before, after = recorded.get(part), now.get(part)
        if before != after:
            change = f"{_show(before)} -> {_show(after)}"
            lines.append(f"{part} changed since the last passed validation: {change}")
    return lines


def _show(value: str | None) -> str:
    """A value as a drift line shows it: hashes shortened to 12 characters, None as absent."""
    if value is None:
        return "absent"
    if len(value) == 64 and all(c in "0123456789abcdef" for c in value):
        return value[:12]
    return value
