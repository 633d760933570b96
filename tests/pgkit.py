"""A throwaway PostgreSQL server for the ledger tests, started once per session.

The server runs as an unprivileged user (`ledgerpg`, created when the tests run as root, as CI
does: PostgreSQL refuses to run as root) on a Unix socket only (`listen_addresses=''`, `-k DIR`:
no TCP port to race for) with `fsync=off` (the tests prove behaviour, not durability). The
bootstrap superuser `ledger` owns every table, as a team's DBA would; opspatch writes as
`opspatch_writer`, which `opspatch ledger migrate --writer-role` grants SELECT and INSERT only.
Every test gets a fresh schema (`fresh_ledger`), migrated, so tests share one server and never
one history. Skips with a reason when the PostgreSQL binaries or psycopg are missing.
"""

from __future__ import annotations

import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from opspatch.core.ledgerlocation import PostgresLedger
from opspatch.ledger import Ledger
from opspatch.ledger.database import migrate
from tests.tiers import counted_as

OWNER = "ledger"
WRITER = "opspatch_writer"
SERVICE_USER = "ledgerpg"
BACKENDS = ("sqlite", pytest.param("postgresql", marks=pytest.mark.postgres))
"""The params of every backend-neutral ledger fixture (a PostgreSQL one is a `postgres` test)."""


def postgres_bin() -> Path | None:
    """The newest installed PostgreSQL's bin directory (Debian's layout), or None."""
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    return found[-1].parent if found else None


@dataclass
class PostgresServer:
    """A running cluster, reached through `socket_dir`."""

    socket_dir: Path
    _schemas: Iterator[int]
    _ctl: list[str] = field(default_factory=list)
    """`pg_ctl -D DATA -l LOG` as the service user, for `stop` and `start`."""
    _options: str = ""

    def url(self, role: str = OWNER, schema: str | None = None) -> str:
        query = f"host={quote(str(self.socket_dir))}"
        if schema is not None:
            query += "&options=" + quote(f"-csearch_path={schema}")
        return f"postgresql://{role}@/postgres?{query}"

    def admin(self) -> Any:
        import psycopg

        return psycopg.connect(self.url(), autocommit=True)

    def fresh_ledger(self) -> PostgresLedger:
        """A new, migrated ledger (its own schema), as the writer role reaches it."""
        schema = f"ledger_{next(self._schemas)}"
        with self.admin() as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        migrate(PostgresLedger(self.url(OWNER, schema)), WRITER)
        return PostgresLedger(self.url(WRITER, schema))

    def own_writer(self, location: PostgresLedger) -> tuple[str, PostgresLedger]:
        """A login role of its own that writes as the writer does (a member of it), and
        `location` as that role reaches it: a controller the test can keep off the server
        (`keep_out`) while every other connection goes on working."""
        role = f"controller_{next(self._schemas)}"
        with self.admin() as conn:
            conn.execute(f"CREATE ROLE {role} LOGIN IN ROLE {WRITER}")
        return role, PostgresLedger(location.url.replace(f"//{WRITER}@", f"//{role}@", 1))

    def keep_out(self, role: str, *, out: bool = True) -> None:
        """Refuse `role`'s new connections (`out`), or let it connect again: to the controller,
        the server is unreachable, as behind a network cut."""
        with self.admin() as conn:
            conn.execute(f"ALTER ROLE {role} {'NOLOGIN' if out else 'LOGIN'}")

    def stop(self) -> None:
        """Shut the server down as a restart does (`pg_ctl stop -m fast`: every session ended,
        nothing committed lost), and wait until it is down: from now on nobody reaches it."""
        with counted_as("postgres"):  # through runuser as the service user, when root
            subprocess.run([*self._ctl, "-m", "fast", "-w", "stop"], check=True,
                           capture_output=True, timeout=120)  # fmt: skip

    def start(self) -> None:
        """Start the server again after `stop`, and wait until it takes connections."""
        with counted_as("postgres"):
            subprocess.run([*self._ctl, "-w", "-o", self._options, "start"], check=True,
                           capture_output=True, timeout=120)  # fmt: skip

    def end_session(self, pid: int) -> None:
        """End the server session `pid` as a restart or an operator's `pg_terminate_backend`
        does, and wait until it is gone (so its client finds out at its next statement)."""
        with self.admin() as conn:
            ended = conn.execute("SELECT pg_terminate_backend(%s, 60000)", (pid,)).fetchone()
        assert ended == (True,), f"the server session {pid} did not end"


