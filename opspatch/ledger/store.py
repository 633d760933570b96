"""The ledger store: the `Ledger` class over one database (open, appends, queries, verify).

An operator must be able to say, after an incident, what changed where, by whom, when, with which
bytes before and after, and whether that record can be trusted. The store appends runs, per-host
steps, facts, outcomes and file versions (with the full pre-image bytes) as hash-chained events
(`chain.py`) in a SQLite file (`sqlite.py`, the default: WAL, `synchronous=FULL`) or a
PostgreSQL database (`postgres.py`), both behind the small interface of `database.py`:
append-only (triggers, and on PostgreSQL privileges), tamper-evident (`verify()`), and safe for
several processes, threads and controllers (every "read the last hash, insert the next event"
runs inside the database's `writing()` transaction, so the chain never forks). State is derived
when read, never updated (`events.py`: finished, running, interrupted, recovered, unknown). A
full or read-only filesystem is named as such (`failures.py`).

The names callers have always imported from here (`Ledger`, the records, `ControllerProcess`,
`canonical_json`, `event_hash`, `GENESIS_HASH`, `new_run_id`, `operator_identity`) still import
from here; `opspatch.ledger` re-exports the public ones. docs/ledger.md has the whole design.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, TypeVar

from opspatch import __version__
from opspatch.core.filechange import FileChange
from opspatch.core.hostfacts import HostFacts
from opspatch.core.jsonrecord import check_present
from opspatch.core.ledgerlocation import LedgerLocation
from opspatch.core.remedy import CliCommand, remedy_text
from opspatch.core.source import sha256_hex
from opspatch.core.vocabulary import (
    RECORDED_OUTCOMES,
    Command,
    EventKind,
    FileAction,
    Outcome,
    RunOutcome,
    Step,
    StepStatus,
)
from opspatch.errors import InputError, LedgerError, LedgerIntegrityError, LedgerUnreachable
from opspatch.ledger import lease_store
from opspatch.ledger.approvals import approvals_of, signed_in
from opspatch.ledger.chain import (
    GENESIS_HASH,
    ROW_COLUMNS,
    EventRow,
    canonical_json,
    event_hash,
    next_link,
    store_blob,
    verify_chain,
)
from opspatch.ledger.copy import copy_history
from opspatch.ledger.database import Database, open_database
from opspatch.ledger.events import (
    file_version,
    require_open_run,
    run_detail,
    run_summaries,
    select_events,
    start_event,
)
from opspatch.ledger.lineage import applied_versions
from opspatch.ledger.liveness import ControllerProcess, operator_identity
from opspatch.ledger.records import (
    FILE_ACTIONS,
    Approval,
    ContainerRecord,
    CopyReport,
    FileVersion,
    HostRecord,
    LeaseGrant,
    LeaseHolder,
    Machine,
    RunDetail,
    RunSummary,
    StepRecord,
    VerifyReport,
    file_change,
    new_run_id,
    require_sha256,
    require_word,
)
from opspatch.ledger.schema import (
    APPEND_ONLY_MESSAGE,
    BUSY_TIMEOUT_SECONDS,
    SCHEMA_VERSION,
)

__all__ = [
    "APPEND_ONLY_MESSAGE",
    "BUSY_TIMEOUT_SECONDS",
    "FILE_ACTIONS",
    "GENESIS_HASH",
    "SCHEMA_VERSION",
    "ControllerProcess",
    "FileVersion",
    "HostRecord",
    "Ledger",
    "Machine",
    "RunDetail",
    "RunSummary",
    "StepRecord",
    "VerifyReport",
    "canonical_json",
    "event_hash",
    "new_run_id",
    "operator_identity",
]


T = TypeVar("T")


def _utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _now_ms() -> int:
    return int(time.time() * 1000)


def _holder(lease: lease_store.Lease, now_ms: int) -> LeaseHolder:
    return LeaseHolder(
        identity=lease.identity,
        host=lease.host,
        run_id=lease.run_id,
        operator=lease.operator,
        controller=lease.controller,
        silent_seconds=lease.silent_ms(now_ms) / 1000,
        expires_after_seconds=lease.expires_after_ms / 1000,
    )


FIRST_RETRY_SECONDS = 0.2
"""The pause before a write whose server is gone is tried again; doubled each try after."""

LAST_RETRY_SECONDS = 2.0
"""The longest pause between two tries: a server back is found within this."""


@dataclass
class WritePatience:
    """How long a ledger's writes keep trying while its server is gone (`seconds`, 0: never),
    and since when the outage under way has lasted (`since`, monotonic; None: no outage). One
    per `Ledger.retrying` view, shared by every write through it: an outage is timed from its
    first failed write, so once it outlasted the patience no later write waits again."""

    seconds: float
    since: float | None = None

    def failed(self) -> float:
        """A try failed for want of the server: the seconds of patience left (0: give up)."""
        now = time.monotonic()
        if self.since is None:
            self.since = now
        return self.seconds - (now - self.since)

    def through(self) -> None:
        """A write got through: the outage, if any, is over."""
        self.since = None

    def given_up(self, exc: LedgerUnreachable, unknown: bool) -> LedgerUnreachable:
        """`exc`, saying how long the write was tried (and that a try lost at COMMIT may have
        committed, when one was)."""
        if self.seconds <= 0:
            return exc
        lasted = time.monotonic() - (self.since or time.monotonic())
        said = (
            "; a try lost at COMMIT may have committed: "
            f"`{remedy_text(CliCommand.LEDGER_SHOW, 'RUN')}` tells"
            if unknown and not exc.outcome_unknown
            else ""
        )
        return LedgerUnreachable(
            f"{exc.message} (tried again for {lasted:.0f} s, the run's lease expiry is "
            f"{self.seconds:g} s){said}",
            hint=exc.hint,
            outcome_unknown=exc.outcome_unknown or unknown,
        )


# ---------------------------------------------------------------------------------------------
# the ledger


@dataclass
class Ledger:
    """An open ledger (a SQLite file or a PostgreSQL database). Safe to share between threads;
    one per process is enough.

    Use `Ledger.open(location)`; close it with `close()` or a `with` block.
    """

    path: LedgerLocation
    _db: Database = field(repr=False)
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False)
    _warnings: tuple[str, ...] = ()
    _patience: WritePatience = field(default_factory=lambda: WritePatience(0.0), repr=False)
    _appended: list[str] | None = field(default=None, repr=False)
    """The hashes the write transaction under way appended (under `_lock`), for `_write`."""

    # -- opening --------------------------------------------------------------------------------

    @classmethod
    def open(cls, path: LedgerLocation) -> Ledger:
        """Open the ledger at `path`: a SQLite file (created if needed, with its parent
        directories and schema) or a PostgreSQL database (`PostgresLedger`, migrated by its
        owner with `opspatch ledger migrate`).

        Raises:
            LedgerError: the file cannot be created or opened (the message says when the
                filesystem is full or read-only), is not an SQLite database, the server refuses
                the connection, the schema is missing or was written by a newer opspatch, or the
                filesystem refuses WAL mode.
        """
        database, warnings = open_database(path)
        return cls(path=database.location, _db=database, _warnings=warnings)

    def retrying(self, seconds: float) -> Ledger:
        """This ledger (the same connection and lock) with writes tried again, with backoff,
        while its server is gone (`LedgerUnreachable`: a restart, a network cut), until one gets
        through or the outage has lasted `seconds`: a run's records, patient for its lease
        expiry (`runs.fleet.recorded.recorded_run`). Once an outage outlasted it, every write is
        tried once until one gets through again. Closing it closes this ledger.
        """
        return replace(self, _patience=WritePatience(seconds), _appended=None)

    def close(self) -> None:
        """Close the connection; safe to call twice."""
        with self._lock:
            self._db.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- writing --------------------------------------------------------------------------------

    def begin_run(
        self,
        *,
        command: Command,
        patch_id: str | None,
        patch_sha256: str | None,
        operator: str,
        command_line: str,
        hosts: Sequence[str],
        playbook: str | None = None,
        parent_run: str | None = None,
        inventories: Mapping[str, str] | None = None,
        approved_by: Sequence[str] | None = None,
    ) -> str:
        """Record the start of a run and return its new id.

        `command` is the opspatch command (`apply`, `rollback`, `recover`, ...); `parent_run` names
        the run this one rolls back or recovers; `inventories` names, per host, the inventory it
        was taken from (so that `recover` finds the same hosts when another inventory has a host
        of the same name, as `sandbox` and `sandbox-ssh` do). The controller's hostname, pid and process start
        time are recorded so the run can later be told apart as running or interrupted.
        `approved_by` names the principals whose signatures of the patch were verified before
        the run began (left out of the body when None, so older bodies stay byte-identical).

        Raises:
            ValueError: `command` is not a `Command` or `patch_sha256` is not a sha256.
            LedgerError: the ledger cannot be written.
        """
        command = require_word(Command, command, "command")
        if patch_sha256 is not None:
            require_sha256(patch_sha256, "patch_sha256")
        if isinstance(hosts, str):
            raise ValueError("hosts must be a sequence of host names, not one string")
        body = {
            "command": command.value,
            "patch_id": patch_id,
            "patch_sha256": patch_sha256,
            "playbook": playbook,
            "operator": operator,
            "command_line": command_line,
            "hosts": list(hosts),
            "parent_run": parent_run,
            "controller": ControllerProcess.current().to_json(),
            "opspatch_version": __version__,
        }
        if inventories is not None:
            body["inventories"] = dict(inventories)
        if approved_by is not None:
            body["approved_by"] = list(approved_by)

        def write(conn: Database) -> str:
            for _attempt in range(5):
                run_id = new_run_id()
                if start_event(conn, run_id) is None:
                    break
            else:  # pragma: no cover - 24 random bits colliding five times in one second
                raise LedgerError("could not pick an unused run id")
            if parent_run is not None and start_event(conn, parent_run) is None:
                raise LedgerError(f"parent run {parent_run} is not in the ledger")
            self._append(conn, run_id=run_id, kind=EventKind.RUN_STARTED, body=body)
            return run_id

        return self._write(write)

    def record_step(
        self,
        run_id: str,
        host: str,
        step: Step,
        status: StepStatus | str,
        seconds: float | None = None,
        detail: str = "",
    ) -> None:
        """Record that `host` went through `step` with `status` (a `StepStatus`: `started`, `ok`,
        `failed`, `skipped`).

        Raises:
            ValueError: `step` is not a `Step` or `status` not a step status.
            LedgerError: the run is unknown or finished, or the ledger cannot be written.
        """
        name = require_word(Step, step, "step")
        word = require_word(StepStatus, status, "status")
        body = {"step": name.value, "status": word.value, "seconds": seconds, "detail": detail}

        def write(conn: Database) -> None:
            require_open_run(conn, run_id)
            self._append(conn, run_id=run_id, kind=EventKind.STEP, host=host, body=body)

        self._write(write)

    def record_facts(self, run_id: str, host: str, facts: HostFacts | Mapping[str, Any]) -> None:
        """Record what was found on `host` (python, sglang, torch versions, GPUs, ...).

        A run records its `HostFacts`. A plain object (facts in an earlier opspatch's shape,
        which ledgers hold and `ledger show` prints as they are) is checked key by key: a key
        `HostFacts` names must hold its type (the machine lookup reads `machine_id` and
        `hostname`); other keys are kept as they are.

        Raises:
            ValueError: a key of `facts` that `HostFacts` names holds another type.
            TypeError, ValueError: `facts` is not JSON-serialisable.
            LedgerError: the run is unknown or finished, or the ledger cannot be written.
        """
        if isinstance(facts, HostFacts):
            body = {"facts": facts.to_json()}
        else:
            check_present(HostFacts, facts, "facts")
            body = {"facts": dict(facts)}
        canonical_json(body)  # fail before the transaction, with the caller's own error

        def write(conn: Database) -> None:
            require_open_run(conn, run_id)
            self._append(conn, run_id=run_id, kind=EventKind.FACTS, host=host, body=body)

        self._write(write)

    def record_file_version(
        self,
        run_id: str,
        host: str,
        *,
        path: str,
        sha256_before: str,
        sha256_after: str,
        mode: int,
        owner: str,
        pre_image: bytes,
        post_image: bytes | None = None,
        action: FileAction = FileAction.PATCH,
        container: ContainerRecord | None = None,
    ) -> FileVersion:
        """Record a change of `path` on `host`, storing the full bytes before it (and after it).

        Record it before the swap (backup step), so that a controller killed mid-swap still has
        the pre-image. `action` is `patch` or `restore`. `container` is the container the file
        is in (its id and creation time), for an engine in one. Returns what was recorded.

        Raises:
            ValueError: a hash is malformed, the bytes do not hash to the hashes given, or
                `action` is unknown.
            LedgerError: the run is unknown or finished, or the ledger cannot be written.
            LedgerIntegrityError: the blob store already holds different bytes under that hash.
        """
        action = require_word(FileAction, action, "action")
        require_sha256(sha256_before, "sha256_before")
        require_sha256(sha256_after, "sha256_after")
        if sha256_hex(pre_image) != sha256_before:
            raise ValueError("pre_image does not hash to sha256_before")
        if post_image is not None and sha256_hex(post_image) != sha256_after:
            raise ValueError("post_image does not hash to sha256_after")

        def write(conn: Database) -> EventRow:
            start = require_open_run(conn, run_id)
            body = {
                "patch_id": start.data["patch_id"],
                "action": action.value,
                "sha256_before": sha256_before,
                "sha256_after": sha256_after,
                "mode": int(mode),
                "owner": owner,
                "size_before": len(pre_image),
            }
            if container is not None:
                body["container"] = container.to_json()
            store_blob(conn, sha256_before, pre_image)
            if post_image is not None:
                store_blob(conn, sha256_after, post_image)
            return self._append(
                conn,
                run_id=run_id,
                kind=EventKind.FILE_VERSION,
                host=host,
                path=path,
                body=body,
                pre_image=sha256_before,
                post_image=sha256_after if post_image is not None else None,
            )

        return file_version(self._write(write))

    def record_host_outcome(
        self,
        run_id: str,
        host: str,
        outcome: Outcome | str,
        error: str | None = None,
        file: FileChange | None = None,
    ) -> None:
        """Record how `host` ended in this run (`applied`, `rolled-back`, `needs-attention`, ...).

        `outcome` is one of the `RECORDED_OUTCOMES` of the vocabulary. `file` is the file the
        host's run was about, as the JSON output shows it. A later outcome for the same host
        supersedes an earlier one (for example after `recover`).

        Raises:
            ValueError: `outcome` is not a recorded host outcome; `file` is not a `FileChange`.
            LedgerError: the run is unknown or finished, or the ledger cannot be written.
        """
        word = require_word(Outcome, outcome, "outcome", RECORDED_OUTCOMES)
        if file is not None and not isinstance(file, FileChange):
            raise ValueError(f"file must be a FileChange, got {type(file).__name__}")
        body = {
            "outcome": word.value,
            "error": error,
            "file": None if file is None else file.to_json(),
        }
        canonical_json(body)

        def write(conn: Database) -> None:
            require_open_run(conn, run_id)
            self._append(conn, run_id=run_id, kind=EventKind.HOST_OUTCOME, host=host, body=body)

        self._write(write)

    def finish_run(self, run_id: str, outcome: RunOutcome) -> None:
        """Record the end of a run with its overall outcome; nothing can be added to it after.

        Raises:
            ValueError: `outcome` is not a `RunOutcome`.
            LedgerError: the run is unknown or already finished, or the ledger cannot be written.
        """
        body = {"outcome": require_word(RunOutcome, outcome, "outcome").value}

        def write(conn: Database) -> None:
            require_open_run(conn, run_id)
            self._append(conn, run_id=run_id, kind=EventKind.RUN_FINISHED, body=body)

        self._write(write)

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
                hint=f"`{remedy_text(CliCommand.LEDGER_LIST)}` shows the runs",
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
            found = conn.execute("SELECT data FROM blobs WHERE sha256 = ?", (sha256,)).fetchone()
        if found is None:
            raise LedgerError(f"the ledger has no stored bytes with sha256 {sha256}")
        data = bytes(found[0])
        if sha256_hex(data) != sha256:
            raise LedgerIntegrityError(
                f"the stored bytes for sha256 {sha256} were altered (they hash to "
                f"{sha256_hex(data)})",
                hint=f"run `{remedy_text(CliCommand.LEDGER_VERIFY)}`",
            )
        return data

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

    def settings(self) -> dict[str, Any]:
        """The settings this connection runs with, as the database reports them.

        SQLite: `journal_mode` (`wal`), `synchronous` (2 = FULL), `foreign_keys` (1),
        `busy_timeout_ms`, `schema_version` (PRAGMA); PostgreSQL: `backend`, `server_version`,
        `synchronous_commit`, `fsync`, `role`, `schema_version`. What the durability promises
        rest on, for tests and `ledger verify`.
        """
        with self._reading() as conn:
            return conn.settings()

    def copy_to(self, target: Ledger) -> CopyReport:
        """Append to `target` every event and blob of this ledger it does not hold yet, as they
        were written (`copy.py`): the same chain, verified on both sides to the same head.

        Raises:
            InputError: `target` holds a different history, or is this ledger.
            LedgerIntegrityError: this ledger does not verify, or the copy does not.
            LedgerError: either ledger cannot be read or written.
        """
        if str(target.path) == str(self.path):
            raise InputError(f"--from and --to are the same ledger {self.path}")
        with self._lock, target._lock:
            try:
                return copy_history(self._db, target._db)
            except (*self._db.errors, *target._db.errors) as exc:
                raise target._db.failure(exc, "copy into") from exc

    # -- approvals (history: `approve` runs) -----------------------------------------------------

    def record_approval(
        self,
        *,
        patch_id: str | None,
        patch_sha256: str,
        principal: str,
        signature: str,
        operator: str,
        command_line: str,
    ) -> str:
        """Record that `principal` signed `patch_sha256` (`signature`, armored OpenSSH): a finished
        run with command `approve` and one `sign` step; returns the run id.

        Raises:
            ValueError: `patch_sha256` is not a sha256, or `principal` is empty.
            LedgerError: the ledger cannot be written.
        """
        if not principal.strip():
            raise ValueError("principal must not be empty")
        run_id = self.begin_run(
            command=Command.APPROVE,
            patch_id=patch_id,
            patch_sha256=patch_sha256,
            operator=operator,
            command_line=command_line,
            hosts=[],
        )
        self.record_step(run_id, principal, Step.SIGN, StepStatus.OK, detail=signature)
        self.finish_run(run_id, RunOutcome.OK)
        return run_id

    def approvals(self, patch_sha256: str) -> list[Approval]:
        """Every approval recorded for `patch_sha256`, oldest first (verified by the caller).

        Raises:
            LedgerError: the ledger cannot be read.
        """
        with self._reading() as conn:
            return approvals_of(conn, [patch_sha256]).get(patch_sha256, [])

    # -- leases (mutable state beside the history; each change recorded as a step) ---------------

    def take_leases(
        self,
        run_id: str,
        identities: Mapping[str, str],
        *,
        expires_after: float,
        taking_over: Collection[str] = (),
    ) -> LeaseGrant:
        """Lease each host of `identities` (inventory name -> host identity) to `run_id`, which
        must heart-beat (`renew_leases`) more often than every `expires_after` seconds.

        A live lease of another run refuses the whole request (nothing is taken: the grant's
        `refused` names every such holder); an expired one is taken over, and so is one of the
        runs in `taking_over` (the caller knows their controllers are gone: a recover of runs
        this machine saw die). Each lease taken is recorded as a `lease` step of the run in the
        same transaction, naming any run it was taken over from.

        Raises:
            LedgerError: the run is unknown or finished, or the ledger cannot be written.
        """
        if expires_after <= 0:
            raise ValueError(f"expires_after must be positive, got {expires_after}")

        def write(conn: Database) -> LeaseGrant:
            now = _now_ms()  # each try's own: a retried one takes its leases when it does
            start = require_open_run(conn, run_id).data
            current = {
                lease.identity: lease
                for lease in lease_store.leases_on(conn, sorted(set(identities.values())))
            }
            others = {i: lease for i, lease in current.items() if lease.run_id != run_id}
            refused = tuple(
                _holder(lease, now)
                for lease in others.values()
                if lease.live(now) and lease.run_id not in taking_over
            )
            if refused:
                return LeaseGrant(refused=refused)
            taken = [
                lease_store.Lease(
                    identity=identity,
                    host=host,
                    run_id=run_id,
                    operator=str(start["operator"]),
                    controller=str(start["controller"]["hostname"]),
                    taken_at_ms=now,
                    heartbeat_at_ms=now,
                    expires_after_ms=int(expires_after * 1000),
                )
                for host, identity in identities.items()
            ]
            lease_store.put(conn, taken)
            taken_over = []
            for lease in taken:
                before = others.get(lease.identity)
                detail = f"took the lease on {lease.identity}"
                if before is not None:
                    taken_over.append(_holder(before, now))
                    why = (
                        f"expired after {before.expires_after_ms / 1000:g} s"
                        if not before.live(now)
                        else "its controller is gone"
                    )
                    detail += f", taken over from {taken_over[-1].describe()} ({why})"
                body = {
                    "step": Step.LEASE.value,
                    "status": StepStatus.OK.value,
                    "seconds": None,
                    "detail": detail,
                }
                self._append(conn, run_id=run_id, kind=EventKind.STEP, host=lease.host, body=body)
            return LeaseGrant(taken_over=tuple(taken_over))

        return self._write(write)

    def renew_leases(self, run_id: str) -> int:
        """A heartbeat of `run_id`: its leases renewed; how many it still holds (fewer than it
        took means another run took some over after this one went quiet too long).

        Tried once, never again within a run's patience (`retrying`): the heartbeat beats again
        on its own, and says so when one does not get through.

        Raises:
            LedgerError: the ledger cannot be written.
        """
        return self._write(lambda conn: lease_store.renew(conn, run_id, _now_ms()), patient=False)

    def give_back_leases(self, run_id: str) -> int:
        """Remove `run_id`'s leases, each recorded as a `lease` step while the run is open (a
        finished run's leases are removed unrecorded); how many it held.

        Raises:
            LedgerError: the ledger cannot be written.
        """

        def write(conn: Database) -> int:
            held = lease_store.give_back(conn, run_id)
            if held and not select_events(
                conn, f"run_id = ? AND kind = '{EventKind.RUN_FINISHED}'", (run_id,)
            ):
                for lease in held:
                    body = {
                        "step": Step.LEASE.value,
                        "status": StepStatus.OK.value,
                        "seconds": None,
                        "detail": f"gave the lease on {lease.identity} back",
                    }
                    self._append(
                        conn, run_id=run_id, kind=EventKind.STEP, host=lease.host, body=body
                    )
            return len(held)

        return self._write(write)

    def leases_of(self, run_ids: Sequence[str]) -> list[LeaseHolder]:
        """The leases any of `run_ids` holds, live or expired, as this machine's clock judges.

        Raises:
            LedgerError: the ledger cannot be read.
        """
        now = _now_ms()
        with self._reading() as conn:
            return [_holder(lease, now) for lease in lease_store.leases_of(conn, list(run_ids))]

    # -- integrity ------------------------------------------------------------------------------

    def verify(self) -> VerifyReport:
        """Walk the whole chain: every hash, every link, every id, every blob (`chain.py`).

        Raises:
            LedgerError: the ledger cannot be read.
        """
        with self._reading() as conn:
            return verify_chain(conn, self._warnings)

    def ensure_intact(self) -> VerifyReport:
        """`verify()`, raising if the chain is broken; apply, rollback and recover call it first.

        Raises:
            LedgerIntegrityError: the chain is broken; the message names the first broken link.
        """
        report = self.verify()
        if not report.ok:
            raise LedgerIntegrityError(
                f"the ledger {self.path} is not intact at event {report.first_broken}: "
                f"{report.reason}",
                first_broken=report.first_broken,
                hint="nothing was changed; run "
                f"`{remedy_text(CliCommand.LEDGER_VERIFY)}` and find out who edited "
                "the ledger before trusting it again",
            )
        return report

    # -- internals ------------------------------------------------------------------------------

    def _write(self, work: Callable[[Database], T], *, patient: bool = True) -> T:
        """`work` in one write transaction (`Database.writing`: no other writer between read
        and insert); what it returned.

        Tried again while the server is gone and this ledger's patience lasts (`retrying`;
        `patient=False`: once). Nothing is ever written twice: a try that failed before its
        COMMIT left nothing on the server (it rolls back what it never saw committed); one lost
        at COMMIT may have committed, so the next try first looks, in its own transaction
        under the chain lock (the lost one has ended by then), for the last event the lost one
        appended, by its hash (unique: it covers the id, the link and the content). There, the
        write is done and its result is the lost try's; not there, `work` runs again and
        appends afresh, chained to the head as it then is.
        """
        unknown: tuple[str, T] | None = None  # (last hash, result) of a try lost at COMMIT
        delay = FIRST_RETRY_SECONDS
        while True:
            appended: list[str] = []
            produced: list[T] = []
            try:
                with self._lock:
                    self._appended = appended
                    try:
                        with self._db.writing():
                            if unknown is not None and self._landed(unknown[0]):
                                produced.append(unknown[1])
                            else:
                                produced.append(work(self._db))
                    finally:
                        self._appended = None
            except LedgerUnreachable as exc:
                if exc.outcome_unknown and appended and produced:
                    unknown = (appended[-1], produced[-1])
                left = self._patience.failed() if patient else 0.0
                if left <= 0:
                    raise self._patience.given_up(exc, unknown is not None) from exc
                time.sleep(min(delay, left))
                delay = min(delay * 2, LAST_RETRY_SECONDS)
                continue
            self._patience.through()
            return produced[-1]

    def _landed(self, event_hash: str) -> bool:
        """Whether the event with `event_hash` is in the ledger (inside `writing()`)."""
        try:
            found = self._db.execute("SELECT 1 FROM events WHERE hash = ?", (event_hash,))
            return found.fetchone() is not None
        except self._db.errors as exc:
            raise self._db.failure(exc, "write") from exc

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Database]:
        """One write transaction (`Database.writing`): no other writer between read and insert."""
        with self._lock, self._db.writing():
            yield self._db

    @contextlib.contextmanager
    def _reading(self) -> Iterator[Database]:
        """The database, for reads; turns what cannot be read into a `LedgerError`."""
        with self._lock:
            try:
                with self._db.reading():
                    yield self._db
            except self._db.errors as exc:
                raise self._db.failure(exc, "read") from exc
            except (KeyError, TypeError, ValueError) as exc:
                # Only decoding raises these here: an event body this opspatch cannot read.
                raise LedgerError(
                    f"the ledger {self.path} holds an event this opspatch cannot read: {exc}",
                    hint="was it written by a newer opspatch? upgrade, and run "
                    f"`{remedy_text(CliCommand.LEDGER_VERIFY)}`",
                ) from exc

    def _append(
        self,
        conn: Database,
        *,
        run_id: str,
        kind: EventKind,
        body: Mapping[str, Any],
        host: str | None = None,
        path: str | None = None,
        pre_image: str | None = None,
        post_image: str | None = None,
    ) -> EventRow:
        """Insert one event chained to the last one; the caller is inside `writing()`."""
        try:
            event_id, prev_hash = next_link(conn)
            unsealed = EventRow(
                id=event_id,
                run_id=run_id,
                kind=EventKind(kind).value,  # a plain word: a driver may adapt an enum otherwise
                host=host,
                path=path,
                recorded_at=_utc_now(),
                body=canonical_json(dict(body)),
                pre_image=pre_image,
                post_image=post_image,
                prev_hash=prev_hash,
                hash="",
            )
            row = replace(unsealed, hash=unsealed.computed_hash())
            conn.execute(
                f"INSERT INTO events ({ROW_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                row.values(),
            )
        except conn.errors as exc:
            raise conn.failure(exc, "write") from exc
        if self._appended is not None:
            self._appended.append(row.hash)
        return row
