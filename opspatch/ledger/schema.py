"""The ledger's SQLite schema (version 1) and what opening a ledger sets up."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

from opspatch.core.vocabulary import EventKind
from opspatch.errors import LedgerConfigError
from opspatch.ledger.lease_store import LEASES_TABLE

SCHEMA_VERSION = 1
"""In `PRAGMA user_version`; a ledger with a newer one is refused, never rewritten."""

BUSY_TIMEOUT_SECONDS = 30.0
"""How long a writer waits for another one (two operators, a rollout's threads)."""

APPEND_ONLY_MESSAGE = "opspatch ledger is append-only"
"""What the triggers say when an UPDATE or DELETE is tried."""

EVENT_KINDS = tuple(kind.value for kind in EventKind)
"""The kinds of event the `events` table accepts (both backends), as plain words in the order
the schema has always named them (its `CHECK` constraint is written from them)."""
_HISTORY_TABLES = ("events", "blobs")

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS blobs (
    sha256 TEXT PRIMARY KEY CHECK (length(sha256) = 64),
    size   INTEGER NOT NULL,
    data   BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
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
);
CREATE UNIQUE INDEX IF NOT EXISTS one_start_per_run ON events(run_id) WHERE kind = 'run-started';
CREATE UNIQUE INDEX IF NOT EXISTS one_finish_per_run ON events(run_id) WHERE kind = 'run-finished';
CREATE INDEX IF NOT EXISTS events_by_run ON events(run_id, id);
CREATE INDEX IF NOT EXISTS file_versions_by_file ON events(host, path, id)
    WHERE kind = 'file-version';
"""


def _trigger_sql(table: str, action: str) -> str:
    return (
        f"CREATE TRIGGER IF NOT EXISTS {table}_refuse_{action.lower()} BEFORE {action} ON {table} "
        f"BEGIN SELECT RAISE(ABORT, '{APPEND_ONLY_MESSAGE}'); END;"
    )


_TRIGGERS = {
    f"{table}_refuse_{action.lower()}": _trigger_sql(table, action)
    for table in _HISTORY_TABLES
    for action in ("UPDATE", "DELETE")
}


def prepare(conn: sqlite3.Connection, path: Path) -> tuple[str, ...]:
    """Set the pragmas, create or check the schema; return warnings for `verify()`."""
    conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_SECONDS * 1000)}")
    conn.execute("PRAGMA foreign_keys = ON")
    mode = str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]).lower()
    if mode != "wal":
        raise LedgerConfigError(
            f"the ledger {path} cannot use WAL journaling (the filesystem gave {mode!r})",
            hint="keep the ledger on a local filesystem",
        )
    conn.execute("PRAGMA synchronous = FULL")
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if version > SCHEMA_VERSION:
        raise LedgerConfigError(
            f"the ledger {path} has schema version {version}; this opspatch knows {SCHEMA_VERSION}",
            hint="upgrade opspatch",
        )
    present = {
        str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")
    }
    missing = [name for name in _TRIGGERS if name not in present]
    # The leases are mutable state beside the history (not in its chain, no schema version of
    # their own): a ledger written before them gets the table the first time it is opened.
    has_leases = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'leases'"
    ).fetchone()
    if version == SCHEMA_VERSION and not missing and has_leases:
        return ()
    conn.execute("BEGIN IMMEDIATE")
    try:
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                conn.execute(statement)
        conn.execute(LEASES_TABLE)
        for name in missing:
            conn.execute(_TRIGGERS[name])
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        # A failed COMMIT (a full disk) may have ended the transaction already: keep its error.
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        raise
    if version == SCHEMA_VERSION:
        return (
            f"append-only triggers were missing and have been re-created: {', '.join(missing)}",
        )
    return ()
