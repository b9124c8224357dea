"""The wheel a host installs: a cached build with the plain Python of the current `kernels/`.

The cache keys a wheel by what its compile reads (`key.py`), so the Python a cached wheel carries
may be older than the checkout's. `with_python` swaps it without a compile: it drops every entry
that `key.is_python_file` names, adds the current files, and rewrites RECORD (the per-file
sha256 that pip records and uninstalls by, and `action=audit` reads); the compiled extension and
the metadata stay byte for byte. Identical inputs give an identical wheel, so every host of one
key and one Python installs the same wheel sha256. Installing a whole wheel, instead of copying
the Python over an installed one, keeps the venv's RECORD true and the kept wheel a complete
rollback.

Written with `zipfile`: the `wheel` project offers no public Python API (only its command line,
which is not a runtime dependency here), and RECORD is three CSV columns (PEP 376/627).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import zipfile
from pathlib import Path

from ddtree_deploy.kernel_build.errors import KernelBuildError
from ddtree_deploy.kernel_build.key import is_python_file, python_files

# A fixed time for the entries written here (a zip cannot hold times before 1980).
_ENTRY_TIME = (2020, 9, 13, 12, 26, 40)


def with_python(wheel: bytes, root: Path) -> bytes:
    """`wheel` with its plain Python replaced by `python_files(root)`, RECORD rewritten."""
    payload = {p.relative_to(root).as_posix(): p.read_bytes() for p in python_files(root)}
    with zipfile.ZipFile(io.BytesIO(wheel)) as old:
        records = [n for n in old.namelist() if n.endswith(".dist-info/RECORD")]
        if len(records) != 1:
            raise KernelBuildError(
                f"The kernels wheel holds {len(records)} .dist-info/RECORD files, not one; "
                "delete its entry from the kernels cache and build it again."
            )
        kept = {
            info.filename: (info, old.read(info))
            for info in old.infolist()
            if not info.is_dir() and info.filename != records[0]
            if not is_python_file(info.filename)
        }
    entries = {**kept, **{name: (_new_entry(name), data) for name, data in payload.items()}}
    # Package files first, then the .dist-info folder with RECORD last, as the wheel spec asks.
    order = sorted(entries, key=lambda name: (".dist-info/" in name, name))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as new:
        for name in order:
            info, data = entries[name]
            new.writestr(info, data)
        record = _record({name: entries[name][1] for name in order}, records[0])
        new.writestr(_new_entry(records[0]), record)
    return buffer.getvalue()


def _new_entry(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, _ENTRY_TIME)
    info.external_attr = 0o644 << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    return info


def _record(files: dict[str, bytes], record_name: str) -> bytes:
    """RECORD's rows: path, `sha256=` urlsafe base64 digest without padding, size; RECORD's own
    row leaves both empty."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        writer.writerow((name, f"sha256={digest}", len(data)))
    writer.writerow((record_name, "", ""))
    return out.getvalue().encode()
