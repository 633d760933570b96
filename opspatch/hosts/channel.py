"""The agent channel: typed calls to the host agent over a `Transport`, in one place.

`AgentChannel.call_batch(calls, as_user=...)` is the only code that sends operations to a host
and reads their replies: a list of operations (`OperationCall`) run in order by the agent in one
exec, stopping at the first refusal, and a reply per operation (`done`, `refused` or `not-run`).
`call(op, args, as_user=...)` is a batch of one that returns the result or raises the refusal.
Who answers is an `AgentEndpoint`: for the SSH and local transports, `BootstrapEndpoint`, the one
real path, which builds `<python> -c BOOTSTRAP` with the request on stdin (`encode_request`),
sends it as the login user or, through `Sudo`, as a raised one, and reads the reply line
(`parse_reply`); a test double that answers typed requests itself (`transport.scripted`) is its
own endpoint. The channel notes who ran each exec (`ran_as`) and turns a refusal into the error
tree through `REFUSAL_ERRORS`, the one table from the agent's codes to errors.
`HostOperations` (`opspatch.hosts.operations`) builds each operation's typed request
(`opspatch.hosts.agent.protocol`), composes them ("lock, then inspect"; "smoke, then give the
lock back") and makes result values of the typed replies.

While a run holds the host's lock, every exec it sends as the lock's user re-asserts the lock
first, in the same exec (`_Fence`): the lock is then busy as long as the exec may run plus the
run's grace (its lease expiry), and keeps other runs off for `LOCK_HOLD_SECONDS` after that.
So a controller that is alive keeps its lock however long the run takes; a recover of a run
whose controller is gone takes a host over once no exec of it can still be running there; and
an exec sent after another run took the lock over is refused before it does anything
(`lock-lost`). With become, an exec as another user is one process of its own: a read (the
login user) is not fenced, since it changes nothing and the run's next change is; a change (a
restart as root) is preceded by a re-assertion of its own only when the lock might lapse
before its deadline.
"""

from __future__ import annotations

import ast
import base64
import functools
import json
import threading
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, Protocol, cast, runtime_checkable

from opspatch.core.host import Host
from opspatch.core.syntax import parse_python
from opspatch.errors import (
    InputError,
    LockHeld,
    PreimageMismatch,
    RemoteOperationError,
    TargetError,
    TransportError,
)
from opspatch.hosts.agent.protocol import (
    AgentReply,
    AgentRequest,
    LockRequest,
    OperationCall,
    OperationReply,
)
from opspatch.hosts.become import (
    LOGIN_OPERATIONS,
    RAISED_OPERATIONS,
    BecomePasswords,
    Sudo,
    not_allowed_to_read,
    run_as,
)
from opspatch.hosts.transport.base import Command, Transport

BOOTSTRAP = (  # short names: the whole program travels on every command line
    "import base64, json, os, sys, types, zlib\n"
    "r = json.loads(sys.stdin.buffer.read().splitlines()[-1])\n"
    "os.environ.update(r.pop('env', None) or {})\n"
    "sys.pycache_prefix = os.environ.get('PYTHONPYCACHEPREFIX', sys.pycache_prefix)\n"
    "for name, src in json.loads(zlib.decompress(base64.b64decode(r.pop('agent')))):\n"
    "    p = name.split('.')\n"
    "    for i in range(1, len(p)):\n"
    "        sys.modules.setdefault('.'.join(p[:i]), types.ModuleType('.'.join(p[:i])))"
    ".__path__ = []\n"
    "    m = sys.modules[name] = types.ModuleType(name)\n"
    "    exec(compile(src, '<opspatch-agent>/' + name, 'exec'), m.__dict__)\n"
    "sys.exit(m.main(r))\n"
)
"""The `-c` program: small and stable, so the command line never changes between operations.

The request is stdin's last line (a line ahead of it is never the agent's business: it is sudo's
password, read by sudo itself). Its `env` (sent when the agent runs through sudo, which resets
the environment) is applied first, so a start command and the bytecode cache folder see the
engine's environment. It registers each agent module sent in the request (`[name, source]` pairs
in dependency order, as zlib-compressed JSON in base64: a third of the bytes), in `sys.modules` under its real dotted name, its parents as empty stub packages (whose empty
`__path__` means nothing under these names is ever imported from the host's disk), executes it,
and calls the last module's `main(request)`."""

