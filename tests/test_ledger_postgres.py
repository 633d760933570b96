"""The team ledger on a real PostgreSQL server (tests/pgkit.py): controllers appending at once
never fork the chain, the writer role cannot change history, `ledger migrate` refuses a newer
schema, `ledger copy` keeps the head hash from SQLite to PostgreSQL and back, and a URL with a
password is refused. A connection the server ended is opened again by the next transaction, and nothing is written
twice. The ledger's own behaviour on both backends: test_ledger.py,
test_ledger_runs.py (parametrised)."""

from __future__ import annotations

import multiprocessing
import re
import sqlite3
import threading
from itertools import pairwise
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from opspatch.core.ledgerlocation import PostgresLedger, ledger_location
from opspatch.errors import InputError, LedgerError, LedgerLost
from opspatch.ledger import Ledger
from opspatch.ledger.database import migrate
from tests.clirunner import opspatch
from tests.ledgerkit import begin, full_run, raw
from tests.pgkit import OWNER, WRITER, PostgresServer, as_owner, backend_pid

pytestmark = pytest.mark.postgres

psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed")
PG_SCHEMA_VERSION = pytest.importorskip("opspatch.ledger.postgres").SCHEMA_VERSION


@pytest.fixture
def location(postgres: PostgresServer) -> PostgresLedger:
    return postgres.fresh_ledger()


# ---------------------------------------------------------------------------------------------
# two controllers at once


def _controller(url: str, name: str, events: int, ready: Any) -> None:
    """One controller: its own connection, one run of `events` steps."""
    with Ledger.open(ledger_location(url)) as ledger:
        ready.wait()
        run_id = begin(ledger, hosts=(name,), operator=f"{name}@controller")
        for step in range(events):
            ledger.record_step(run_id, name, "smoke", "ok", float(step))
        ledger.finish_run(run_id, "ok")


def test_controllers_appending_at_once_keep_one_chain_and_every_event(
    location: PostgresLedger,
) -> None:
    # Two controller processes and two controller threads with their own connections, at once.
    events = 100
    context = multiprocessing.get_context("spawn")
    ready = context.Barrier(4)
    processes = [
        context.Process(target=_controller, args=(location.url, f"proc-{i}", events, ready))
        for i in range(2)
    ]
    threads = [
        threading.Thread(target=_controller, args=(location.url, f"thread-{i}", events, ready))
        for i in range(2)
    ]
    for worker in (*processes, *threads):
        worker.start()
    for process in processes:
        process.join(timeout=120)
        assert process.exitcode == 0
    for thread in threads:
        thread.join(timeout=120)
        assert not thread.is_alive()

    with Ledger.open(location) as ledger:
        report = ledger.verify()
        runs = ledger.list_runs()
        details = [ledger.get_run(r.run_id) for r in runs]
    assert report.ok, report
    assert report.events_checked == 4 * (events + 2)  # no event lost
    assert all(r.status == "finished" and r.outcome == "ok" for r in runs)
    assert sorted(len(d.hosts[0].steps) for d in details) == [events] * 4
    rows = raw(location).execute("SELECT id, run_id, prev_hash, hash FROM events ORDER BY id")
    rows = rows.fetchall()
    # No fork: consecutive ids, each event chained to the one before it, no hash twice.
    assert [r[0] for r in rows] == list(range(1, len(rows) + 1))
    assert all(after[2] == before[3] for before, after in pairwise(rows))
    assert len({r[3] for r in rows}) == len(rows)
    # The writers really interleaved (otherwise this proves nothing about forks).
    assert sum(1 for a, b in pairwise(rows) if a[1] != b[1]) >= 4


