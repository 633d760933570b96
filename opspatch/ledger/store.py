"""The ledger: an append-only, hash-chained SQLite record of everything opspatch changed.

Why it exists: after an incident an operator must be able to say what changed where, by whom,
when, with which bytes before and after, and whether the record itself can be trusted. So the
ledger holds runs (patch id and patch file hash, operator, command line, outcome), per-host steps
with timings, host facts, host outcomes, and file versions with the full pre-image bytes (the
last resort for a rollback when a host's own backup is gone).

How it stays trustworthy:

- Durable: WAL journal with `synchronous=FULL`, so a committed event survives a power cut.
- Append-only: triggers refuse UPDATE and DELETE on every table (`events`, `blobs`).
- Tamper-evident: every event row carries `prev_hash` and `hash = sha256(canonical row content
  + prev_hash)`; the first event chains to 64 zeros. File bytes live in a content-addressed
  `blobs` table (sha256 -> bytes) and events name them by sha256, so the chain covers them;
  `verify()` re-hashes every blob too. A deleted tail is caught by SQLite's AUTOINCREMENT
  sequence, which remembers the highest id ever handed out.
- Concurrency-safe: several processes (two operators on one controller) and several threads (a
  rollout's worker pool) may append at once. "Read the last hash, insert the next event" runs
  inside `BEGIN IMMEDIATE`, so the chain never forks; a busy timeout makes writers wait.
- State is derived, never updated: a run is `finished` when it has a finish event, `running` when
  it has none and the process that began it is still alive on this controller (pid and process
  start time, so a reused pid does not count), `interrupted` when that process is gone (for
  example after SIGKILL), and `unknown` when it was begun on another controller.

Everything the queries return is a frozen dataclass with `to_json()`; `RunDetail.from_json`
reads one back. See docs/ledger.md for the schema and the hashing rules.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import re
import secrets
import socket
import sqlite3
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from opspatch import __version__
from opspatch.core.source import sha256_hex
from opspatch.errors import InputError, LedgerError, LedgerIntegrityError

SCHEMA_VERSION = 1
GENESIS_HASH = "0" * 64
BUSY_TIMEOUT_SECONDS = 30.0
APPEND_ONLY_MESSAGE = "opspatch ledger is append-only"

# Host outcomes the rollout reports (architecture.md); others are accepted if they are tokens.
KNOWN_HOST_OUTCOMES = frozenset(
    {
        "applied",
        "already-applied",
        "rolled-back",
        "restored",
        "failed",
        "skipped",
        "needs-attention",
    }
)
FILE_ACTIONS = frozenset({"patch", "restore"})
RUN_STATUSES = ("running", "interrupted", "finished", "unknown")

_EVENT_KINDS = ("run-started", "step", "facts", "file-version", "host-outcome", "run-finished")
_HISTORY_TABLES = ("events", "blobs")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_TOKEN_RE = re.compile(r"^[a-z][a-z0-9]*(?:-[a-z0-9]+)*$")
_RUN_ID_RE = re.compile(r"^\d{8}T\d{6}Z-[0-9a-f]{6}$")

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS blobs (
    sha256 TEXT PRIMARY KEY CHECK (length(sha256) = 64),
    size   INTEGER NOT NULL,
    data   BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id      TEXT NOT NULL,
    kind        TEXT NOT NULL CHECK (kind IN ({", ".join(repr(k) for k in _EVENT_KINDS)})),
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


# ---------------------------------------------------------------------------------------------
# small pure helpers


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


def new_run_id(now: datetime | None = None) -> str:
    """A sortable, unique run id such as `20261130T025012Z-3f9a1c` (UTC second + 24 random bits)."""
    moment = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    return f"{moment:%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"


def operator_identity() -> str:
    """`user@controller-hostname`: who ran a command, as the ledger records it.

    Falls back to `uid<N>` when the user has no name (containers without a passwd entry).
    """
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid{os.getuid()}"
    return f"{user}@{socket.gethostname()}"


def _utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _require_sha256(value: str, what: str) -> None:
    if not _SHA256_RE.match(value):
        raise ValueError(f"{what} must be 64 lower-case hex digits, got {value!r}")


def _require_token(value: str, what: str) -> None:
    if not _TOKEN_RE.match(value):
        raise ValueError(f"{what} must be a lower-case kebab-case word, got {value!r}")


# ---------------------------------------------------------------------------------------------
# the controller process that began a run


@dataclass(frozen=True)
class ControllerProcess:
    """The process that began a run: controller hostname, pid, and a start-time token.

    `start_token` is `<boot id>/<start time in clock ticks>` from /proc on Linux (None elsewhere):
    a pid alone can be reused after the process dies; pid + boot + start time cannot.
    """

    hostname: str
    pid: int
    start_token: str | None

    @classmethod
    def current(cls) -> ControllerProcess:
        """This process."""
        return cls(socket.gethostname(), os.getpid(), _process_start_token(os.getpid()))

    def is_alive(self) -> bool | None:
        """True if this process still runs, False if it is gone, None if it ran elsewhere."""
        if self.hostname != socket.gethostname():
            return None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # it exists but belongs to someone else
        if _process_is_zombie(self.pid):
            return False
        if self.start_token is None:
            return True
        return _process_start_token(self.pid) == self.start_token

    def to_json(self) -> dict[str, Any]:
        return {"hostname": self.hostname, "pid": self.pid, "start_token": self.start_token}


def _read_proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (state first); None if unreadable."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    # The command name is in parentheses and may itself contain spaces or parentheses.
    return text[text.rfind(")") + 1 :].split()


def _process_is_zombie(pid: int) -> bool:
    # A killed child nobody has reaped yet still answers kill(pid, 0); it is not running.
    fields = _read_proc_stat(pid)
    return fields is not None and len(fields) > 0 and fields[0] in ("Z", "X")


def _process_start_token(pid: int) -> str | None:
    fields = _read_proc_stat(pid)
    if not fields or len(fields) < 20:
        return None
    try:
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
    except OSError:
        boot_id = "unknown-boot"
    return f"{boot_id}/{fields[19]}"  # field 22 of stat: start time in clock ticks since boot


# ---------------------------------------------------------------------------------------------
# what the queries return


@dataclass(frozen=True)
class StepRecord:
    """One step a host went through (lock, inspect, swap, restart, ready, smoke, ...)."""

    event_id: int
    step: str
    status: str
    seconds: float | None
    detail: str
    recorded_at: str

    def to_json(self) -> dict[str, Any]:
        return {
            "event_id": self.event_id,
            "step": self.step,
            "status": self.status,
            "seconds": self.seconds,
            "detail": self.detail,
            "recorded_at": self.recorded_at,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StepRecord:
        return cls(
            event_id=int(data["event_id"]),
            step=str(data["step"]),
            status=str(data["status"]),
            seconds=None if data["seconds"] is None else float(data["seconds"]),
            detail=str(data["detail"]),
            recorded_at=str(data["recorded_at"]),
        )


@dataclass(frozen=True)
class FileVersion:
    """One change of one file on one host, with the bytes needed to undo it.

    `action` is `patch` (the patched text was swapped in) or `restore` (earlier bytes were put
    back). `pre_image_sha256` names the full bytes before the change in the blob store (always
    stored; equal to `sha256_before`); `post_image_sha256` names the bytes after it when they were
    stored too.
    """

    event_id: int
    run_id: str
    patch_id: str | None
    host: str
    path: str
    action: str
    sha256_before: str
    sha256_after: str
    mode: int
    owner: str
    size_before: int
    pre_image_sha256: str
    post_image_sha256: str | None
    recorded_at: str

    def to_json(self) -> dict[str, Any]:
        return {
            "event_id": self.event_id,
            "run_id": self.run_id,
            "patch_id": self.patch_id,
            "host": self.host,
            "path": self.path,
            "action": self.action,
            "sha256_before": self.sha256_before,
            "sha256_after": self.sha256_after,
            "mode": self.mode,
            "owner": self.owner,
            "size_before": self.size_before,
            "pre_image_sha256": self.pre_image_sha256,
            "post_image_sha256": self.post_image_sha256,
            "recorded_at": self.recorded_at,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FileVersion:
        return cls(
            event_id=int(data["event_id"]),
            run_id=str(data["run_id"]),
            patch_id=None if data["patch_id"] is None else str(data["patch_id"]),
            host=str(data["host"]),
            path=str(data["path"]),
            action=str(data["action"]),
            sha256_before=str(data["sha256_before"]),
            sha256_after=str(data["sha256_after"]),
            mode=int(data["mode"]),
            owner=str(data["owner"]),
            size_before=int(data["size_before"]),
            pre_image_sha256=str(data["pre_image_sha256"]),
            post_image_sha256=(
                None if data["post_image_sha256"] is None else str(data["post_image_sha256"])
            ),
            recorded_at=str(data["recorded_at"]),
        )


@dataclass(frozen=True)
class HostRecord:
    """Everything one run recorded about one host; `last_step` says where it stopped."""

    host: str
    steps: tuple[StepRecord, ...]
    facts: dict[str, Any] | None
    file_versions: tuple[FileVersion, ...]
    outcome: str | None
    error: str | None
    file: dict[str, Any] | None

    @property
    def last_step(self) -> StepRecord | None:
        return self.steps[-1] if self.steps else None

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "outcome": self.outcome,
            "error": self.error,
            "file": self.file,
            "last_step": None if self.last_step is None else self.last_step.to_json(),
            "steps": [s.to_json() for s in self.steps],
            "facts": self.facts,
            "file_versions": [v.to_json() for v in self.file_versions],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> HostRecord:
        return cls(
            host=str(data["host"]),
            steps=tuple(StepRecord.from_json(s) for s in data["steps"]),
            facts=None if data["facts"] is None else dict(data["facts"]),
            file_versions=tuple(FileVersion.from_json(v) for v in data["file_versions"]),
            outcome=None if data["outcome"] is None else str(data["outcome"]),
            error=None if data["error"] is None else str(data["error"]),
            file=None if data["file"] is None else dict(data["file"]),
        )


@dataclass(frozen=True)
class RunSummary:
    """One run as `ledger list` shows it, with its derived status.

    `status` is one of `running`, `interrupted`, `finished`, `unknown` (begun on another
    controller, whose processes this one cannot see); `outcome` is set only when finished.
    """

    run_id: str
    command: str
    patch_id: str | None
    patch_sha256: str | None
    playbook: str | None
    operator: str
    command_line: str
    hosts: tuple[str, ...]
    parent_run: str | None
    controller: ControllerProcess
    opspatch_version: str
    started_at: str
    finished_at: str | None
    status: str
    outcome: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "command": self.command,
            "patch_id": self.patch_id,
            "patch_sha256": self.patch_sha256,
            "playbook": self.playbook,
            "operator": self.operator,
            "command_line": self.command_line,
            "hosts": list(self.hosts),
            "parent_run": self.parent_run,
            "controller": self.controller.to_json(),
            "opspatch_version": self.opspatch_version,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "status": self.status,
            "outcome": self.outcome,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunSummary:
        controller = data["controller"]
        return cls(
            run_id=str(data["run_id"]),
            command=str(data["command"]),
            patch_id=data["patch_id"],
            patch_sha256=data["patch_sha256"],
            playbook=data["playbook"],
            operator=str(data["operator"]),
            command_line=str(data["command_line"]),
            hosts=tuple(str(h) for h in data["hosts"]),
            parent_run=data["parent_run"],
            controller=ControllerProcess(
                str(controller["hostname"]), int(controller["pid"]), controller["start_token"]
            ),
            opspatch_version=str(data["opspatch_version"]),
            started_at=str(data["started_at"]),
            finished_at=data["finished_at"],
            status=str(data["status"]),
            outcome=data["outcome"],
        )


@dataclass(frozen=True)
class RunDetail:
    """A run with every host's steps, facts, file versions and outcome (`ledger show`)."""

    summary: RunSummary
    hosts: tuple[HostRecord, ...]

    @property
    def run_id(self) -> str:
        return self.summary.run_id

    def host(self, name: str) -> HostRecord:
        """The record of host `name`. Raises KeyError if the run never mentioned it."""
        for record in self.hosts:
            if record.host == name:
                return record
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return {**self.summary.to_json(), "host_records": [h.to_json() for h in self.hosts]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunDetail:
        return cls(
            summary=RunSummary.from_json(data),
            hosts=tuple(HostRecord.from_json(h) for h in data["host_records"]),
        )


@dataclass(frozen=True)
class VerifyReport:
    """What `verify()` found: ok, how much it checked, and the first broken link if any.

    `first_broken` is the id of the first event whose hash, link, or blobs do not check out (for
    a deleted tail: the first missing id). `head_hash` is the hash of the last event, worth
    writing down elsewhere: a ledger rewritten wholesale from that point on cannot reproduce it.
    `warnings` are findings that do not break the chain (append-only triggers that were missing
    and have been re-created when the ledger was opened).
    """

    ok: bool
    events_checked: int
    blobs_checked: int
    first_broken: int | None
    reason: str | None
    head_hash: str
    warnings: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "events_checked": self.events_checked,
            "blobs_checked": self.blobs_checked,
            "first_broken": self.first_broken,
            "reason": self.reason,
            "head_hash": self.head_hash,
            "warnings": list(self.warnings),
        }