AGENT_PACKAGE = "opspatch.hosts.agent"

REFUSAL_ERRORS: dict[str, type[RemoteOperationError] | type[TargetError]] = {
    "preimage-mismatch": PreimageMismatch,
    "lock-held": LockHeld,
    "module-not-found": TargetError,
    "module-not-source": TargetError,
    "bad-module": TargetError,
}
"""The agent's refusal codes that are their own error; every other code is a
`RemoteOperationError` carrying it. The one table from the agent's words to the error tree."""

_INTERPRETER_MISSING_STATUS = (126, 127)  # the shell's "not executable" / "not found"

DEFAULT_LOCK_GRACE = 60.0
"""Seconds past an exec's deadline that it may still be running on the host (its lock's
`busy_until`), when the run names no lease expiry of its own (`[team] lease_expiry` is what a
run passes)."""

LOCK_HOLD_SECONDS = 30 * 60
"""How long a host lock keeps other runs off after its run's last exec there: a rollout takes
every host's lock at preflight and reaches a later batch's host only after the canary and the
batches before it. A recover of the run takes it over sooner, once no exec of the run can still
be running there (`busy_until`)."""


def lock_times(timeout: float, grace: float) -> tuple[float, float]:
    """A lock's `ttl_seconds` and `busy_seconds` when taken or re-asserted by an exec that may
    run for `timeout` seconds: it keeps other runs off for `LOCK_HOLD_SECONDS` (or longer, if
    the exec may), and is busy as long as the exec may run plus `grace`."""
    busy = timeout + grace
    return max(LOCK_HOLD_SECONDS, busy), busy


_LOCK_OPERATIONS = frozenset({"lock", "unlock"})


@dataclass(frozen=True)
class _Fence:
    """The host lock this channel's run holds: what re-asserts it (a `lock` that only refreshes
    a lock still this run's), who runs it, and until when (monotonic) it is known to hold."""

    request: LockRequest
    user: str | None
    good_until: float


@functools.cache
def agent_modules() -> tuple[tuple[str, str], ...]:
    """The host agent as sent to hosts: (dotted name, source text) of each of its modules, in
    the order the bootstrap executes them (`opspatch.hosts.agent.MODULES`)."""
    from opspatch.hosts.agent import MODULES

    package = resources.files(AGENT_PACKAGE)
    return tuple(
        (f"{AGENT_PACKAGE}.{name}", package.joinpath(f"{name}.py").read_text(encoding="utf-8"))
        for name in MODULES
    )


@functools.cache
def _agent_statements(name: str) -> tuple[ast.stmt, ...]:
    """Every statement of agent module `name`, nested ones too: what the two scans below look
    for are statements, so their expressions (most of the tree) are never walked."""
    found: list[ast.stmt] = []
    blocks = [parse_python(dict(agent_modules())[name]).body]
    while blocks:
        for stmt in blocks.pop():
            found.append(stmt)
            for field in ("body", "orelse", "finalbody"):
                inner = getattr(stmt, field, None)
                if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                    blocks.append(inner)
            for clause in (*getattr(stmt, "handlers", ()), *getattr(stmt, "cases", ())):
                if isinstance(clause, ast.ExceptHandler | ast.match_case):
                    blocks.append(clause.body)
    return tuple(found)


@functools.cache
def _defining_modules() -> dict[str, str]:
    """Operation name -> the agent module that registers it (its `@operation("name")`)."""
    defined: dict[str, str] = {}
    for name, _ in agent_modules():
        for node in _agent_statements(name):
            if isinstance(node, ast.FunctionDef):
                for decorator in node.decorator_list:
                    if (
                        isinstance(decorator, ast.Call)
                        and isinstance(decorator.func, ast.Name)
                        and decorator.func.id == "operation"
                        and isinstance(decorator.args[0], ast.Constant)
                    ):
                        defined[str(decorator.args[0].value)] = name
    return defined


@functools.cache
def _imports(name: str) -> frozenset[str]:
    """The agent modules `name` imports anywhere (in a function too: it runs on the host)."""
    found: set[str] = set()
    for node in _agent_statements(name):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == AGENT_PACKAGE:
                found.update(f"{AGENT_PACKAGE}.{alias.name}" for alias in node.names)
            elif node.module.startswith(AGENT_PACKAGE + "."):
                found.add(node.module)
    return frozenset(found)


