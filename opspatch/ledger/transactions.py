"""How a `Ledger` reaches its database: the write transaction (tried again through an outage),
the chained append, the read."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, TypeVar

from opspatch.core.ledgerlocation import LedgerLocation
from opspatch.core.remedy import remedy_text
from opspatch.core.vocabulary import Command, EventKind
from opspatch.errors import LedgerError, LedgerUnreachable
from opspatch.ledger.chain import ROW_COLUMNS, EventRow, canonical_json, next_link
from opspatch.ledger.database import Database

T = TypeVar("T")


def _utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


FIRST_RETRY_SECONDS = 0.2
"""The pause before a write whose server is gone is tried again; doubled each try after."""

LAST_RETRY_SECONDS = 2.0
"""The longest pause between two tries: a server back is found within this."""


@dataclass
class WritePatience:
    """How long a ledger's writes keep trying while its server is gone (`seconds`, 0: never),
    and since when the outage under way has lasted (`since`, monotonic; None: no outage). One
    per `Ledger.retrying` view, shared by every write through it: an outage is timed from its
    first failed write, so once it outlasted the patience no later write waits again."""

    seconds: float
    since: float | None = None

    def failed(self) -> float:
        """A try failed for want of the server: the seconds of patience left (0: give up)."""
        now = time.monotonic()
        if self.since is None:
            self.since = now
        return self.seconds - (now - self.since)

    def through(self) -> None:
        """A write got through: the outage, if any, is over."""
        self.since = None

    def given_up(self, exc: LedgerUnreachable, unknown: bool) -> LedgerUnreachable:
        """`exc`, saying how long the write was tried (and that a try lost at COMMIT may have
        committed, when one was)."""
        if self.seconds <= 0:
            return exc
        lasted = time.monotonic() - (self.since or time.monotonic())
        said = (
            "; a try lost at COMMIT may have committed: "
            f"`{remedy_text(Command.LEDGER_SHOW, 'RUN')}` tells"
            if unknown and not exc.outcome_unknown
            else ""
        )
        return LedgerUnreachable(
            f"{exc.message} (tried again for {lasted:.0f} s, the run's lease expiry is "
            f"{self.seconds:g} s){said}",
            hint=exc.hint,
            outcome_unknown=exc.outcome_unknown or unknown,
        )


@dataclass
class Transactions:
    """The open database of a `Ledger` and the ways into it: `_write` (one write transaction,
    tried again while the server is gone and the patience lasts), `_append` (one event chained
    to the last, inside it), `_reading` (a read, its failures as `LedgerError`)."""

    path: LedgerLocation
    _db: Database = field(repr=False)
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False)
    _warnings: tuple[str, ...] = ()
    _patience: WritePatience = field(default_factory=lambda: WritePatience(0.0), repr=False)
    _appended: list[str] | None = field(default=None, repr=False)
    """The hashes the write transaction under way appended (under `_lock`), for `_write`."""

    # -- internals ------------------------------------------------------------------------------

    def _write(self, work: Callable[[Database], T], *, patient: bool = True) -> T:
        """`work` in one write transaction (`Database.writing`: no other writer between read
        and insert); what it returned.

        Tried again while the server is gone and this ledger's patience lasts (`retrying`;
        `patient=False`: once). Nothing is ever written twice: a try that failed before its
        COMMIT left nothing on the server (it rolls back what it never saw committed); one lost
        at COMMIT may have committed, so the next try first looks, in its own transaction
        under the chain lock (the lost one has ended by then), for the last event the lost one
        appended, by its hash (unique: it covers the id, the link and the content). There, the
        write is done and its result is the lost try's; not there, `work` runs again and
        appends afresh, chained to the head as it then is.
        """
        unknown: tuple[str, T] | None = None  # (last hash, result) of a try lost at COMMIT
        delay = FIRST_RETRY_SECONDS
        while True:
            appended: list[str] = []
            produced: list[T] = []
            try:
                with self._lock:
                    self._appended = appended
                    try:
                        with self._db.writing():
                            if unknown is not None and self._landed(unknown[0]):
                                produced.append(unknown[1])
                            else:
                                produced.append(work(self._db))
                    finally:
                        self._appended = None
            except LedgerUnreachable as exc:
                if exc.outcome_unknown and appended and produced:
                    unknown = (appended[-1], produced[-1])
                left = self._patience.failed() if patient else 0.0
                if left <= 0:
                    raise self._patience.given_up(exc, unknown is not None) from exc
                time.sleep(min(delay, left))
                delay = min(delay * 2, LAST_RETRY_SECONDS)
                continue
            self._patience.through()
            return produced[-1]

    def _landed(self, event_hash: str) -> bool:
        """Whether the event with `event_hash` is in the ledger (inside `writing()`)."""
        try:
            found = self._db.execute("SELECT 1 FROM events WHERE hash = ?", (event_hash,))
            return found.fetchone() is not None
        except self._db.errors as exc:
            raise self._db.failure(exc, "write") from exc

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Database]:
        """One write transaction (`Database.writing`): no other writer between read and insert."""
        with self._lock, self._db.writing():
            yield self._db

    @contextlib.contextmanager
    def _reading(self) -> Iterator[Database]:
        """The database, for reads; turns what cannot be read into a `LedgerError`."""
        with self._lock:
            try:
                with self._db.reading():
                    yield self._db
            except self._db.errors as exc:
                raise self._db.failure(exc, "read") from exc
            except (KeyError, TypeError, ValueError) as exc:
                # Only decoding raises these here: an event body this opspatch cannot read.
                raise LedgerError(
                    f"the ledger {self.path} holds an event this opspatch cannot read: {exc}",
                    hint="was it written by a newer opspatch? upgrade, and run "
                    f"`{remedy_text(Command.LEDGER_VERIFY)}`",
                ) from exc

    def _append(
        self,
        conn: Database,
        *,
        run_id: str,
        kind: EventKind,
        body: Mapping[str, Any],
        host: str | None = None,
        path: str | None = None,
        pre_image: str | None = None,
        post_image: str | None = None,
    ) -> EventRow:
        """Insert one event chained to the last one; the caller is inside `writing()`."""
        try:
            event_id, prev_hash = next_link(conn)
            unsealed = EventRow(
                id=event_id,
                run_id=run_id,
                kind=EventKind(kind).value,  # a plain word: a driver may adapt an enum otherwise
                host=host,
                path=path,
                recorded_at=_utc_now(),
                body=canonical_json(dict(body)),
                pre_image=pre_image,
                post_image=post_image,
                prev_hash=prev_hash,
                hash="",
            )
            row = replace(unsealed, hash=unsealed.computed_hash())
            conn.execute(
                f"INSERT INTO events ({ROW_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                row.values(),
            )
        except conn.errors as exc:
            raise conn.failure(exc, "write") from exc
        if self._appended is not None:
            self._appended.append(row.hash)
        return row