# ---------------------------------------------------------------------------------------------
# the ledger


@dataclass(frozen=True)
class _Row:
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
        loaded: dict[str, Any] = json.loads(self.body)
        return loaded


_ROW_COLUMNS = (
    "id, run_id, kind, host, path, recorded_at, body, pre_image, post_image, prev_hash, hash"
)


@dataclass
class Ledger:
    """An open ledger file. Safe to share between threads; one per process is enough.

    Use `Ledger.open(path)`; close it with `close()` or a `with` block.
    """

    path: Path
    _conn: sqlite3.Connection = field(repr=False)
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False)
    _warnings: tuple[str, ...] = ()

    # -- opening --------------------------------------------------------------------------------

    @classmethod
    def open(cls, path: Path) -> Ledger:
        """Open (creating if needed) the ledger at `path`, with its parent directories and schema.

        Raises:
            LedgerError: the file cannot be created or opened, is not an SQLite database, was
                written by a newer opspatch, or the filesystem refuses WAL mode.
        """
        path = Path(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(
                str(path),
                timeout=BUSY_TIMEOUT_SECONDS,
                isolation_level=None,  # autocommit; transactions are explicit BEGIN IMMEDIATE
                check_same_thread=False,  # a rollout's worker threads share it under _lock
            )
        except (OSError, sqlite3.Error) as exc:
            raise LedgerError(
                f"cannot open the ledger {path}: {exc}",
                hint="check the path and its permissions, or move it with --ledger / OPSPATCH_LEDGER",
            ) from exc
        try:
            warnings = _prepare(conn, path)
        except LedgerError:
            conn.close()
            raise
        except sqlite3.Error as exc:
            conn.close()
            raise LedgerError(
                f"the ledger {path} is unusable: {exc}",
                hint="is it an opspatch ledger? move it aside or point --ledger elsewhere",
            ) from exc
        return cls(path=path, _conn=conn, _warnings=warnings)

    def close(self) -> None:
        """Close the connection; safe to call twice."""
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- writing --------------------------------------------------------------------------------

    def begin_run(
        self,
        *,
        command: str,
        patch_id: str | None,
        patch_sha256: str | None,
        operator: str,
        command_line: str,
        hosts: Sequence[str],
        playbook: str | None = None,
        parent_run: str | None = None,
    ) -> str:
        """Record the start of a run and return its new id.

        `command` is the opspatch command (`apply`, `rollback`, `recover`, ...); `parent_run` names
        the run this one rolls back or recovers. The controller's hostname, pid and process start
        time are recorded so the run can later be told apart as running or interrupted.

        Raises:
            ValueError: `command` is not a kebab-case word or `patch_sha256` is not a sha256.
            LedgerError: the ledger cannot be written.
        """
        _require_token(command, "command")
        if patch_sha256 is not None:
            _require_sha256(patch_sha256, "patch_sha256")
        if isinstance(hosts, str):
            raise ValueError("hosts must be a sequence of host names, not one string")
        body = {
            "command": command,
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
        with self._transaction() as conn:
            for _attempt in range(5):
                run_id = new_run_id()
                if not _run_exists(conn, run_id):
                    break
            else:  # pragma: no cover - 24 random bits colliding five times in one second
                raise LedgerError("could not pick an unused run id")
            if parent_run is not None and not _run_exists(conn, parent_run):
                raise LedgerError(f"parent run {parent_run} is not in the ledger")
            self._append(conn, run_id=run_id, kind="run-started", body=body)
        return run_id

    def record_step(
        self,
        run_id: str,
        host: str,
        step: str,
        status: str,
        seconds: float | None = None,
        detail: str = "",
    ) -> None:
        """Record that `host` went through `step` with `status` (e.g. `started`, `ok`, `failed`).

        Raises:
            ValueError: `step` or `status` is not a kebab-case word.
            LedgerError: the run is unknown or finished, or the ledger cannot be written.
        """
        _require_token(step, "step")
        _require_token(status, "status")
        body = {"step": step, "status": status, "seconds": seconds, "detail": detail}
        with self._transaction() as conn:
            _require_open_run(conn, run_id)
            self._append(conn, run_id=run_id, kind="step", host=host, body=body)

    def record_facts(self, run_id: str, host: str, facts: Mapping[str, Any]) -> None:
        """Record what was found on `host` (python, sglang, torch versions, GPUs, ...).

        Raises:
            TypeError, ValueError: `facts` is not JSON-serialisable.
            LedgerError: the run is unknown or finished, or the ledger cannot be written.
        """
        body = {"facts": dict(facts)}
        canonical_json(body)  # fail before the transaction, with the caller's own error
        with self._transaction() as conn:
            _require_open_run(conn, run_id)
            self._append(conn, run_id=run_id, kind="facts", host=host, body=body)

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
        action: str = "patch",
    ) -> FileVersion:
        """Record a change of `path` on `host`, storing the full bytes before it (and after it).

        Record it before the swap (backup step), so that a controller killed mid-swap still has
        the pre-image. `action` is `patch` or `restore`. Returns what was recorded.

        Raises:
            ValueError: a hash is malformed, the bytes do not hash to the hashes given, or
                `action` is unknown.
            LedgerError: the run is unknown or finished, or the ledger cannot be written.
            LedgerIntegrityError: the blob store already holds different bytes under that hash.
        """
        if action not in FILE_ACTIONS:
            raise ValueError(f"action must be one of {sorted(FILE_ACTIONS)}, got {action!r}")
        _require_sha256(sha256_before, "sha256_before")
        _require_sha256(sha256_after, "sha256_after")
        if sha256_hex(pre_image) != sha256_before:
            raise ValueError("pre_image does not hash to sha256_before")
        if post_image is not None and sha256_hex(post_image) != sha256_after:
            raise ValueError("post_image does not hash to sha256_after")
        with self._transaction() as conn:
            start = _require_open_run(conn, run_id)
            body = {
                "patch_id": start.data["patch_id"],
                "action": action,
                "sha256_before": sha256_before,
                "sha256_after": sha256_after,
                "mode": int(mode),
                "owner": owner,
                "size_before": len(pre_image),
            }
            _store_blob(conn, sha256_before, pre_image)
            if post_image is not None:
                _store_blob(conn, sha256_after, post_image)
            row = self._append(
                conn,
                run_id=run_id,
                kind="file-version",
                host=host,
                path=path,
                body=body,
                pre_image=sha256_before,
                post_image=sha256_after if post_image is not None else None,
            )
        return _file_version(row)

    def record_host_outcome(
        self,
        run_id: str,
        host: str,
        outcome: str,
        error: str | None = None,
        file: Mapping[str, Any] | None = None,
    ) -> None:
        """Record how `host` ended in this run (`applied`, `rolled-back`, `needs-attention`, ...).

        `file` is the `{"path", "sha256_before", "sha256_after"}` the JSON output shows. A later
        outcome for the same host supersedes an earlier one (for example after `recover`).

        Raises:
            ValueError: `outcome` is not a kebab-case word; `file` is not JSON-serialisable.
            LedgerError: the run is unknown or finished, or the ledger cannot be written.
        """
        _require_token(outcome, "outcome")
        body = {"outcome": outcome, "error": error, "file": None if file is None else dict(file)}
        canonical_json(body)
        with self._transaction() as conn:
            _require_open_run(conn, run_id)
            self._append(conn, run_id=run_id, kind="host-outcome", host=host, body=body)

    def finish_run(self, run_id: str, outcome: str) -> None:
        """Record the end of a run with its overall outcome; nothing can be added to it after.

        Raises:
            ValueError: `outcome` is not a kebab-case word.
            LedgerError: the run is unknown or already finished, or the ledger cannot be written.
        """
        _require_token(outcome, "outcome")
        with self._transaction() as conn:
            _require_open_run(conn, run_id)
            self._append(conn, run_id=run_id, kind="run-finished", body={"outcome": outcome})

    # -- reading --------------------------------------------------------------------------------

    def list_runs(self, limit: int = 50) -> list[RunSummary]:
        """The newest `limit` runs, newest first, each with its derived status.

        Raises:
            LedgerError: the ledger cannot be read.
        """
        with self._reading() as conn:
            starts = _rows(
                conn,
                f"SELECT {_ROW_COLUMNS} FROM events WHERE kind = 'run-started' "
                "ORDER BY id DESC LIMIT ?",
                (limit,),
            )
            finishes = _finishes(conn, [s.run_id for s in starts])
        return [_summary(start, finishes.get(start.run_id)) for start in starts]

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
                    "SELECT run_id FROM events WHERE kind = 'run-started' "
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
                hint="`opspatch ledger list` shows the runs",
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
            rows = _rows(
                conn, f"SELECT {_ROW_COLUMNS} FROM events WHERE run_id = ? ORDER BY id", (full_id,)
            )
        start = next(r for r in rows if r.kind == "run-started")
        finish = next((r for r in rows if r.kind == "run-finished"), None)
        summary = _summary(start, finish)
        order = list(dict.fromkeys([*summary.hosts, *(r.host for r in rows if r.host)]))
        return RunDetail(summary=summary, hosts=tuple(_host_record(h, rows) for h in order))

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
                hint="run `opspatch ledger verify`",
            )
        return data

    def file_history(self, host: str, path: str | None = None) -> list[FileVersion]:
        """Every recorded change of `path` (or of any file) on `host`, newest first.

        Raises:
            LedgerError: the ledger cannot be read.
        """
        query = f"SELECT {_ROW_COLUMNS} FROM events WHERE kind = 'file-version' AND host = ?"
        params: tuple[Any, ...] = (host,)
        if path is not None:
            query += " AND path = ?"
            params += (path,)
        with self._reading() as conn:
            rows = _rows(conn, query + " ORDER BY id DESC", params)
        return [_file_version(r) for r in rows]

    def last_applied(self, host: str, path: str, patch_id: str) -> FileVersion | None:
        """The newest `patch` change that `patch_id` made to `path` on `host` and that the same
        run did not restore afterwards; None if there is none.

        Rollback restores its pre-image when the live file still hashes to its `sha256_after`;
        status compares the live hash with both of its hashes (applied, not applied, drifted).
        A later rollback run does not hide it: the live hash tells whether it is still in place.

        Raises:
            LedgerError: the ledger cannot be read.
        """
        history = self.file_history(host, path)  # newest first
        for index, version in enumerate(history):
            if version.action != "patch" or version.patch_id != patch_id:
                continue
            undone_in_same_run = any(
                later.run_id == version.run_id and later.action == "restore"
                for later in history[:index]
            )
            if not undone_in_same_run:
                return version
        return None

    def settings(self) -> dict[str, Any]:
        """The SQLite settings this connection runs with, as PRAGMA reports them.

        `journal_mode` (`wal`), `synchronous` (2 = FULL), `foreign_keys` (1), `busy_timeout_ms`,
        `schema_version`: what the durability promises rest on, for tests and `ledger verify`.
        """
        with self._reading() as conn:
            return {
                name: conn.execute(f"PRAGMA {pragma}").fetchone()[0]
                for name, pragma in (
                    ("journal_mode", "journal_mode"),
                    ("synchronous", "synchronous"),
                    ("foreign_keys", "foreign_keys"),
                    ("busy_timeout_ms", "busy_timeout"),
                    ("schema_version", "user_version"),
                )
            }

    # -- integrity ------------------------------------------------------------------------------

    def verify(self) -> VerifyReport:
        """Walk the whole chain: every hash, every link, every id, every blob.

        Raises:
            LedgerError: the ledger cannot be read.
        """
        with self._reading() as conn:
            return _verify(conn, self._warnings)

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
                hint="nothing was changed; run `opspatch ledger verify` and find out who edited "
                "the ledger before trusting it again",
            )
        return report

    # -- internals ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction under BEGIN IMMEDIATE: no other writer between read and insert."""
        with self._lock:
            conn = self._conn
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                raise LedgerError(
                    f"cannot write the ledger {self.path}: {exc}",
                    hint=f"another opspatch held it for more than {BUSY_TIMEOUT_SECONDS:.0f} s, "
                    "or the file is read-only",
                ) from exc
            try:
                yield conn
            except BaseException:
                # SQLite may already have rolled back after some errors; keep the first error.
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise
            try:
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise LedgerError(f"cannot write the ledger {self.path}: {exc}") from exc

    @contextlib.contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                yield self._conn
            except sqlite3.Error as exc:
                raise LedgerError(f"cannot read the ledger {self.path}: {exc}") from exc

    def _append(
        self,
        conn: sqlite3.Connection,
        *,
        run_id: str,
        kind: str,
        body: Mapping[str, Any],
        host: str | None = None,
        path: str | None = None,
        pre_image: str | None = None,
        post_image: str | None = None,
    ) -> _Row:
        """Insert one event chained to the last one; the caller holds BEGIN IMMEDIATE."""
        try:
            last = conn.execute("SELECT id, hash FROM events ORDER BY id DESC LIMIT 1").fetchone()
            sequence = _sequence(conn)
            # Next id after the highest ever handed out: a deleted tail leaves a visible gap.
            last_id = 0 if last is None else int(last[0])
            event_id = max(last_id, sequence) + 1
            prev_hash = GENESIS_HASH if last is None else str(last[1])
            row = _Row(
                id=event_id,
                run_id=run_id,
                kind=kind,
                host=host,
                path=path,
                recorded_at=_utc_now(),
                body=canonical_json(dict(body)),
                pre_image=pre_image,
                post_image=post_image,
                prev_hash=prev_hash,
                hash="",
            )
            row = replace(row, hash=_row_hash(row))
            conn.execute(
                f"INSERT INTO events ({_ROW_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    row.id,
                    row.run_id,
                    row.kind,
                    row.host,
                    row.path,
                    row.recorded_at,
                    row.body,
                    row.pre_image,
                    row.post_image,
                    row.prev_hash,
                    row.hash,
                ),
            )
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot write the ledger {self.path}: {exc}") from exc
        return row


