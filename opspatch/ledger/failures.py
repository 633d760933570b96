"""Why SQLite could not open, read or write the ledger, told in the operator's words."""

from __future__ import annotations

import ctypes
import errno
import os
import sqlite3
import struct
from pathlib import Path
from typing import Any

from opspatch.errors import LedgerError

# SQLite primary result codes (the low byte of an extended code).
_SQLITE_READONLY = 8
_SQLITE_IOERR = 10
_SQLITE_FULL = 13
_SQLITE_CANTOPEN = 14

_NEARLY_FULL_BYTES = 1 << 20
"""Below this much free space, an I/O error while growing the ledger is put down to a full disk."""

_MOVE_IT = "or point --ledger / OPSPATCH_LEDGER at a ledger on another filesystem"

_UNWRITABLE_FLAGS = 0x10 | 0x20
"""STATX_ATTR_IMMUTABLE (`chattr +i`) and STATX_ATTR_APPEND (`chattr +a`): no write in place."""

COMPANIONS = ("", "-wal", "-shm")
"""The ledger file and the two files SQLite keeps beside it in WAL mode."""


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
    frozen = immutable_files(path, folder=True)
    if frozen:
        return immutable_failure(path, frozen, doing, said)
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


def immutable_files(path: Path, *, folder: bool = False) -> list[Path]:
    """The ledger's files (and with `folder`, its directory) that are immutable or append-only
    (`chattr +i` / `+a`): SQLite cannot write them in place, and writing the mapped `-shm` of
    one kills the process (SIGBUS). A file that is not there, or a filesystem without these
    attributes, is none."""
    found = [f"{path}{suffix}" for suffix in COMPANIONS]  # a Path each only when frozen:
    if folder:  # the ledger asks before every write transaction
        found.append(str(path.parent))
    return [Path(candidate) for candidate in found if _flags(candidate) & _UNWRITABLE_FLAGS]


def immutable_failure(path: Path, frozen: list[Path], doing: str, said: str = "") -> LedgerError:
    """The error that names the ledger's immutable files and how to write them again."""
    names = " ".join(str(p) for p in frozen)
    why = f" ({said})" if said else ""
    return LedgerError(
        f"cannot {doing} the ledger {path}: {', '.join(str(p) for p in frozen)} "
        f"{'is' if len(frozen) == 1 else 'are'} immutable or append-only (chattr +i / +a){why}",
        hint=f"as root, `chattr -i -a {names}` lets opspatch write it again, {_MOVE_IT}",
    )


def _flags(path: str) -> int:
    """`path`'s `STATX_ATTR_*` attributes (0 when it is not there, or when the attributes
    cannot be read). Read with statx(2), by path: never by opening the file, since closing any
    descriptor of the ledger would drop SQLite's POSIX locks on it (fcntl locks are the
    process's, per file) and let another process corrupt it."""
    if _statx is None:
        return 0
    buffer = ctypes.create_string_buffer(_STATX_SIZE)
    if _statx(_AT_FDCWD, os.fsencode(path), _AT_SYMLINK_NOFOLLOW, 0, buffer) != 0:
        return 0
    attributes = struct.unpack_from("=Q", buffer, 8)[0]  # stx_attributes
    supported = struct.unpack_from("=Q", buffer, 56)[0]  # stx_attributes_mask
    return int(attributes & supported)


def _libc_statx() -> Any:
    """glibc's `statx` (2.28 and later), or None: os.stat does not return the attributes."""
    try:
        found = ctypes.CDLL(None, use_errno=True).statx
    except (AttributeError, OSError):
        return None
    found.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_char_p)
    found.restype = ctypes.c_int
    return found


_statx = _libc_statx()
_STATX_SIZE = 256
_AT_FDCWD = -100
_AT_SYMLINK_NOFOLLOW = 0x100


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
