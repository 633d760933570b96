"""The ledger store: the `Ledger` class over one database (open, appends, queries, verify)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from opspatch.core.ledgerlocation import LedgerLocation
from opspatch.core.remedy import remedy_text
from opspatch.core.vocabulary import Command
from opspatch.errors import InputError, LedgerIntegrityError
from opspatch.ledger.chain import GENESIS_HASH, canonical_json, event_hash, verify_chain
from opspatch.ledger.copy import copy_history
from opspatch.ledger.database import open_database
from opspatch.ledger.leasing import Leasing
from opspatch.ledger.liveness import ControllerProcess, operator_identity
from opspatch.ledger.queries import Queries
from opspatch.ledger.records import (
    FILE_ACTIONS,
    CopyReport,
    FileVersion,
    HostRecord,
    Machine,
    RunDetail,
    RunSummary,
    StepRecord,
    VerifyReport,
    new_run_id,
)
from opspatch.ledger.run_writes import RunWrites
from opspatch.ledger.schema import (
    APPEND_ONLY_MESSAGE,
    BUSY_TIMEOUT_SECONDS,
    SCHEMA_VERSION,
)
from opspatch.ledger.transactions import WritePatience

__all__ = [
    "APPEND_ONLY_MESSAGE",
    "BUSY_TIMEOUT_SECONDS",
    "FILE_ACTIONS",
    "GENESIS_HASH",
    "SCHEMA_VERSION",
    "ControllerProcess",
    "FileVersion",
    "HostRecord",
    "Ledger",
    "Machine",
    "RunDetail",
    "RunSummary",
    "StepRecord",
    "VerifyReport",
    "canonical_json",
    "event_hash",
    "new_run_id",
    "operator_identity",
]


@dataclass
class Ledger(RunWrites, Queries, Leasing):
    """An open ledger (a SQLite file or a PostgreSQL database). Safe to share between threads;
    one per process is enough.

    Use `Ledger.open(location)`; close it with `close()` or a `with` block. Its fields (the
    location, the database, the lock) are `Transactions`'; its writes, reads and leases are the
    parts it is made of.
    """

    # -- opening --------------------------------------------------------------------------------

    @classmethod
    def open(cls, path: LedgerLocation) -> Ledger:
        """Open the ledger at `path`: a SQLite file (created if needed, with its parent
        directories and schema) or a PostgreSQL database (`PostgresLedger`, migrated by its
        owner with `opspatch ledger migrate`).

        Raises:
            LedgerError: the file cannot be created or opened (the message says when the
                filesystem is full or read-only), is not an SQLite database, the server refuses
                the connection, the schema is missing or was written by a newer opspatch, or the
                filesystem refuses WAL mode.
        """
        database, warnings = open_database(path)
        return cls(path=database.location, _db=database, _warnings=warnings)

    @property
    def created(self) -> bool:
        """Whether opening it created it: there was no ledger file at its path. Opening
        creates one for the library's callers; the CLI says so whenever it does
        (`cli/context.py:GlobalOptions.open_ledger`), and its read-only commands never do."""
        return self._db.created

    def retrying(self, seconds: float) -> Ledger:
        """This ledger (the same connection and lock) with writes tried again, with backoff,
        while its server is gone (`LedgerUnreachable`: a restart, a network cut), until one gets
        through or the outage has lasted `seconds`: a run's records, patient for its lease
        expiry (`runs.fleet.recorded.recorded_run`). Once an outage outlasted it, every write is
        tried once until one gets through again. Closing it closes this ledger.
        """
        return replace(self, _patience=WritePatience(seconds), _appended=None)

    def close(self) -> None:
        """Close the connection; safe to call twice."""
        with self._lock:
            self._db.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- the whole ledger: integrity, settings, copying -----------------------------------------

    def verify(self) -> VerifyReport:
        """Walk the whole chain: every hash, every link, every id, every blob (`chain.py`).

        Raises:
            LedgerError: the ledger cannot be read.
        """
        with self._reading() as conn:
            return verify_chain(conn, self._warnings)

    def ensure_intact(self) -> VerifyReport:
        """`verify()`, raising if the chain is broken; apply, rollback and recover call it first.

        Raises:
            LedgerIntegrityError: the chain is broken; the message names the first broken link.
        """
        report = self.verify()
        if not report.ok:
            raise LedgerIntegrityError(
                f"the ledger {self.path} is not intact at event {report.first_broken}: "
                f"{report.reason}",
                first_broken=report.first_broken,
                hint="nothing was changed; run "
                f"`{remedy_text(Command.LEDGER_VERIFY)}` and find out who edited "
                "the ledger before trusting it again",
            )
        return report

    def settings(self) -> dict[str, Any]:
        """The settings this connection runs with, as the database reports them.

        SQLite: `journal_mode` (`wal`), `synchronous` (2 = FULL), `foreign_keys` (1),
        `busy_timeout_ms`, `schema_version` (PRAGMA); PostgreSQL: `backend`, `server_version`,
        `synchronous_commit`, `fsync`, `role`, `schema_version`. What the durability promises
        rest on, for tests and `ledger verify`.
        """
        with self._reading() as conn:
            return conn.settings()

    def copy_to(self, target: Ledger) -> CopyReport:
        """Append to `target` every event and blob of this ledger it does not hold yet, as they
        were written (`copy.py`): the same chain, verified on both sides to the same head.

        Raises:
            InputError: `target` holds a different history, or is this ledger.
            LedgerIntegrityError: this ledger does not verify, or the copy does not.
            LedgerError: either ledger cannot be read or written.
        """
        if str(target.path) == str(self.path):
            raise InputError(f"--from and --to are the same ledger {self.path}")
        with self._lock, target._lock:
            try:
                return copy_history(self._db, target._db)
            except (*self._db.errors, *target._db.errors) as exc:
                raise target._db.failure(exc, "copy into") from exc
