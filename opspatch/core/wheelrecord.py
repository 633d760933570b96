"""An installed distribution's RECORD, as pip writes it (pure): every installed file with its
sha256 (urlsafe base64, no padding) and size, the RECORD itself last with neither."""

from __future__ import annotations

import base64
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
