"""What host operations return: frozen values built from the host agent's replies, and the
`Operation` descriptor that names, for each agent operation, its request, its reply and the
record the reply is read as."""

from __future__ import annotations

import base64
import binascii
import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Annotated, Any, Generic, TypeVar

from opspatch.core import codec
from opspatch.core.codec import NOT_WRITTEN, Record, json_options

# what a host runs lives in core, since the ledger records it too: re-exported here
from opspatch.core.host import Host
from opspatch.core.hostfacts import HostFacts as HostFacts
from opspatch.errors import RemoteOperationError
from opspatch.hosts.agent.dispatch import op_whoami
from opspatch.hosts.agent.facts import op_facts, op_inspect, op_resolve
from opspatch.hosts.agent.files import op_read, op_restore, op_swap
from opspatch.hosts.agent.locks import op_lock, op_unlock
from opspatch.hosts.agent.protocol import (
    FactsReply,
    FileReply,
    InspectReply,
    InspectRequest,
    LockReply,
    LockRequest,
    NoArgs,
    OperationCall,
    ReadRequest,
    ResolveReply,
    ResolveRequest,
    RestoreReply,
    RestoreRequest,
    SwapReply,
    SwapRequest,
    UnlockReply,
    UnlockRequest,
    WhoamiReply,
)
from opspatch.hosts.become import RunsAs, raised_user

R = TypeVar("R")
Req = TypeVar("Req", bound=Mapping[str, Any])
Rep = TypeVar("Rep", bound=Mapping[str, Any])

OPERATIONS: dict[str, Operation[Any, Any, Any]] = {}
"""Every agent operation's descriptor by name (each registers itself where its record is
defined: here and in `_DESCRIBED_IN`)."""

_DESCRIBED_IN = (
    "opspatch.hosts.engine",
    "opspatch.hosts.measure",
    "opspatch.hosts.diagnosis",
    "opspatch.hosts.live",
    "opspatch.hosts.liveinstall",
)
"""The modules that define the other descriptors (they import this one, so they are imported
when a name is first looked up: `descriptor`)."""


def descriptor(name: str) -> Operation[Any, Any, Any]:
    """The descriptor of the agent operation `name`.

    Raises:
        KeyError: no agent operation has that name.
    """
    if name not in OPERATIONS:
        for module in _DESCRIBED_IN:
            importlib.import_module(module)
    return OPERATIONS[name]


def run_as(host: Host, operation: str) -> str | None:
    """The user `operation` runs as through sudo on `host` (its descriptor's `runs_as`), or
    None for the login user."""
    return raised_user(host, descriptor(operation).runs_as)


def changes_host(calls: Iterable[OperationCall]) -> bool:
    """Whether any of `calls` changes the host (its descriptor's `runs_as.changes`)."""
    return any(descriptor(call["op"]).runs_as.changes for call in calls)


def read_reply(cls: type[R], reply: Mapping[str, object], *, host: str, step: str) -> R:
    """The agent's `reply` read as `cls`, every field checked against its type: the reply's own
    wire type (a TypedDict) or a record that adds to it, through pydantic (`codec.read`).

    Raises:
        RemoteOperationError: `agent-bad-reply`, the reply lacks a field or one has the wrong
            type (an agent of another opspatch version, or a broken host); names the field.
    """
    try:
        return codec.read(cls, reply)
    except ValueError as exc:
        raise RemoteOperationError(
            f"the host agent's reply is not what this opspatch reads: {exc}",
            code="agent-bad-reply",
            host=host,
            step=step,
        ) from None


@dataclass(frozen=True)
class Operation(Generic[Req, Rep, R]):
    """One agent operation, for the controller: its `name`, the `request` and `reply` TypedDicts
    both ends read (`agent.protocol`), the `record` its reply is read as (the `reply` itself
    unless the controller adds to it: bytes, methods, what `--json` prints), the agent's
    `function` (`@operation(name)`: mypy checks it takes `request` and returns `reply`), and who
    runs it on a host with `become` (`runs_as`). The record's fields are the reply's keys;
    `renamed` maps a reply key to a record field of another name (smoke's `results` are
    `prompts`). Only the agent modules travel to a host (`channel.modules_for`); this
    descriptor never does."""

    name: str
    request: type[Req]
    reply: type[Rep]
    record: type[R]
    function: Callable[[Req], Rep]
    _: KW_ONLY
    runs_as: RunsAs
    renamed: Mapping[str, str] = field(default_factory=dict)
    in_process: Callable[[Mapping[str, Any]], bool] = field(default=lambda args: False)
    """Whether a call (these arguments) may run in the controller's own process where the host's
    interpreter is the controller's (`channel.OwnProcessEndpoint`): work on files of a bounded
    size, nothing started, waited for or imported from the engine's import path. False unless
    the descriptor says."""

    def __post_init__(self) -> None:
        OPERATIONS[self.name] = self

    def read(self, reply: Mapping[str, Any], *, host: str, step: str) -> R:
        """The reply read as the record (`read_reply`).

        Raises:
            RemoteOperationError: `agent-bad-reply`, naming the field.
        """
        if self.renamed:
            reply = {self.renamed.get(key, key): value for key, value in reply.items()}
        return read_reply(self.record, reply, host=host, step=step)


