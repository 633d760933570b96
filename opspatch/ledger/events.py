"""Reading events back: one run's rows turned into the records of `records.py`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opspatch.core.reasons import Reason
from opspatch.core.vocabulary import Command, EventKind, RunStatus
from opspatch.errors import LedgerError
from opspatch.ledger.chain import ROW_COLUMNS, EventRow
from opspatch.ledger.database import Database
from opspatch.ledger.liveness import ControllerProcess
from opspatch.ledger.records import FileVersion, HostRecord, RunDetail, RunSummary


def select_events(conn: Database, where: str, params: Sequence[Any] = ()) -> list[EventRow]:
    """The event rows `SELECT ... FROM events WHERE <where>` returns (`where` may order them)."""
    return [
        EventRow(*values)
        for values in conn.execute(f"SELECT {ROW_COLUMNS} FROM events WHERE {where}", tuple(params))
    ]


def start_event(conn: Database, run_id: str) -> EventRow | None:
    """The `run-started` event of `run_id`, or None if there is no such run."""
    found = select_events(conn, f"run_id = ? AND kind = '{EventKind.RUN_STARTED}'", (run_id,))
    return found[0] if found else None


def require_open_run(conn: Database, run_id: str) -> EventRow:
    """The run's start event; raises LedgerError if the run is unknown or already finished.

    Two point lookups on the one-start/one-finish partial unique indexes: every event a fleet
    run writes asks this, and a scan of the run's own events made a 1,000-host run quadratic."""
    found = open_run(conn, run_id)
    if isinstance(found, LedgerError):
        raise found
    return found


def open_run(conn: Database, run_id: str) -> EventRow | LedgerError:
    """`require_open_run` as a value: the run's start event, or why nothing can be added to
    it (so a transaction of several runs' events refuses only that run's)."""
    start = start_event(conn, run_id)
    if start is None:
        return LedgerError(f"run {run_id} is not in the ledger")
    if select_events(conn, f"run_id = ? AND kind = '{EventKind.RUN_FINISHED}'", (run_id,)):
        return LedgerError(f"run {run_id} is already finished; nothing can be added to it")
    return start


def finish_events(conn: Database, run_ids: Sequence[str]) -> dict[str, EventRow]:
    """The `run-finished` event of each of `run_ids` that has one."""
    if not run_ids:
        return {}
    marks = ", ".join("?" for _ in run_ids)
    found = select_events(
        conn, f"kind = '{EventKind.RUN_FINISHED}' AND run_id IN ({marks})", run_ids
    )
    return {row.run_id: row for row in found}


def recovered_by(conn: Database, parents: Sequence[str]) -> dict[str, str]:
    """For each of `parents` that has one, the first `recover` run that finished and descends
    from it through `parent_run`: a recover recovers its parent, and a recover of a recover that
    was itself killed recovers the original run too. A killed recover recovers nothing, nor does
    one that halted before starting some host (`halted_part_way`): the parent stays interrupted
    there, for a later recover to finish."""
    if not parents:
        return {}
    # The canonical body has no spaces: LIKE is a cheap filter before the bodies are parsed.
    candidates = select_events(
        conn,
        f"kind = '{EventKind.RUN_STARTED}' AND body LIKE ? ORDER BY id",
        (f'%"command":"{Command.RECOVER}"%',),
    )
    children: dict[str, list[str]] = {}  # parent run -> recover runs naming it
    for row in candidates:
        if row.data["command"] == Command.RECOVER and row.data["parent_run"]:
            children.setdefault(row.data["parent_run"], []).append(row.run_id)
    recovers = [c for runs in children.values() for c in runs]
    partial = halted_part_way(conn, recovers)
    finished = {
        run: row for run, row in finish_events(conn, recovers).items() if run not in partial
    }
    found: dict[str, str] = {}
    for parent in parents:
        best: tuple[int, str] | None = None
        queue, seen = list(children.get(parent, ())), {parent}
        while queue:
            child = queue.pop()
            if child in seen:
                continue
            seen.add(child)
            finish = finished.get(child)
            if finish is not None and (best is None or finish.id < best[0]):
                best = (finish.id, child)
            queue.extend(children.get(child, ()))
        if best is not None:
            found[parent] = best[1]
    return found


