"""The agent's contract with the controller: operations are registered by name, take the
request's `args` (a JSON object) and return a JSON object; an expected refusal is an `OpFailure`
with a stable, machine-readable `code`.

Adding an operation: in the module of its concern, write `def op_name(args: NameRequest) ->
NameReply` (its two TypedDicts below, which the controller's `HostOperations` reads too, so mypy
checks both ends against one shape; `Args` -> `Result` for an operation not yet typed), decorate it
with `@operation("name")`, raise `OpFailure(code, message, data)` for expected refusals, and
list that module in `opspatch.hosts.agent.MODULES` (the controller finds which module defines an
operation from its decorator and sends an exec that module and what it imports). That is the whole
pattern.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal, TypedDict, TypeVar

if TYPE_CHECKING:  # aliases for the checker only: `dict[...]` cannot be evaluated on Python 3.8
    Args = dict[str, Any]
    Result = dict[str, Any]

OPERATIONS: dict[str, Callable[[Any], Mapping[str, Any]]] = {}
"""Every operation by name: it takes its request's `args` (a TypedDict below, or `Args`) and
returns its reply's `result` (likewise)."""
OpFunction = TypeVar("OpFunction", bound="Callable[[Any], Mapping[str, Any]]")


# -- the wire format of the operations the controller calls -------------------------------------
# One request and one reply shape per operation, imported by the controller's channel
# (`opspatch.hosts.channel`) so both ends read the same names. `typing.TypedDict` exists on
# Python 3.8, and these classes cost a host nothing beyond `typing`, which dispatch imports anyway.
# The field types stay strings here (`from __future__ import annotations`), so 3.8 never
# evaluates `list[str]`; mypy checks them on the controller.


class ServerHint(TypedDict):
    pid_file: str | None
    url: str | None


class LockRequest(TypedDict):
    state_dir: str
    owner: str
    run_id: str
    ttl_seconds: float
    takeover_run: str | None  # `recover` takes over the lock of the run it recovers
    refresh_only: bool  # re-assert a lock still this run's (an exec of a run holding it)
    busy_seconds: float  # how long an exec of this run may still be running here, from now
    takeover_idle: bool  # take `takeover_run`'s lock only once it is not busy (busy_until)


class LockHolderReply(TypedDict, total=False):
    owner: str | None
    run_id: str | None
    hostname: str
    acquired_at: float
    expires_at: float
    busy_until: float
    acquired_at_iso: str
    expires_at_iso: str
    busy_until_iso: str
    unreadable: bool
    modified_at: float


class LockReply(TypedDict):
    holder: LockHolderReply
    refreshed: bool
    previous: LockHolderReply | None


class UnlockRequest(TypedDict):
    state_dir: str
    run_id: str
    force: bool


class UnlockReply(TypedDict):
    released: bool
    reason: str
    previous: LockHolderReply | None


class ResolveRequest(TypedDict):
    module: str


class ReadRequest(TypedDict):
    path: str


class FileReply(TypedDict):
    path: str
    realpath: str
    symlink_target: str | None
    content_b64: str
    sha256: str
    size: int
    mode: int
    uid: int
    gid: int
    owner: str | None
    group: str | None
    mtime_ns: int
    nlink: int


class InspectRequest(TypedDict):
    module: str | None
    path: str | None
    server: ServerHint | None


class InspectReply(TypedDict):
    facts: dict[str, Any]
    resolved: dict[str, Any] | None
    file: FileReply
    server: dict[str, Any] | None


class SwapRequest(TypedDict):
    path: str
    expected_sha256: str
    content_b64: str
    state_dir: str
    lock_run_id: str | None


class SwapReply(TypedDict, total=False):
    path: str
    realpath: str
    sha256_before: str
    sha256_after: str
    mode: int
    uid: int
    gid: int
    changed: bool
    backup_path: str | None
    purged_bytecode: list[str]
    purge_failures: list[str]


class RestoreRequest(TypedDict):
    path: str
    pre_sha256: str
    content_b64: str | None
    current_sha256: str | None
    force: bool
    state_dir: str


class RestoreReply(TypedDict):
    path: str
    realpath: str
    sha256_before: str
    sha256_after: str
    changed: bool
    source: Literal["backup", "given", "already"]
    kept_copy: str | None
    purged_bytecode: list[str]
    purge_failures: list[str]


class WhoamiReply(TypedDict):
    user: str
    uid: int


# -- one exec: a list of operations -------------------------------------------------------------
# An exec carries a list of operations, run in order in one process: how the controller composes
# "take the lock, then inspect" or "smoke, then give the lock back" without a flag on either.


class OperationCall(TypedDict):
    op: str
    args: dict[str, Any]
    gate: bool
    """The operations after this one run only if its result says `ok: true` (a smoke that
    passed); whatever `gate` says, a refusal stops the batch."""


ReplyStatus = Literal["done", "refused", "not-run"]


class OperationReply(TypedDict, total=False):
    """One operation's reply: `done` with its `result`, `refused` with a stable `code`, a
    `message` and `data`, or `not-run` (an earlier operation of the exec stopped it)."""

    status: ReplyStatus
    result: Any
    code: str
    message: str
    data: dict[str, Any]


class AgentRequest(TypedDict):
    """What `dispatch.main` runs: the operations, and the server's folder to run them in."""

    ops: list[OperationCall]
    cwd: str | None


class AgentReply(TypedDict):
    """The one reply line `dispatch.main` prints: a reply per operation, in the request's
    order, and who ran them (the effective user: the login user, or the one sudo raised to)."""

    replies: list[OperationReply]
    identity: WhoamiReply | None  # None: a test double that does not say


class OpFailure(Exception):
    """An expected refusal or failure; `code` is stable and machine-readable."""

    def __init__(self, code: str, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data or {}


def operation(name: str) -> Callable[[OpFunction], OpFunction]:
    """Register a function as the operation `name`."""

    def register(function: OpFunction) -> OpFunction:
        OPERATIONS[name] = function
        return function

    return register


def os_failure(code: str, what: str, exc: OSError) -> OpFailure:
    name = errno.errorcode.get(exc.errno or 0, "") if exc.errno else ""
    return OpFailure(
        code,
        f"{what}: {exc.strerror or exc}",
        {"errno": name, "filename": exc.filename},
    )