@functools.cache
def modules_for(*operations: str) -> tuple[str, ...]:
    """The agent modules an exec of `operations` needs, in the order the bootstrap runs them:
    the modules that define them, what those import (transitively), and `dispatch` last. An
    unknown operation gets every module (the agent then says `unknown-operation`)."""
    every = [name for name, _ in agent_modules()]
    dispatch = every[-1]
    defined = _defining_modules()
    if any(operation not in defined for operation in operations):
        return tuple(every)
    needed: set[str] = set()
    pending = [dispatch, *(defined[operation] for operation in operations)]
    while pending:
        name = pending.pop()
        if name not in needed:
            needed.add(name)
            pending.extend(_imports(name))
    return tuple(name for name in every if name in needed)


_PACKING = threading.Lock()
"""`functools.cache` lets every thread that misses compute the value: the preflight's 16 threads
each scanned and packed the agent for their first `begin` (13 ms of controller CPU per host at
N = 32). Packing holds this lock, so the others wait for the one that computes it."""


def _packed_agent(operations: tuple[str, ...]) -> str:
    """The `agent` field of a request for `operations`: the union of their modules, compressed
    (made once per set of operations)."""
    with _PACKING:
        return _pack_agent(operations)


@functools.cache
def _pack_agent(operations: tuple[str, ...]) -> str:
    sources = dict(agent_modules())
    pairs = [[name, sources[name]] for name in modules_for(*operations)]
    return base64.b64encode(zlib.compress(json.dumps(pairs).encode("utf-8"), 6)).decode("ascii")


def operation_call(
    operation: str, args: Mapping[str, object], *, gate: bool = False
) -> OperationCall:
    """One operation of a batch; with `gate`, the operations after it run only if its result
    says `ok: true`."""
    return OperationCall(op=operation, args=dict(args), gate=gate)


def encode_request(request: AgentRequest, *, env: dict[str, str] | None) -> bytes:
    """The request line the bootstrap reads: the agent's source (the modules its operations
    need), the operations and the engine's folder, and (through sudo, which resets it) the
    engine's environment."""
    operations = tuple(call["op"] for call in request["ops"])
    line: dict[str, Any] = {"agent": _packed_agent(operations), **request}
    if env is not None:
        line["env"] = env
    return json.dumps(line).encode("utf-8")


def decode_request(stdin: bytes) -> AgentRequest:
    """The request an exec carries, read as the bootstrap reads it (stdin's last line), for a
    test double that sees the bytes a transport sends (a sudo stand-in).

    Raises:
        ValueError: `stdin` is not a host-agent request.
    """
    try:
        request = json.loads(stdin.splitlines()[-1].decode("utf-8"))
    except (ValueError, IndexError, UnicodeDecodeError) as exc:
        raise ValueError("not a host-agent request") from exc
    calls = request.get("ops") if isinstance(request, dict) else None
    if not isinstance(calls, list) or not all(
        isinstance(call, dict) and isinstance(call.get("op"), str) for call in calls
    ):
        raise ValueError("not a host-agent request")
    return AgentRequest(ops=calls, cwd=request.get("cwd"))


def parse_reply(stdout: bytes) -> AgentReply | None:
    """The agent's reply: the last non-empty stdout line, if it is a JSON object with a reply
    per operation (`replies`)."""
    for line in reversed(stdout.splitlines()):
        if not line.strip():
            continue
        try:
            reply = json.loads(line)
        except ValueError:
            return None
        if isinstance(reply, dict) and isinstance(reply.get("replies"), list):
            return cast(AgentReply, reply)
        return None
    return None


@dataclass(frozen=True)
class AgentAnswer:
    """What one exec of the agent gave back: its reply line (None: it printed none), and the
    command's exit status and stderr, which say why when there is none."""

    reply: AgentReply | None
    exit_code: int = 0
    stderr: str = ""


@runtime_checkable
class AgentEndpoint(Protocol):
    """Who answers an agent request (one exec): `BootstrapEndpoint` over a real transport, or a
    test double that answers the typed request itself (`transport.scripted.ScriptedTransport`)."""

    def answer(
        self, request: AgentRequest, *, as_user: str | None, timeout: float
    ) -> AgentAnswer: ...


