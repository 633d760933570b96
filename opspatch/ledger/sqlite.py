"""The embedded ledger: one SQLite file (WAL, `synchronous=FULL`), the `Database` of `database.py`.

Writers serialise on `BEGIN IMMEDIATE` (other processes wait up to the busy timeout); the id
sequence is SQLite's AUTOINCREMENT `sqlite_sequence`; a full or read-only filesystem is named as
such (`failures.py`). The file format is `schema.py`'s and does not depend on this module.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opspatch.errors import LedgerConfigError, LedgerError
from opspatch.ledger.failures import filesystem_failure
from opspatch.ledger.schema import BUSY_TIMEOUT_SECONDS, prepare


@dataclass
class SqliteDatabase:
    """A SQLite ledger file, open."""

    location: Path
    _conn: sqlite3.Connection = field(repr=False)
    errors: tuple[type[BaseException], ...] = (sqlite3.Error,)

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
        return cls(location=path, _conn=conn)

    @classmethod
    def open(cls, path: Path) -> tuple[SqliteDatabase, tuple[str, ...]]:
        """Open the ledger at `path`, creating or upgrading its schema (`schema.prepare`).

        Raises:
            LedgerError: the file cannot be created or opened (the message says when the
                filesystem is full or read-only), is not an SQLite database, was written by a
                newer opspatch, or the filesystem refuses WAL mode.
        """
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
        return database, warnings

    def execute(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        return self._conn.execute(sql, tuple(params))

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """`BEGIN IMMEDIATE`: no other writer between reading the chain head and inserting."""
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise filesystem_failure(self.location, exc, "write") or LedgerError(
                f"cannot write the ledger {self.location}: {exc}",
                hint=f"another opspatch held it for more than {BUSY_TIMEOUT_SECONDS:.0f} s, "
                "or the file is read-only",
            ) from exc
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
        if self._conn.in_transaction:  # reads inside `writing()` see that transaction
            yield
            return
        self._conn.execute("BEGIN")
        try:
            yield
        finally:
            with contextlib.suppress(sqlite3.Error):
                self._conn.execute("COMMIT")

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
        self._conn.close()
