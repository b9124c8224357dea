"""Wheel RECORD files: the installer's sha256 of every file, our reference for "pristine".

RECORD lines are CSV rows `path,sha256=<urlsafe base64, no padding>,size`; hashes are turned
into lowercase hex so they compare with the manifest's.
"""

from __future__ import annotations

import base64
import csv
import io
from pathlib import PurePosixPath


def sha256_hex_from_record(value: str) -> str | None:
    """`sha256=...` (RECORD's form) as hex; None for an empty or non-sha256 hash."""
    algorithm, _, digest = value.partition("=")
    if algorithm != "sha256" or not digest:
        return None
    raw = base64.urlsafe_b64decode(digest + "=" * (-len(digest) % 4))
    return raw.hex()


def parse_record(text: str) -> dict[PurePosixPath, str]:
    """Map each hashed path of a RECORD (relative to site-packages) to its sha256 hex."""
    hashes: dict[PurePosixPath, str] = {}
    for row in csv.reader(io.StringIO(text)):
        if len(row) < 2:
            continue
        digest = sha256_hex_from_record(row[1])
        if digest is not None:
            hashes[PurePosixPath(row[0])] = digest
    return hashes