def backend_pid(ledger: Ledger) -> int:
    """The server session an open PostgreSQL ledger writes through."""
    return int(ledger._db._conn.info.backend_pid)


def as_owner(location: PostgresLedger) -> str:
    """The same ledger's URL as the owner of its tables (who can disable the triggers)."""
    return location.url.replace(f"//{WRITER}@", f"//{OWNER}@", 1)


def _as_service_user(command: list[str]) -> list[str]:
    return ["runuser", "-u", SERVICE_USER, "--", *command] if os.geteuid() == 0 else command


def _run(command: list[str], **options: Any) -> subprocess.CompletedProcess[Any]:
    """`subprocess.run` for the server: as root, its useradd and runuser are part of starting
    PostgreSQL, not a test of root's (tests/tiers.py)."""
    with counted_as("postgres"):
        return subprocess.run(command, **options)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One throwaway cluster for the session, stopped (pg_ctl stop) at its end."""
    pytest.importorskip("psycopg", reason="psycopg is not installed (pip install -e '.[dev]')")
    bin_dir = postgres_bin()
    if bin_dir is None or not (bin_dir / "initdb").exists():
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SERVICE_USER)
        except KeyError:
            _run(["useradd", "--system", "--no-create-home", SERVICE_USER], check=True)
    base = Path(tempfile.mkdtemp(prefix="opspatch-pg-"))
    data, sock, log = base / "data", base / "sock", base / "log"
    sock.mkdir()
    if os.geteuid() == 0:
        shutil.chown(base, SERVICE_USER)
        shutil.chown(sock, SERVICE_USER)
    base.chmod(0o755)  # the tests connect to the socket inside as root
    _run(
        _as_service_user(
            [str(bin_dir / "initdb"), "-D", str(data), "-U", OWNER, "--auth=trust", "-E", "UTF8",
             "--locale=C.UTF-8", "--no-sync"]
        ),
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    options = f"-k {sock} -c listen_addresses='' -c fsync=off -c max_connections=200"
    started = _run(
        _as_service_user(
            [str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-o", options, "start"]
        ),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if started.returncode != 0:
        log_text = log.read_text() if log.exists() else ""
        shutil.rmtree(base, ignore_errors=True)
        pytest.fail(f"the PostgreSQL test server did not start: {started.stderr}{log_text}")
    server = PostgresServer(
        socket_dir=sock,
        _schemas=itertools.count(1),
        _ctl=_as_service_user([str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(log)]),
        _options=options,
    )
    try:
        with server.admin() as conn:
            conn.execute(f"CREATE ROLE {WRITER} LOGIN")
        yield server
    finally:
        _run(
            _as_service_user(
                [str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"]
            ),
            capture_output=True, timeout=120,
        )  # fmt: skip
        shutil.rmtree(base, ignore_errors=True)


def backend_location(request: pytest.FixtureRequest, tmp_path: Path) -> Path | PostgresLedger:
    """For a fixture parametrised with `BACKENDS`: a fresh ledger file, or a fresh migrated
    PostgreSQL ledger on the session's server."""
    if request.param == "sqlite":
        return tmp_path / "state" / "ledger.sqlite3"
    server: PostgresServer = request.getfixturevalue("postgres")
    return server.fresh_ledger()


class PostgresTamper:
    """A connection that goes behind opspatch's back on PostgreSQL, as the tables' owner: the
    SQLite tamperer's statements (`?` placeholders) run as they are, and `total_changes` counts
    the rows they changed, as sqlite3's does."""

    def __init__(self, url: str) -> None:
        import psycopg

        self._conn = psycopg.connect(url, autocommit=True)
        self.total_changes = 0

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        if sql.startswith("PRAGMA foreign_keys"):
            # `disable_triggers` already switched off the foreign keys with the triggers.
            return self._conn.execute("SELECT 1")
        if params:
            cursor = self._conn.execute(sql.replace("%", "%%").replace("?", "%s"), params)
        else:
            cursor = self._conn.execute(sql)
        if not sql.lstrip().upper().startswith("SELECT") and cursor.rowcount > 0:
            self.total_changes += cursor.rowcount
        return cursor

    def disable_triggers(self) -> None:
        # What an owner (or superuser) can do: no user trigger, no foreign key, fires.
        self._conn.execute("SET session_replication_role = replica")
