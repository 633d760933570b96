"""Approvals read back from the history: the `sign` steps of `approve` runs for a patch sha256."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from opspatch.core.vocabulary import Command, EventKind, Step, StepStatus
from opspatch.ledger.chain import EventRow, canonical_json
from opspatch.ledger.database import Database
from opspatch.ledger.events import finish_events, select_events
from opspatch.ledger.records import Approval, RunDetail


def approvals_of(conn: Database, patch_sha256s: Sequence[str]) -> dict[str, list[Approval]]:
    """Per sha256 of `patch_sha256s`, the finished approvals recorded for it, oldest first."""
    wanted = sorted(set(patch_sha256s))
    if not wanted:
        return {}
    starts = [
        row
        for row in select_events(
            conn,
            f"kind = '{EventKind.RUN_STARTED}' AND body LIKE ? ORDER BY id",
            (f'%"command":{canonical_json(Command.APPROVE.value)}%',),
        )
        if row.data.get("command") == Command.APPROVE and row.data.get("patch_sha256") in wanted
    ]
    if not starts:
        return {}
    finished = finish_events(conn, [s.run_id for s in starts])
    by_run = {s.run_id: s for s in starts if s.run_id in finished}
    marks = ", ".join("?" for _ in by_run)
    found: dict[str, list[Approval]] = {}
    steps = (
        select_events(
            conn, f"kind = '{EventKind.STEP}' AND run_id IN ({marks}) ORDER BY id", sorted(by_run)
        )
        if by_run
        else []
    )
    for row in steps:
        if _signed(row):
            start = by_run[row.run_id]
            found.setdefault(start.data["patch_sha256"], []).append(_approval(start, row))
    return found


def signed_in(conn: Database, detail: RunDetail) -> RunDetail:
    """`detail` of an `approve` run told as what it is: its `sign` steps as `approvals` (the
    principal who signed), not as host records (their host column holds the principal)."""
    if detail.summary.command != Command.APPROVE:
        return detail
    rows = select_events(conn, "run_id = ? ORDER BY id", (detail.run_id,))
    start = next(row for row in rows if row.kind == EventKind.RUN_STARTED)
    approvals = tuple(_approval(start, row) for row in rows if _signed(row))
    principals = {approval.principal for approval in approvals}
    return replace(
        detail,
        hosts=tuple(h for h in detail.hosts if h.host not in principals),
        approvals=approvals,
    )


def _signed(row: EventRow) -> bool:
    return (
        row.kind == EventKind.STEP
        and row.data.get("step") == Step.SIGN
        and row.data.get("status") == StepStatus.OK
    )


def _approval(start: EventRow, sign: EventRow) -> Approval:
    """The approval an `approve` run's start and its `sign` step record."""
    return Approval(
        run_id=sign.run_id,
        patch_id=start.data["patch_id"],
        patch_sha256=start.data["patch_sha256"],
        principal=str(sign.host),
        operator=start.data["operator"],
        signature=str(sign.data["detail"]),
        recorded_at=sign.recorded_at,
    )
