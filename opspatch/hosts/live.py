"""Live fixes, as the controller sends them: the agent's `live` operation (the engine's sockets
asked on the host, `hosts/agent/live.py`), its record, and each engine process's answer read out
of it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from opspatch.core.codec import WIRE, Record
from opspatch.core.host import Host
from opspatch.core.live import LiveDefinition
from opspatch.hosts.agent.live import op_live
from opspatch.hosts.agent.protocol import LiveAnswer, LiveFixRequest, LiveReply, LiveRequest
from opspatch.hosts.become import RunsAs
from opspatch.hosts.liveplugin.wire import PEER_NOT_ALLOWED
from opspatch.hosts.operations import HostOperations
from opspatch.hosts.results import Operation

LiveOp = Literal["take", "revert", "list", "check"]

NOT_LOADED = "module-not-loaded"
"""The fix runtime's refusal of a take in a process that never imported the module: nothing
to fix there (the main process does not import the scheduler's modules), not a failure."""

EXEC_MARGIN = 30.0


@dataclass(frozen=True)
class LiveFix:
    """One request to the engine's processes. `take`: `module` at `path` must hash to `sha256`
    there, and `definitions` are taken from it; `revert`: the fix `fix_id` is undone; `list`:
    what each process holds; `check` (the preflight): whether each take of `fixes` would be in
    effect in each process (`liveplugin/checks.py`), nothing changed."""

    op: LiveOp
    fix_id: str = ""
    module: str = ""
    path: str = ""
    sha256: str = ""
    definitions: tuple[LiveDefinition, ...] = ()
    paths: tuple[str, ...] = ()
    """A unit's take: the file on the other nodes (each swapped to `sha256`); the entry rank's
    broadcast reaches every node's ranks, each taking its own copy."""
    objects: tuple[str, ...] = ()
    """A checked take's construction methods (`LiveForm.objects`): each process counts the
    objects of their classes it already built."""
    fixes: tuple[LiveFix, ...] = ()
    """A check's takes, as they would be sent."""

    @classmethod
    def check(cls, takes: Sequence[LiveFix]) -> LiveFix:
        """The preflight's question about `takes`."""
        return cls("check", fixes=tuple(takes))

    def request(self) -> LiveFixRequest:
        if self.op == "list":
            return {"op": "list"}
        if self.op == "check":
            return {"op": "check", "fixes": [fix.request() for fix in self.fixes]}
        if self.op == "revert":
            return {"op": "revert", "fix_id": self.fix_id}
        request: LiveFixRequest = {
            "op": "take",
            "fix_id": self.fix_id,
            "module": self.module,
            "path": self.path,
            "sha256": self.sha256,
            "definitions": [{"name": d.name, "kind": str(d.kind)} for d in self.definitions],
        }
        if self.paths:
            request["paths"] = list(self.paths)
        if self.objects:
            request["objects"] = list(self.objects)
        return request


@dataclass(frozen=True)
class LiveEngineReply(Record):
    """The agent's answer: the engine's main pid, its socket folder, why no process was asked
    (`missing`, `unread` when it could not be), and each socket's answer."""

    server_pid: int | None
    folder: str | None
    missing: str | None
    answers: Annotated[tuple[LiveAnswer, ...], WIRE] = ()
    unread: bool = False
    """`missing` because this agent's user may not ask the engine (another user's engine),
    not because nothing listens: what it holds is not known."""

    @property
    def peer_refused(self) -> bool:
        """The engine listens, but not to this agent's user: kept out before any process was
        asked (`unread`), or refused by every process (`peer-not-allowed`)."""
        processes = self.processes()
        return self.unread or (
            bool(processes) and all(p.code == PEER_NOT_ALLOWED for p in processes)
        )

    def processes(self) -> tuple[ProcessAnswer, ...]:
        """One answer per engine process: the entry rank's reply split into every rank's."""
        found: list[ProcessAnswer] = []
        for answer in self.answers:
            socket, reply = answer["socket"], answer["reply"]
            if reply is None:
                process = _socket_process(socket)
                found.append(
                    ProcessAnswer(process, None, False, (), "unreachable", answer["error"])
                )
                continue
            ranks = reply.get("ranks")
            replies = ranks if isinstance(ranks, list) and ranks else [reply]
            found.extend(ProcessAnswer.of(each, socket) for each in replies)
        return tuple(found)


@dataclass(frozen=True)
class ProcessAnswer(Record):
    """What one engine process said: who (`main`, `detokenizer`, `scheduler-tp1`), its pid,
    whether it did what was asked, what it holds or took (`took`: the fix runtime's entries,
    each with the definition's `name`), and the refusal's code and message when it did not."""

    process: str
    pid: int | None
    ok: bool
    took: tuple[dict[str, Any], ...] = ()
    code: str | None = None
    message: str | None = None
    checks: tuple[dict[str, Any], ...] = ()
    """A `check`'s answer: one entry per fix asked (`liveplugin/checks.py`)."""

    @classmethod
    def of(cls, reply: dict[str, Any], socket: str) -> ProcessAnswer:
        described = reply.get("process") if isinstance(reply.get("process"), dict) else {}
        assert isinstance(described, dict)
        role, rank = described.get("role"), described.get("rank")
        if role == "scheduler" and isinstance(rank, int):
            name = f"scheduler-tp{rank}"
        else:
            name = str(role) if role else _socket_process(socket)
        pid = described.get("pid")
        refused = reply.get("refused") if isinstance(reply.get("refused"), dict) else {}
        assert isinstance(refused, dict)
        took, checks = reply.get("took"), reply.get("checks")
        return cls(
            process=name,
            pid=pid if isinstance(pid, int) else None,
            ok=reply.get("ok") is True,
            took=tuple(t for t in took if isinstance(t, dict)) if isinstance(took, list) else (),
            code=str(refused["code"]) if refused.get("code") else None,
            message=str(refused["message"]) if refused.get("message") else None,
            checks=tuple(c for c in checks if isinstance(c, dict))
            if isinstance(checks, list)
            else (),
        )

    @property
    def not_loaded(self) -> bool:
        """A take this process refused only because it never imported the module."""
        return not self.ok and self.code == NOT_LOADED

    def describe(self) -> str:
        who = f"{self.process} (pid {self.pid})" if self.pid is not None else self.process
        if self.ok:
            return f"{who}: ok"
        return f"{who}: {self.code or 'refused'}: {self.message or 'no reason given'}"


def _socket_process(socket: str) -> str:
    return socket.removesuffix(".sock")


LIVE = Operation("live", LiveRequest, LiveReply, LiveEngineReply, op_live, runs_as=RunsAs.CHANGE)


def live_request(host: Host, fix: LiveFix, *, timeout: float) -> LiveRequest:
    """The agent's `live` arguments for `host`: where its engine runs (pid file, URL), its
    inventory environment (the socket base if the engine's own cannot be read) and `fix`."""
    return {
        "fix": fix.request(),
        "pid": None,
        "pid_file": getattr(host.engine.restart, "pid_file", None),
        "url": host.engine.url,
        "env": dict(host.engine.env),
        "timeout": timeout,
    }


def ask_engine(
    ops: HostOperations, fix: LiveFix, *, timeout: float, step: str = "live"
) -> LiveEngineReply:
    """Send `fix` to the running engine's processes on the host (one exec) and read what each
    said.

    Raises:
        RemoteOperationError, TransportError: the exec failed (as for every operation).
    """
    request = live_request(ops.host, fix, timeout=timeout)
    return ops.run(LIVE, request, timeout=timeout * 2 + EXEC_MARGIN, step=step)


def took_names(answer: ProcessAnswer) -> set[str]:
    """The definitions a process reports it holds or took (each `took` entry's `name`)."""
    return {str(entry["name"]) for entry in answer.took if "name" in entry}


def missing_definitions(answer: ProcessAnswer, names: Sequence[str]) -> list[str]:
    """The `names` a process that answered ok does not report as taken."""
    held = took_names(answer)
    return [name for name in names if name not in held]