class BootstrapEndpoint:
    """The real path: the request as bytes to `<engine python> -c BOOTSTRAP` over the host's
    transport, through sudo when raised, and the reply line read back."""

    def __init__(self, transport: Transport, host: Host, sudo: Sudo) -> None:
        self.transport = transport
        self.host = host
        self._sudo = sudo

    def answer(self, request: AgentRequest, *, as_user: str | None, timeout: float) -> AgentAnswer:
        """One exec.

        Raises:
            TransportError, CommandTimeout: the host could not be reached or the deadline passed.
            BecomeError: `as_user` is set and sudo cannot run it.
        """
        program = (str(self.host.engine.python), "-c", BOOTSTRAP)
        env = dict(self.host.engine.env)
        if as_user is None:
            command = Command(program, env=env)
            result = self.transport.run(
                command, stdin=encode_request(request, env=None), timeout=timeout
            )
        else:  # sudo resets the environment, so the request carries it
            result = self._sudo.run(
                as_user,
                program,
                encode_request(request, env=env),
                send=lambda command, payload: self.transport.run(
                    command, stdin=payload, timeout=timeout
                ),
                program_text=BOOTSTRAP,
            )
        return AgentAnswer(
            reply=parse_reply(result.stdout),
            exit_code=result.exit_code,
            stderr=result.stderr.decode("utf-8", errors="replace").strip(),
        )


