"""The small database interface the ledger's SQL runs over, and opening one by its location."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

from opspatch.core.ledgerlocation import LedgerLocation, PostgresLedger
from opspatch.errors import InputError, LedgerError
from opspatch.ledger.records import MigrateReport


class Rows(Protocol):
    """What a statement returns: its rows as tuples (sqlite3's and psycopg's cursors are this)."""

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Database(Protocol):
    """One connection to a ledger database. The `Ledger` holds its lock around every use."""

    @property
    def location(self) -> LedgerLocation:
        """Where it is (a URL without a password, for messages)."""
        ...

    @property
    def created(self) -> bool:
        """Whether opening it created it (a SQLite file that was not there; never a database)."""
        ...

    @property
    def errors(self) -> tuple[type[BaseException], ...]:
        """The driver's exception classes, which `failure()` turns into a `LedgerError`."""
        ...

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Rows:
        """Run one statement (`?` placeholders) and return its rows."""
        ...

    def writing(self) -> AbstractContextManager[None]:
        """A write transaction that no other writer (thread, process, controller) interleaves
        with: committed when the block ends, rolled back when it raises.

        Raises:
            LedgerLost: the ledger at its location is no longer the one opened (a file
                deleted or replaced, a database recreated or restored).
            LedgerError: the transaction cannot be begun or committed, or a statement in it
                fails (the driver's error, as `failure()` tells it).
        """
        ...

    def reading(self) -> AbstractContextManager[None]:
        """A block of reads that sees the chain as one committed state."""
        ...

    def take_event_id(self, last_id: int) -> int:
        """The id of the event about to be inserted (inside `writing()`): one more than the
        highest id ever handed out, so a deleted tail leaves a visible gap."""
        ...

    def highest_event_id(self) -> int:
        """The highest event id ever handed out (0 for an empty ledger)."""
        ...

    def failure(self, exc: BaseException, doing: str) -> LedgerError:
        """The `LedgerError` that says why `exc` (one of `errors`) happened while `doing`
        (`open`, `read`, `write`) the ledger."""
        ...

    def settings(self) -> dict[str, Any]:
        """What the durability promises rest on, as the database reports it."""
        ...

    def schema_version(self) -> int:
        """The schema version the database holds (0: none yet)."""
        ...

    def close(self) -> None:
        """Close the connection; safe to call twice."""
        ...


def open_database(location: LedgerLocation) -> tuple[Database, tuple[str, ...]]:
    """The database at `location`, ready for the ledger, and the warnings `verify()` reports.

    A SQLite file is created with its schema; a PostgreSQL database must have been migrated by
    its owner (`opspatch ledger migrate`). psycopg is imported only here, for a PostgreSQL
    ledger, so the embedded default does not need it.

    Raises:
        LedgerConfigError: the database cannot be reached or used as given: it holds no or an
            older schema (PostgreSQL), or a newer one, or is not a ledger (exit 2).
        LedgerError: the file cannot be created or written (a full or read-only filesystem).
    """
    if isinstance(location, PostgresLedger):
        from opspatch.ledger.postgres import PostgresDatabase

        database = PostgresDatabase.open(location)
        try:
            return database, database.append_only_warnings()
        except database.errors as exc:
            database.close()
            raise database.unusable(exc) from exc
    from opspatch.ledger.sqlite import SqliteDatabase

    return SqliteDatabase.open(Path(location))  # a str from a script is a file path too


def migrate(location: LedgerLocation, writer_role: str | None) -> MigrateReport:
    """Create or upgrade the schema at `location` (`opspatch ledger migrate`, run as the
    database's owner); on PostgreSQL, grant `writer_role` what opspatch writes with.

    A SQLite file keeps its version in `PRAGMA user_version` and has no roles.

    Raises:
        InputError: the database is newer than this opspatch (both versions named), or
            `writer_role` is given for a SQLite file, names no role, or names the owner.
        LedgerConfigError: the database cannot be reached or refused the change (migrate not
            run as the owner): nothing was changed.
    """
    if isinstance(location, PostgresLedger):
        from opspatch.ledger.postgres import PostgresDatabase

        database = PostgresDatabase.connect(location)
        try:
            return database.migrate(writer_role)
        finally:
            database.close()
    from opspatch.ledger.schema import SCHEMA_VERSION
    from opspatch.ledger.sqlite import SqliteDatabase

    if writer_role is not None:
        raise InputError(
            f"--writer-role {writer_role}: the ledger {location} is a SQLite file, which has no "
            "roles (file permissions decide who writes it)",
            hint="leave out --writer-role, or give --ledger postgresql://...",
        )
    existed = location.exists()
    sqlite_file = SqliteDatabase.connect(location)
    try:
        before = sqlite_file.schema_version() if existed else 0
    except sqlite_file.errors as exc:
        raise sqlite_file.failure(exc, "open") from exc
    finally:
        sqlite_file.close()
    if before > SCHEMA_VERSION:
        raise InputError(
            f"the ledger {location} has schema version {before}; this opspatch knows only up to "
            f"{SCHEMA_VERSION} and will not touch it",
            hint="run `ledger migrate` with the newer opspatch that wrote it",
        )
    opened, _warnings = SqliteDatabase.open(location)
    opened.close()
    return MigrateReport(
        ledger=str(location),
        backend="sqlite",
        version_before=before,
        version=SCHEMA_VERSION,
        writer_role=None,
    )
