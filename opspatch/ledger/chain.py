"""The hash chain: how an event row is hashed, how the next one is linked, and the verify walk."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from opspatch.core.remedy import remedy_text
from opspatch.core.source import sha256_hex
from opspatch.core.vocabulary import Command
from opspatch.errors import LedgerError, LedgerIntegrityError
from opspatch.ledger.database import Database
from opspatch.ledger.records import VerifyReport

GENESIS_HASH = "0" * 64
"""The `prev_hash` of the first event."""

ROW_COLUMNS = (
    "id, run_id, kind, host, path, recorded_at, body, pre_image, post_image, prev_hash, hash"
)
"""The columns of `events`, in the order `EventRow` takes them."""


def canonical_json(value: Any) -> str:
    """The one serialisation that is hashed: sorted keys, no spaces, UTF-8 kept as is.

    Raises:
        TypeError: `value` holds something JSON cannot represent.
        ValueError: `value` holds NaN or infinity (they have no canonical JSON form).
    """
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def event_hash(
    *,
    event_id: int,
    run_id: str,
    kind: str,
    host: str | None,
    path: str | None,
    recorded_at: str,
    body: str,
    pre_image: str | None,
    post_image: str | None,
    prev_hash: str,
) -> str:
    """The hash of one event row: sha256 of the canonical JSON of every column but `hash`.

    The id is included so renumbering is detected; `body` is hashed as the exact stored text.
    """
    content = {
        "id": event_id,
        "run_id": run_id,
        "kind": kind,
        "host": host,
        "path": path,
        "recorded_at": recorded_at,
        "body": body,
        "pre_image": pre_image,
        "post_image": post_image,
        "prev_hash": prev_hash,
    }
    return sha256_hex(canonical_json(content).encode("utf-8"))


@dataclass(frozen=True)
class EventRow:
    """One row of `events`, as stored (`body` is the canonical JSON text that was hashed)."""

    id: int
    run_id: str
    kind: str
    host: str | None
    path: str | None
    recorded_at: str
    body: str
    pre_image: str | None
    post_image: str | None
    prev_hash: str
    hash: str

    @property
    def data(self) -> dict[str, Any]:
        """The body, parsed."""
        loaded: dict[str, Any] = json.loads(self.body)
        return loaded

    def computed_hash(self) -> str:
        """What `hash` must be for this row's content and link."""
        return event_hash(
            event_id=self.id,
            run_id=self.run_id,
            kind=self.kind,
            host=self.host,
            path=self.path,
            recorded_at=self.recorded_at,
            body=self.body,
            pre_image=self.pre_image,
            post_image=self.post_image,
            prev_hash=self.prev_hash,
        )

    def values(self) -> tuple[Any, ...]:
        """The column values in `ROW_COLUMNS` order, for an INSERT."""
        return (
            self.id,
            self.run_id,
            self.kind,
            self.host,
            self.path,
            self.recorded_at,
            self.body,
            self.pre_image,
            self.post_image,
            self.prev_hash,
            self.hash,
        )


def next_link(conn: Database) -> tuple[int, str]:
    """The id and `prev_hash` of the next event; the caller is inside `conn.writing()`.

    The id is one more than the highest ever handed out, so a deleted tail leaves a visible gap.
    """
    last = conn.execute("SELECT id, hash FROM events ORDER BY id DESC LIMIT 1").fetchone()
    last_id = 0 if last is None else int(last[0])
    event_id = conn.take_event_id(last_id)
    return event_id, GENESIS_HASH if last is None else str(last[1])


def store_blob(conn: Database, sha256: str, data: bytes) -> None:
    """Store `data` under its `sha256` once (identical pre-images are stored once).

    Raises:
        LedgerIntegrityError: different bytes are already stored under that sha256.
    """
    existing = conn.execute("SELECT data FROM blobs WHERE sha256 = ?", (sha256,)).fetchone()
    if existing is None:
        conn.execute(
            "INSERT INTO blobs (sha256, size, data) VALUES (?, ?, ?)", (sha256, len(data), data)
        )
    elif sha256_hex(bytes(existing[0])) != sha256:
        raise LedgerIntegrityError(
            f"the ledger already holds altered bytes under sha256 {sha256}",
            hint=f"run `{remedy_text(Command.LEDGER_VERIFY)}`",
        )


