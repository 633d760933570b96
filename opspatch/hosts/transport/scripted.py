"""The scripted transport: agent requests answered by a function, for fast tests of rare paths."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from opspatch.hosts.agent.dispatch import perform, run_batch
from opspatch.hosts.agent.protocol import AgentRequest, OperationReply
from opspatch.hosts.channel import AgentAnswer, agent_modules
from opspatch.hosts.containers import ContainerIdentity
from opspatch.hosts.transport.base import ClosesOnExit, Command, CommandResult


@dataclass(frozen=True)
class Refusal:
    """The agent's refusal: a stable `code` (`preimage-mismatch`, `lock-held`, ...), a message,
    and the refusal's data (what the real agent attaches: `log_tail`, the lock holder...)."""

    code: str
    message: str
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class NoReply:
    """An exec that printed no reply line: its exit status and stderr (an interpreter that is
    missing: 127; an agent killed: 1 and "Killed")."""

    exit_code: int
    stderr: str = ""


Answer = dict[str, Any] | Refusal | NoReply
Handler = Callable[[str, dict[str, Any]], Answer]


@dataclass(frozen=True)
class ScriptedCall:
    """One operation the transport was asked to run: its name, arguments, the exec's deadline,
    the user it ran as (None: the login user) and which exec carried it (0, 1, ...)."""

    op: str
    args: dict[str, Any]
    timeout: float
    cwd: str | None = None
    as_user: str | None = None
    exec_index: int = 0


class _ExecEnded(Exception):
    """A handler's `NoReply`: the exec ends there, with that status and no reply line."""

    def __init__(self, no_reply: NoReply) -> None:
        super().__init__("no reply")
        self.no_reply = no_reply


class ScriptedTransport(ClosesOnExit):
    """A transport whose host is a function: `handler(op, args)` answers each operation of each
    typed agent request (`answer`).

    `host` is the inventory name used in messages; `exec_count` counts execs, `execs` lists the
    operations of each and `calls` records every operation (the handler can keep its own record
    too). `closed` says whether `close()` was called. `pins`: the container its commands run
    in, pinned by the first exec as the container transport pins it (`container` None before).
    Thread-safe as far as the handler is: one transport per host.
    """

    def __init__(
        self, handler: Handler, *, host: str = "scripted", pins: ContainerIdentity | None = None
    ) -> None:
        self.host = host
        self.exec_count = 0
        self.calls: list[ScriptedCall] = []
        self.execs: list[tuple[str, ...]] = []
        self.closed = False
        self._handler = handler
        self._pins = pins
        self._pinned: ContainerIdentity | None = None

    @property
    def container(self) -> ContainerIdentity | None:
        """`pins` once the first exec ran (None before it, and where nothing is pinned)."""
        return self._pinned

    @property
    def ops(self) -> list[str]:
        """The operations requested so far, in order (every exec's, one after another)."""
        return [call.op for call in self.calls]

    def answer(self, request: AgentRequest, *, as_user: str | None, timeout: float) -> AgentAnswer:
        """Run the request's operations through the handler, by the agent's batch rule.

        Raises:
            TransportError, CommandTimeout: as the handler raises them.
        """
        index = self.exec_count
        self.exec_count += 1
        self._pinned = self._pins
        self.execs.append(tuple(call["op"] for call in request["ops"]))

        def perform(op: str, args: dict[str, Any]) -> OperationReply:
            copy = json.loads(json.dumps(args))  # what a host would decode: no shared objects
            self.calls.append(ScriptedCall(op, copy, timeout, request["cwd"], as_user, index))
            answer = self._handler(op, copy)
            if isinstance(answer, NoReply):
                raise _ExecEnded(answer)
            if isinstance(answer, Refusal):
                return {
                    "status": "refused",
                    "code": answer.code,
                    "message": answer.message,
                    "data": dict(answer.data),
                }
            return {"status": "done", "result": json.loads(json.dumps(answer))}

        try:
            replies = run_batch(request["ops"], perform)
        except _ExecEnded as ended:
            no_reply = ended.no_reply
            return AgentAnswer(reply=None, exit_code=no_reply.exit_code, stderr=no_reply.stderr)
        return AgentAnswer(reply={"replies": replies, "identity": None})

    def run(self, command: Command, *, stdin: bytes = b"", timeout: float) -> CommandResult:
        """Not a shell: this transport only answers typed host-agent requests (`answer`).

        Raises:
            ValueError: always.
        """
        raise ValueError(
            f"the scripted transport only answers host-agent requests, not `{command.masked()}`"
        )

    def close(self) -> None:
        """Nothing to release; recorded in `closed`. Safe to call twice."""
        self.closed = True


def agent_perform(op: str, args: dict[str, Any]) -> OperationReply:
    """The real host agent's operation `op`, run here, in this process, on this machine's files,
    as the agent runs each operation of a batch (`dispatch.perform`): its reply. The request's
    `cwd` is not entered: the test process stays where it is."""
    for name, _ in agent_modules():
        importlib.import_module(name)  # each registers its operations
    return perform(op, json.loads(json.dumps(args)))  # the copy a host would decode


def agent_operation(op: str, args: dict[str, Any]) -> dict[str, Any] | Refusal:
    """`agent_perform` as a handler's answer: the result, or the refusal as a `Refusal` (an
    unexpected exception becomes `agent-error`, as on a host)."""
    reply = agent_perform(op, args)
    if reply["status"] == "done":
        return dict(reply["result"])
    return Refusal(reply["code"], reply["message"], reply.get("data") or {})