# ---------------------------------------------------------------------------------------------
# module internals (all take the connection explicitly)


def _prepare(conn: sqlite3.Connection, path: Path) -> tuple[str, ...]:
    """Set the pragmas, create or check the schema; return warnings for `verify()`."""
    conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_SECONDS * 1000)}")
    conn.execute("PRAGMA foreign_keys = ON")
    mode = str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]).lower()
    if mode != "wal":
        raise LedgerError(
            f"the ledger {path} cannot use WAL journaling (the filesystem gave {mode!r})",
            hint="keep the ledger on a local filesystem",
        )
    conn.execute("PRAGMA synchronous = FULL")
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if version > SCHEMA_VERSION:
        raise LedgerError(
            f"the ledger {path} has schema version {version}; this opspatch knows {SCHEMA_VERSION}",
            hint="upgrade opspatch",
        )
    present = {
        str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")
    }
    missing = [name for name in _TRIGGERS if name not in present]
    if version == SCHEMA_VERSION and not missing:
        return ()
    conn.execute("BEGIN IMMEDIATE")
    try:
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                conn.execute(statement)
        for name in missing:
            conn.execute(_TRIGGERS[name])
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    if version == SCHEMA_VERSION:
        return (
            f"append-only triggers were missing and have been re-created: {', '.join(missing)}",
        )
    return ()


