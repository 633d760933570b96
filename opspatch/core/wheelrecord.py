"""An installed distribution's RECORD, as pip writes it (pure): every installed file with its
sha256 (urlsafe base64, no padding) and size, the RECORD itself last with neither."""

from __future__ import annotations

import base64
import csv
import hashlib
from collections.abc import Mapping


def record_hash(data: bytes) -> str:
    """A RECORD hash field as pip writes it: `sha256=` + urlsafe base64 without padding."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode("ascii")


def record_line(relative_path: str, data: bytes) -> str:
    """One RECORD row: `path,sha256=...,size` (paths are relative to site-packages, with /)."""
    return f"{relative_path},{record_hash(data)},{len(data)}"


def record_file(files: Mapping[str, bytes], record_path: str) -> bytes:
    """The RECORD at `record_path` for `files` (in their order), itself listed last."""
    rows = [record_line(path, data) for path, data in files.items()]
    rows.append(f"{record_path},,")
    return ("\n".join(rows) + "\n").encode("utf-8")


def record_sha256s(text: str) -> dict[str, str | None]:
    """A RECORD read back: each listed path with its sha256 as hex (None: listed without a
    hash, as the RECORD itself is). RECORD is CSV: a path with a comma in it is quoted (real
    SGLang 0.5.23 ships `"...world=16,H=7168,device_name=NVIDIA_GB200.json"`).

    Raises:
        ValueError: a row that is not `path,hash,size`, or a hash that is not sha256.
    """
    found: dict[str, str | None] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            (row,) = csv.reader([line])
        except (csv.Error, ValueError):
            row = []
        if len(row) != 3 or not row[0]:
            raise ValueError(f"RECORD line {number}: expected path,hash,size: {line!r}")
        path, hashed, _size = row
        if not hashed:
            found[path] = None
            continue
        algorithm, _, value = hashed.partition("=")
        if algorithm != "sha256" or not value:
            raise ValueError(f"RECORD line {number}: not a sha256 hash: {hashed!r}")
        found[path] = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).hex()
    return found
