"""The team ledger: a PostgreSQL database, the `Database` of `database.py`, and its migrations."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from opspatch import __version__
from opspatch.core.ledgerlocation import PostgresLedger
from opspatch.core.remedy import remedy_text
from opspatch.core.vocabulary import Command
from opspatch.errors import (
    InputError,
    LedgerConfigError,
    LedgerError,
    LedgerLost,
    LedgerUnreachable,
)
from opspatch.ledger.database import Rows
from opspatch.ledger.lease_store import LEASES_TABLE
from opspatch.ledger.records import MigrateReport
from opspatch.ledger.schema import APPEND_ONLY_MESSAGE, BUSY_TIMEOUT_SECONDS, EVENT_KINDS

if TYPE_CHECKING:
    import psycopg

SCHEMA_VERSION = 3
"""The newest schema this opspatch knows, in the `schema_version` table."""

CHAIN_LOCK_KEY = int.from_bytes(
    hashlib.sha256(b"opspatch ledger chain head").digest()[:8], "big", signed=True
)
"""The advisory lock every append takes first: one writer at a time moves the chain head. One key
per database: ledgers in two schemas of one database serialise together, which costs nothing."""

LOCK_TIMEOUT_SECONDS = BUSY_TIMEOUT_SECONDS
"""How long a writer waits for the chain lock (as SQLite's busy timeout): then SQLSTATE 55P03."""

STALLED_TRANSACTION_SECONDS = 60.0
"""A session of ours idle inside a transaction this long is ended by the server, so a controller
frozen mid-append (SIGSTOP, a suspended laptop) does not hold the chain lock for ever."""

HISTORY_TABLES = ("events", "blobs", "schema_version")
"""What nobody may change: the writer role gets SELECT and INSERT on these, nothing more."""

_SCHEMA_VERSION_TABLE = """
CREATE TABLE IF NOT EXISTS schema_version (
    version          INTEGER PRIMARY KEY,
    migrated_at      TEXT NOT NULL,
    opspatch_version TEXT NOT NULL
)"""

_MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        """CREATE TABLE blobs (
            sha256 TEXT PRIMARY KEY CHECK (length(sha256) = 64),
            size   BIGINT NOT NULL,
            data   BYTEA NOT NULL
        )""",
        "CREATE SEQUENCE events_id_seq AS BIGINT MINVALUE 1",
        f"""CREATE TABLE events (
            id          BIGINT PRIMARY KEY,
            run_id      TEXT NOT NULL,
            kind        TEXT NOT NULL CHECK (kind IN ({", ".join(repr(k) for k in EVENT_KINDS)})),
            host        TEXT,
            path        TEXT,
            recorded_at TEXT NOT NULL,
            body        TEXT NOT NULL,
            pre_image   TEXT REFERENCES blobs(sha256),
            post_image  TEXT REFERENCES blobs(sha256),
            prev_hash   TEXT NOT NULL,
            hash        TEXT NOT NULL UNIQUE
        )""",
        "CREATE UNIQUE INDEX one_start_per_run ON events(run_id) WHERE kind = 'run-started'",
        "CREATE UNIQUE INDEX one_finish_per_run ON events(run_id) WHERE kind = 'run-finished'",
        "CREATE INDEX events_by_run ON events(run_id, id)",
        "CREATE INDEX file_versions_by_file ON events(host, path, id) WHERE kind = 'file-version'",
    ),
    # Run leases: mutable state beside the history (ledger/lease_store.py), never in its chain.
    2: (LEASES_TABLE,),
    # The highest event id ever handed out, kept in a table: a sequence's nextval survives the
    # rollback of a failed write, which would read as a deleted tail forever after.
    3: (
        """CREATE TABLE chain_tip (
            one     BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one),
            last_id BIGINT NOT NULL
        )""",
        """INSERT INTO chain_tip (last_id) SELECT GREATEST(
            (SELECT COALESCE(max(id), 0) FROM events),
            (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM events_id_seq)
        )""",
        """CREATE OR REPLACE FUNCTION opspatch_tip_only_grows() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.last_id < OLD.last_id THEN
                RAISE EXCEPTION 'opspatch ledger is append-only: the chain tip only grows'
                    USING ERRCODE = 'restrict_violation';
            END IF;
            RETURN NEW;
        END $$""",
        "CREATE TRIGGER chain_tip_only_grows BEFORE UPDATE ON chain_tip "
        "FOR EACH ROW EXECUTE FUNCTION opspatch_tip_only_grows()",
        "CREATE TRIGGER chain_tip_refuse_delete BEFORE DELETE OR TRUNCATE ON chain_tip "
        "FOR EACH STATEMENT EXECUTE FUNCTION opspatch_refuse_change()",
    ),
}
"""Each version's statements, applied in order by `migrate`, never edited once released."""