def _row_hash(row: _Row) -> str:
    return event_hash(
        event_id=row.id,
        run_id=row.run_id,
        kind=row.kind,
        host=row.host,
        path=row.path,
        recorded_at=row.recorded_at,
        body=row.body,
        pre_image=row.pre_image,
        post_image=row.post_image,
        prev_hash=row.prev_hash,
    )


def _rows(conn: sqlite3.Connection, query: str, params: Sequence[Any] = ()) -> list[_Row]:
    return [_Row(*r) for r in conn.execute(query, tuple(params))]


def _sequence(conn: sqlite3.Connection) -> int:
    found = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'events'").fetchone()
    return 0 if found is None else int(found[0])


def _run_exists(conn: sqlite3.Connection, run_id: str) -> bool:
    found = conn.execute(
        "SELECT 1 FROM events WHERE run_id = ? AND kind = 'run-started'", (run_id,)
    ).fetchone()
    return found is not None


def _require_open_run(conn: sqlite3.Connection, run_id: str) -> _Row:
    """The run's start event; raises LedgerError if the run is unknown or already finished."""
    rows = _rows(
        conn,
        f"SELECT {_ROW_COLUMNS} FROM events WHERE run_id = ? "
        "AND kind IN ('run-started', 'run-finished') ORDER BY id",
        (run_id,),
    )
    starts = [r for r in rows if r.kind == "run-started"]
    if not starts:
        raise LedgerError(f"run {run_id} is not in the ledger")
    if any(r.kind == "run-finished" for r in rows):
        raise LedgerError(f"run {run_id} is already finished; nothing can be added to it")
    return starts[0]


