"""`diagnose` on one host, controller side: the request, one exec of the agent's `diagnose`
operation (`opspatch.hosts.agent.diagnose`), and its reply as frozen values."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from opspatch.core.codec import Record, json_options
from opspatch.errors import RemoteOperationError
from opspatch.hosts.agent.checks import find_tracebacks
from opspatch.hosts.agent.diagnose import op_diagnose
from opspatch.hosts.agent.protocol import DiagnoseReply
from opspatch.hosts.agent.protocol import DiagnoseRequest as DiagnoseArgs
from opspatch.hosts.become import RunsAs
from opspatch.hosts.engine import SMOKE, SmokeResult
from opspatch.hosts.live import LiveEngineReply
from opspatch.hosts.operations import HostOperations
from opspatch.hosts.results import HostFacts, Operation, RemoteFile, from_base64, read_reply
from opspatch.hosts.transport.container import ContainerIdentity


@dataclass(frozen=True)
class DiagnoseRequest:
    """What to look at on a host (each part costs nothing when left out).

    `modules`: the dotted modules whose files are judged. `server`: find the engine's process and
    ask /health. `log`: read the log since the last start (or `since_seconds` ago), at most
    `max_log_read` bytes from its end. `smoke`: the agent's `smoke` arguments (`--decode`).
    `source_modules`: send these modules' files with their package siblings and the
    same-package modules they import; `traceback_sources`: the same for the frames where logged
    AttributeErrors were raised.
    """

    modules: tuple[str, ...]
    server: bool = True
    log: bool = True
    since_seconds: float | None = None
    max_log_read: int | None = None
    smoke: Mapping[str, Any] | None = None
    source_modules: tuple[str, ...] = ()
    traceback_sources: bool = False
    facts: bool = True

    def args(self, ops: HostOperations) -> DiagnoseArgs:
        """The agent's arguments for this request on the host `ops` works on."""
        engine = ops.host.engine
        restart = engine.restart
        settings = {k: v for k, v in vars(restart).items() if v is not None} if restart else {}
        wants_sources = bool(self.source_modules) or self.traceback_sources
        args = {
            "facts": self.facts,
            "modules": list(self.modules),
            "server": {"url": engine.url, "restart": settings} if self.server else None,
            "log": (
                {
                    "file": engine.log_file,
                    "since_seconds": self.since_seconds,
                    "max_read": self.max_log_read,
                }
                if self.log and engine.log_file
                else None
            ),
            "smoke": dict(self.smoke) if self.smoke is not None else None,
            "sources": (
                {"modules": list(self.source_modules), "tracebacks": self.traceback_sources}
                if wants_sources
                else None
            ),
        }
        return cast(DiagnoseArgs, args)  # `smoke` is `engine.smoke_args`'s SmokeRequest


def _maybe_base64(text: Any) -> bytes | None:
    return None if text is None else from_base64(text)


@dataclass(frozen=True)
class InstalledCopy(Record):
    """A copy of the package the interpreter could import, and what points at it."""

    path: str
    kind: str  # sys.path | egg-link | pth | editable-finder
    via: str
    exists: bool
    imported: bool


@dataclass(frozen=True)
class CachedBytecode(Record):
    """One pyc of the module, judged against its source (`runs_old_code`: the next import would
    run code that is not the source's)."""

    path: str
    kind: str
    verdict: str
    runs_old_code: bool


@dataclass(frozen=True)
class Checkout(Record):
    """The git checkout a module's file lives in (an editable install's source tree)."""

    root: str
    relpath: str
    error: str | None
    head: str | None = None
    branch: str | None = None
    author: str | None = None
    date: str | None = None
    subject: str | None = None
    tracked: bool = False
    head_sha256: str | None = None
    # HEAD's bytes of the file, when they differ from the live one
    head_content: bytes | None = field(
        default=None,
        metadata=json_options(key="head_content_b64", decode=_maybe_base64, written=False),
    )
    diff: str | None = None  # `git diff HEAD -- file`
    uncommitted: tuple[str, ...] = ()  # `git status --porcelain` of the whole checkout
    uncommitted_count: int = 0


@dataclass(frozen=True)
class ModuleDiagnosis:
    """The file a host imports for one module, and where its code comes from."""

    module: str
    error: str | None = None  # the module does not resolve (or is not a .py source)
    error_code: str | None = None
    file: RemoteFile | None = None
    origin: str | None = None
    distribution: str | None = None
    distribution_version: str | None = None
    record_sha256: str | None = None
    installed: Mapping[str, Any] | None = None  # name, version, editable, url
    distributions: tuple[Mapping[str, Any], ...] = ()
    copies: tuple[InstalledCopy, ...] = ()
    checkout: Checkout | None = None
    bytecode: tuple[CachedBytecode, ...] = ()
    server_older_than_file: bool | None = None
    changed_after_log_start: bool | None = None

    @property
    def version(self) -> str | None:
        """The installed distribution's version (RECORD's, else the dist-info's)."""
        if self.distribution_version:
            return self.distribution_version
        return str(self.installed["version"]) if self.installed else None


