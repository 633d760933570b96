"""Run leases: which run holds which host, renewed by a heartbeat (mutable state, not history)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from opspatch.ledger.database import Database

LEASES_TABLE = """
CREATE TABLE IF NOT EXISTS leases (
    identity         TEXT PRIMARY KEY,
    host             TEXT NOT NULL,
    run_id           TEXT NOT NULL,
    operator         TEXT NOT NULL,
    controller       TEXT NOT NULL,
    taken_at_ms      BIGINT NOT NULL,
    heartbeat_at_ms  BIGINT NOT NULL,
    expires_after_ms BIGINT NOT NULL
)
"""
"""Created beside the history tables when a ledger is opened; never part of the hash chain."""

_COLUMNS = (
    "identity, host, run_id, operator, controller, taken_at_ms, heartbeat_at_ms, expires_after_ms"
)


@dataclass(frozen=True)
class Lease:
    """One row: `identity` held by `run_id` (`host` is the inventory name it was taken under)."""

    identity: str
    host: str
    run_id: str
    operator: str
    controller: str
    taken_at_ms: int
    heartbeat_at_ms: int
    expires_after_ms: int

    def silent_ms(self, now_ms: int) -> int:
        """How long since its last heartbeat (never negative: clocks differ between machines)."""
        return max(0, now_ms - self.heartbeat_at_ms)

    def live(self, now_ms: int) -> bool:
        """Whether its holder heart-beat recently enough."""
        return self.silent_ms(now_ms) <= self.expires_after_ms


def _rows(conn: Database, where: str, params: Sequence[object]) -> list[Lease]:
    query = f"SELECT {_COLUMNS} FROM leases WHERE {where} ORDER BY identity"
    return [Lease(*row) for row in conn.execute(query, tuple(params))]


def _marks(values: Sequence[object]) -> str:
    return ", ".join("?" for _ in values)


def leases_on(conn: Database, identities: Sequence[str]) -> list[Lease]:
    """The leases, live or not, on any of `identities`."""
    if not identities:
        return []
    return _rows(conn, f"identity IN ({_marks(identities)})", identities)


def leases_of(conn: Database, run_ids: Sequence[str]) -> list[Lease]:
    """The leases held by any of `run_ids`."""
    if not run_ids:
        return []
    return _rows(conn, f"run_id IN ({_marks(run_ids)})", run_ids)


def put(conn: Database, leases: Sequence[Lease]) -> None:
    """Write `leases`, replacing whatever row held each identity (the caller decided it may)."""
    for lease in leases:
        conn.execute("DELETE FROM leases WHERE identity = ?", (lease.identity,))
        conn.execute(
            f"INSERT INTO leases ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                lease.identity,
                lease.host,
                lease.run_id,
                lease.operator,
                lease.controller,
                lease.taken_at_ms,
                lease.heartbeat_at_ms,
                lease.expires_after_ms,
            ),
        )


def renew(conn: Database, run_id: str, now_ms: int) -> int:
    """A heartbeat: every lease `run_id` still holds is renewed; how many it holds."""
    held = len(leases_of(conn, [run_id]))  # the caller's write transaction: no one in between
    conn.execute("UPDATE leases SET heartbeat_at_ms = ? WHERE run_id = ?", (now_ms, run_id))
    return held


def give_back(conn: Database, run_id: str) -> list[Lease]:
    """Remove every lease `run_id` holds; the leases it held."""
    held = leases_of(conn, [run_id])
    conn.execute("DELETE FROM leases WHERE run_id = ?", (run_id,))
    return held