def from_base64(text: Any) -> bytes:
    """Bytes a reply carries as base64 (a file's content)."""
    if not isinstance(text, str):
        raise ValueError(f"expected base64 text, got {type(text).__name__}")
    try:
        return base64.b64decode(text, validate=True)
    except binascii.Error as exc:
        raise ValueError(f"not base64: {exc}") from None


@dataclass(frozen=True)
class RemoteFile(Record):
    """A file as read on the host: its exact bytes and what must be kept when it is replaced.

    `path` is what was asked for; `realpath` is the file really read (and later written) when
    `path` is a symlink, whose `symlink_target` is kept as it is.
    """

    path: str
    realpath: str
    symlink_target: str | None
    content: bytes = field(
        metadata=json_options(key="content_b64", decode=from_base64, written=False)
    )
    sha256: str
    size: int
    mode: int
    uid: int
    gid: int
    owner: str | None
    group: str | None
    mtime_ns: int
    nlink: int


def file_owner(file: RemoteFile) -> str:
    """`owner:group` of `file` as the ledger records it (names, else ids)."""
    return f"{file.owner or file.uid}:{file.group or file.gid}"


@dataclass(frozen=True)
class ServerProcess(Record):
    """The engine's running process as the host sees it: pid and start time (epoch seconds).
    An inspection without one (`HostInspection.server` None) found no server running."""

    pid: int | None = None
    """None: something listens on the engine's port, but its process is not visible to the
    login user (another user's)."""
    started_at: float | None = None

    def predates(self, file: RemoteFile) -> bool:
        """Whether the server started before `file` last changed (so it runs older code)."""
        # /proc start times are whole boot-clock seconds plus ticks: up to ~1 s early; 2 s slack
        return self.started_at is not None and self.started_at < file.mtime_ns / 1e9 - 2.0


@dataclass(frozen=True)
class HostInspection(Record):
    """Everything `plan` needs from one host, from one exec (and the running server, when the
    host's engine says where to find it)."""

    facts: HostFacts
    module: Annotated[ResolveReply | None, codec.WIRE] = field(
        metadata=json_options(key="resolved")
    )
    file: RemoteFile
    server: ServerProcess | None = None


@dataclass(frozen=True)
class SwapResult(Record):
    """A completed swap: the hashes before and after, where the pre-image backup is, and which
    cached bytecode files were removed. `changed` is False when the new bytes equal the old."""

    path: str
    realpath: str
    sha256_before: str
    sha256_after: str
    changed: bool
    backup_path: str | None
    purged_bytecode: tuple[str, ...]
    purge_failures: tuple[str, ...]
    mode: int
    uid: int
    gid: int
    lock_released: bool = field(default=False, metadata=NOT_WRITTEN)
    """The swap gave the run's lock back in the same exec (`then_unlock`)."""


# -- the operations whose records are above -----------------------------------------------------


def _always(args: Mapping[str, Any]) -> bool:
    return True


def _by_path(args: Mapping[str, Any]) -> bool:
    # a module is found on the import path, and the controller's own is not the engine's (it
    # starts with the folder the controller was started from, and whatever it added since)
    return not args.get("module")


FACTS = Operation(
    "facts", NoArgs, FactsReply, HostFacts, op_facts, runs_as=RunsAs.READ, in_process=_always
)
RESOLVE = Operation(
    "resolve", ResolveRequest, ResolveReply, ResolveReply, op_resolve, runs_as=RunsAs.READ
)
READ = Operation(
    "read", ReadRequest, FileReply, RemoteFile, op_read, runs_as=RunsAs.READ, in_process=_always
)
INSPECT = Operation(
    "inspect",
    InspectRequest,
    InspectReply,
    HostInspection,
    op_inspect,
    runs_as=RunsAs.READ,
    in_process=_by_path,
)
SWAP = Operation(
    "swap", SwapRequest, SwapReply, SwapResult, op_swap, runs_as=RunsAs.CHANGE, in_process=_always
)
RESTORE = Operation(
    "restore",
    RestoreRequest,
    RestoreReply,
    RestoreReply,
    op_restore,
    runs_as=RunsAs.CHANGE,
    in_process=_always,
)
LOCK = Operation(
    "lock", LockRequest, LockReply, LockReply, op_lock, runs_as=RunsAs.CHANGE, in_process=_always
)
UNLOCK = Operation(
    "unlock",
    UnlockRequest,
    UnlockReply,
    UnlockReply,
    op_unlock,
    runs_as=RunsAs.CHANGE,
    in_process=_always,
)
WHOAMI = Operation(
    "whoami",
    NoArgs,
    WhoamiReply,
    WhoamiReply,
    op_whoami,
    runs_as=RunsAs.LOGIN,
    in_process=_always,
)
