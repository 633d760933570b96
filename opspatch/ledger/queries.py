"""Reading the ledger back: the runs (newest, a run's ancestry, one run in full), a file's
history on a host, the outcomes and steps recorded on a host, stored bytes, the approvals of a
patch."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from opspatch.core.filechange import FileChange
from opspatch.core.remedy import remedy_text
from opspatch.core.vocabulary import Command, EventKind, Outcome, Step
from opspatch.errors import InputError
from opspatch.ledger.approvals import approvals_of, signed_in
from opspatch.ledger.chain import EventRow, canonical_json, stored_blob
from opspatch.ledger.database import Database
from opspatch.ledger.events import (
    file_version,
    run_detail,
    run_summaries,
    select_events,
    start_event,
)
from opspatch.ledger.lineage import applied_versions
from opspatch.ledger.records import (
    Approval,
    FileVersion,
    Machine,
    RunDetail,
    RunSummary,
    StepRecord,
    file_change,
)
from opspatch.ledger.transactions import Transactions


class Queries(Transactions):
    """The reads: `list_runs`, `run_chain`, `resolve_run_id`, `get_run`, `blob`, `file_history`,
    `outcomes_since`, `last_applied`, `host_steps`, `approvals`."""

    # -- reading --------------------------------------------------------------------------------

    def list_runs(self, limit: int = 50) -> list[RunSummary]:
        """The newest `limit` runs, newest first, each with its derived status.

        Raises:
            LedgerError: the ledger cannot be read.
        """
        with self._reading() as conn:
            starts = select_events(
                conn, f"kind = '{EventKind.RUN_STARTED}' ORDER BY id DESC LIMIT ?", (limit,)
            )
            return run_summaries(conn, starts)

    def run_chain(self, run_id: str) -> list[RunSummary]:
        """The run and its ancestors through `parent_run`: the run first, its oldest ancestor last.

        For a `recover` of a `recover` of an `apply` that is `[recover 2, recover 1, apply]`: what
        a recover must reconcile when the recover before it was itself interrupted. `run_id` may
        be a unique prefix. Each summary carries its derived status.

        Raises:
            InputError: no run (or several) matches `run_id`.
            LedgerError: the ledger cannot be read.
        """
        current: str | None = self.resolve_run_id(run_id)
        with self._reading() as conn:
            starts: list[EventRow] = []
            while current is not None and all(s.run_id != current for s in starts):
                start = start_event(conn, current)
                if start is None:  # only after tampering: begin_run checks the parent exists
                    break
                starts.append(start)
                current = start.data["parent_run"]
            return run_summaries(conn, starts)

    def resolve_run_id(self, run_id_or_prefix: str) -> str:
        """The full id of the one run whose id is or starts with `run_id_or_prefix`.

        Raises:
            InputError: no run, or more than one run, matches.
        """
        prefix = run_id_or_prefix.strip()
        with self._reading() as conn:
            matches = [
                str(r[0])
                for r in conn.execute(
                    f"SELECT run_id FROM events WHERE kind = '{EventKind.RUN_STARTED}' "
                    "AND substr(run_id, 1, ?) = ? ORDER BY id DESC LIMIT 6",
                    (len(prefix), prefix),
                )
            ]
        if prefix and len(matches) == 1:
            return matches[0]
        if prefix in matches:
            return prefix
        if not matches or not prefix:
            raise InputError(
                f"no run {run_id_or_prefix!r} in the ledger {self.path}",
                hint=f"`{remedy_text(Command.LEDGER_LIST)}` shows the runs",
            )
        raise InputError(
            f"{run_id_or_prefix!r} matches several runs: {', '.join(matches[:5])}",
            hint="give more of the run id",
        )

    def get_run(self, run_id: str) -> RunDetail:
        """One run with every host's steps, latest facts, file versions and outcome.

        `run_id` may be a unique prefix. Hosts come in the order the run named them, then any
        other host its events mention.

        Raises:
            InputError: no run (or several) matches `run_id`.
            LedgerError: the ledger cannot be read.
        """
        full_id = self.resolve_run_id(run_id)
        with self._reading() as conn:
            return signed_in(conn, run_detail(conn, full_id))

    def blob(self, sha256: str) -> bytes:
        """The bytes stored under `sha256`, re-hashed before they are returned.

        Raises:
            LedgerError: no blob has that hash.
            LedgerIntegrityError: the stored bytes no longer hash to `sha256`.
        """
        with self._reading() as conn:
            return stored_blob(conn, sha256)

    def file_history(
        self, host: str, path: str | None = None, *, machine: Machine | None = None
    ) -> list[FileVersion]:
        """Every change of `path` (or of any file) on `host` that may have been written, newest
        first.

        A `patch` version is recorded (with its pre-image) before the swap, so that a controller
        killed during the swap leaves what recover needs. A run whose outcome on the host is
        `failed` changed nothing there by definition (the swap was refused: the file had changed
        since it was read, the host compile failed...): its versions are not changes opspatch
        made and are left out, so status and rollback never say "changed since run R wrote it"
        about a run that wrote nothing.

        With `path` and `machine` (the host's machine id and hostname, from its facts), the
        changes of that file recorded under another host name whose run's facts say the same
        machine are included: one machine reached through two inventories is one host. A
        version's `host` is the name it was recorded under.

        Raises:
            LedgerError: the ledger cannot be read.
        """
        where = f"kind = '{EventKind.FILE_VERSION}'"
        params: tuple[Any, ...] = ()
        if path is not None:
            where += " AND path = ?"
            params += (path,)
        with self._reading() as conn:
            same_machine = (
                self._runs_on_machine(conn, machine)
                if machine is not None and path is not None
                else set()
            )
            hosts = {host} | {name for _, name in same_machine}
            marks = ", ".join("?" for _ in hosts)
            versions = [
                file_version(row)
                for row in select_events(
                    conn,
                    f"{where} AND host IN ({marks}) ORDER BY id DESC",
                    (*params, *sorted(hosts)),
                )
                if row.host == host or (row.run_id, row.host) in same_machine
            ]
            unwritten = self._changed_nothing(conn, {(v.run_id, v.host) for v in versions})
        return [v for v in versions if (v.run_id, v.host) not in unwritten]

    @staticmethod
    def _runs_on_machine(conn: Database, machine: Machine) -> set[tuple[str, str]]:
        """`(run_id, host)` of every run whose recorded facts of a host say `machine`."""
        # The canonical body has no spaces: LIKE is a cheap filter before the bodies are parsed.
        rows = select_events(
            conn,
            f"kind = '{EventKind.FACTS}' AND body LIKE ?",
            (f'%"machine_id":{canonical_json(machine.machine_id)}%',),
        )
        return {
            (row.run_id, row.host)
            for row in rows
            if row.host is not None and machine.said_by(row.data["facts"])
        }

    @staticmethod
    def _changed_nothing(conn: Database, runs: set[tuple[str, str]]) -> set[tuple[str, str]]:
        """Those `(run_id, host)` of `runs` whose last recorded outcome on the host is `failed`
        (nothing changed there)."""
        if not runs:
            return set()
        run_ids = sorted({run_id for run_id, _ in runs})
        marks = ", ".join("?" for _ in run_ids)
        rows = select_events(
            conn, f"kind = '{EventKind.HOST_OUTCOME}' AND run_id IN ({marks}) ORDER BY id", run_ids
        )
        last = {(row.run_id, row.host): row.data.get("outcome") for row in rows}
        return {pair for pair in runs if last.get(pair) == Outcome.FAILED}

    def outcomes_since(
        self, hosts: Sequence[str], event_id: int
    ) -> list[tuple[str, Outcome, FileChange | None]]:
        """`(run_id, outcome, file)` of every host outcome recorded on any of `hosts` (the names
        one machine was recorded under) after the event `event_id` (a file version), oldest
        first: whether any run concluded anything about that change since (`status` tells a
        change proven by a smoke from one never proven).

        Raises:
            LedgerError: the ledger cannot be read.
        """
        names = sorted(set(hosts))
        marks = ", ".join("?" for _ in names)
        with self._reading() as conn:
            rows = select_events(
                conn,
                f"kind = '{EventKind.HOST_OUTCOME}' AND host IN ({marks}) AND id > ? ORDER BY id",
                (*names, event_id),
            )
        return [
            (row.run_id, Outcome(row.data["outcome"]), file_change(row.data.get("file")))
            for row in rows
        ]

    def last_applied(self, host: str, path: str, patch_id: str) -> FileVersion | None:
        """The newest `patch` change that `patch_id` made to `path` on `host` and that the same
        run did not restore afterwards; None if there is none.

        Rollback restores its pre-image when the live file still hashes to its `sha256_after`;
        status compares the live hash with both of its hashes (applied, not applied, drifted).
        A later rollback run does not hide it: the live hash tells whether it is still in place.

        Raises:
            LedgerError: the ledger cannot be read.
        """
        found = applied_versions(self.file_history(host, path), patch_id)
        return found[0] if found else None

    def host_steps(self, host: str, steps: Collection[Step]) -> list[tuple[str, StepRecord]]:
        """`(run_id, step)` of every step named in `steps` that any run recorded on `host`,
        newest first, its `started` records included (what a run that died part-way began).

        Raises:
            LedgerError: the ledger cannot be read.
        """
        wanted = set(steps)
        with self._reading() as conn:
            rows = select_events(
                conn, f"kind = '{EventKind.STEP}' AND host = ? ORDER BY id DESC", (host,)
            )
        return [
            (
                row.run_id,
                StepRecord.from_json(
                    {**row.data, "event_id": row.id, "recorded_at": row.recorded_at}
                ),
            )
            for row in rows
            if row.data.get("step") in wanted
        ]

    # -- approvals (history: `approve` runs) -----------------------------------------------------

    def approvals(self, patch_sha256: str) -> list[Approval]:
        """Every approval recorded for `patch_sha256`, oldest first (verified by the caller).

        Raises:
            LedgerError: the ledger cannot be read.
        """
        with self._reading() as conn:
            return approvals_of(conn, [patch_sha256]).get(patch_sha256, [])
