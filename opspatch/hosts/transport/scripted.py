"""The scripted transport: host-agent requests answered by a function, for fast tests of rare paths.

In the manner of httpx's `MockTransport`: a `ScriptedTransport` is built with a handler,
`handler(op, args)`, and every `run` decodes the host-agent request sent on stdin (the JSON the
bootstrap reads: `op`, `args`, `cwd`, the agent's source) and answers with what the handler
returns, encoded exactly as the agent prints its reply line. `HostOperations`, `EngineControl`
and everything above them cannot tell it from a host, yet no process, engine or sshd is started.

What a handler returns, or raises:
- a `dict`: the operation succeeded with that result (`{"ok": true, "result": {...}}`);
- a `Refusal(code, message, data)`: the agent refused (`{"ok": false, "code": ...}`), which
  `HostOperations` turns into `PreimageMismatch`, `LockHeld`, `RemoteOperationError`...;
- a `RawReply(stdout, stderr, exit_code)`: the command's output verbatim (an agent that printed
  no reply, an interpreter that is missing: exit 127);
- raise `TransportError` / `CommandTimeout`: the connection was lost, or the deadline passed,
  with no reply; whatever the handler did before raising (a real write, say) stays done.

`agent_operation(op, args)` runs the real host agent's operation in this process, on this
machine's files, and returns its result or refusal: a handler scripts only the step under test
and lets the others really happen. A lost swap, for example (the file is written, the reply never
arrives):

    def handler(op, args):
        answer = agent_operation(op, args)
        if op == "swap":
            raise TransportError("the connection broke", step="exec")
        return answer

    with ScriptedTransport(handler, host="h1") as transport:
        ops = HostOperations(transport, host)

Every call is recorded (`calls`: operation, arguments, deadline) and counted in `exec_count`,
as the real transports count their execs, so a test can check round trips and deadlines.
"""

from __future__ import annotations

import importlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from opspatch.hosts.channel import agent_modules, decode_request
from opspatch.hosts.transport.base import ClosesOnExit, Command, CommandResult


@dataclass(frozen=True)
class Refusal:
    """The agent's refusal: a stable `code` (`preimage-mismatch`, `lock-held`, ...), a message,
    and the refusal's data (what the real agent attaches: `log_tail`, the lock holder...)."""

    code: str
    message: str
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RawReply:
    """A command's output taken verbatim, for replies the agent never prints itself."""

    stdout: bytes = b""
    stderr: bytes = b""
    exit_code: int = 0


Answer = dict[str, Any] | Refusal | RawReply
Handler = Callable[[str, dict[str, Any]], Answer]


@dataclass(frozen=True)
class ScriptedCall:
    """One request the transport received: the agent operation, its arguments, the deadline."""

    op: str
    args: dict[str, Any]
    timeout: float
    cwd: str | None = None


class ScriptedTransport(ClosesOnExit):
    """A transport whose host is a function: `handler(op, args)` answers each agent request.

    `host` is the inventory name used in messages; `exec_count` counts `run` calls and `calls`
    records each request (the handler can keep its own record too). `closed` says whether
    `close()` was called. Thread-safe as far as the handler is: one transport per host.
    """

    def __init__(self, handler: Handler, *, host: str = "scripted") -> None:
        self.host = host
        self.exec_count = 0
        self.calls: list[ScriptedCall] = []
        self.closed = False
        self._handler = handler

    @property
    def ops(self) -> list[str]:
        """The operations requested so far, in order."""
        return [call.op for call in self.calls]

    def run(self, command: Command, *, stdin: bytes = b"", timeout: float) -> CommandResult:
        """Decode the agent request on `stdin`, ask the handler, encode its answer.

        Raises:
            ValueError: `stdin` is not a host-agent request (this transport only speaks to the
                agent).
            TransportError, CommandTimeout: as the handler raises them.
        """
        self.exec_count += 1
        started = time.monotonic()
        try:
            request = decode_request(stdin)  # the channel's one wire format
            op = request["op"]
            args = dict(request.get("args") or {})
        except (ValueError, TypeError) as exc:
            raise ValueError(
                f"the scripted transport only answers host-agent requests, not `{command.masked()}`"
            ) from exc
        self.calls.append(ScriptedCall(op, args, timeout, request.get("cwd")))
        answer = self._handler(op, args)
        if isinstance(answer, RawReply):
            stdout, stderr, exit_code = answer.stdout, answer.stderr, answer.exit_code
        else:
            stdout, stderr, exit_code = encode_reply(answer), b"", 0
        return CommandResult(
            command=command.masked(),
            exit_code=exit_code,
            stdout=stdout,
            stderr=stderr,
            seconds=time.monotonic() - started,
        )

    def close(self) -> None:
        """Nothing to release; recorded in `closed`. Safe to call twice."""
        self.closed = True


def encode_reply(answer: dict[str, Any] | Refusal) -> bytes:
    """The reply line the host agent prints for a result or a refusal."""
    if isinstance(answer, Refusal):
        reply: dict[str, Any] = {
            "ok": False,
            "code": answer.code,
            "message": answer.message,
            "data": dict(answer.data),
        }
    else:
        reply = {"ok": True, "result": answer}
    return (json.dumps(reply, sort_keys=True) + "\n").encode("utf-8")


def agent_operation(op: str, args: dict[str, Any]) -> dict[str, Any] | Refusal:
    """Run the real host agent's operation `op` here, in this process, on this machine's files.

    Returns its result, or its refusal as a `Refusal` (an unexpected exception becomes
    `agent-error`, as on a host). The request's `cwd` is not entered: the test process stays
    where it is.
    """
    from opspatch.hosts.agent.protocol import OPERATIONS, OpFailure

    for name, _ in agent_modules():
        importlib.import_module(name)  # each registers its operations

    function = OPERATIONS.get(op)
    if function is None:
        return Refusal("unknown-operation", f"this agent has no operation {op!r}")
    try:
        return dict(function(json.loads(json.dumps(args))))  # the copy a host would decode
    except OpFailure as failure:
        return Refusal(failure.code, failure.message, failure.data)
    except Exception as exc:
        return Refusal("agent-error", f"{type(exc).__name__}: {exc}")