def halted_part_way(conn: Database, run_ids: Sequence[str]) -> set[str]:
    """Those of `run_ids` that left a host never started: its last outcome `not-started`."""
    if not run_ids:
        return set()
    marks = ", ".join("?" for _ in run_ids)
    rows = select_events(
        conn,
        f"kind = '{EventKind.HOST_OUTCOME}' AND run_id IN ({marks}) ORDER BY id",
        run_ids,
    )
    last = {(row.run_id, row.host): row.data.get("reason") for row in rows}
    return {run for (run, _), reason in last.items() if reason == Reason.NOT_STARTED}


def run_summaries(conn: Database, starts: Sequence[EventRow]) -> list[RunSummary]:
    """The summaries of the runs begun by `starts`, in that order, with derived statuses."""
    finished = finish_events(conn, [s.run_id for s in starts])
    recovery = recovered_by(conn, [s.run_id for s in starts if s.run_id not in finished])
    return [
        _summary(start, finished.get(start.run_id), recovery.get(start.run_id)) for start in starts
    ]


def run_detail(conn: Database, run_id: str) -> RunDetail:
    """Run `run_id` (a full id that exists) with every host's record.

    Hosts come in the order the run named them, then any other host its events mention.
    """
    events = select_events(conn, "run_id = ? ORDER BY id", (run_id,))
    start = next(row for row in events if row.kind == EventKind.RUN_STARTED)
    (summary,) = run_summaries(conn, [start])
    order = dict.fromkeys([*summary.hosts, *(row.host for row in events if row.host)])
    return RunDetail(
        summary=summary,
        hosts=tuple(HostRecord.from_json(_host_record_json(h, events)) for h in order),
    )


def file_version(row: EventRow) -> FileVersion:
    """A `file-version` event as a `FileVersion`."""
    return FileVersion.from_json(_file_version_json(row))


def _summary(start: EventRow, finish: EventRow | None, recovery: str | None) -> RunSummary:
    data = start.data
    controller = ControllerProcess.from_json(data["controller"])
    status, outcome, recovered = RunStatus.FINISHED, None, None
    if finish is not None:
        outcome = finish.data["outcome"]
    else:
        alive = controller.is_alive()
        if alive is None:
            status = RunStatus.UNKNOWN
        elif alive:
            status = RunStatus.RUNNING
        elif recovery is not None:
            status, recovered = RunStatus.RECOVERED, recovery
        else:
            status = RunStatus.INTERRUPTED
    return RunSummary.from_json(
        {
            **data,
            "run_id": start.run_id,
            "started_at": start.recorded_at,
            "finished_at": None if finish is None else finish.recorded_at,
            "status": status.value,
            "outcome": outcome,
            "recovered_by": recovered,
        }
    )


def _file_version_json(row: EventRow) -> dict[str, Any]:
    """A `file-version` event as `FileVersion` JSON: its body plus the row's columns."""
    return {
        **row.data,
        "event_id": row.id,
        "run_id": row.run_id,
        "host": row.host,
        "path": row.path,
        "pre_image_sha256": row.pre_image,
        "post_image_sha256": row.post_image,
        "recorded_at": row.recorded_at,
    }


def _host_record_json(host: str, events: Sequence[EventRow]) -> dict[str, Any]:
    """Everything `events` (one run's) say about `host`, as `HostRecord` JSON: every step, the
    latest facts, every file version, and the latest outcome (a later one supersedes)."""
    mine = [row for row in events if row.host == host]
    facts = [row.data["facts"] for row in mine if row.kind == EventKind.FACTS]
    outcomes = [row.data for row in mine if row.kind == EventKind.HOST_OUTCOME]
    last_outcome: dict[str, Any] = outcomes[-1] if outcomes else {}
    return {
        "host": host,
        "outcome": last_outcome.get("outcome"),
        "error": last_outcome.get("error"),
        "reason": last_outcome.get("reason"),
        "file": last_outcome.get("file"),
        "steps": [
            {**row.data, "event_id": row.id, "recorded_at": row.recorded_at}
            for row in mine
            if row.kind == EventKind.STEP
        ],
        "facts": facts[-1] if facts else None,
        "file_versions": [
            _file_version_json(row) for row in mine if row.kind == EventKind.FILE_VERSION
        ],
    }
