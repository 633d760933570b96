"""Approvals read back from the history: the `sign` steps of `approve` runs for a patch sha256.

An approval is history, recorded through the ordinary events (no table of its own): a run with
command `approve` and the patch's id and sha256, and one `sign` step whose host column is the
signer principal and whose detail is the armored OpenSSH signature. Portable SQL (`?`
placeholders, LIKE as a cheap filter before the bodies are parsed); the caller holds the
ledger's lock.
"""

from __future__ import annotations

from collections.abc import Sequence

from opspatch.core.vocabulary import StepStatus
from opspatch.ledger.chain import canonical_json
from opspatch.ledger.database import Database
from opspatch.ledger.events import finish_events, select_events
from opspatch.ledger.records import Approval

APPROVE_COMMAND = "approve"
SIGN_STEP = "sign"


def approvals_of(
    conn: Database, patch_sha256s: Sequence[str]
) -> dict[str, list[Approval]]:
    """Per sha256 of `patch_sha256s`, the finished approvals recorded for it, oldest first."""
    wanted = sorted(set(patch_sha256s))
    if not wanted:
        return {}
    starts = [
        row
        for row in select_events(
            conn,
            "kind = 'run-started' AND body LIKE ? ORDER BY id",
            (f'%"command":{canonical_json(APPROVE_COMMAND)}%',),
        )
        if row.data.get("command") == APPROVE_COMMAND and row.data.get("patch_sha256") in wanted
    ]
    if not starts:
        return {}
    finished = finish_events(conn, [s.run_id for s in starts])
    by_run = {s.run_id: s for s in starts if s.run_id in finished}
    marks = ", ".join("?" for _ in by_run)
    found: dict[str, list[Approval]] = {}
    steps = (
        select_events(conn, f"kind = 'step' AND run_id IN ({marks}) ORDER BY id", sorted(by_run))
        if by_run
        else []
    )
    for row in steps:
        if row.data.get("step") != SIGN_STEP or row.data.get("status") != StepStatus.OK:
            continue
        start = by_run[row.run_id].data
        found.setdefault(start["patch_sha256"], []).append(
            Approval(
                run_id=row.run_id,
                patch_id=start["patch_id"],
                patch_sha256=start["patch_sha256"],
                principal=str(row.host),
                operator=start["operator"],
                signature=str(row.data["detail"]),
                recorded_at=row.recorded_at,
            )
        )
    return found
