"""The live plugin's installation, as the controller asks for it: where the engine's environment
installs distributions and what is there (`LIVE_SITE`), the distribution's files written there
(`INSTALL_FILES`) and removed again (`REMOVE_FILES`), each one agent exec
(`hosts/agent/liveinstall.py`)."""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from opspatch.core.codec import Record
from opspatch.core.host import Host
from opspatch.core.wheelrecord import record_sha256s
from opspatch.hosts.agent.liveinstall import (
    op_file_hashes,
    op_install_files,
    op_live_site,
    op_remove_files,
)
from opspatch.hosts.agent.protocol import (
    FileHashesReply,
    FileHashesRequest,
    InstallFilesReply,
    InstallFilesRequest,
    LiveSiteReply,
    LiveSiteRequest,
    RemoveFilesReply,
    RemoveFilesRequest,
)
from opspatch.hosts.become import RunsAs
from opspatch.hosts.livedist import LiveStart
from opspatch.hosts.operations import HostOperations
from opspatch.hosts.results import Operation


@dataclass(frozen=True)
class InstalledLive(Record):
    """One `opspatch_live` installation found in site-packages: its dist-info folder and the
    text of its RECORD (None: unreadable)."""

    dist_info: str
    record: str | None

    def files(self) -> dict[str, str | None]:
        """Every file the RECORD lists (relative to site-packages) with its sha256 hex (None:
        the RECORD itself).

        Raises:
            ValueError: no RECORD, or one that is not a RECORD.
        """
        if self.record is None:
            raise ValueError(f"{self.dist_info}/RECORD cannot be read")
        return record_sha256s(self.record)


@dataclass(frozen=True)
class LiveSite(Record):
    """The engine's environment as `live enable` sees it."""

    purelib: str
    sglang_dir: str | None
    plugin_framework: bool
    installed: tuple[InstalledLive, ...]
    filtered: str | None

    @property
    def start(self) -> LiveStart:
        """How the plugin starts there: SGLang's entry point where it has the plugin framework,
        else the `.pth` line."""
        return "entry-point" if self.plugin_framework else "pth"


LIVE_SITE = Operation(
    "live_site", LiveSiteRequest, LiveSiteReply, LiveSite, op_live_site, runs_as=RunsAs.READ
)
INSTALL_FILES = Operation(
    "install_files",
    InstallFilesRequest,
    InstallFilesReply,
    InstallFilesReply,
    op_install_files,
    runs_as=RunsAs.CHANGE,
)
REMOVE_FILES = Operation(
    "remove_files",
    RemoveFilesRequest,
    RemoveFilesReply,
    RemoveFilesReply,
    op_remove_files,
    runs_as=RunsAs.CHANGE,
)
FILE_HASHES = Operation(
    "file_hashes",
    FileHashesRequest,
    FileHashesReply,
    FileHashesReply,
    op_file_hashes,
    runs_as=RunsAs.READ,
)


def read_site(ops: HostOperations, *, timeout: float, step: str) -> LiveSite:
    """The engine's environment on the host (one exec, changing nothing)."""
    host: Host = ops.host
    request: LiveSiteRequest = {
        "pid_file": getattr(host.engine.restart, "pid_file", None),
        "url": host.engine.url,
        "env": dict(host.engine.env),
    }
    return ops.run(LIVE_SITE, request, timeout=timeout, step=step)


def install(
    ops: HostOperations,
    root: str,
    files: Mapping[str, bytes],
    *,
    lock_run_id: str | None,
    timeout: float,
    step: str,
) -> InstallFilesReply:
    """Write `files` under `root` (none when one is there with other bytes).

    Raises:
        RemoteOperationError: `file-exists` (naming it), `write-failed`, `lock-lost`.
    """
    request: InstallFilesRequest = {
        "root": root,
        "files": {path: base64.b64encode(data).decode("ascii") for path, data in files.items()},
        "state_dir": ops.host.state_dir,
        "lock_run_id": lock_run_id,
    }
    return ops.run(INSTALL_FILES, request, timeout=timeout, step=step)


def remove(
    ops: HostOperations,
    root: str,
    files: Mapping[str, str],
    *,
    lock_run_id: str | None,
    timeout: float,
    step: str,
) -> RemoveFilesReply:
    """Remove `files` (path -> sha256) under `root` (none when one holds other bytes).

    Raises:
        RemoteOperationError: `file-changed` (naming it), `remove-failed`, `lock-lost`.
    """
    request: RemoveFilesRequest = {
        "root": root,
        "files": dict(files),
        "state_dir": ops.host.state_dir,
        "lock_run_id": lock_run_id,
    }
    return ops.run(REMOVE_FILES, request, timeout=timeout, step=step)


def read_hashes(
    ops: HostOperations, root: str, paths: Sequence[str], *, timeout: float, step: str
) -> dict[str, str | None]:
    """Each of `paths` under `root` read back (one exec, changing nothing): its sha256, None
    when absent. What an `install` or a `remove` whose reply was lost left there."""
    request: FileHashesRequest = {"root": root, "paths": list(paths)}
    return ops.run(FILE_HASHES, request, timeout=timeout, step=step)["sha256"]