_CONNECTION_DEFAULTS = {
    "connect_timeout": 10,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,
}
"""libpq settings a URL does not give: a cut network (no RST) fails a write within about 30 s
instead of blocking for the kernel's quarter of an hour, so the heartbeat says it lost the
ledger while the lease is still live (TCP only; a socket connection ignores them)."""

_CONNECT_HINT = "check the URL, that the server is up, and the password in PGPASSWORD or ~/.pgpass"

_ENDED_BY_SERVER = ("57P01", "57P02")
"""admin_shutdown (a restart, pg_terminate_backend) and crash_shutdown: the server ended the
session; like class 08 (connection exception), the connection is gone, not the statement wrong."""

_REFUSE_FUNCTION = f"""
CREATE OR REPLACE FUNCTION opspatch_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '{APPEND_ONLY_MESSAGE}' USING ERRCODE = 'restrict_violation';
END $$"""


def _append_only_triggers(table: str) -> tuple[str, ...]:
    return (
        f"DROP TRIGGER IF EXISTS {table}_refuse_change ON {table}",
        f"CREATE TRIGGER {table}_refuse_change BEFORE UPDATE OR DELETE ON {table} "
        "FOR EACH ROW EXECUTE FUNCTION opspatch_refuse_change()",
        f"DROP TRIGGER IF EXISTS {table}_refuse_truncate ON {table}",
        f"CREATE TRIGGER {table}_refuse_truncate BEFORE TRUNCATE ON {table} "
        "FOR EACH STATEMENT EXECUTE FUNCTION opspatch_refuse_change()",
    )


def quote_identifier(name: str) -> str:
    """`name` as a PostgreSQL identifier, quoted (a role name goes into GRANT as is)."""
    return '"' + name.replace('"', '""') + '"'