def _store_blob(conn: sqlite3.Connection, sha256: str, data: bytes) -> None:
    existing = conn.execute("SELECT data FROM blobs WHERE sha256 = ?", (sha256,)).fetchone()
    if existing is None:
        conn.execute(
            "INSERT INTO blobs (sha256, size, data) VALUES (?, ?, ?)", (sha256, len(data), data)
        )
    elif sha256_hex(bytes(existing[0])) != sha256:
        raise LedgerIntegrityError(
            f"the ledger already holds altered bytes under sha256 {sha256}",
            hint="run `opspatch ledger verify`",
        )


def _finishes(conn: sqlite3.Connection, run_ids: Sequence[str]) -> dict[str, _Row]:
    if not run_ids:
        return {}
    marks = ", ".join("?" for _ in run_ids)
    rows = _rows(
        conn,
        f"SELECT {_ROW_COLUMNS} FROM events WHERE kind = 'run-finished' AND run_id IN ({marks})",
        run_ids,
    )
    return {r.run_id: r for r in rows}


def _summary(start: _Row, finish: _Row | None) -> RunSummary:
    data = start.data
    controller = data["controller"]
    process = ControllerProcess(
        str(controller["hostname"]), int(controller["pid"]), controller["start_token"]
    )
    if finish is not None:
        status, outcome = "finished", str(finish.data["outcome"])
    else:
        alive = process.is_alive()
        status = "unknown" if alive is None else ("running" if alive else "interrupted")
        outcome = None
    return RunSummary(
        run_id=start.run_id,
        command=str(data["command"]),
        patch_id=data["patch_id"],
        patch_sha256=data["patch_sha256"],
        playbook=data["playbook"],
        operator=str(data["operator"]),
        command_line=str(data["command_line"]),
        hosts=tuple(str(h) for h in data["hosts"]),
        parent_run=data["parent_run"],
        controller=process,
        opspatch_version=str(data["opspatch_version"]),
        started_at=start.recorded_at,
        finished_at=None if finish is None else finish.recorded_at,
        status=status,
        outcome=outcome,
    )


