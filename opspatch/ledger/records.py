"""What the ledger's queries return: frozen dataclasses, serialised by one mechanism
(`opspatch.core.codec.Record`)."""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import Enum
from typing import Any, TypeVar

from opspatch.core.codec import Record, json_field, json_options
from opspatch.core.filechange import FileChange
from opspatch.core.reasons import Reason
from opspatch.core.vocabulary import (
    Command,
    FileAction,
    Outcome,
    RunOutcome,
    RunStatus,
    Step,
    StepStatus,
)
from opspatch.ledger.liveness import ControllerProcess

FILE_ACTIONS = frozenset(FileAction)
"""What a file version records: the patched text swapped in, or earlier bytes put back."""

_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_Word = TypeVar("_Word", bound=Enum)


@dataclass(frozen=True)
class StepRecord(Record):
    """One step a host went through (lock, inspect, swap, restart, ready, smoke, ...)."""

    event_id: int
    step: Step
    status: StepStatus
    seconds: float | None
    detail: str
    recorded_at: str


@dataclass(frozen=True)
class ContainerRecord(Record):
    """The container a file version was written in: the runtime's id for it and when it was
    created. A container recreated from its image (the fix gone with its writable layer) has
    another id under the same name."""

    runtime: str
    name: str
    id: str
    created: str
    image: str = ""


@dataclass(frozen=True)
class FileVersion(Record):
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
    action: FileAction
    sha256_before: str
    sha256_after: str
    mode: int
    owner: str
    size_before: int
    pre_image_sha256: str
    post_image_sha256: str | None
    recorded_at: str
    container: ContainerRecord | None = None
    """Where the file was written, for an engine in a container (None: on the host)."""


@dataclass(frozen=True)
class NewFileVersion:
    """A change of one file that a run records before it makes it (`record_file_version`):
    where, the hashes before and after, the mode and owner kept, and the full bytes before (and
    after, when the run has them). `pre_image` None: the bytes the ledger already holds under
    `sha256_before` (a restore overwrites the post-image of the change it undoes)."""

    path: str
    sha256_before: str
    sha256_after: str
    mode: int
    owner: str
    """`owner:group` (names, else ids) as the host reported them."""
    pre_image: bytes | None
    post_image: bytes | None = None
    action: FileAction = FileAction.PATCH
    container: ContainerRecord | None = None
    """The container the file is in, for an engine in one."""


def file_change(value: Any) -> FileChange | None:
    """A host outcome's `file` read back (None: the outcome named no file)."""
    return None if value is None else FileChange.from_json(value)