def test_a_writer_waits_for_the_chain_lock_only_so_long_and_writes_nothing(
    location: PostgresLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    from opspatch.ledger import postgres

    monkeypatch.setattr(postgres, "LOCK_TIMEOUT_SECONDS", 0.3)
    with Ledger.open(location) as ledger:
        begin(ledger)
        with psycopg.connect(as_owner(location), autocommit=True) as holder:
            holder.execute("SELECT pg_advisory_lock(%s)", (postgres.CHAIN_LOCK_KEY,))
            with pytest.raises(LedgerError, match="cannot write the ledger") as caught:
                begin(ledger)
        assert "chain lock" in (caught.value.hint or "")
        assert ledger.verify().events_checked == 1  # the refused append left nothing behind
        begin(ledger)  # the holder is gone: the lock is free again
        assert ledger.verify().ok


# ---------------------------------------------------------------------------------------------
# a lost connection


def _steps(ledger: Ledger, run_id: str) -> list[tuple[str, str]]:
    (host,) = ledger.get_run(run_id).hosts
    return [(step.step, step.detail) for step in host.steps]


def test_a_connection_the_server_ended_between_two_appends_is_opened_again_once(
    location: PostgresLedger, postgres: PostgresServer
) -> None:
    """A restart or `pg_terminate_backend` between two writes (or reads): the next one connects
    again and goes through, the chain verifies, and every event is there once."""
    with Ledger.open(location) as ledger:
        run_id = begin(ledger, hosts=("gpu-01",))
        ledger.record_step(run_id, "gpu-01", "lock", "ok", 0.1, "first")
        first = backend_pid(ledger)
        postgres.end_session(first)
        ledger.record_step(run_id, "gpu-01", "swap", "ok", 0.1, "second")
        assert backend_pid(ledger) != first
        postgres.end_session(backend_pid(ledger))
        assert _steps(ledger, run_id) == [("lock", "first"), ("swap", "second")]  # a read
        report = ledger.verify()
    assert report.ok, report
    assert report.events_checked == 3
    hashes = [row[0] for row in raw(location).execute("SELECT hash FROM events").fetchall()]
    assert len(hashes) == len(set(hashes)) == 3


def test_a_connection_lost_inside_a_write_is_not_written_again(
    location: PostgresLedger, postgres: PostgresServer
) -> None:
    """Lost after the write began, the write fails and is never sent twice: in the middle,
    the server rolled it back; at COMMIT, the ledger says it cannot know whether the server
    committed. Either way the next write connects again and the chain goes on whole."""
    with Ledger.open(location) as ledger:
        run_id = begin(ledger, hosts=("gpu-01",))
        with (
            pytest.raises(LedgerError, match="cannot write the ledger") as midway,
            ledger._transaction() as db,
        ):
            db.take_event_id(0)
            postgres.end_session(backend_pid(ledger))
            db.execute("SELECT 1")
        assert "the server rolled back" in (midway.value.hint or "")

        step = {"step": "lock", "status": "ok", "seconds": None, "detail": "at commit"}
        with (
            pytest.raises(LedgerError, match="lost at COMMIT") as at_commit,
            ledger._transaction() as db,
        ):
            ledger._append(db, run_id=run_id, kind="step", host="gpu-01", body=step)
            postgres.end_session(backend_pid(ledger))
        assert "whether the server committed this write is unknown" in at_commit.value.message
        assert "did not write it again" in (at_commit.value.hint or "")
        # The server never saw the COMMIT: the event is not there, and nobody wrote it twice.
        assert _steps(ledger, run_id) == []
        ledger.record_step(run_id, "gpu-01", "lock", "ok", 0.1, "after")
        assert _steps(ledger, run_id) == [("lock", "after")]
        report = ledger.verify()
    assert report.ok, report
    assert report.events_checked == 2


class LostAtCommit:
    """A ledger's connection whose next COMMIT is lost for real: the server ends the session
    either after committing (`committed`: only the reply is lost) or before the COMMIT reaches
    it. Everything else goes to the real connection."""

    def __init__(self, conn: Any, server: PostgresServer, *, committed: bool) -> None:
        self._conn = conn
        self._server = server
        self._committed = committed
        self.lost = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def execute(self, sql: str, *args: Any) -> Any:
        if sql == "COMMIT" and not self.lost:
            self.lost = True
            if self._committed:
                self._conn.execute("COMMIT")  # the server has it
            self._server.end_session(int(self._conn.info.backend_pid))
            sql = "COMMIT" if not self._committed else "SELECT 1"  # either way: no reply
        return self._conn.execute(sql, *args)


@pytest.mark.parametrize("committed", [True, False], ids=["committed", "not-committed"])
def test_a_write_lost_at_commit_is_looked_for_before_it_is_tried_again(
    location: PostgresLedger, postgres: PostgresServer, committed: bool
) -> None:
    """A run's write (`Ledger.retrying`) whose COMMIT is lost does not know whether the server
    committed it: its next try looks for the event it appended, by its hash, and writes it
    only when it is not there. Either way the event is in the ledger once and the chain
    verifies."""
    with Ledger.open(location) as plain:
        ledger = plain.retrying(60)
        run_id = begin(ledger, hosts=("gpu-01",))
        cut = LostAtCommit(ledger._db._conn, postgres, committed=committed)  # type: ignore[attr-defined]
        ledger._db._conn = cut  # type: ignore[attr-defined]
        ledger.record_step(run_id, "gpu-01", "lock", "ok", 0.1, "lost at commit")
        assert cut.lost and ledger._db._conn is not cut  # lost, and connected again
        ledger.record_step(run_id, "gpu-01", "swap", "ok", 0.1, "after")
        assert _steps(ledger, run_id) == [("lock", "lost at commit"), ("swap", "after")]
        report = ledger.verify()
    assert report.ok, report
    assert report.events_checked == 3
    rows = raw(location).execute("SELECT id, hash FROM events ORDER BY id").fetchall()
    assert [r[0] for r in rows] == [1, 2, 3] and len({r[1] for r in rows}) == 3


def test_a_server_that_cannot_be_reached_again_is_one_clear_error_until_it_can(
    location: PostgresLedger, postgres: PostgresServer
) -> None:
    role, mine = postgres.own_writer(location)
    with Ledger.open(mine) as ledger:
        run_id = begin(ledger, hosts=("gpu-01",))
        postgres.keep_out(role)
        try:
            postgres.end_session(backend_pid(ledger))
            for _ in range(2):  # the first finds the connection lost, the next finds it gone
                with pytest.raises(LedgerError) as caught:
                    ledger.record_step(run_id, "gpu-01", "lock", "ok", 0.1, "refused")
                error = caught.value
                assert error.message.startswith(f"cannot write the ledger {mine}: ")
                assert "the connection to the server was lost" in error.message
                assert "connecting again failed" in error.message
                assert "not permitted to log in" in error.message
                assert "that the server is up" in (error.hint or "")
            with pytest.raises(LedgerError, match="cannot read the ledger"):
                ledger.list_runs()
        finally:
            postgres.keep_out(role, out=False)
        ledger.record_step(run_id, "gpu-01", "lock", "ok", 0.1, "let in again")
        assert _steps(ledger, run_id) == [("lock", "let in again")]
        assert ledger.verify().ok


# ---------------------------------------------------------------------------------------------
# append-only in the database


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE events SET body = '{}' WHERE id = 2",
        "DELETE FROM events WHERE id = 2",
        "TRUNCATE events",
        "UPDATE blobs SET data = '\\x00'::bytea",
        "DELETE FROM blobs",
        "TRUNCATE blobs CASCADE",
        "DELETE FROM schema_version",
        "SELECT setval('events_id_seq', 1)",
    ],
)
def test_the_writer_role_cannot_change_history(location: PostgresLedger, statement: str) -> None:
    with Ledger.open(location) as ledger:
        full_run(ledger)
    with psycopg.connect(location.url, autocommit=True) as writer:
        assert writer.execute("SELECT current_user").fetchone()[0] == WRITER
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            writer.execute(statement)
    with Ledger.open(location) as ledger:
        assert ledger.verify().ok and ledger.verify().events_checked == 15


