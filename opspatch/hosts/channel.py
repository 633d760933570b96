"""The agent channel's wire: how a request reaches the host agent and its reply comes back."""

from __future__ import annotations

import ast
import base64
import functools
import json
import os
import shutil
import sys
import threading
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Protocol, cast, runtime_checkable

from opspatch.core.host import Host
from opspatch.core.syntax import parse_python, warnings_ignored
from opspatch.errors import (
    LockHeld,
    PreimageMismatch,
    RemoteOperationError,
    TargetError,
)
from opspatch.hosts.agent.protocol import (
    AgentReply,
    AgentRequest,
    OperationCall,
    SentRequest,
)
from opspatch.hosts.become import (
    Sudo,
)
from opspatch.hosts.transport.base import Command, Transport

_LOAD = (  # short names: the whole program travels on every command line
    "import base64, json, os, sys, types, zlib\n"
    "def load(r):\n"
    "    m = None\n"
    "    for name, src in json.loads(zlib.decompress(base64.b64decode("
    "r.pop('agent', 'eJyLjgUAARUAuQ==')))):\n"
    "        p = name.split('.')\n"
    "        for i in range(1, len(p)):\n"
    "            sys.modules.setdefault('.'.join(p[:i]), types.ModuleType('.'.join(p[:i])))"
    ".__path__ = []\n"
    "        m = sys.modules[name] = types.ModuleType(name)\n"
    "        exec(compile(src, '<opspatch-agent>/' + name, 'exec'), m.__dict__)\n"
    "    return m\n"
)
"""How both programs below register the agent modules a request carries (`agent`: `[name,
source]` pairs in dependency order, as zlib-compressed JSON in base64, a third of the bytes; none:
an empty list): each in `sys.modules` under its real dotted name, its parents as empty stub
packages (whose empty `__path__` means nothing under these names is ever imported from the
host's disk), executed; the last one registered is returned (`dispatch`, on a first request)."""

BOOTSTRAP = _LOAD + (
    "r = json.loads(sys.stdin.buffer.read().splitlines()[-1])\nsys.exit(load(r).main(r))\n"
)
"""The per-exec `-c` program: small and stable, so the command line never changes between
operations. The request is stdin's last line (a line ahead of it is never the agent's business:
it is sudo's password, read by sudo itself); `dispatch.main` applies its `env` (sent when the
agent runs through sudo, which resets the environment) and answers it."""

RESIDENT = _LOAD + (
    "r = json.loads(sys.stdin.buffer.readline())\nsys.exit(load(r).serve(r, load))\n"
)
"""The resident agent's `-c` program (`opspatch.hosts.resident`): the first request line
registers the agent, `dispatch.serve` answers it and every line after it, each in a fork, until
stdin ends (sudo has read its password line, if any, before the interpreter starts)."""

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


def _packed_agent(modules: tuple[str, ...]) -> str:
    """The `agent` field of a request that needs `modules` (in `agent_modules` order),
    compressed (made once per set of modules)."""
    with _PACKING:
        return _pack_agent(modules)


@functools.cache
def _pack_agent(modules: tuple[str, ...]) -> str:
    sources = dict(agent_modules())
    pairs = [[name, sources[name]] for name in modules]
    return base64.b64encode(zlib.compress(json.dumps(pairs).encode("utf-8"), 6)).decode("ascii")


def operation_call(
    operation: str, args: Mapping[str, object], *, gate: bool = False
) -> OperationCall:
    """One operation of a batch; with `gate`, the operations after it run only if its result
    says `ok: true`."""
    return OperationCall(op=operation, args=dict(args), gate=gate)


def request_modules(request: AgentRequest) -> tuple[str, ...]:
    """The agent modules `request`'s operations need (`modules_for`)."""
    return modules_for(*(call["op"] for call in request["ops"]))


def encode_request(
    request: AgentRequest,
    *,
    env: dict[str, str] | None,
    loaded: frozenset[str] = frozenset(),
    seq: int | None = None,
) -> bytes:
    """The request line the agent reads: the agent's source (the modules its operations need
    that it has not `loaded` yet), the operations and the engine's folder, (through sudo, which
    resets it) the engine's environment, and a resident agent's request number `seq`."""
    line = SentRequest(ops=request["ops"], cwd=request["cwd"])
    modules = tuple(name for name in request_modules(request) if name not in loaded)
    if modules:
        line["agent"] = _packed_agent(modules)
    if env is not None:
        line["env"] = env
    if seq is not None:
        line["seq"] = seq
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
    """What one request to the agent gave back: its reply line (None: it printed none), and
    the agent's exit status and stderr, which say why when there is none."""

    reply: AgentReply | None
    exit_code: int = 0
    stderr: str = ""
    notice: str = ""
    """What the channel did on the way that the run should say (the host agent started again
    after it had ended); empty for nothing."""


@runtime_checkable
class AgentEndpoint(Protocol):
    """Who answers an agent request (one exec): `ResidentEndpoint` or `BootstrapEndpoint` over
    a real transport, or a test double that answers the typed request itself
    (`transport.scripted.ScriptedTransport`)."""

    def answer(
        self, request: AgentRequest, *, as_user: str | None, timeout: float
    ) -> AgentAnswer: ...


def is_this_interpreter(python: str) -> bool:
    """Whether `python` (a path, or a name found on PATH) is the file this process runs: the
    same path, not merely the same binary (a venv's python links to its base's, and imports
    other packages)."""
    found = python if os.sep in python else shutil.which(python)
    return found is not None and os.path.abspath(found) == os.path.abspath(sys.executable)


class OwnProcessEndpoint:
    """The agent's operations run in the controller's own process: the host is this machine,
    its interpreter this very one, as this user, so a new interpreter would run the same
    functions on the same files. What cannot be answered here goes to `fallback` (the resident
    agent or a new interpreter): a request as another user (sudo), one in the engine's folder, and
    one with an operation whose descriptor does not allow it here (`Operation.in_process`: a
    restart, a wait, a module found on the import path, which is not the engine's here).

    The lock, the fence, the compile check, the backup and the atomic write are the agent's
    own, unchanged; arguments and replies are copied as JSON, as they travel to a host."""

    def __init__(self, fallback: AgentEndpoint) -> None:
        self.fallback = fallback

    def answer(self, request: AgentRequest, *, as_user: str | None, timeout: float) -> AgentAnswer:
        """One exec, here when it may be (see the class).

        Raises:
            As the fallback's `answer`, for a request sent there.
        """
        from opspatch.hosts.agent.dispatch import identity, perform, run_batch
        from opspatch.hosts.results import OPERATIONS

        calls = request["ops"]
        here = as_user is None and not request.get("cwd")
        for call in calls:
            described = OPERATIONS.get(call["op"])
            here = here and described is not None and described.in_process(call["args"])
        if not here:
            return self.fallback.answer(request, as_user=as_user, timeout=timeout)
        copied = json.loads(json.dumps(calls))  # what a host would decode: nothing shared
        with warnings_ignored():  # an agent's stderr is read only when it gives no reply
            replies = run_batch(copied, perform)
        reply = {"replies": replies, "identity": identity()}
        return AgentAnswer(reply=cast(AgentReply, json.loads(json.dumps(reply, sort_keys=True))))


class BootstrapEndpoint:
    """The per-exec path: the request as bytes to `<engine python> -c BOOTSTRAP` over the host's
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
