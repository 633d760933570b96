"""The agent's contract with the controller: operations are registered by name, take the
request's `args` (a JSON object) and return a JSON object; an expected refusal is an `OpFailure`
with a stable, machine-readable `code`."""

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
# One request and one reply shape per operation, named by the controller's `Operation`
# descriptors (`opspatch.hosts.results`) so both ends read the same names. `typing.TypedDict` exists on
# Python 3.8, and these classes cost a host nothing beyond `typing`, which dispatch imports anyway.
# The field types stay strings here (`from __future__ import annotations`), so 3.8 never
# evaluates `list[str]`; mypy checks them on the controller.


class NoArgs(TypedDict):
    """The request of an operation that takes no arguments (`facts`, `whoami`)."""


class FactsReply(TypedDict, total=False):
    """What a host runs (`results.HostFacts`); a probe that failed leaves its keys out."""

    python_version: str
    python_executable: str
    python_implementation: str
    hostname: str
    platform: str
    machine: str
    sglang_version: str | None
    torch_version: str | None
    cuda_available: bool | None
    cuda_version: str | None
    cuda_device_count: int | None
    gpu_names: list[str]
    notes: list[str]
    driver_version: str | None
    gpu_memory_mib: list[int]
    machine_id: str | None


class ResolveReply(TypedDict):
    """The file the engine imports for `module`; `record_sha256` is the hash pip recorded for
    it in its distribution's RECORD (an edit made outside any tool shows as a difference)."""

    module: str
    origin: str
    realpath: str
    is_symlink: bool
    is_package: bool
    distribution: str | None
    distribution_version: str | None
    record_sha256: str | None


class ServerReply(TypedDict):
    pid: int | None
    started_at: float | None


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
    facts: FactsReply
    resolved: ResolveReply | None
    file: FileReply
    server: ServerReply | None


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


class RestartRequest(TypedDict):
    restart: dict[str, Any]  # the inventory's strategy: `kind` and its settings
    log_file: str | None
    env: dict[str, str]
    timeout: float


class Strategy(TypedDict):
    strategy: str  # the restart kind that ran (command, systemd, supervisor, container)


class RestartReply(Strategy, total=False):
    """What a restart or a start did; a key left out is unknown (None) or none (`stopped`)."""

    pid: int | None  # the new engine's, if known
    log_offset: int | None  # where the engine's log stood when it started
    stopped: list[int]
    detail: str


# `start` takes a `RestartRequest` and answers a `RestartReply` (the second half of a restart).


class StopRequest(TypedDict):
    restart: dict[str, Any]  # the inventory's strategy: `kind` and its settings
    log_file: str | None
    timeout: float


class StopReply(Strategy, total=False):
    stopped: list[int]  # the processes stopped (command: the whole tree; a service: its main pid)
    log_offset: int | None  # where the engine's log stood before the stop
    detail: str


class GroupCheck(TypedDict):
    """The group a multi-node server's head must hold (its `/server_info`): `nnodes` nodes,
    `tp_size` tensor-parallel ranks in all."""

    nnodes: int
    tp_size: int | None  # None: not checked


class WaitReadyRequest(TypedDict):
    url: str | None
    timeout: float
    pid: int | None
    pid_file: str | None
    log_file: str | None
    log_offset: int | None
    total: float  # the whole wait's deadline, said in the failure
    slice: bool  # one part of a longer wait: answer `waiting` at the deadline, not fail
    group: GroupCheck | None  # a multi-node server's head: ready only holding this group


class ReadyWaitingReply(TypedDict):
    seconds: float
    polls: int
    last: str


class ReadyReply(TypedDict, total=False):
    seconds: float  # ready
    polls: int
    waiting: ReadyWaitingReply  # a part that ran out


class WaitDrainedRequest(TypedDict):
    url: str | None
    timeout: float
    settle: float
    poll: float


class DrainedReply(TypedDict):
    seconds: float
    polls: int
    answered: bool


class SmokePrompt(TypedDict):
    text: str
    expect: str | None


class SmokeRequest(TypedDict):
    url: str | None
    prompts: list[SmokePrompt]
    max_new_tokens: int
    require_spec_verify: bool
    baseline: list[str | None] | None
    log_file: str | None
    log_offset: int | None
    fail_patterns: list[str]
    ignore_patterns: list[str]
    checks: bool
    timeout: float
    pid: int | None
    pid_file: str | None


class SmokeReply(TypedDict):
    ok: bool
    results: list[dict[str, Any]]  # a prompt's result: prompt, ok, text, tokens, problem
    failures: list[str]
    log_hits: list[str]
    log_offset: int | None
    exceptions: list[dict[str, Any]]
    log_tail: str | None
    exception: dict[str, Any] | None


class MeasureRequest(TypedDict):
    url: str | None
    prompts: list[str]
    max_new_tokens: int
    top_logprobs: int  # k of SGLang's `top_logprobs_num`; 0 asks for no logprobs
    warmup: int  # unmeasured decodes before the measured ones (of the prompts, in turn)
    repeats: int  # rounds over the prompts; a prompt's fastest decode is its sample
    timeout: float  # all prompts together


