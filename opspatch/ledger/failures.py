"""Why SQLite could not open, read or write the ledger, told in the operator's words.

SQLite reports a full or read-only filesystem in several ways depending on the moment: `database
or disk is full` (SQLITE_FULL), `attempt to write a readonly database` (SQLITE_READONLY), but
also `disk I/O error` (it could not grow the WAL index, SQLITE_IOERR_SHMSIZE) or `unable to open
database file` (SQLITE_CANTOPEN) when the `-wal`/`-shm` files beside the ledger cannot be created.
Those last two say nothing useful, so when SQLite's code is not conclusive the filesystem itself
is asked (`statvfs`: mounted read-only? no space left? is the file writable?) and the message
names what is true, the path, and what to do.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path

from opspatch.errors import LedgerError

# SQLite primary result codes (the low byte of an extended code).
_SQLITE_READONLY = 8
_SQLITE_IOERR = 10
_SQLITE_FULL = 13
_SQLITE_CANTOPEN = 14

_NEARLY_FULL_BYTES = 1 << 20
"""Below this much free space, an I/O error while growing the ledger is put down to a full disk."""

_MOVE_IT = "or point --ledger / OPSPATCH_LEDGER at a ledger on another filesystem"


def filesystem_failure(path: Path, exc: BaseException, doing: str) -> LedgerError | None:
    """A `LedgerError` naming a full or read-only filesystem (or file) when that is why `exc`
    happened while `doing` (`open`, `write`, `read`) the ledger at `path`; None otherwise."""
    code = _sqlite_code(exc)
    os_errno = exc.errno if isinstance(exc, OSError) else None
    said = _reason(exc)
    where = _existing_ancestor(path)
    if code == _SQLITE_FULL or os_errno in (errno.ENOSPC, errno.EDQUOT):
        return _full(path, where, doing, said)
    inconclusive = code in (_SQLITE_IOERR, _SQLITE_CANTOPEN)
    if not (inconclusive or code == _SQLITE_READONLY or os_errno == errno.EROFS):
        return None
    if _mounted_read_only(where):
        return LedgerError(
            f"cannot {doing} the ledger {path}: the filesystem that holds it is mounted "
            f"read-only ({said})",
            hint=f"remount it read-write, {_MOVE_IT}",
        )
    if inconclusive and _free_bytes(where) < _NEARLY_FULL_BYTES:
        return _full(path, where, doing, said)
    unwritable = _unwritable(path)
    if unwritable is not None:
        return LedgerError(
            f"cannot {doing} the ledger {path}: {unwritable} is read-only for this user ({said})",
            hint="opspatch writes the ledger and its -wal and -shm files beside it: make "
            f"them writable (chmod/chown), {_MOVE_IT}",
        )
    return None


def _full(path: Path, where: Path, doing: str, said: str) -> LedgerError:
    free = _free_bytes(where)
    folder = where if where.is_dir() else where.parent
    return LedgerError(
        f"cannot {doing} the ledger {path}: the filesystem that holds it is full "
        f"({free // 1024} KiB free; {said})",
        hint=f"free space on the filesystem of {folder} (`df -h {folder}`), {_MOVE_IT}",
    )


def _sqlite_code(exc: BaseException) -> int | None:
    """The primary SQLite result code of `exc` (Python 3.11+ carries it), guessed from the
    message on older Pythons."""
    if not isinstance(exc, sqlite3.Error):
        return None
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF
    text = str(exc).lower()
    for needle, guessed in (
        ("disk is full", _SQLITE_FULL),
        ("readonly database", _SQLITE_READONLY),
        ("disk i/o error", _SQLITE_IOERR),
        ("unable to open database file", _SQLITE_CANTOPEN),
    ):
        if needle in text:
            return guessed
    return None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    name = getattr(exc, "sqlite_errorname", None)
    return f"SQLite: {exc} [{name}]" if name else f"SQLite: {exc}"


def _existing_ancestor(path: Path) -> Path:
    """`path` itself if it exists, else its nearest existing parent directory."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path("/")


def _mounted_read_only(where: Path) -> bool:
    try:
        return bool(os.statvfs(where).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _free_bytes(where: Path) -> int:
    try:
        stats = os.statvfs(where)
    except OSError:
        return _NEARLY_FULL_BYTES  # unknown: never claim a full disk on a guess
    return stats.f_bavail * stats.f_frsize


def _unwritable(path: Path) -> str | None:
    """`the file` or `its directory` when this user cannot write it (root never hits this)."""
    if path.exists() and not os.access(path, os.W_OK):
        return "the file"
    if path.parent.exists() and not os.access(path.parent, os.W_OK | os.X_OK):
        return f"its directory {path.parent}"
    return None