@pytest.mark.parametrize(
    "statement",
    ["UPDATE events SET body = '{}' WHERE id = 2", "DELETE FROM events", "TRUNCATE events",
     "DELETE FROM blobs", "TRUNCATE schema_version"],
)  # fmt: skip
def test_the_triggers_refuse_even_the_owner(location: PostgresLedger, statement: str) -> None:
    with Ledger.open(location) as ledger:
        full_run(ledger)
    with (
        psycopg.connect(as_owner(location), autocommit=True) as owner,
        pytest.raises(psycopg.errors.RestrictViolation, match="append-only"),
    ):
        owner.execute(statement)


def test_a_disabled_trigger_is_a_warning_and_migrate_puts_it_back(
    location: PostgresLedger,
) -> None:
    with psycopg.connect(as_owner(location), autocommit=True) as owner:
        owner.execute("ALTER TABLE events DISABLE TRIGGER events_refuse_change")
    with Ledger.open(location) as ledger:
        (warning,) = ledger.verify().warnings
    assert "events_refuse_change" in warning and "ledger migrate" in warning
    migrated = opspatch("--ledger", as_owner(location), "ledger", "migrate")
    assert migrated.code == 0, migrated.stderr
    with Ledger.open(location) as ledger:
        assert ledger.verify().warnings == ()