class DecodeSample(TypedDict):
    """One prompt's greedy decode as the judge measures it (`opspatch.hosts.measure`)."""

    prompt: str
    problem: str | None  # why the request failed; None when it answered 200 with a completion
    refused: bool  # the connection was refused: no server listens (not one that dropped it)
    text: str | None
    output_ids: list[int] | None
    top_ids: list[list[int]] | None  # per output position, the ids of SGLang's top logprobs
    top_logprobs: list[list[float]] | None  # per output position, their logprobs, in that order
    token_logprobs: list[float] | None  # per output position, the chosen token's logprob
    token_texts: list[str | None] | None  # per output position, the token's text if told
    completion_tokens: int | None
    spec_verify_ct: int | None
    seconds: float | None  # from the send to the last token's arrival, timed on the host
    first_token_seconds: float | None  # from the send to the first token's (the same stream)
    server_seconds: float | None  # meta_info's e2e_latency: the server's own, receipt to finish


class MeasureReply(TypedDict):
    samples: list[DecodeSample]
    spec_accept_length: float | None  # the `sglang:spec_accept_length` gauge of /metrics


class DiagnoseRequest(TypedDict):
    facts: bool
    modules: list[str]
    server: dict[str, Any] | None  # url, restart, health_timeout
    log: dict[str, Any] | None  # file, since_seconds, max_read, max_text
    smoke: SmokeRequest | None
    sources: dict[str, Any] | None  # modules, tracebacks, budget, max_files


class DiagnoseReply(TypedDict):
    facts: FactsReply | None
    server: dict[str, Any] | None
    smoke: SmokeReply | None
    log: dict[str, Any] | None
    modules: list[dict[str, Any]]
    sources: dict[str, Any] | None


class LiveDefinition(TypedDict):
    """One definition a live fix takes: `name` (`Class.attr`, `function`, `Class.method`) and
    its `kind` (the live form's word: constant, class-attribute, function, method)."""

    name: str
    kind: str


class LiveFixRequest(TypedDict, total=False):
    """What the engine's plugin takes on its socket (`liveplugin`): `op` take, revert, list or
    check; a take names the module, the file and the sha256 it must have, and the definitions
    (no code travels); a revert names the fix; a check the takes it asks about (`fixes`)."""

    op: str
    fix_id: str
    module: str
    path: str
    paths: list[str]  # a unit's: the file on every node, a rank takes its own copy's
    sha256: str
    definitions: list[LiveDefinition]
    objects: list[str]  # a checked take's construction methods (their classes' objects counted)
    fixes: list[LiveFixRequest]  # a check's takes


class LiveRequest(TypedDict):
    fix: LiveFixRequest
    pid: int | None  # the engine's pid, when the controller knows it
    pid_file: str | None
    url: str | None  # else whoever listens on its port
    env: dict[str, str]  # the inventory's engine.env: its socket base if /proc does not say
    timeout: float  # each socket's answer (an entry rank's take waits for a boundary)


class LiveAnswer(TypedDict):
    """One socket's answer: its name (`scheduler-tp0.sock`), the plugin's reply, or `error`
    when it could not be asked (nobody listens, no whole reply)."""

    socket: str
    reply: dict[str, Any] | None
    error: str | None


class LiveReply(TypedDict):
    server_pid: int | None
    folder: str | None  # the server's socket folder, when found
    missing: str | None  # why no process was asked (not running, the plugin not loaded...)
    answers: list[LiveAnswer]
    unread: bool  # missing because this agent's user may not ask (not: nothing listens)


class LiveSiteRequest(TypedDict):
    pid_file: str | None  # where the running engine is, for its SGLANG_PLUGINS
    url: str | None
    env: dict[str, str]  # the inventory's engine.env, where /proc cannot be read


class LiveInstalled(TypedDict):
    dist_info: str  # opspatch_live-<version>.dist-info
    record: str | None  # its RECORD's text (None: unreadable)


class LiveSiteReply(TypedDict):
    purelib: str  # the engine interpreter's site-packages
    sglang_dir: str | None
    plugin_framework: bool  # sglang/srt/plugins/__init__.py is there
    installed: list[LiveInstalled]
    filtered: str | None  # SGLANG_PLUGINS keeps the plugin out: why, and where it was read


class InstallFilesRequest(TypedDict):
    root: str
    files: dict[str, str]  # relative path -> base64
    state_dir: str
    lock_run_id: str | None


class InstallFilesReply(TypedDict):
    root: str
    written: list[str]
    already: list[str]  # there already with these bytes


class RemoveFilesRequest(TypedDict):
    root: str
    files: dict[str, str]  # relative path -> the sha256 it was written with
    state_dir: str
    lock_run_id: str | None


class RemoveFilesReply(TypedDict):
    root: str
    removed: list[str]
    absent: list[str]
    purged_bytecode: list[str]


class FileHashesRequest(TypedDict):
    root: str
    paths: list[str]  # relative to root


class FileHashesReply(TypedDict):
    root: str
    sha256: dict[str, str | None]  # relative path -> its sha256 (None: absent)


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


class SentRequest(AgentRequest, total=False):
    """A request as it travels: what the bootstrap and the resident agent take off it before
    `dispatch` runs it. `agent`: the agent modules this process lacks (zlib-compressed JSON of
    `[name, source]` pairs, base64); `env`: the engine's environment (sent when raised: sudo
    resets it); `seq`: a resident agent's request number, said back in its `Receipt`."""

    agent: str
    env: dict[str, str]
    seq: int


class Receipt(TypedDict):
    """A resident agent's line ahead of each reply: it has request `taken` and nothing of it
    ran before this line. No receipt, and the agent's end, means the request never started."""

    taken: int


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