def _as_stored(value: Any) -> Any:
    """`value` as JSON with every object's keys sorted, as the ledger's canonical body holds it
    and as `ledger show --json` has always printed it."""
    if isinstance(value, Record):
        value = value.to_json()
    if isinstance(value, dict):
        return {key: _as_stored(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [_as_stored(item) for item in value]
    return value


@dataclass(frozen=True)
class Machine:
    """What a host is, whatever an inventory calls it: its /etc/machine-id and its hostname, as
    its facts reported them. The hostname too, because machines cloned from one image may share
    a machine id that nobody regenerated."""

    machine_id: str
    hostname: str

    @classmethod
    def of(cls, machine_id: str | None, hostname: str) -> Machine | None:
        """The identity, or None when the host reported no machine id."""
        return cls(machine_id, hostname) if machine_id else None

    def said_by(self, facts: dict[str, Any]) -> bool:
        """Whether recorded `facts` describe this machine."""
        return facts.get("machine_id") == self.machine_id and facts.get("hostname") == self.hostname


@dataclass(frozen=True)
class HostRecord(Record):
    """Everything one run recorded about one host; `last_step` says where it stopped.

    `outcome`, `error`, `reason` and `file` come from the host's latest `host-outcome` event (None when the
    run never recorded one, for example because it was killed first). `file` is printed as the
    ledger stores it (its keys sorted), as it always was. `facts` stay the object recorded: a
    run records a `HostFacts` (`opspatch.core.hostfacts`), but ledgers also hold facts in
    earlier shapes, which `ledger show` prints as they are (`Ledger.record_facts`).
    """

    host: str
    outcome: Outcome | None
    error: str | None
    file: FileChange | None = field(metadata=json_options(encode=_as_stored, decode=file_change))
    last_step: StepRecord | None = field(init=False, compare=False, repr=False)
    steps: tuple[StepRecord, ...]
    facts: dict[str, Any] | None
    file_versions: tuple[FileVersion, ...]
    reason: Reason | None = json_field(default=None, omit_none=True)
    """The code of `error` (`core/reasons.py`); None where the run gave none, as runs before
    reason codes."""

    def __post_init__(self) -> None:
        # Derived, so that it is serialised in its place among the fields (codec: init=False).
        object.__setattr__(self, "last_step", self.steps[-1] if self.steps else None)


@dataclass(frozen=True)
class RunSummary(Record):
    """One run as `ledger list` shows it, with its derived status.

    `status` (derived, never stored) is `finished` (it has a finish event; `outcome` is set only
    then), `running` (its controller process is alive), `interrupted` (that process is gone),
    `recovered` (interrupted, and a later `recover` run naming it as `parent_run` finished; that
    run is `recovered_by`), or `unknown` (begun on another controller, whose processes this one
    cannot see). `inventories` names, per host, the inventory the run took it from (None for
    runs recorded before it was).
    """

    run_id: str
    command: Command
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
    status: RunStatus
    outcome: RunOutcome | None
    recovered_by: str | None = None
    inventories: dict[str, str] | None = None
    approved_by: tuple[str, ...] | None = json_field(default=None, omit_none=True)
    """The principals whose signatures of `patch_sha256` (`opspatch approve`) were verified
    against the playbook's allowed_signers before the run began; None (left out of the JSON)
    when the run needed no approval."""


@dataclass(frozen=True)
class RunDetail(Record):
    """A run with every host's steps, facts, file versions and outcome (`ledger show`).

    Its JSON is the summary's keys followed by `host_records`, and for an `approve` run
    `approvals`: who signed (its `sign` steps, whose host column is the principal, not a host).
    """

    summary: RunSummary = json_field(inline=True)
    hosts: tuple[HostRecord, ...] = json_field(key="host_records")
    approvals: tuple[Approval, ...] | None = json_field(omit_none=True, default=None)

    @property
    def run_id(self) -> str:
        return self.summary.run_id

    def host(self, name: str) -> HostRecord:
        """The record of host `name`. Raises KeyError if the run never mentioned it."""
        for record in self.hosts:
            if record.host == name:
                return record
        raise KeyError(name)


@dataclass(frozen=True)
class Approval(Record):
    """One `opspatch approve`: `principal` signed the patch's sha256 with OpenSSH (`signature`,
    armored, namespace `opspatch`); `operator` ran the command, in run `run_id`."""

    run_id: str
    patch_id: str | None
    patch_sha256: str
    principal: str
    operator: str
    signature: str
    recorded_at: str


@dataclass(frozen=True)
class LeaseHolder(Record):
    """A lease as a refusal or a takeover names it: host, the run, its operator and controller
    machine, and how long its heartbeat has been silent against how long it may be."""

    identity: str
    host: str
    run_id: str
    operator: str
    controller: str
    silent_seconds: float
    expires_after_seconds: float

    @property
    def live(self) -> bool:
        return self.silent_seconds <= self.expires_after_seconds

    def describe(self) -> str:
        """`run R of alice@ctl (controller ctl), last heartbeat 3 s ago`."""
        return (
            f"run {self.run_id} of {self.operator} (controller {self.controller}), last "
            f"heartbeat {self.silent_seconds:.0f} s ago"
        )


@dataclass(frozen=True)
class LeaseGrant:
    """What taking leases did: `refused` (live leases of other runs: nothing was taken) or the
    leases taken, some of them `taken_over` from runs whose heartbeat had expired."""

    refused: tuple[LeaseHolder, ...] = ()
    taken_over: tuple[LeaseHolder, ...] = ()


@dataclass(frozen=True)
class VerifyReport(Record):
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


@dataclass(frozen=True)
class MigrateReport(Record):
    """What `opspatch ledger migrate` found and left: the schema version before and after, and
    the role granted SELECT and INSERT on the history (PostgreSQL only)."""

    ledger: str
    backend: str
    version_before: int
    version: int
    writer_role: str | None


@dataclass(frozen=True)
class CopyReport(Record):
    """What `opspatch ledger copy` did: events and blobs copied, events the target already held
    (the same ones, by id and hash), and the head hash both ledgers now verify to."""

    source: str
    target: str
    events_copied: int
    events_already_there: int
    blobs_copied: int
    head_hash: str


# ---------------------------------------------------------------------------------------------
# what an event may hold: checked before anything is written


def new_run_id(now: datetime | None = None) -> str:
    """A sortable, unique run id such as `20261130T025012Z-3f9a1c` (UTC second + 24 random bits)."""
    moment = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    return f"{moment:%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"


def require_sha256(value: str, what: str) -> None:
    """Raises ValueError unless `value` is 64 lower-case hex digits."""
    if not _SHA256_RE.match(value):
        raise ValueError(f"{what} must be 64 lower-case hex digits, got {value!r}")


def require_word(
    vocabulary: type[_Word], value: str, what: str, allowed: frozenset[_Word] | None = None
) -> _Word:
    """`value` as a word of `vocabulary` (and of `allowed`); ValueError naming the words if not."""
    try:
        found = vocabulary(value)  # every record asks: a lookup, not a scan of the words
    except (ValueError, TypeError):
        found = None
    if found is not None and (allowed is None or found in allowed):
        return found
    words = list(vocabulary) if allowed is None else [w for w in vocabulary if w in allowed]
    known = ", ".join(str(w.value) for w in words)
    raise ValueError(f"{what} must be one of {known}; got {value!r}")
