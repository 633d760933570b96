"""A run's events written by many threads at once share transactions (issue 44, item 4): the
events queued while one transaction commits go in the next, one writer taking them all. Each
writer still returns only once its own event is committed, a run that cannot take an event
refuses only its own, and a ledger deleted under queued writers stops every one of them.

The queue is built without timing: the test holds the ledger's lock (what a transaction in
progress holds) while the writers queue, and lets go once all of them wait. Transactions are
counted by the statements the real SQLite connection runs.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import pytest

from opspatch.core.vocabulary import RunOutcome, Step, StepStatus
from opspatch.errors import LedgerError, LedgerLost
from opspatch.ledger import Ledger
from tests.fleetkit import wait_until
from tests.ledgerkit import begin

pytestmark = pytest.mark.pure


class Writers:
    """Threads that each write one record, and what each one saw when its write returned."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []
        self.faults: dict[str, BaseException] = {}
        self.seen_on_return: dict[str, int] = {}

    def start(self, name: str, write: Callable[[], object], seen: Callable[[], int]) -> None:
        def run() -> None:
            try:
                write()
            except BaseException as exc:
                self.faults[name] = exc
                return
            self.seen_on_return[name] = seen()

        thread = threading.Thread(target=run, name=name)
        thread.start()
        self.threads.append(thread)

    def join(self) -> None:
        for thread in self.threads:
            thread.join()


@contextmanager
def counting_transactions(ledger: Ledger) -> Iterator[list[str]]:
    """The write transactions the ledger's own connection begins meanwhile."""
    begun: list[str] = []
    conn: sqlite3.Connection = ledger._db._conn  # type: ignore[attr-defined]
    conn.set_trace_callback(lambda sql: begun.append(sql) if sql == "BEGIN IMMEDIATE" else None)
    try:
        yield begun
    finally:
        conn.set_trace_callback(None)


def steps_in_file(path: Path, run_id: str, host: str) -> int:
    """The step events of `host` in `run_id`, read by a connection of its own (committed only)."""
    with sqlite3.connect(path) as conn:
        found = conn.execute(
            "SELECT count(*) FROM events WHERE run_id = ? AND host = ? AND kind = 'step'",
            (run_id, host),
        ).fetchone()
    return int(found[0])


@contextmanager
def queued(ledger: Ledger, count: int) -> Iterator[None]:
    """Hold the ledger's lock (as a transaction in progress does) until `count` events wait."""
    with ledger._lock:
        yield
        assert wait_until(lambda: len(ledger._waiting) == count, timeout=60)


def test_steps_queued_during_a_transaction_are_committed_together_each_durable_on_return(
    tmp_path: Path,
) -> None:
    """Before, each step was a transaction of its own: eight steps, eight transactions (and
    eight fsyncs), one writer at a time."""
    path = tmp_path / "ledger.sqlite3"
    hosts = tuple(f"gpu-{n:02}" for n in range(1, 9))
    with Ledger.open(path) as ledger:
        run_id = begin(ledger, hosts=hosts)
        writers = Writers()
        with counting_transactions(ledger) as begun:
            with queued(ledger, len(hosts)):
                for host in hosts:
                    writers.start(
                        host,
                        partial(ledger.record_step, run_id, host, Step.LOCK, StepStatus.OK, 0.01),
                        partial(steps_in_file, path, run_id, host),
                    )
            writers.join()
        assert writers.faults == {}
        assert len(begun) == 1
        assert writers.seen_on_return == dict.fromkeys(hosts, 1)
        report = ledger.verify()
        assert report.ok and report.events_checked == 1 + len(hosts)
        detail = ledger.get_run(run_id)
        assert {h: [s.step for s in detail.host(h).steps] for h in hosts} == dict.fromkeys(
            hosts, ["lock"]
        )


def test_a_finished_runs_step_in_a_shared_transaction_is_refused_alone(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    with Ledger.open(path) as ledger:
        open_run = begin(ledger, hosts=("gpu-01", "gpu-02"))
        over = begin(ledger, hosts=("gpu-09",))
        ledger.finish_run(over, RunOutcome.OK)
        writers = Writers()
        with counting_transactions(ledger) as begun:
            with queued(ledger, 3):
                for run_id, host in (
                    (open_run, "gpu-01"),
                    (over, "gpu-09"),
                    (open_run, "gpu-02"),
                ):
                    writers.start(
                        host,
                        partial(ledger.record_step, run_id, host, Step.SWAP, StepStatus.OK),
                        partial(steps_in_file, path, run_id, host),
                    )
            writers.join()
        assert len(begun) == 1
        assert set(writers.faults) == {"gpu-09"}
        assert isinstance(writers.faults["gpu-09"], LedgerError)
        assert "already finished" in str(writers.faults["gpu-09"])
        assert writers.seen_on_return == {"gpu-01": 1, "gpu-02": 1}
        assert ledger.verify().ok


def test_a_ledger_deleted_under_queued_writers_stops_every_one_and_keeps_what_was_written(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger.sqlite3"
    ledger = Ledger.open(path)
    run_id = begin(ledger, hosts=("gpu-01", "gpu-02", "gpu-03"))
    ledger.record_step(run_id, "gpu-01", Step.LOCK, StepStatus.OK, 0.01)
    writers = Writers()
    with queued(ledger, 3):
        for host in ("gpu-01", "gpu-02", "gpu-03"):
            writers.start(
                host,
                partial(ledger.record_step, run_id, host, Step.SWAP, StepStatus.STARTED),
                lambda: 0,
            )
        path.unlink()
    writers.join()
    assert sorted(writers.faults) == ["gpu-01", "gpu-02", "gpu-03"]
    assert all(isinstance(fault, LedgerLost) for fault in writers.faults.values())
    ledger.close()
    with Ledger.open(path) as back:  # put back from the connection that still held it
        assert not back.created and back.verify().ok
        assert [s.step for s in back.get_run(run_id).host("gpu-01").steps] == ["lock"]