class AgentChannel:
    """Calls to one host's agent: `call_batch(calls, as_user=...)`, the single path every host
    operation takes, and `call(op, args, as_user=...)`, a batch of one. `ran_as` lists the user
    every exec ran as (`name`, or `name (sudo)`)."""

    def __init__(
        self,
        transport: Transport,
        host: Host,
        *,
        passwords: BecomePasswords | None = None,
        lock_grace: float = DEFAULT_LOCK_GRACE,
    ) -> None:
        self.transport = transport
        self.host = host
        self.lock_grace = lock_grace
        """Seconds past an exec's deadline that the host lock stays busy (`lock_times`)."""
        self.ran_as: list[str] = []
        self._fence: _Fence | None = None
        sudo = Sudo(host, passwords or BecomePasswords())
        self.endpoint: AgentEndpoint = (
            transport
            if isinstance(transport, AgentEndpoint)
            else BootstrapEndpoint(transport, host, sudo)
        )

    @property
    def name(self) -> str:
        return self.host.name

    def default_user(self, operation: str) -> str | None:
        """Who runs `operation` on this host: the become user for one that changes it (with
        `become`), else None, the login user."""
        return run_as(self.host, operation)

    def call(
        self,
        operation: str,
        args: Mapping[str, object],
        *,
        as_user: str | None,
        timeout: float,
        step: str,
    ) -> dict[str, Any]:
        """Run agent operation `operation` with `args` as `as_user` (None: the login user);
        its `result` on success. A read the login user is not allowed is asked again raised.

        Raises:
            InputError: the inventory names no engine interpreter, or it cannot run on the host.
            TargetError: a module named in `args` does not resolve on the host.
            PreimageMismatch, LockHeld, RemoteOperationError: the agent refused (`code` says why).
            TransportError, CommandTimeout: the host could not be reached or the deadline passed.
            BecomeError: `as_user` is set and sudo cannot run it.
        """
        (reply,) = self.call_batch(
            [operation_call(operation, args)], as_user=as_user, timeout=timeout, step=step
        )
        if (
            reply.get("status") == "refused"
            and as_user is None
            and self.host.become.enabled
            and not_allowed_to_read(operation, reply)
        ):
            # the login user may not read what this needs: ask again as the become user
            user = self.host.become.user
            return self.call(operation, args, as_user=user, timeout=timeout, step=step)
        return self.result(reply, step=step, args=args)

    def call_batch(
        self,
        calls: Sequence[OperationCall],
        *,
        as_user: str | None,
        timeout: float,
        step: str,
    ) -> list[OperationReply]:
        """Run `calls` in order in one exec as `as_user` (None: the login user); a reply per
        call, in order: `done`, `refused` (the first refusal stops the batch), `not-run`. A
        refusal is a value here; `result` turns one reply into its result or its error.

        Raises:
            InputError: the inventory names no engine interpreter, or it cannot run on the host.
            RemoteOperationError: the agent gave no reply (`agent-no-reply`,
                `agent-unsupported-python`) or not one per call (`agent-bad-reply`).
            TransportError, CommandTimeout: the host could not be reached or the deadline passed.
            BecomeError: `as_user` is set and sudo cannot run it.
            RemoteOperationError: `lock-lost`, this run held the host's lock and no longer does
                (another run took it over): nothing of `calls` was run.
        """
        fence = self._fence
        if fence is None or not calls or calls[0]["op"] in _LOCK_OPERATIONS:
            return self._send(calls, as_user=as_user, timeout=timeout, step=step)
        ttl, busy = lock_times(timeout, self.lock_grace)
        refresh = operation_call(
            "lock", {**fence.request, "ttl_seconds": ttl, "busy_seconds": busy}
        )
        if as_user == fence.user:  # the same process: re-asserted in the same exec, for free
            replies = self._send([refresh, *calls], as_user=as_user, timeout=timeout, step=step)
            self._fenced(replies[0], step)
            return replies[1:]
        # Another user's process (become). A read changes nothing, so it is not fenced: this
        # run's next change is. A change (a restart as root) runs only while the lock holds
        # to its deadline: the lock's user re-asserts it on its own when it might lapse first.
        changes = any(call["op"] in RAISED_OPERATIONS for call in calls)
        if changes and time.monotonic() + timeout > fence.good_until:
            (reply,) = self._send([refresh], as_user=fence.user, timeout=timeout, step=step)
            self._fenced(reply, step)
        return self._send(calls, as_user=as_user, timeout=timeout, step=step)

    def _fenced(self, reply: OperationReply, step: str) -> None:
        """Raise `lock-lost` when the run's lock was not re-asserted (another run holds it, or
        it is gone): the rest of the exec did not run."""
        if reply.get("status") == "done":
            return
        # the fence stays: every later exec of this run is refused the same way
        run_id = self._fence.request["run_id"] if self._fence is not None else "?"
        said = str(reply.get("message") or reply.get("code") or "refused")
        raw = reply.get("data")
        raise RemoteOperationError(
            f"this run ({run_id}) no longer holds the host's lock ({said}): another run took it "
            "over (a recover once no command of this run could still be running there, or "
            "after the lock expired), or it was removed; nothing more is done here",
            code="lock-lost",
            host=self.name,
            step=step,
            data=raw if isinstance(raw, dict) else {},
        )

    def _send(
        self,
        calls: Sequence[OperationCall],
        *,
        as_user: str | None,
        timeout: float,
        step: str,
    ) -> list[OperationReply]:
        """One exec of `calls` (`call_batch` without the fence), noting what it did to the lock."""
        sent_at = time.monotonic()
        replies = self._exchange_batch(calls, as_user=as_user, timeout=timeout, step=step)
        self._track(calls, replies, as_user, sent_at)
        return replies

    def _track(
        self,
        calls: Sequence[OperationCall],
        replies: Sequence[OperationReply],
        as_user: str | None,
        sent_at: float,
    ) -> None:
        """The fence after an exec: set (or extended) by a `lock` done, cleared by an `unlock`
        that gave the lock back."""
        for call, reply in zip(calls, replies, strict=False):
            if reply.get("status") != "done":
                continue
            if call["op"] == "lock":
                args = cast(LockRequest, call["args"])
                request = LockRequest(
                    state_dir=args["state_dir"],
                    owner=args["owner"],
                    run_id=args["run_id"],
                    ttl_seconds=args["ttl_seconds"],
                    takeover_run=None,
                    refresh_only=True,
                    busy_seconds=float(args.get("busy_seconds", args["ttl_seconds"])),
                    takeover_idle=False,
                )
                self._fence = _Fence(request, as_user, sent_at + float(args["ttl_seconds"]))
            elif call["op"] == "unlock":
                result = reply.get("result")
                if isinstance(result, dict) and result.get("released"):
                    self._fence = None

    def _exchange_batch(
        self,
        calls: Sequence[OperationCall],
        *,
        as_user: str | None,
        timeout: float,
        step: str,
    ) -> list[OperationReply]:
        python = self.host.engine.python
        if not python:
            raise InputError(
                f"[{self.name}] the inventory sets no engine.python for this host",
                hint="set engine.python to the interpreter the SGLang server runs with, "
                "e.g. /opt/sglang/venv/bin/python",
            )
        cwd = getattr(self.host.engine.restart, "workdir", None)
        request = AgentRequest(ops=list(calls), cwd=cwd)
        answer = self._exchange(request, as_user, timeout, step)
        reply = answer.reply
        if reply is None:
            if answer.exit_code in _INTERPRETER_MISSING_STATUS:
                if self._may_raise_instead(as_user, calls):
                    # an interpreter only its owner may run: read as the become user instead
                    user = self.host.become.user
                    return self.call_batch(calls, as_user=user, timeout=timeout, step=step)
                raise InputError(
                    f"[{self.name}] engine.python {python!r} cannot be run on the host "
                    f"(exit {answer.exit_code}: {_last_line(answer.stderr)})",
                    hint="set engine.python in the inventory to the interpreter the server "
                    "runs with",
                )
            if "SyntaxError" in answer.stderr:
                raise RemoteOperationError(
                    f"{python} could not run the host agent (it needs Python 3.8 or newer): "
                    f"{_last_line(answer.stderr)}",
                    code="agent-unsupported-python",
                    host=self.name,
                    step=step,
                )
            raise RemoteOperationError(
                f"the host agent gave no reply (exit {answer.exit_code}): "
                f"{_last_line(answer.stderr)}",
                code="agent-no-reply",
                host=self.name,
                step=step,
                data={"stderr": answer.stderr[-4000:], "exit_code": answer.exit_code},
            )
        self._note_user(reply, as_user)
        replies = list(reply["replies"])
        if len(replies) != len(calls):
            raise RemoteOperationError(
                f"the host agent answered {len(replies)} of {len(calls)} operations",
                code="agent-bad-reply",
                host=self.name,
                step=step,
            )
        return replies

    def result(
        self, reply: OperationReply, *, step: str, args: Mapping[str, object]
    ) -> dict[str, Any]:
        """The result of a `done` reply; a refusal (or an operation not run) raised as its error.

        Raises:
            TargetError, PreimageMismatch, LockHeld, RemoteOperationError: as `call`.
        """
        status = reply.get("status")
        if status == "done":
            value = reply.get("result")
            return value if isinstance(value, dict) else {"value": value}
        if status == "not-run":
            raise RemoteOperationError(
                "the host agent did not run this: an earlier operation of the exec stopped it",
                code="not-run",
                host=self.name,
                step=step,
            )
        raise self._refusal(reply, step, args)

    def _may_raise_instead(self, as_user: str | None, calls: Sequence[OperationCall]) -> bool:
        return (
            as_user is None
            and self.host.become.enabled
            and all(call["op"] in LOGIN_OPERATIONS for call in calls)
        )

    def _exchange(
        self, request: AgentRequest, as_user: str | None, timeout: float, step: str
    ) -> AgentAnswer:
        """The one exec; transport failures name this host and step."""
        try:
            return self.endpoint.answer(request, as_user=as_user, timeout=timeout)
        except TransportError as exc:
            if exc.step == step and exc.host == self.name:
                raise
            raise type(exc)(exc.detail, host=self.name, step=step, hint=exc.hint) from None

    def _note_user(self, reply: AgentReply, user: str | None) -> None:
        identity = reply.get("identity")
        name = identity.get("user") if isinstance(identity, dict) else None
        if name is None and user is None:
            return  # an agent that does not say (a scripted host)
        name = str(name or user)
        self.ran_as.append(f"{name} (sudo)" if user is not None else name)

    def _refusal(
        self, reply: OperationReply, step: str, args: Mapping[str, object]
    ) -> TargetError | RemoteOperationError:
        code = str(reply.get("code") or "agent-error")
        message = str(reply.get("message") or "the host agent refused")
        raw_data = reply.get("data")
        data: dict[str, Any] = raw_data if isinstance(raw_data, dict) else {}
        error_type = REFUSAL_ERRORS.get(code, RemoteOperationError)
        if error_type is TargetError:
            return TargetError(
                f"[{self.name}] module {args.get('module')!r} does not resolve under "
                f"{self.host.engine.python}: {message}",
                hint="check the patch's target module and the host's engine.python / engine.env",
            )
        if data.get("errno") in ("EACCES", "EPERM") and not self.host.become.enabled:
            # said in the message itself: a host's error line is what the report shows
            message += (
                " (the login user may not change this; set become = true and become_user to "
                "the owner of the file in the inventory)"
            )
        assert issubclass(error_type, RemoteOperationError)
        return error_type(message, code=code, host=self.name, step=step, data=data)


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1][-500:] if lines else "no output"