def test_a_ledger_not_yet_migrated_says_who_must_migrate_it(postgres: PostgresServer) -> None:
    with postgres.admin() as conn:
        conn.execute("CREATE SCHEMA never_migrated")
    with pytest.raises(LedgerError, match="schema version 0") as caught:
        Ledger.open(PostgresLedger(postgres.url(schema="never_migrated")))
    assert "ledger migrate" in (caught.value.hint or "")


def test_a_ledger_that_cannot_be_used_as_given_is_a_configuration_error_exit_2(
    location: PostgresLedger, postgres: PostgresServer, tmp_path: Path
) -> None:
    """Unreachable, another database, not migrated, migrate run as the writer: each found when
    the ledger is opened or migrated, before anything changed: exit 2 (bad configuration), as
    docs/cli.md says, with what to do; exit 3 is for a ledger lost part-way through a run."""
    with postgres.admin() as conn:
        conn.execute("CREATE SCHEMA left_unmigrated")
    nowhere = f"postgresql://{WRITER}@/postgres?host={tmp_path / 'no-server-here'}"
    other_database = postgres.url(WRITER).replace("@/postgres?", "@/no_such_db?")
    for url, said, hint in (
        (nowhere, f"cannot open the ledger {nowhere}: ", "that the server is up"),
        (other_database, 'database "no_such_db" does not exist', "check the URL"),
        (postgres.url(schema="left_unmigrated"), "has schema version 0", "ledger migrate"),
    ):
        done = opspatch("--ledger", url, "ledger", "list")
        assert done.code == 2, done.stdout + done.stderr
        assert said in done.stderr and "hint: " in done.stderr and hint in done.stderr
    as_writer = opspatch("--ledger", location.url, "ledger", "migrate", "--json")
    assert as_writer.code == 2, as_writer.stdout + as_writer.stderr
    assert as_writer.json()["error"]["exit_code"] == 2
    assert "cannot migrate the ledger" in as_writer.stderr
    assert "run migrate as the database owner" in as_writer.stderr
    with Ledger.open(location) as ledger:  # nothing changed: the writer writes as before
        begin(ledger)
        assert ledger.verify().ok and ledger.verify().warnings == ()


def test_migrate_refuses_a_newer_schema_and_changes_nothing(location: PostgresLedger) -> None:
    with psycopg.connect(as_owner(location), autocommit=True) as owner:
        owner.execute("INSERT INTO schema_version VALUES (99, 'later', '99.0')")
    done = opspatch("--ledger", as_owner(location), "ledger", "migrate", "--writer-role", WRITER)
    assert done.code == 2, done.stderr
    assert "schema version 99" in done.stderr and f"up to {PG_SCHEMA_VERSION}" in done.stderr
    known = f"schema version 99; this opspatch knows {PG_SCHEMA_VERSION}"
    with pytest.raises(LedgerError, match=known):
        Ledger.open(location)
    again = opspatch("--ledger", as_owner(location), "ledger", "migrate", "--json")
    assert again.code == 2


def test_migrate_is_idempotent_and_sqlite_refuses_a_newer_file(
    location: PostgresLedger, tmp_path: Path
) -> None:
    done = opspatch("--ledger", as_owner(location), "ledger", "migrate", "--json",
                    "--writer-role", WRITER)  # fmt: skip
    assert done.code == 0, done.stderr
    assert done.json() == {
        "ledger": as_owner(location),
        "backend": "postgresql",
        "version_before": PG_SCHEMA_VERSION,  # the fixture migrated it already: nothing to do
        "version": PG_SCHEMA_VERSION,
        "writer_role": WRITER,
    }
    path = tmp_path / "ledger.sqlite3"
    Ledger.open(path).close()
    sqlite3.connect(path).execute("PRAGMA user_version = 7")
    refused = opspatch("--ledger", str(path), "ledger", "migrate")
    assert refused.code == 2
    assert "schema version 7" in refused.stderr and "up to 1" in refused.stderr


# ---------------------------------------------------------------------------------------------
# copy