@dataclass
class PostgresDatabase:
    """A PostgreSQL ledger, open (one connection, autocommit outside `writing()`, opened
    again once when a transaction finds it lost before it did anything: `_begin`)."""

    location: PostgresLedger
    _conn: psycopg.Connection[Any] = field(repr=False)
    errors: tuple[type[BaseException], ...] = ()
    created: bool = False
    """Never: a database is created by its owner (`ledger migrate`), not by opening it."""
    _first: str | None = field(default=None, repr=False)
    """The hash of the ledger's first event, once there is one: the history's own name."""
    _tip: int = field(default=0, repr=False)
    """The highest event id known committed here (when opened, then by this connection): the
    tip only grows, so a ledger whose tip is lower is an older copy of it."""
    _taking: int = field(default=0, repr=False)
    """The id the write transaction under way took, counted once it commits."""

    @classmethod
    def connect(cls, location: PostgresLedger) -> PostgresDatabase:
        """Connect to `location`, schema untouched (the password from libpq's environment).

        Raises:
            LedgerConfigError: psycopg is not installed, the server cannot be reached, or it
                refused the connection (no such database or role, a password wanted).
        """
        try:
            import psycopg
        except ImportError:
            raise LedgerConfigError(
                f"the ledger {location} is on PostgreSQL, and psycopg is not installed",
                hint="pip install 'opspatch[postgres]' (psycopg 3)",
            ) from None
        try:
            conn = _session(location)
        except psycopg.Error as exc:
            raise LedgerConfigError(
                f"cannot open the ledger {location}: {_first_line(exc)}",
                hint=_CONNECT_HINT,
            ) from exc
        return cls(location=location, _conn=conn, errors=(psycopg.Error,))

    @classmethod
    def open(cls, location: PostgresLedger) -> PostgresDatabase:
        """Connect and check the schema is the one this opspatch writes.

        Raises:
            LedgerConfigError: the connection fails, the role may not read the schema, or the
                database holds no schema, an older one (its owner runs `opspatch ledger
                migrate`) or a newer one (upgrade opspatch).
        """
        database = cls.connect(location)
        try:
            version = database.schema_version()
        except database.errors as exc:
            database.close()
            raise database.unusable(exc) from exc
        if version != SCHEMA_VERSION:
            database.close()
            if version > SCHEMA_VERSION:
                raise LedgerConfigError(
                    f"the ledger {location} has schema version {version}; this opspatch knows "
                    f"{SCHEMA_VERSION}",
                    hint="upgrade opspatch",
                )
            raise LedgerConfigError(
                f"the ledger {location} has schema version {version}; this opspatch writes "
                f"{SCHEMA_VERSION}",
                hint="have the database owner run `opspatch --ledger URL ledger migrate "
                "--writer-role ROLE` first",
            )
        try:
            database._first, database._tip = database._identity()
        except database.errors as exc:
            database.close()
            raise database.unusable(exc) from exc
        return database

    def append_only_warnings(self) -> tuple[str, ...]:
        """What `verify()` lists when a history table's append-only trigger is missing or
        disabled (only the owner can do either; the chain itself still decides `ok`)."""
        marks = ", ".join("?" for _ in HISTORY_TABLES)
        rows = self.execute(
            "SELECT c.relname, t.tgname, t.tgenabled FROM pg_trigger t "
            "JOIN pg_class c ON c.oid = t.tgrelid "
            f"WHERE c.oid = ANY (ARRAY[{marks}]::regclass[]) AND NOT t.tgisinternal",
            HISTORY_TABLES,
        ).fetchall()
        enabled = {str(name) for _, name, state in rows if state != "D"}
        wanted = [
            f"{table}_{what}"
            for table in HISTORY_TABLES
            for what in ("refuse_change", "refuse_truncate")
        ]
        off = [name for name in wanted if name not in enabled]
        if not off:
            return ()
        return (
            f"append-only triggers are missing or disabled: {', '.join(off)} (the database owner "
            f"did it; run `{remedy_text(Command.LEDGER_MIGRATE)}` as the owner to put them "
            "back, and compare "
            "the head hash with the one kept elsewhere)",
        )

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Rows:
        if not params:
            return self._conn.execute(sql)  # no parameters: psycopg leaves `%` alone
        return self._conn.execute(sql.replace("%", "%%").replace("?", "%s"), tuple(params))

    def _value(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """The first column of the one row `sql` returns."""
        return self.execute(sql, params).fetchone()[0]

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """A transaction that takes the chain head's advisory lock before anything else, in the
        ledger this connection opened (`_still_the_ledger`)."""
        with self._transaction("SELECT pg_advisory_xact_lock(?)", "write"):
            self._still_the_ledger()
            yield

    def _identity(self) -> tuple[str | None, int]:
        """The hash of the first event (None: none yet) and the chain tip, as stored now."""
        first = self.execute("SELECT hash FROM events ORDER BY id LIMIT 1").fetchone()
        return (str(first[0]) if first else None), self.highest_event_id()

    def _still_the_ledger(self) -> None:
        """Inside `writing()`: this must be the history this connection opened, its first
        event the same and its tip no lower than this connection knows it. A schema made again
        under the same name, a database recreated or restored from an older copy (found by a
        connection opened again, or by a `search_path` that now resolves elsewhere) would take
        the run's writes where nobody reads them. (A tail deleted behind opspatch's back is
        not this: the tip stays, and `verify` names the gap.)

        Raises:
            LedgerLost: another history, or an older copy of this one.
        """
        first, tip = self._identity()
        if self._first is None:
            self._first = first
        if first == self._first and tip >= self._tip:
            return
        what = (
            "another history (its first event is not this ledger's)"
            if first != self._first
            else f"an older copy of it (its events end at {tip}; this process knows {self._tip})"
        )
        raise LedgerLost(
            f"the ledger {self.location} now holds {what}: the database or its schema was "
            "recreated, replaced or restored while this process used it; nothing more is "
            "written to it",
            hint="what this process recorded before is in the ledger it wrote to: find it "
            "(a renamed schema, the database as it was before the restore)",
        )

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """A transaction holding the chain lock shared: no append is half-way while it reads."""
        from psycopg.pq import TransactionStatus

        inside = (TransactionStatus.INTRANS, TransactionStatus.INERROR)
        if self._conn.info.transaction_status in inside:  # within `writing()`: its snapshot
            yield
            return
        with self._transaction("SELECT pg_advisory_xact_lock_shared(?)", "read"):
            yield

    @contextlib.contextmanager
    def _transaction(self, lock: str, doing: str) -> Iterator[None]:
        """BEGIN, take the chain lock with `lock`, run the block, COMMIT; every driver error as
        the `LedgerError` of `failure(exc, doing)`.

        A connection lost before the block ran (`_begin`) is opened again once and the
        transaction begun on it, as if nothing happened. Nothing is retried here once the block
        ran: a connection lost in it took the whole transaction with it (the server rolls back
        what it never saw committed), and one lost at COMMIT leaves unknown whether the
        server committed (`LedgerUnreachable.outcome_unknown`), which is said, never guessed by
        writing the events again: the ledger's own retry (`Ledger._write`, `transactions.py`)
        first looks, in a new transaction under the chain lock, whether the events it appended
        are there.
        """
        import psycopg

        self._begin(lock, doing)
        self._taking = 0
        try:
            yield
        except psycopg.Error as exc:
            self._roll_back()
            raise self.failure(exc, doing) from exc
        except BaseException:
            self._roll_back()
            raise
        try:
            self._conn.execute("COMMIT")
            self._tip = max(self._tip, self._taking)
        except psycopg.Error as exc:
            self._roll_back()
            if not self._lost(exc):
                raise self.failure(exc, doing) from exc
            raise LedgerUnreachable(
                f"cannot {doing} the ledger {self.location}: the connection to the server was "
                f"lost at COMMIT ({_first_line(exc)}); whether the server committed this "
                f"{doing} is unknown",
                hint="opspatch did not write it again, so nothing is recorded twice; "
                f"`{remedy_text(Command.LEDGER_SHOW, 'RUN')}` tells whether it is there, "
                "and the next use of "
                "the ledger connects again",
                outcome_unknown=True,
            ) from exc

    def _begin(self, lock: str, doing: str) -> None:
        """BEGIN and the chain lock. A connection already lost (an earlier transaction failed
        with it) or lost at these two statements, which leave nothing behind on the server, is
        opened again once (same URL, same settings) and the two sent again on it.

        Raises:
            LedgerError: the connection cannot be opened again, or fails again, or the lock is
                refused (its timeout passed).
        """
        import psycopg

        reconnected = False
        if self._conn.broken:
            self._reconnect(doing, None)
            reconnected = True
        while True:
            try:
                self._conn.execute("BEGIN")
                self.execute(lock, (CHAIN_LOCK_KEY,))
                return
            except psycopg.Error as exc:
                self._roll_back()
                if reconnected or not self._lost(exc):
                    raise self.failure(exc, doing) from exc
                self._reconnect(doing, _first_line(exc))
                reconnected = True

    def _reconnect(self, doing: str, why: str | None) -> None:
        """Replace the lost connection with a new one to the same ledger.

        Raises:
            LedgerUnreachable: the server cannot be reached or refuses the connection.
        """
        import psycopg

        said = f" ({why})" if why else ""
        try:
            conn = _session(self.location)
        except psycopg.Error as exc:
            raise LedgerUnreachable(
                f"cannot {doing} the ledger {self.location}: the connection to the server was "
                f"lost{said} and connecting again failed: {_first_line(exc)}",
                hint=_CONNECT_HINT,
            ) from exc
        with contextlib.suppress(psycopg.Error):
            self._conn.close()
        self._conn = conn

    def _lost(self, exc: BaseException) -> bool:
        """Whether `exc` says the connection is gone (the server ended it, or it broke)."""
        import psycopg

        sqlstate = getattr(exc, "sqlstate", None) or ""
        return isinstance(exc, psycopg.OperationalError) and (
            self._conn.broken or sqlstate.startswith("08") or sqlstate in _ENDED_BY_SERVER
        )

    def _roll_back(self) -> None:
        import psycopg

        # A lost connection has nothing to roll back (the server did it); keep the first error.
        with contextlib.suppress(psycopg.Error):
            if not self._conn.closed:
                self._conn.execute("ROLLBACK")

    def take_event_id(self, last_id: int) -> int:
        # Under the chain lock, in the append's own transaction: a write that fails or is cut
        # off rolls its id back with it, so a gap means events were really removed.
        taken = max(last_id, self.highest_event_id()) + 1
        self.execute("UPDATE chain_tip SET last_id = ?", (taken,))
        self._taking = taken
        return taken

    def highest_event_id(self) -> int:
        return int(self._value("SELECT last_id FROM chain_tip"))

    def failure(self, exc: BaseException, doing: str) -> LedgerError:
        sqlstate = getattr(exc, "sqlstate", None)
        hint = None
        if sqlstate == "42501":  # insufficient_privilege
            hint = (
                "the role opspatch connects as lacks that privilege: have the database owner "
                f"run `{remedy_text(Command.LEDGER_MIGRATE, writer_role='ROLE')}` for it"
            )
        elif sqlstate == "55P03":  # lock_not_available: lock_timeout passed
            hint = (
                f"another controller held the ledger's chain lock for more than "
                f"{LOCK_TIMEOUT_SECONDS:.0f} s; pg_locks joined with pg_stat_activity (locktype "
                "'advisory') shows which session"
            )
        elif self._lost(exc):
            return LedgerUnreachable(
                f"cannot {doing} the ledger {self.location}: {_first_line(exc)}",
                hint="the connection to the server was lost; what it had not committed, the "
                "server rolled back, and the next use of the ledger connects again",
            )
        return LedgerError(
            f"cannot {doing} the ledger {self.location}: {_first_line(exc)}", hint=hint
        )

    def unusable(self, exc: BaseException) -> LedgerConfigError:
        """`failure(exc, "open")` as what it is when the ledger is being opened: the ledger as
        given cannot be used (the role may not read it, it is not an opspatch schema)."""
        error = self.failure(exc, "open")
        return LedgerConfigError(error.message, hint=error.hint)

    def settings(self) -> dict[str, Any]:
        """The server's version, `synchronous_commit`, `fsync`, the role, the schema version."""
        return {
            "backend": "postgresql",
            "server_version": str(self._value("SHOW server_version")),
            "synchronous_commit": str(self._value("SHOW synchronous_commit")),
            "fsync": str(self._value("SHOW fsync")),
            "role": str(self._value("SELECT current_user")),
            "schema_version": self.schema_version(),
        }

    def schema_version(self) -> int:
        found = self._value("SELECT to_regclass('schema_version') IS NOT NULL")
        if not found:
            return 0
        return int(
            self.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchone()[0]
        )

    def migrate(self, writer_role: str | None) -> MigrateReport:
        """Create or upgrade the schema, (re)create the append-only triggers and, for
        `writer_role`, grant SELECT and INSERT on the history (and the id sequence) only.

        Run as the owner of the tables. Safe to run again: applied versions are skipped, the
        triggers and grants are put back as they should be.

        Raises:
            InputError: the database is newer than this opspatch, or `writer_role` does not
                exist or is the role migrating (the owner can change anything).
            LedgerConfigError: the database refused (not its owner, no privilege to create):
                nothing was changed, the transaction rolled back.
        """
        try:
            with self._conn.transaction():
                self.execute("SELECT pg_advisory_xact_lock(?)", (CHAIN_LOCK_KEY,))
                self.execute(_SCHEMA_VERSION_TABLE)
                before = self.schema_version()
                if before > SCHEMA_VERSION:
                    raise InputError(
                        f"the ledger {self.location} has schema version {before}; this opspatch "
                        f"knows only up to {SCHEMA_VERSION} and will not touch it",
                        hint="run `ledger migrate` with the newer opspatch that wrote it",
                    )
                self.execute(_REFUSE_FUNCTION)  # migration 3's trigger uses it too
                for version in range(before + 1, SCHEMA_VERSION + 1):
                    for statement in _MIGRATIONS[version]:
                        self.execute(statement)
                    self.execute(
                        "INSERT INTO schema_version (version, migrated_at, opspatch_version) "
                        "VALUES (?, ?, ?)",
                        (version, _utc_now(), __version__),
                    )
                for table in HISTORY_TABLES:
                    for statement in _append_only_triggers(table):
                        self.execute(statement)
                self.execute(f"REVOKE ALL ON {', '.join(HISTORY_TABLES)} FROM PUBLIC")
                if writer_role is not None:
                    self._grant_writer(writer_role)
        except self.errors as exc:
            raise LedgerConfigError(
                self.failure(exc, "migrate").message,
                hint="run migrate as the database owner (a role that may create in the schema)",
            ) from exc
        return MigrateReport(
            ledger=str(self.location),
            backend="postgresql",
            version_before=before,
            version=SCHEMA_VERSION,
            writer_role=writer_role,
        )

    def _grant_writer(self, role: str) -> None:
        me = str(self._value("SELECT current_user"))
        if role == me:
            raise InputError(
                f"--writer-role {role} is the role running migrate; the owner of the tables can "
                "change history, so opspatch must write as another role",
                hint="CREATE ROLE opspatch LOGIN; then migrate --writer-role opspatch",
            )
        if self.execute("SELECT 1 FROM pg_roles WHERE rolname = ?", (role,)).fetchone() is None:
            raise InputError(
                f"--writer-role {role}: no such role in the database server",
                hint=f"create it first (CREATE ROLE {quote_identifier(role)} LOGIN) and run "
                "migrate again",
            )
        who = quote_identifier(role)
        tables = ", ".join(HISTORY_TABLES)
        schema = quote_identifier(str(self._value("SELECT current_schema()")))
        self.execute(f"REVOKE ALL ON {tables} FROM {who}")
        self.execute(f"GRANT SELECT, INSERT ON events, blobs TO {who}")
        self.execute(f"GRANT SELECT ON schema_version TO {who}")
        self.execute(f"REVOKE ALL ON SEQUENCE events_id_seq FROM {who}")
        self.execute(f"GRANT USAGE, SELECT ON SEQUENCE events_id_seq TO {who}")
        self.execute(f"GRANT USAGE ON SCHEMA {schema} TO {who}")
        self.execute(f"GRANT SELECT, UPDATE ON chain_tip TO {who}")  # it only grows (trigger)
        # The leases are the present, not history: the one table the writer may change.
        self.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON leases TO {who}")

    def close(self) -> None:
        self._conn.close()


def _session(location: PostgresLedger) -> psycopg.Connection[Any]:
    """A new connection to `location` with the settings every session of ours runs with: the
    URL's own, `_CONNECTION_DEFAULTS` for what it leaves out, and the two timeouts."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    given = conninfo_to_dict(location.url)
    unsaid = {k: v for k, v in _CONNECTION_DEFAULTS.items() if k not in given}
    conn = psycopg.connect(make_conninfo(location.url, **unsaid), autocommit=True)
    try:
        conn.execute(f"SET lock_timeout = '{int(LOCK_TIMEOUT_SECONDS * 1000)}ms'")
        conn.execute(
            "SET idle_in_transaction_session_timeout = "
            f"'{int(STALLED_TRANSACTION_SECONDS * 1000)}ms'"
        )
    except BaseException:
        conn.close()
        raise
    return conn


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