@dataclass(frozen=True)
class ServerState:
    """The engine's process and its /health answer."""

    pid: int | None
    found_by: str
    running: bool
    started_at: float | None
    cmdline: tuple[str, ...]
    speculative: Mapping[str, str]
    spec_v2_env: str | None
    health_status: int | None
    health_error: str | None
    running_after_decode: bool | None = None


@dataclass(frozen=True)
class TracebackGroup:
    """The tracebacks of one exception (type and message) in the log window."""

    type: str | None
    message: str | None
    count: int
    first_time: str | None
    last_time: str | None
    first_line_number: int
    frame: str | None
    file: str | None
    lineno: int | None
    context: str | None

    @property
    def exception(self) -> str:
        return f"{self.type}: {self.message}" if self.message is not None else str(self.type)

    @property
    def when(self) -> str:
        """Its times as the log stamps them; a traceback printed on lines of its own (the
        interpreter's, or after a `logger.exception` message) carries none."""
        if self.first_time is None and self.last_time is None:
            return "time not logged"
        return f"first {self.first_time}, last {self.last_time}"


@dataclass(frozen=True)
class LogMarker(Record):
    """Lines of one known kind (scheduler exception, warm-up failure, CUDA OOM, ...)."""

    kind: str
    count: int
    first_time: str | None
    last_time: str | None
    line_number: int
    line: str


@dataclass(frozen=True)
class LogWindow:
    """The log since the server's last start (or since a time), as read on the host."""

    path: str
    exists: bool
    size: int
    basis: str
    started_at: float | None = None  # the start the window begins with (its log line's time)
    truncated: bool = False
    first_line: int = 1
    text: str = ""
    text_cut: bool = False
    tracebacks: tuple[TracebackGroup, ...] = ()
    markers: tuple[LogMarker, ...] = ()

    def marker(self, kind: str) -> LogMarker | None:
        return next((m for m in self.markers if m.kind == kind), None)

    def passed_over(self, group: TracebackGroup, ignore: Sequence[str]) -> str | None:
        """The first of `ignore` (a playbook's `ignore_patterns`) that the line before every
        traceback of `group` matches: a warning logged with its traceback, which the smoke's log
        scan passes over too (`checks.scan_log`); None when one is logged otherwise."""
        lines = self.text.splitlines()
        found = [
            t
            for t in find_tracebacks(self.text)
            if (t["type"], t["message"]) == (group.type, group.message)
        ]
        for pattern in ignore:
            if found and all(
                t["line_number"] >= 2 and re.search(pattern, lines[t["line_number"] - 2])
                for t in found
            ):
                return pattern
        return None


@dataclass(frozen=True)
class HostDiagnosis:
    """Everything one `diagnose` exec brought back from a host."""

    host: str
    facts: HostFacts | None
    server: ServerState | None
    modules: tuple[ModuleDiagnosis, ...]
    smoke: SmokeResult | None
    log: LogWindow | None
    sources: Mapping[str, str] = field(default_factory=dict)  # path -> text
    sources_left_out: tuple[str, ...] = ()
    container: ContainerIdentity | None = None
    """The container the engine runs in, as this diagnosis found it (None: on the host)."""
    live: LiveEngineReply | None = None
    """What each engine process answered to `list` (its live fixes in memory): a host with
    `live = true` only (None: not asked, or not answered)."""
    live_error: str | None = None
    """Why the engine could not be asked `list` on a host with `live = true` (None: asked, or
    not a live host)."""

    def module(self, name: str) -> ModuleDiagnosis:
        return next(m for m in self.modules if m.module == name)


@dataclass(frozen=True)
class ModuleError(Record):
    code: str
    message: str


@dataclass(frozen=True)
class ModuleReply(Record):
    """One module of a `diagnose` reply as the agent sends it: the resolved file and where its
    code comes from, or the `error` that it does not resolve (then nothing else)."""

    module: str
    error: ModuleError | None = None
    file: RemoteFile | None = None
    origin: str | None = None
    realpath: str | None = None
    is_symlink: bool | None = None
    is_package: bool | None = None
    distribution: str | None = None
    distribution_version: str | None = None
    record_sha256: str | None = None
    installed: dict[str, Any] | None = None
    distributions: tuple[dict[str, Any], ...] = ()
    copies: tuple[InstalledCopy, ...] = ()
    checkout: Checkout | None = None
    bytecode: tuple[CachedBytecode, ...] = ()
    server_older_than_file: bool | None = None
    changed_after_log_start: bool | None = None


@dataclass(frozen=True)
class SourceFile(Record):
    path: str
    text: str