def stored_blob(conn: Database, sha256: str) -> bytes:
    """The bytes stored under `sha256`, re-hashed before they are returned.

    Raises:
        LedgerError: no blob has that hash.
        LedgerIntegrityError: the stored bytes no longer hash to `sha256`.
    """
    found = conn.execute("SELECT data FROM blobs WHERE sha256 = ?", (sha256,)).fetchone()
    if found is None:
        raise LedgerError(f"the ledger has no stored bytes with sha256 {sha256}")
    data = bytes(found[0])
    if sha256_hex(data) != sha256:
        raise LedgerIntegrityError(
            f"the stored bytes for sha256 {sha256} were altered (they hash to {sha256_hex(data)})",
            hint=f"run `{remedy_text(Command.LEDGER_VERIFY)}`",
        )
    return data


def verify_chain(conn: Database, warnings: tuple[str, ...]) -> VerifyReport:
    """Check every event in id order, then every blob; stop at the first broken link."""
    expected_prev = GENESIS_HASH
    expected_id = 1
    checked = 0
    referenced: dict[str, int] = {}  # blob sha256 -> first event that names it

    def broken(event_id: int | None, reason: str, blobs_checked: int = 0) -> VerifyReport:
        return VerifyReport(
            ok=False,
            events_checked=checked,
            blobs_checked=blobs_checked,
            first_broken=event_id,
            reason=reason,
            head_hash=expected_prev,
            warnings=warnings,
        )

    for values in conn.execute(f"SELECT {ROW_COLUMNS} FROM events ORDER BY id"):
        row = EventRow(*values)
        if row.id != expected_id:
            missing = (
                f"{expected_id}" if row.id == expected_id + 1 else f"{expected_id}-{row.id - 1}"
            )
            return broken(row.id, f"event(s) {missing} before it are missing (deleted)")
        if row.prev_hash != expected_prev:
            return broken(row.id, "its prev_hash does not match the hash of the event before it")
        if row.computed_hash() != row.hash:
            return broken(row.id, "its content does not match its hash (the row was edited)")
        for sha in (row.pre_image, row.post_image):
            if sha is not None:
                referenced.setdefault(sha, row.id)
        expected_prev = row.hash
        expected_id += 1
        checked += 1

    sequence = conn.highest_event_id()
    if sequence >= expected_id:
        return broken(
            expected_id,
            f"events {expected_id}-{sequence} were deleted from the end (the id sequence reached "
            f"{sequence})",
        )

    blobs_checked = 0
    problems: list[tuple[int, str]] = []  # (first event naming the blob, reason)
    stored: set[str] = set()
    for sha, size, data in conn.execute("SELECT sha256, size, data FROM blobs"):
        blob = bytes(data)
        stored.add(str(sha))
        blobs_checked += 1
        if sha256_hex(blob) != sha or len(blob) != size:
            problems.append(
                (
                    referenced.get(str(sha), 0),
                    f"the stored bytes {sha} it names no longer hash to that sha256 "
                    "(the blob was edited)",
                )
            )
    for sha, event_id in referenced.items():
        if sha not in stored:
            problems.append(
                (event_id, f"the stored bytes {sha} it names are missing (the blob was deleted)")
            )
    if problems:
        # Unreferenced blobs (event id 0) sort last: a referenced one matters more.
        event_id, reason = min(problems, key=lambda p: (p[0] == 0, p[0]))
        return broken(event_id or None, reason, blobs_checked)
    return VerifyReport(
        ok=True,
        events_checked=checked,
        blobs_checked=blobs_checked,
        first_broken=None,
        reason=None,
        head_hash=expected_prev,
        warnings=warnings,
    )
