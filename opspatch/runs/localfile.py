"""Facts about files on the controller's own disk (the `--file` commands).

The remote equivalent runs inside the host agent; this is the same question asked locally: which
version of the distribution owns this source file?
"""

from __future__ import annotations

import re
from email.parser import HeaderParser
from pathlib import Path

from opspatch.core.spec import Target


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def distribution_version_for(file: Path, target: Target) -> str | None:
    """The version in `<site>/<distribution>-<version>.dist-info/METADATA` beside the package that
    holds `file`, or None when the file is not inside an installed distribution (a checkout)."""
    resolved = file.resolve().as_posix()
    for relpath in target.module_relpaths():
        if resolved.endswith("/" + relpath):
            site = Path(resolved[: -len(relpath) - 1])
            break
    else:
        return None
    wanted = _normalize(target.distribution)
    for info in sorted(site.glob("*.dist-info")):
        name = info.name[: -len(".dist-info")]
        dist, _, version = name.partition("-")
        if _normalize(dist) != wanted:
            continue
        metadata = info / "METADATA"
        if metadata.is_file():
            headers = HeaderParser().parsestr(
                metadata.read_text(encoding="utf-8", errors="replace")
            )
            return headers.get("Version") or version or None
        return version or None
    return None