@dataclass(frozen=True)
class SourcesReply(Record):
    files: tuple[SourceFile, ...] = ()
    left_out: tuple[str, ...] = ()
    bytes: int = 0


@dataclass(frozen=True)
class DiagnosisReply(Record):
    """A `diagnose` reply as the agent sends it, read field by field (`HostDiagnosis` is what
    it says, judged nowhere yet). The server's and the log's parts are read by `_server` and
    `_log`; the smoke's by `engine.SMOKE`."""

    facts: HostFacts | None
    server: dict[str, Any] | None
    smoke: dict[str, Any] | None
    log: dict[str, Any] | None
    modules: tuple[ModuleReply, ...]
    sources: SourcesReply | None


DIAGNOSE = Operation(
    "diagnose", DiagnoseArgs, DiagnoseReply, DiagnosisReply, op_diagnose, runs_as=RunsAs.LOGIN
)


# ---------------------------------------------------------------------------------------------


def diagnose_host(
    ops: HostOperations, request: DiagnoseRequest, *, timeout: float
) -> HostDiagnosis:
    """Run the agent's `diagnose` on the host (one exec, nothing written) and read its reply.

    Raises:
        InputError: the host's engine interpreter is not set or cannot run.
        TransportError, CommandTimeout, RemoteOperationError: the host could not be asked.
    """
    reply = ops.run(DIAGNOSE, request.args(ops), timeout=timeout, step="diagnose")
    return _host_diagnosis(ops, reply)


def _host_diagnosis(ops: HostOperations, reply: DiagnosisReply) -> HostDiagnosis:
    sources = reply.sources or SourcesReply()
    return HostDiagnosis(
        host=ops.name,
        facts=reply.facts,
        server=_server(reply.server),
        modules=tuple(_module(ops, m) for m in reply.modules),
        smoke=SMOKE.read(reply.smoke, host=ops.name, step="diagnose") if reply.smoke else None,
        log=_log(reply.log, ops.name),
        sources={f.path: f.text for f in sources.files},
        sources_left_out=sources.left_out,
    )


def _module(ops: HostOperations, data: ModuleReply) -> ModuleDiagnosis:
    if data.error is not None:
        return ModuleDiagnosis(
            module=data.module, error=data.error.message, error_code=data.error.code
        )
    if data.file is None or data.origin is None:
        missing = "file" if data.file is None else "origin"
        raise RemoteOperationError(
            f"the host agent's reply is not what this opspatch reads: "
            f"ModuleReply.{missing}: missing (module {data.module})",
            code="agent-bad-reply",
            host=ops.name,
            step="diagnose",
        )
    return ModuleDiagnosis(
        module=data.module,
        file=ops.verified(data.file, "diagnose"),
        origin=data.origin,
        distribution=data.distribution,
        distribution_version=data.distribution_version,
        record_sha256=data.record_sha256,
        installed=data.installed,
        distributions=data.distributions,
        copies=data.copies,
        checkout=data.checkout,
        bytecode=data.bytecode,
        server_older_than_file=data.server_older_than_file,
        changed_after_log_start=data.changed_after_log_start,
    )


def _server(data: Mapping[str, Any] | None) -> ServerState | None:
    if not data:
        return None
    health = data.get("health") or {}
    return ServerState(
        pid=data.get("pid"),
        found_by=str(data.get("found_by") or ""),
        running=bool(data.get("running")),
        started_at=data.get("started_at"),
        cmdline=tuple(data.get("cmdline") or ()),
        speculative=dict(data.get("speculative") or {}),
        spec_v2_env=data.get("spec_v2_env"),
        health_status=health.get("status"),
        health_error=health.get("error"),
        running_after_decode=data.get("running_after_decode"),
    )


def _log(data: Mapping[str, Any] | None, host: str) -> LogWindow | None:
    if not data:
        return None
    return LogWindow(
        path=str(data["path"]),
        exists=bool(data.get("exists")),
        size=int(data.get("size") or 0),
        basis=str(data.get("basis") or ""),
        started_at=data.get("started_at"),
        truncated=bool(data.get("truncated")),
        first_line=int(data.get("first_line") or 1),
        text=str(data.get("text") or ""),
        text_cut=bool(data.get("text_cut")),
        tracebacks=tuple(_traceback(t) for t in data.get("tracebacks") or ()),
        markers=tuple(
            read_reply(LogMarker, m, host=host, step="diagnose") for m in data.get("markers") or ()
        ),
    )


def _traceback(data: Mapping[str, Any]) -> TracebackGroup:
    return TracebackGroup(
        type=data.get("type"),
        message=data.get("message"),
        count=int(data.get("count") or 0),
        first_time=data.get("first_time"),
        last_time=data.get("last_time"),
        first_line_number=int(data.get("first_line_number") or 0),
        frame=data.get("frame"),
        file=data.get("file"),
        lineno=data.get("lineno"),
        context=data.get("context"),
    )