def test_copy_sqlite_to_postgresql_and_back_keeps_every_event_and_the_head(
    location: PostgresLedger, tmp_path: Path
) -> None:
    first, back = tmp_path / "first.sqlite3", tmp_path / "back.sqlite3"
    with Ledger.open(first) as ledger:
        full_run(ledger)
        begin(ledger, hosts=("gpu-03",))  # an unfinished run too
        head = ledger.verify().head_hash

    there = opspatch("ledger", "copy", "--from", str(first), "--to", location.url, "--json")
    assert there.code == 0, there.stderr
    assert there.json()["head_hash"] == head and there.json()["events_copied"] == 16
    home = opspatch("ledger", "copy", "--from", location.url, "--to", str(back))
    assert home.code == 0, home.stderr
    assert f"head {head}" in home.stdout

    def history(path: Path | PostgresLedger) -> tuple[list[Any], list[Any]]:
        conn = raw(path)
        events = [tuple(r) for r in conn.execute("SELECT * FROM events ORDER BY id").fetchall()]
        blobs = [
            (r[0], r[1], bytes(r[2]))
            for r in conn.execute("SELECT * FROM blobs ORDER BY sha256").fetchall()
        ]
        return events, blobs

    assert history(first) == history(location) == history(back)
    verified = opspatch("--ledger", location.url, "ledger", "verify")
    assert verified.code == 0 and f"head {head}" in verified.stdout
    with Ledger.open(back) as ledger:
        assert ledger.verify().head_hash == head


def test_copy_refuses_a_different_history_and_writes_nothing(
    location: PostgresLedger, tmp_path: Path
) -> None:
    other = tmp_path / "other.sqlite3"
    with Ledger.open(other) as ledger:
        full_run(ledger)
    with Ledger.open(location) as ledger:
        begin(ledger)
        before = ledger.verify()
    refused = opspatch("ledger", "copy", "--from", str(other), "--to", location.url)
    assert refused.code == 2
    assert "already holds a different history" in refused.stderr
    with Ledger.open(location) as ledger:
        assert ledger.verify() == before


# ---------------------------------------------------------------------------------------------
# the password


@pytest.mark.parametrize("where", ["--ledger", "OPSPATCH_LEDGER"])
def test_a_url_with_a_password_is_refused_and_never_printed(where: str) -> None:
    url = "postgresql://opspatch:hunter2-secret@db.example/ledger"
    args, env = (["--ledger", url], {}) if where == "--ledger" else ([], {"OPSPATCH_LEDGER": url})
    done = opspatch(*args, "ledger", "list", env=env)
    assert done.code == 2
    assert f"{where}: the PostgreSQL URL carries a password" in done.stderr
    assert "PGPASSWORD" in done.stderr and "~/.pgpass" in done.stderr
    assert "hunter2" not in done.stdout + done.stderr


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u@db.example/ledger?password=hunter2-secret",
        "postgresql://u@db.example/ledger?pass%77ord=hunter2-secret",  # libpq decodes the key
        "postgresql://u@db.example/ledger?sslmode=require&PASSWORD=hunter2-secret",
    ],
)
def test_a_password_in_the_urls_query_is_refused_however_it_is_spelled(url: str) -> None:
    with pytest.raises(InputError, match="carries a password") as caught:
        ledger_location(url, given_by="--ledger")
    assert "hunter2" not in caught.value.message + (caught.value.hint or "")


def test_a_libpq_string_with_a_password_is_refused_not_taken_for_a_file(tmp_path: Path) -> None:
    dsn = "host=db.example dbname=ledger password=hunter2-secret"
    done = opspatch("--ledger", dsn, "ledger", "list", cwd=tmp_path)
    assert done.code == 2
    assert "libpq connection string with a password" in done.stderr
    assert "hunter2" not in done.stdout + done.stderr
    assert list(tmp_path.iterdir()) == []