def _file_version(row: _Row) -> FileVersion:
    data = row.data
    return FileVersion(
        event_id=row.id,
        run_id=row.run_id,
        patch_id=data["patch_id"],
        host=str(row.host),
        path=str(row.path),
        action=str(data["action"]),
        sha256_before=str(data["sha256_before"]),
        sha256_after=str(data["sha256_after"]),
        mode=int(data["mode"]),
        owner=str(data["owner"]),
        size_before=int(data["size_before"]),
        pre_image_sha256=str(row.pre_image),
        post_image_sha256=row.post_image,
        recorded_at=row.recorded_at,
    )


def _host_record(host: str, rows: Sequence[_Row]) -> HostRecord:
    mine = [r for r in rows if r.host == host]
    steps = tuple(
        StepRecord(
            event_id=r.id,
            step=str(r.data["step"]),
            status=str(r.data["status"]),
            seconds=r.data["seconds"],
            detail=str(r.data["detail"]),
            recorded_at=r.recorded_at,
        )
        for r in mine
        if r.kind == "step"
    )
    facts_rows = [r for r in mine if r.kind == "facts"]
    outcomes = [r.data for r in mine if r.kind == "host-outcome"]
    last_outcome = outcomes[-1] if outcomes else None
    return HostRecord(
        host=host,
        steps=steps,
        facts=dict(facts_rows[-1].data["facts"]) if facts_rows else None,
        file_versions=tuple(_file_version(r) for r in mine if r.kind == "file-version"),
        outcome=None if last_outcome is None else str(last_outcome["outcome"]),
        error=None if last_outcome is None else last_outcome["error"],
        file=None if last_outcome is None else last_outcome["file"],
    )


