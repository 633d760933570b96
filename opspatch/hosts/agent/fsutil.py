"""Files on the host: exact bytes in, atomic writes out, and the small helpers around them."""

from __future__ import annotations

import base64
import contextlib
import errno
import importlib
import os
import re
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Any

from opspatch.hosts.agent.protocol import OpFailure, os_failure

if TYPE_CHECKING:
    from opspatch.hosts.agent.protocol import Result

try:  # POSIX hosts only; the agent is never run elsewhere, but importing it must not fail
    import grp
    import pwd
except ImportError:  # pragma: no cover
    grp = None  # type: ignore[assignment]
    pwd = None  # type: ignore[assignment]

TEMP_SUFFIX = ".opspatch-tmp"


def _sha256_constructor() -> Any:
    """The interpreter's own SHA-256 (`_sha2`, `_sha256` before 3.12) where it is built in, else
    hashlib's: importing hashlib loads OpenSSL, a few ms of every exec for one digest."""
    for name in ("_sha2", "_sha256"):
        try:
            return importlib.import_module(name).sha256
        except (ImportError, AttributeError):
            continue
    import hashlib

    return hashlib.sha256


_SHA256 = _sha256_constructor()


def sha256_hex(data: bytes) -> str:
    return str(_SHA256(data).hexdigest())


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)


def iso(timestamp: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(timestamp))


def read_bytes(path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        raise OpFailure("not-found", f"{path} does not exist", {"path": path}) from None
    except IsADirectoryError:
        raise OpFailure("not-a-file", f"{path} is a directory", {"path": path}) from None
    except PermissionError as exc:
        raise os_failure("permission-denied", f"cannot read {path}", exc) from None


def host_name() -> str:
    """This machine's name, as `socket.gethostname()` says it (the kernel's node name), without
    importing `socket` into every exec."""
    return os.uname().nodename


def python_version() -> str:
    """This interpreter's version (`3.11.7`, `3.13.0rc1`), as `platform.python_version()` says
    it, without importing `platform` (its regular expressions compile at import)."""
    return sys.version.split()[0]


def user_name(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name if pwd else None
    except KeyError:
        return None


def group_name(gid: int) -> str | None:
    try:
        return grp.getgrgid(gid).gr_name if grp else None
    except KeyError:
        return None


def dist_version(name: str) -> str | None:
    """The installed version of distribution `name`, as `importlib.metadata.version` finds it.

    A wheel's `<name>-<version>.dist-info` folder says it in its name, so the first one on
    `sys.path` answers without importing `importlib.metadata` (tens of ms of a host's CPU on
    every `begin`); only a legacy `.egg-info` install falls back to it."""
    wanted = _normalized(name)
    for entry in sys.path or ["."]:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for folder in names:
            stem, dot, kind = folder.rpartition(".")
            if not dot or kind not in ("dist-info", "egg-info"):
                continue
            project, _, version = stem.partition("-")
            if _normalized(project) != wanted:
                continue
            if kind == "dist-info" and version:
                return version
            return _metadata_version(name)
    return None


def _normalized(project: str) -> str:
    return project.replace("-", "_").replace(".", "_").lower()


def _metadata_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def ensure_state_dir(state_dir: str) -> str:
    try:
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise os_failure(
            "state-dir-unwritable", f"cannot create the state folder {state_dir}", exc
        ) from None
    return state_dir


def fsync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:  # some filesystems cannot fsync a directory; the rename still stands
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def write_atomically(target: str, content: bytes, mode: int, uid: int, gid: int) -> None:
    """Replace `target` by `content` atomically, with the given mode and owner.

    A temp file is written in the target's own directory (so the rename cannot cross
    filesystems), fsynced, given mode and owner, renamed over the target, then the directory is
    fsynced. On any failure the temp file is removed and the target is untouched.

    Raises:
        OpFailure("write-failed"): the directory is read-only, the disk is full, the owner
            cannot be kept, or the rename failed.
    """
    directory, name = os.path.split(target)
    try:
        fd, temp = tempfile.mkstemp(prefix="." + name + ".", suffix=TEMP_SUFFIX, dir=directory)
    except OSError as exc:
        raise os_failure("write-failed", f"cannot create a temp file in {directory}", exc) from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
            info = os.fstat(handle.fileno())
            if (info.st_uid, info.st_gid) != (uid, gid):
                os.fchown(handle.fileno(), uid, gid)
            os.fchmod(handle.fileno(), mode)  # after chown, which may clear set-id bits
        os.replace(temp, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise os_failure("write-failed", f"cannot write {target}", exc) from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    fsync_directory(directory)


def file_size(path: str | None) -> int | None:
    if not path:
        return None
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def log_since(path: str | None, offset: int | None, limit: int = 4_000_000) -> str:
    """The log written since `offset` (the whole log if it shrank: it was rotated)."""
    if not path:
        return ""
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            start = offset if offset is not None and offset <= size else 0
            handle.seek(max(start, size - limit))
            return handle.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""


START_MARKER = r"\bserver_args=(?:ServerArgs\(|\{)"
"""SGLang's first log line of a start: the log since the last start begins at the last one.
`server_args=ServerArgs(...)` up to 0.5.13, `server_args={...}` (a dict) from 0.5.20."""

LOG_STAMP = re.compile(r"^\[(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})")
"""The time SGLang stamps a log line with (`[2026-12-01 01:30:50 TP0] ...`)."""


def stamp_epoch(line: str) -> float | None:
    match = LOG_STAMP.match(line)
    if match is None:
        return None
    try:
        return time.mktime(time.strptime(match.group(1), "%Y-%m-%d %H:%M:%S"))
    except (ValueError, OverflowError):
        return None


def log_window(
    path: str, since_seconds: float | None, started_at: float | None, max_read: int
) -> Result:
    """The log since the server's last start (the last `server_args=` line; else the first line
    stamped at or after the process start) or since `since_seconds` ago, read from the file's
    last `max_read` bytes."""
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            start = max(0, size - max_read)
            handle.seek(start)
            raw = handle.read()
    except FileNotFoundError:
        return {
            "path": path,
            "exists": False,
            "size": 0,
            "text": "",
            "basis": "no log file",
            "started_at": None,
        }
    except OSError as exc:
        raise OpFailure("log-unreadable", f"cannot read the log {path}: {exc.strerror}") from None
    if start > 0:
        raw = raw[raw.find(b"\n") + 1 :] if b"\n" in raw else b""
    lines = raw.decode("utf-8", "replace").splitlines(keepends=True)
    begin, basis = 0, "the whole log (no start line found)"
    if since_seconds is not None:
        cutoff = time.time() - since_seconds
        begin = next(
            (i for i, line in enumerate(lines) if (stamp_epoch(line) or 0) >= cutoff), len(lines)
        )
        basis = f"since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(cutoff))}"
    else:
        marks = [i for i, line in enumerate(lines) if re.search(START_MARKER, line)]
        if marks:
            begin, basis = marks[-1], "since the server's last start"
        elif started_at is not None:
            begin = next(
                (i for i, line in enumerate(lines) if (stamp_epoch(line) or 0) >= started_at - 1),
                0,
            )
            basis = "since the server process started"
    if start > 0 and begin == 0:
        basis += f"; only the last {max_read} bytes were read"
    from_start = since_seconds is None and begin < len(lines) and basis.startswith("since")
    return {
        "path": path,
        "exists": True,
        "size": size,
        "read_from": start,
        "truncated": start > 0,
        "first_line": begin + 1,
        "basis": basis,
        "started_at": stamp_epoch(lines[begin]) if from_start else None,
        "text": "".join(lines[begin:]),
    }
