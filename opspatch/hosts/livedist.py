"""The `opspatch_live` distribution: the live-fix plugin (`opspatch.hosts.liveplugin`) as an
engine's environment installs it, built as {path relative to site-packages: bytes}."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from opspatch.core.wheelrecord import record_file
from opspatch.hosts import liveplugin
from opspatch.hosts.liveplugin import socket_paths

LIVE_DIST_NAME = "opspatch_live"
LIVE_PACKAGE = "opspatch_live"
PTH_FILE = "opspatch_live.pth"
ENTRY_POINT = f"{socket_paths.PLUGIN_NAME} = {LIVE_PACKAGE}.plugin:load"
PTH_LINE = f"import {LIVE_PACKAGE}.plugin as _p; _p.start_at_interpreter_start()"

LiveStart = Literal["entry-point", "pth"]

_VERSION = re.compile(r"^[0-9]+(\.[0-9]+)*([._+-]?[A-Za-z0-9]+)*$")


def plugin_sources() -> dict[str, bytes]:
    """The plugin's modules as `opspatch_live/<module>.py`, read from this installation of
    opspatch (bytecode caches left out)."""
    folder = Path(liveplugin.__file__).parent
    return {
        f"{LIVE_PACKAGE}/{path.name}": path.read_bytes() for path in sorted(folder.glob("*.py"))
    }


def live_distribution(
    version: str, sources: Mapping[str, bytes], start: LiveStart = "entry-point"
) -> dict[str, bytes]:
    """Every file of `opspatch_live` `version` as installed in site-packages: `sources` (from
    `plugin_sources`), `opspatch_live-<version>.dist-info/` (METADATA, INSTALLER, WHEEL,
    top_level.txt, `entry_points.txt` for `entry-point`, RECORD last) and, for `pth`, the `.pth`.

    Raises:
        ValueError: a version that is not one, or a source outside the `opspatch_live` package.
    """
    if not _VERSION.match(version):
        raise ValueError(f"not a distribution version: {version!r}")
    outside = sorted(path for path in sources if not path.startswith(f"{LIVE_PACKAGE}/"))
    if outside:
        raise ValueError(f"not files of the {LIVE_PACKAGE} package: {', '.join(outside)}")
    dist_info = f"{LIVE_DIST_NAME}-{version}.dist-info"
    files = dict(sources)
    if start == "pth":
        files[PTH_FILE] = f"{PTH_LINE}\n".encode("ascii")
    files[f"{dist_info}/METADATA"] = _metadata(version).encode("utf-8")
    files[f"{dist_info}/INSTALLER"] = b"opspatch\n"
    files[f"{dist_info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: opspatch\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    files[f"{dist_info}/top_level.txt"] = f"{LIVE_PACKAGE}\n".encode("ascii")
    if start == "entry-point":
        group = socket_paths.ENTRY_POINT_GROUP
        files[f"{dist_info}/entry_points.txt"] = f"[{group}]\n{ENTRY_POINT}\n".encode("ascii")
    record = f"{dist_info}/RECORD"
    files[record] = record_file(files, record)
    return files


def _metadata(version: str) -> str:
    return (
        "Metadata-Version: 2.1\n"
        f"Name: {LIVE_DIST_NAME}\n"
        f"Version: {version}\n"
        "Summary: opspatch live fixes: a plugin that applies a fix in every process of a running "
        "SGLang server\n"
        "Requires-Python: >=3.8\n"
    )