def _verify(conn: sqlite3.Connection, warnings: tuple[str, ...]) -> VerifyReport:
    """Check every event in id order, then every blob; stop at the first broken link."""
    expected_prev = GENESIS_HASH
    expected_id = 1
    checked = 0
    referenced: dict[str, int] = {}  # blob sha256 -> first event that names it

    def broken(event_id: int, reason: str) -> VerifyReport:
        return VerifyReport(False, checked, 0, event_id, reason, expected_prev, warnings)

    for values in conn.execute(f"SELECT {_ROW_COLUMNS} FROM events ORDER BY id"):
        row = _Row(*values)
        if row.id != expected_id:
            missing = (
                f"{expected_id}" if row.id == expected_id + 1 else f"{expected_id}-{row.id - 1}"
            )
            return broken(row.id, f"event(s) {missing} before it are missing (deleted)")
        if row.prev_hash != expected_prev:
            return broken(row.id, "its prev_hash does not match the hash of the event before it")
        if _row_hash(row) != row.hash:
            return broken(row.id, "its content does not match its hash (the row was edited)")
        for sha in (row.pre_image, row.post_image):
            if sha is not None:
                referenced.setdefault(sha, row.id)
        expected_prev = row.hash
        expected_id += 1
        checked += 1

    sequence = _sequence(conn)
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
        return VerifyReport(
            False, checked, blobs_checked, event_id or None, reason, expected_prev, warnings
        )
    return VerifyReport(True, checked, blobs_checked, None, None, expected_prev, warnings)
