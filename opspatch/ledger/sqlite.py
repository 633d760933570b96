"""The embedded ledger: one SQLite file (WAL, `synchronous=FULL`), a `database.Database`."""

from __future__ import annotations

import contextlib
import ctypes
import os
import sqlite3
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from opspatch.core.remedy import remedy_text
from opspatch.core.vocabulary import Command
from opspatch.errors import LedgerConfigError, LedgerError, LedgerLost
from opspatch.ledger.failures import (
    COMPANIONS,
    filesystem_failure,
    immutable_failure,
    immutable_files,
)
from opspatch.ledger.schema import BUSY_TIMEOUT_SECONDS, prepare


@dataclass
class SqliteDatabase:
    """A SQLite ledger file, open."""

    location: Path
    _conn: sqlite3.Connection = field(repr=False)
    errors: tuple[type[BaseException], ...] = (sqlite3.Error,)
    created: bool = False
    """Whether opening it created the file (there was no ledger at its path)."""
    _identity: dict[str, tuple[int, int] | None] = field(default_factory=dict, repr=False)
    """(device, inode) of the file opened and of its `-wal` and `-shm` as opened, by suffix:
    the path must still name the file at every write."""
    _lost: LedgerLost | None = field(default=None, repr=False)
    """Once the file was found deleted or replaced: every later use raises this."""
    _closer: weakref.finalize[Any, Any] | None = field(default=None, repr=False)

    @classmethod
    def connect(cls, path: Path) -> SqliteDatabase:
        """Connect to the file at `path` (creating it and its directories), schema untouched.

        Raises:
            LedgerError: the file cannot be created or opened.
        """
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(
                str(path),
                timeout=BUSY_TIMEOUT_SECONDS,
                isolation_level=None,  # autocommit; transactions are explicit BEGIN IMMEDIATE
                check_same_thread=False,  # a rollout's worker threads share it under a lock
            )
        except (OSError, sqlite3.Error) as exc:
            raise filesystem_failure(path, exc, "open") or LedgerError(
                f"cannot open the ledger {path}: {exc}",
                hint="check the path and its permissions, or move it with --ledger / OPSPATCH_LEDGER",
            ) from exc
        database = cls(location=path, _conn=conn)
        # closed by `close()`, or when the process ends without it, never by a bare dealloc
        database._closer = weakref.finalize(database, _close, conn, path)
        return database

    @classmethod
    def open(cls, path: Path) -> tuple[SqliteDatabase, tuple[str, ...]]:
        """Open the ledger at `path`, creating or upgrading its schema (`schema.prepare`).

        Raises:
            LedgerError: the file cannot be created or opened (the message says when the
                filesystem is full or read-only), is not an SQLite database, was written by a
                newer opspatch, or the filesystem refuses WAL mode.
        """
        created = not path.exists()
        if created and Path(f"{path}-wal").exists():
            raise _orphaned_log(path)
        frozen = immutable_files(path)
        if frozen:  # before SQLite maps the -shm file: a write to it would be a SIGBUS
            raise immutable_failure(path, frozen, "open")
        database = cls.connect(path)
        try:
            warnings = prepare(database._conn, path)
        except LedgerError:
            database.close()
            raise
        except sqlite3.Error as exc:
            database.close()
            raise filesystem_failure(path, exc, "open") or LedgerConfigError(
                f"the ledger {path} is unusable: {exc}",
                hint="is it an opspatch ledger? move it aside or point --ledger elsewhere",
            ) from exc
        database.created = created
        database._identity = {
            suffix: _identity_of(Path(f"{path}{suffix}")) for suffix in COMPANIONS
        }
        return database, warnings

    def execute(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        return self._conn.execute(sql, tuple(params))

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """`BEGIN IMMEDIATE`: no other writer between reading the chain head and inserting.

        Raises:
            LedgerLost: the path no longer names the file opened (deleted, moved, replaced).
            LedgerError: a ledger file is immutable, or SQLite cannot begin or commit.
        """
        self._guard("write")
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise filesystem_failure(self.location, exc, "write") or LedgerError(
                f"cannot write the ledger {self.location}: {exc}",
                hint=f"another opspatch held it for more than {BUSY_TIMEOUT_SECONDS:.0f} s, "
                "or the file is read-only",
            ) from exc
        except sqlite3.Error as exc:  # a damaged file: said as the ledger's error too
            raise self.failure(exc, "write") from exc
        try:
            yield
        except sqlite3.Error as exc:
            # A statement of the block (a lease write, say) failed: the ledger's error, not the
            # driver's, reaches the caller, as an append's does (a heartbeat retries only those).
            self._roll_back()
            raise self.failure(exc, "write") from exc
        except BaseException:
            self._roll_back()
            raise
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            self._roll_back()
            raise self.failure(exc, "write") from exc

    def _roll_back(self) -> None:
        # SQLite may already have rolled back after some errors; keep the first error.
        with contextlib.suppress(sqlite3.Error):
            self._conn.execute("ROLLBACK")

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """A deferred read transaction: one WAL snapshot, so a verify never sees an append of
        another process between its walk and its look at the id sequence."""
        if self._lost is None and self._conn.in_transaction:  # inside `writing()`: its snapshot
            yield
            return
        self._guard("read")
        self._conn.execute("BEGIN")
        try:
            yield
        finally:
            with contextlib.suppress(sqlite3.Error):
                self._conn.execute("COMMIT")

    def _guard(self, doing: str) -> None:
        """Before SQLite touches the files: a ledger already found lost stays lost; an
        immutable file is refused (SQLite would die of SIGBUS writing its mapped `-shm`); a
        writer's path must still name the file it opened.

        Raises:
            LedgerLost, LedgerError: as `writing()` says.
        """
        if self._lost is not None:
            raise self._lost
        frozen = immutable_files(self.location)
        if frozen:
            raise immutable_failure(self.location, frozen, doing)
        if doing == "write" and self._identity:
            now = _identity_of(self.location)
            if now != self._identity[""]:
                self._lost = self._rescue(replaced=now is not None)
                raise self._lost

    def _rescue(self, *, replaced: bool) -> LedgerLost:
        """The error for a ledger file deleted or replaced under this connection, with the
        history this connection still holds saved: back at its path when that is free, else
        beside it. The connection is closed, and the lost file's own `-wal` and `-shm` removed
        (known by their inodes: SQLite keeps them, refusing to checkpoint into a file no longer
        linked, and a file at the path would take them for its own). A replacement is never
        touched, nor its companion files."""
        path = self.location
        happened = "replaced by another file" if replaced else "deleted or moved away"
        lost = f"the ledger {path} was {happened} while this process wrote to it"
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        saved = path.with_name(f"{path.name}.rescued-{stamp}-{os.getpid()}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.closing(sqlite3.connect(str(saved))) as copy:
                self._conn.backup(copy)
        except (OSError, sqlite3.Error) as exc:
            return LedgerLost(
                f"{lost}, and its history could not be saved ({exc}): what it held is lost with it"
            )
        self.close()
        for suffix in COMPANIONS[1:]:  # the lost file's own log and index, if still there
            companion, opened = Path(f"{path}{suffix}"), self._identity.get(suffix)
            if opened is not None and _identity_of(companion) == opened:
                with contextlib.suppress(OSError):
                    companion.unlink()
        if not replaced and not Path(f"{path}-wal").exists():
            with contextlib.suppress(OSError):
                os.link(saved, path)  # never over a file put there since
                saved.unlink()
                return LedgerLost(
                    f"{lost}; its history (this run's records up to here with it) was put "
                    f"back at {path} from the copy this process still held",
                    hint=f"`{remedy_text(Command.LEDGER_VERIFY)}` checks it",
                    rescued=str(path),
                )
        return LedgerLost(
            f"{lost}; its history (this run's records up to here with it) was saved to {saved}",
            hint=f"find out who {'replaced' if replaced else 'moved'} it before putting "
            f"{saved} back in its place",
            rescued=str(saved),
        )

    def take_event_id(self, last_id: int) -> int:
        # Inserting the id moves AUTOINCREMENT's sequence with it, in the same transaction.
        return max(last_id, self.highest_event_id()) + 1

    def highest_event_id(self) -> int:
        found = self._conn.execute(
            "SELECT seq FROM sqlite_sequence WHERE name = 'events'"
        ).fetchone()
        return 0 if found is None else int(found[0])

    def failure(self, exc: BaseException, doing: str) -> LedgerError:
        return filesystem_failure(self.location, exc, doing) or LedgerError(
            f"cannot {doing} the ledger {self.location}: {exc}"
        )

    def settings(self) -> dict[str, Any]:
        """`journal_mode` (`wal`), `synchronous` (2 = FULL), `foreign_keys` (1),
        `busy_timeout_ms`, `schema_version`, as PRAGMA reports them."""
        return {
            name: self._conn.execute(f"PRAGMA {pragma}").fetchone()[0]
            for name, pragma in (
                ("journal_mode", "journal_mode"),
                ("synchronous", "synchronous"),
                ("foreign_keys", "foreign_keys"),
                ("busy_timeout_ms", "busy_timeout"),
                ("schema_version", "user_version"),
            )
        }

    def schema_version(self) -> int:
        return int(self._conn.execute("PRAGMA user_version").fetchone()[0])

    def close(self) -> None:
        if self._closer is not None:
            self._closer()
        else:
            self._conn.close()


def _close(conn: sqlite3.Connection, path: Path) -> None:
    """Close `conn`, unless a file of the ledger is immutable now: SQLite's close writes the
    mapped `-shm` (a SIGBUS then, `failures.py`), so the connection is kept open until the
    process ends, and the kernel unmaps it."""
    if immutable_files(path):
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(conn))  # never freed: never closed
        return
    conn.close()


def _identity_of(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the file at `path`; None when there is none."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_dev, found.st_ino


def _orphaned_log(path: Path) -> LedgerLost:
    """A `-wal` beside no ledger: the ledger was deleted while a controller had it open (or
    still has). A new, empty ledger there would take that log for its own."""
    return LedgerLost(
        f"there is no ledger at {path}, but its write-ahead log {path}-wal is there: the ledger "
        "was deleted while an opspatch had it open (or one still has it open); a new ledger is "
        "not created beside it",
        hint=f"if no opspatch is running, move {path}-wal and {path}-shm aside (or put the "
        "ledger back), then run the command again",
    )
