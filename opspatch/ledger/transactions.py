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
from opspatch.ledger.events import open_run

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


@dataclass(frozen=True)
class RunEvent:
    """One event of an open run (a step, facts, a host's outcome), before it is chained."""

    run_id: str
    kind: EventKind
    host: str | None
    body: Mapping[str, Any]


@dataclass
class _Waiting:
    """A `RunEvent` whose writer waits for the transaction that holds it, and what became of it
    (`done`; `fault`: why it was not written)."""

    event: RunEvent
    done: bool = False
    fault: BaseException | None = None


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
    _appended: list[EventRow] | None = field(default=None, repr=False)
    """The events the write transaction under way appended (under `_lock`): the last one is
    the chain's head, and `_write` looks for it after a try lost at COMMIT."""
    _waiting: list[_Waiting] = field(default_factory=list, repr=False)
    """Run events queued for the next transaction (`_append_to_run`), under `_queue_lock`."""
    _queue_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

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
            appended: list[EventRow] = []
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
                    unknown = (appended[-1].hash, produced[-1])
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
        """Insert one event chained to the last one; the caller is inside `writing()`.

        Within `_write` the head is the event this transaction appended last, if any: no other
        writer can append while it holds the chain's lock, so it is not read again."""
        try:
            head = self._appended[-1] if self._appended else None
            if head is None:
                event_id, prev_hash = next_link(conn)
            else:
                event_id, prev_hash = conn.take_event_id(head.id), head.hash
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
            self._appended.append(row)
        return row

    def _append_to_run(self, event: RunEvent) -> None:
        """Append `event` and return once it is committed (durable, as every append is).

        Events that other threads queue meanwhile go in the same transaction (a group commit):
        while one transaction commits, a fleet's hosts queue their steps, and the next writer
        takes them all. One of a run that is unknown or finished is refused alone.

        Raises:
            LedgerError: the run is unknown or finished, or the ledger cannot be written.
        """
        mine = _Waiting(event)
        with self._queue_lock:
            self._waiting.append(mine)
        with self._lock:
            if not mine.done:  # no writer took it: this thread writes what waits
                with self._queue_lock:
                    batch, self._waiting[:] = list(self._waiting), []
                self._write_waiting(batch)
        if mine.fault is not None:
            raise mine.fault.with_traceback(None)

    def _write_waiting(self, batch: list[_Waiting]) -> None:
        """Write `batch` in one transaction (under `_lock`); each is `done` after, with its
        fault if it was not written."""

        def write(conn: Database) -> list[LedgerError | None]:
            runs: dict[str, LedgerError | None] = {}
            faults: list[LedgerError | None] = []
            for waiting in batch:
                event = waiting.event
                if event.run_id not in runs:
                    found = open_run(conn, event.run_id)
                    runs[event.run_id] = found if isinstance(found, LedgerError) else None
                faults.append(runs[event.run_id])
                if faults[-1] is None:
                    self._append(
                        conn, run_id=event.run_id, kind=event.kind, host=event.host, body=event.body
                    )
            return faults

        try:
            for waiting, fault in zip(batch, self._write(write), strict=True):
                waiting.fault = fault
        except LedgerError as exc:  # nothing of the batch was written (or, said, may have been)
            for waiting in batch:
                waiting.fault = exc
            raise
        except BaseException:
            for waiting in batch:  # rolled back: the others' writers hear it as the ledger's
                waiting.fault = LedgerError(
                    f"the write of this record to the ledger {self.path} was cut off: "
                    "nothing of it was written"
                )
            raise
        finally:
            for waiting in batch:
                waiting.done = True
