"""Copying a history from one ledger to another (`opspatch ledger copy --from A --to B`)."""

from __future__ import annotations

from opspatch.core.remedy import remedy_text
from opspatch.core.vocabulary import Command
from opspatch.errors import InputError, LedgerIntegrityError
from opspatch.ledger.chain import ROW_COLUMNS, EventRow, store_blob, verify_chain
from opspatch.ledger.database import Database
from opspatch.ledger.records import CopyReport


def copy_history(source: Database, target: Database) -> CopyReport:
    """Append to `target` every event and blob of `source` that it does not hold yet.

    Raises:
        InputError: `target` holds a different history (the first event that differs named).
        LedgerIntegrityError: `source` does not verify, or `target` does not verify to the same
            head after the copy (its id sequence shows deleted events, for one).
        LedgerError: either database cannot be read or written.
    """
    with source.reading():
        checked = verify_chain(source, ())
        if not checked.ok:
            raise LedgerIntegrityError(
                f"the ledger {source.location} is not intact at event {checked.first_broken}: "
                f"{checked.reason}; nothing was copied",
                first_broken=checked.first_broken,
                hint="a broken history is not copied; find out who edited it first",
            )
        events = [
            EventRow(*values)
            for values in source.execute(f"SELECT {ROW_COLUMNS} FROM events ORDER BY id")
        ]
        blobs = [
            (str(sha), bytes(data))
            for sha, data in source.execute("SELECT sha256, data FROM blobs")
        ]
    with target.writing():
        held = [
            (int(i), str(h)) for i, h in target.execute("SELECT id, hash FROM events ORDER BY id")
        ]
        _require_same_prefix(held, events, target)
        present = {str(row[0]) for row in target.execute("SELECT sha256 FROM blobs")}
        missing = [(sha, data) for sha, data in blobs if sha not in present]
        for sha, data in missing:
            store_blob(target, sha, data)
        marks = ", ".join("?" for _ in range(len(ROW_COLUMNS.split(","))))
        last_id = held[-1][0] if held else 0
        for row in events[len(held) :]:
            if target.take_event_id(last_id) != row.id:
                raise LedgerIntegrityError(
                    f"the ledger {target.location} has handed out event ids past its last event "
                    f"{last_id} (events were deleted from its end); nothing was copied",
                    first_broken=last_id + 1,
                    hint="copy into an empty ledger",
                )
            target.execute(f"INSERT INTO events ({ROW_COLUMNS}) VALUES ({marks})", row.values())
            last_id = row.id
    with target.reading():
        after = verify_chain(target, ())
    if not after.ok or after.head_hash != checked.head_hash:
        raise LedgerIntegrityError(
            f"the copy in {target.location} does not verify to the source's head "
            f"{checked.head_hash}: {after.reason or after.head_hash}",
            first_broken=after.first_broken,
            hint=f"run `{remedy_text(Command.LEDGER_VERIFY)}` on both",
        )
    return CopyReport(
        source=str(source.location),
        target=str(target.location),
        events_copied=len(events) - len(held),
        events_already_there=len(held),
        blobs_copied=len(missing),
        head_hash=after.head_hash,
    )


def _require_same_prefix(
    held: list[tuple[int, str]], events: list[EventRow], target: Database
) -> None:
    """Refuse a target whose events are not the source's first events, id for id, hash for hash."""
    for index, (event_id, event_hash) in enumerate(held):
        theirs = events[index] if index < len(events) else None
        if theirs is None or (theirs.id, theirs.hash) != (event_id, event_hash):
            raise InputError(
                f"the ledger {target.location} already holds a different history (its event "
                f"{event_id} is not the source's); nothing was copied",
                hint="copy into an empty ledger (a new file, or a freshly migrated database)",
            )