def test_migrate_gives_a_v1_team_ledger_the_leases_table_and_keeps_its_chain(
    postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ledger made by the release before leases (migration 1 alone, ids from a sequence) and
    written to; migrate brings it to the newest version with the writer granted the leases and
    the chain tip, the chain unchanged."""
    from opspatch.ledger import postgres as pg_backend
    from opspatch.ledger.database import migrate

    schema = f"ledger_v1_{next(postgres._schemas)}"
    with postgres.admin() as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    owner = PostgresLedger(postgres.url(schema=schema))
    with monkeypatch.context() as v1:  # that release: its schema, its ids from the sequence
        v1.setattr(pg_backend, "SCHEMA_VERSION", 1)
        v1.setattr(
            pg_backend.PostgresDatabase,
            "take_event_id",
            lambda db, last_id: int(db._value("SELECT nextval('events_id_seq')")),
        )
        v1.setattr(
            pg_backend.PostgresDatabase,
            "highest_event_id",
            lambda db: int(db._value("SELECT last_value FROM events_id_seq")),
        )
        assert migrate(owner, None).version == 1
        with Ledger.open(owner) as ledger:
            run_id = full_run(ledger)
            before = ledger.verify()
    assert before.ok and before.events_checked > 0
    with psycopg.connect(owner.url, autocommit=True) as conn:
        assert conn.execute(f"SELECT to_regclass('{schema}.leases')").fetchone() == (None,)
    with pytest.raises(LedgerError, match="schema version 1") as old:
        Ledger.open(owner)
    assert "ledger migrate" in (old.value.hint or "")
    done = opspatch("--ledger", owner.url, "ledger", "migrate", "--json", "--writer-role", WRITER)
    assert done.code == 0, done.stderr
    assert (done.json()["version_before"], done.json()["version"]) == (1, PG_SCHEMA_VERSION)
    writer = PostgresLedger(postgres.url(WRITER, schema))
    with Ledger.open(writer) as ledger:
        after = ledger.verify()
        assert after.ok and after.head_hash == before.head_hash
        assert after.events_checked == before.events_checked
        assert ledger.get_run(run_id).summary.status == "finished"
        later = begin(ledger, hosts=("gpu-01",))
        grant = ledger.take_leases(later, {"gpu-01": "m/gpu-01:/s"}, expires_after=60)
        assert grant.refused == () and [h.run_id for h in ledger.leases_of([later])] == [later]
        assert ledger.verify().ok


def test_a_write_that_fails_after_taking_its_id_leaves_no_gap(location: PostgresLedger) -> None:
    """The id is taken in the append's own transaction (the chain tip, not a sequence, whose
    nextval would survive the rollback): a write that fails half-way leaves the chain whole,
    and the next append follows on with no 'deleted' events."""
    with Ledger.open(location) as ledger:
        run_id = begin(ledger)
        with pytest.raises(LedgerError), ledger._transaction() as db:
            db.take_event_id(0)
            db.execute("SELECT no_such_column FROM events")
        assert ledger.verify().ok
        ledger.record_step(run_id, "gpu-01", "lock", "ok", 0.1, "locked")
        report = ledger.verify()
        assert report.ok, report


# ---------------------------------------------------------------------------------------------
# the ledger made again under a writer (issue 42, item 12)


@pytest.mark.parametrize("again", ["empty", "older-copy"])
def test_a_ledger_made_again_under_a_writer_stops_it_instead_of_taking_its_writes(
    location: PostgresLedger, postgres: PostgresServer, again: str
) -> None:
    """The ledger's schema renamed away and another put under its name while a run writes: a
    new, empty one, or an older copy of the history (as a restore from a backup leaves it).
    Before, the run's next writes went there, its earlier records out of sight."""
    schema = re.search(r"search_path=(\w+)", unquote(location.url)).group(1)  # type: ignore[union-attr]
    with Ledger.open(location) as ledger:
        run_id = begin(ledger, hosts=("gpu-01",))
        if again == "older-copy":  # the history as it was once the run began
            with postgres.admin() as conn:
                conn.execute(f"CREATE SCHEMA {schema}_older")
            migrate(PostgresLedger(postgres.url(OWNER, f"{schema}_older")), WRITER)
            with Ledger.open(PostgresLedger(postgres.url(WRITER, f"{schema}_older"))) as older:
                ledger.copy_to(older)
        ledger.record_step(run_id, "gpu-01", "lock", "ok", 0.1)
        with postgres.admin() as conn:
            conn.execute(f"ALTER SCHEMA {schema} RENAME TO {schema}_before")
            if again == "older-copy":
                conn.execute(f"ALTER SCHEMA {schema}_older RENAME TO {schema}")
            else:
                conn.execute(f"CREATE SCHEMA {schema}")
        if again == "empty":
            migrate(PostgresLedger(postgres.url(OWNER, schema)), WRITER)
        with pytest.raises(LedgerLost) as caught:
            ledger.record_step(run_id, "gpu-01", "swap", "started")
    assert caught.value.exit_code == 3
    assert "recreated, replaced or restored while this process used it" in caught.value.message
    said = "another history" if again == "empty" else "an older copy of it (its events end at 1"
    assert said in caught.value.message
    with Ledger.open(location) as now:  # nothing of the run was written there since
        runs = now.list_runs()
        assert [len(now.get_run(r.run_id).hosts[0].steps) for r in runs] == (
            [] if again == "empty" else [0]
        )
