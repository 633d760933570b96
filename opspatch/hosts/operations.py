"""Host-side operations, controller side: one exec per call, typed results, typed errors.

Each call is ONE command on the host: the engine's own interpreter running a tiny bootstrap
(`<python> -c BOOTSTRAP`, `opspatch.hosts.channel`) that reads a JSON request on stdin, executes
the host agent's source (the modules of `opspatch/hosts/agent` its operations need, sent with
every request, so nothing is installed on hosts), runs the request's operations in order and
prints one JSON reply line, a reply per operation. Running under the engine's interpreter and environment
is the point: `resolve` then finds the file the server really imports, `facts` reports the
versions it really runs, and `swap` compiles the new text with the Python that will run it.

`HostOperations` turns replies into frozen dataclasses and refusals into the error tree:
`PreimageMismatch`, `LockHeld`, `RemoteOperationError` (with its stable `code`), `TargetError`
for a module that does not resolve, `InputError` for an interpreter that is missing on the host.
Every call takes its deadline from the caller (`timeout=`, seconds for the whole exec): the
rollout passes the playbook's `StepTimeouts` (`opspatch.core.policy`), the one timeout table, so
an operator's `[timeouts]` reach every path. Transport failures arrive as `TransportError` /
`CommandTimeout` with the host and the operation named as the step.

Round trips: `inspect` (what `plan` needs: facts + resolve + read) is 1 exec; read-then-swap is
2; `lock` and `unlock` are 1 each. Compositions are one exec too, a batch the agent runs in
order and stops at the first refusal: `begin` is `lock` then `inspect`; a swap or a smoke that is
a host's last step is followed by `unlock` in the same exec (`then_unlock`; after a smoke, only
if it passed).

With `become` in the host's inventory (`opspatch.hosts.become`), the operations that change the
host run through sudo as the become user, still one exec each (a batch runs as one user); `begin`
is then two (the lock raised, the inspection as the login user), plus one probe per other user a
run raises to. The
first raised exec of a host whose sudo needs a password is sent twice (once to learn that).
`ran_as` lists the user every exec ran as, as the agent reported it, for the step records.
"""

from __future__ import annotations

import base64
import getpass
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar, cast

from opspatch.core.host import Host
from opspatch.core.jsonrecord import JsonRecord
from opspatch.core.source import sha256_hex
from opspatch.errors import InputError, RemoteOperationError, TargetError, TransportError
from opspatch.hosts.agent.protocol import (
    AgentReply,
    AgentRequest,
    InspectRequest,
    LockRequest,
    NoArgs,
    OperationCall,
    OperationReply,
    ReadRequest,
    ResolveRequest,
    RestoreRequest,
    ServerHint,
    SwapRequest,
    UnlockReply,
    UnlockRequest,
)
from opspatch.hosts.become import (
    LOGIN_OPERATIONS,
    RAISED_OPERATIONS,
    BecomePasswords,
    Sudo,
    not_allowed_to_read,
    raised_users,
    run_as,
)
from opspatch.hosts.channel import (
    AGENT_PACKAGE,
    BOOTSTRAP,
    DEFAULT_LOCK_GRACE,
    LOCK_HOLD_SECONDS,
    REFUSAL_ERRORS,
    AgentAnswer,
    AgentEndpoint,
    BootstrapEndpoint,
    agent_modules,
    lock_times,
    operation_call,
)
from opspatch.hosts.results import (
    FACTS,
    INSPECT,
    LOCK,
    READ,
    RESOLVE,
    RESTORE,
    SWAP,
    UNLOCK,
    WHOAMI,
    HostFacts,
    HostInspection,
    LockHolder,
    LockInfo,
    Operation,
    RemoteFile,
    ResolvedModule,
    RestoreResult,
    SwapResult,
    UnlockResult,
)
from opspatch.hosts.transport.base import Transport
from opspatch.hosts.transport.container import ContainerTransport
from opspatch.hosts.transport.local import LocalTransport

__all__ = [  # the result values (`opspatch.hosts.results`) and the channel's names, re-exported
    "AGENT_PACKAGE",
    "BOOTSTRAP",
    "HostFacts",
    "HostInspection",
    "HostOperations",
    "LOCK_HOLD_SECONDS",
    "LockHolder",
    "LockInfo",
    "RemoteFile",
    "ResolvedModule",
    "RestoreResult",
    "SwapResult",
    "UnlockResult",
    "agent_modules",
    "default_lock_owner",
    "open_transport",
]

R = TypeVar("R", bound=JsonRecord)
Req = TypeVar("Req", bound=Mapping[str, Any])
Rep = TypeVar("Rep", bound=Mapping[str, Any])


def default_lock_owner() -> str:
    """`user@controller`, the owner recorded in host locks taken from this machine."""
    return f"{getpass.getuser()}@{socket.gethostname()}"


def open_transport(host: Host, *, accept_new_host_keys: bool = False) -> Transport:
    """The transport the inventory says this host uses (nothing is connected yet); for a host
    whose engine runs in a container, that transport wrapped to exec into the container.

    Paramiko and fabric are imported here, on the first SSH host, not with this module: commands
    that never reach a host over SSH start without them."""
    base: Transport
    if host.transport == "local":
        base = LocalTransport(host.name)
    else:
        from opspatch.hosts.transport.ssh import SSHTransport

        base = SSHTransport(host, accept_new_host_keys=accept_new_host_keys)
    if host.container is None:
        return base
    # the engine runs in a container: every operation is an exec into it, through the host
    return ContainerTransport(base, host.container)


_INTERPRETER_MISSING_STATUS = (126, 127)  # the shell's "not executable" / "not found"
_LOCK_OPERATIONS = frozenset({"lock", "unlock"})


@dataclass(frozen=True)
class _Fence:
    """The host lock this run holds on the host: what re-asserts it (a `lock` that only refreshes
    a lock still this run's), who runs it, and until when (monotonic) it is known to hold."""

    request: LockRequest
    user: str | None
    good_until: float


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1][-500:] if lines else "no output"


# ---------------------------------------------------------------------------------------------
# The operations


class HostOperations:
    """Host-side operations on one host, through its transport, under its engine's interpreter.

    Build one per host per run: `HostOperations(transport, host)`. Each method is one exec and
    takes its deadline as `timeout=` (seconds; the playbook's `StepTimeouts` in a rollout).
    Later operations (restart, readiness, smoke, log scan) are added to the agent and
    called through `call`, the same single path every method here uses.
    Every exec goes through `call_batch_as` (`call` and `call_batch` choose the user the
    inventory says runs an operation; `call_as` is a batch of one that returns the result or
    raises the refusal); `ran_as` notes who ran each exec.

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
        """The user each exec ran as (`name`, or `name (sudo)` when raised), oldest first."""
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

    # -- the one path to the host ---------------------------------------------------------------

    def call(
        self,
        operation: str,
        args: Mapping[str, object],
        *,
        timeout: float,
        step: str | None = None,
    ) -> dict[str, Any]:
        """Run agent operation `operation` with `args` on the host, as the user the inventory
        says runs it (`become`); its `result` on success. See `call_as`."""
        return self.call_as(
            operation,
            args,
            as_user=self.default_user(operation),
            timeout=timeout,
            step=step or operation,
        )

    def call_batch(
        self, calls: Sequence[OperationCall], *, timeout: float, step: str
    ) -> list[OperationReply]:
        """Run `calls` in order in one exec, as the user the inventory says runs them (one user
        for the whole batch); a reply per call (`call_batch_as`), the first refusal
        stopping the rest. `result(reply, ...)` reads one.

        Raises:
            ValueError: the calls would run as different users (a batch is one process).
            As `call_batch_as` otherwise.
        """
        users = {self.default_user(call["op"]) for call in calls}
        if len(users) != 1:
            raise ValueError(f"a batch runs as one user: {[c['op'] for c in calls]} need {users}")
        (user,) = users
        return self.call_batch_as(calls, as_user=user, timeout=timeout, step=step)

    def run(
        self,
        operation: Operation[Req, Rep, R],
        request: Req,
        *,
        timeout: float,
        step: str | None = None,
    ) -> R:
        """Run `operation` with its typed `request` (`call`), its reply read as its record.

        Raises:
            RemoteOperationError: `agent-bad-reply`, the reply is not the record's shape; as
                `call` otherwise.
        """
        step = step or operation.name
        reply = self.call(operation.name, request, timeout=timeout, step=step)
        return operation.read(reply, host=self.name, step=step)

    def read_result(
        self,
        operation: Operation[Req, Rep, R],
        reply: OperationReply,
        *,
        step: str,
        request: Req,
    ) -> R:
        """One reply of a batch (`call_batch`) as `operation`'s record (`result`, then `read`)."""
        result = self.result(reply, step=step, args=request)
        return operation.read(result, host=self.name, step=step)

    def then_unlock(
        self,
        operation: Operation[Req, Rep, R],
        request: Req,
        *,
        run_id: str,
        gate: bool,
        timeout: float,
        step: str,
    ) -> tuple[R, bool]:
        """`operation`, then give `run_id`'s lock back, in one exec: how a host's last step
        ends. With `gate`, the lock goes back only if the result says `ok` (a smoke that failed
        keeps it: the rollback still needs it). Returns the operation's record and whether the
        lock was given back (False: the caller gives it back with its own exec).

        Raises:
            As `run` for `operation`; nothing about the unlock (it is best effort here: any
            reply but a `done` that says `released` leaves the lock to the caller).
        """
        unlock = UnlockRequest(state_dir=self.host.state_dir, run_id=run_id, force=False)
        first, then = self.call_batch(
            [operation_call(operation.name, request, gate=gate), operation_call("unlock", unlock)],
            timeout=timeout,
            step=step,
        )
        record = self.read_result(operation, first, step=step, request=request)
        released = cast(UnlockReply, then.get("result") or {}).get("released")
        return record, then.get("status") == "done" and bool(released)

    def probe_raised(self, user: str, *, timeout: float, step: str) -> str:
        """Run the agent's `whoami` as `user` through sudo: proves sudo lets this host's login
        raise to `user` (preflight, for a user no earlier operation raised to). Returns the user
        the agent ran as.

        Raises:
            BecomeError: as for any raised operation.
        """
        reply = self.call_as("whoami", NoArgs(), as_user=user, timeout=timeout, step=step)
        return WHOAMI.read(reply, host=self.name, step=step).user or user

    # -- the one path to the host's agent: one exec, the fence, refusals ---------------------

    def default_user(self, operation: str) -> str | None:
        """Who runs `operation` on this host: the become user for one that changes it (with
        `become`), else None, the login user."""
        return run_as(self.host, operation)

    def call_as(
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
        (reply,) = self.call_batch_as(
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
            return self.call_as(operation, args, as_user=user, timeout=timeout, step=step)
        return self.result(reply, step=step, args=args)

    def call_batch_as(
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
                    return self.call_batch_as(calls, as_user=user, timeout=timeout, step=step)
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

    # -- facts, resolve, read, inspect -------------------------------------------------------

    def facts(self, *, timeout: float) -> HostFacts:
        """Python, sglang and torch versions (distribution metadata), GPUs and CUDA as the
        driver reports them (NVML or nvidia-smi; nothing imports torch), hostname."""
        return self.run(FACTS, NoArgs(), timeout=timeout)

    def resolve(self, module: str, *, timeout: float) -> ResolvedModule:
        """The file the engine's interpreter imports for `module` (nothing is imported)."""
        return self.run(RESOLVE, ResolveRequest(module=module), timeout=timeout)

    def read(self, path: str, *, timeout: float) -> RemoteFile:
        """The file's exact bytes, sha256, mode, owner, mtime and symlink target."""
        return self.verified(self.run(READ, ReadRequest(path=path), timeout=timeout), "read")

    def inspect(
        self,
        module: str | None = None,
        *,
        path: str | None = None,
        timeout: float,
    ) -> HostInspection:
        """facts + resolve(`module`) + read of its file, in one exec (what `plan` needs).

        Give `path` instead of `module` to read a known file.
        """
        if (module is None) == (path is None):
            raise ValueError("inspect needs exactly one of module or path")
        request = InspectRequest(module=module, path=path, server=self._server_hint())
        return self._verified_inspection(self.run(INSPECT, request, timeout=timeout), "inspect")

    def _verified_inspection(self, inspection: HostInspection, step: str) -> HostInspection:
        self.verified(inspection.file, step)
        return inspection

    def _server_hint(self) -> ServerHint:
        """Where the agent can find the running engine (its pid file, its URL's port)."""
        return ServerHint(
            pid_file=getattr(self.host.engine.restart, "pid_file", None),
            url=self.host.engine.url,
        )

    def verified(self, file: RemoteFile, step: str) -> RemoteFile:
        """`file` as read, once its bytes are known to be what the host hashed.

        Raises:
            RemoteOperationError: `read-corrupt`, they are not.
        """
        if sha256_hex(file.content) != file.sha256:
            raise RemoteOperationError(
                f"{file.path} arrived with a different sha256 than the host computed",
                code="read-corrupt",
                host=self.name,
                step=step,
            )
        return file

    # -- swap, restore -------------------------------------------------------------------------

    def swap(
        self,
        path: str,
        *,
        expected_sha256: str,
        new_content: bytes,
        lock_run_id: str | None = None,
        release_lock: bool = False,
        timeout: float,
    ) -> SwapResult:
        """Atomically replace `path` (its real file, if a symlink) by `new_content`.

        The host checks the current sha256 against `expected_sha256`, compiles the new text
        with its own interpreter, keeps a backup of the pre-image under
        `<state_dir>/backups/<sha256>`, writes a temp file beside the target, fsyncs, keeps mode
        and owner, renames it over the target and removes the module's stale bytecode. With
        `lock_run_id`, it also checks that this run still holds the host's lock, and with
        `release_lock` it gives that lock back once the swap is done, in the same exec (the
        host's last step: `then_unlock`).

        Raises:
            PreimageMismatch: the file is not the bytes the plan was made from; nothing written.
            RemoteOperationError: `compile-failed` (with the line), `write-failed`,
                `backup-failed`, `lock-lost`; nothing written in each case.
        """
        args = SwapRequest(
            path=path,
            expected_sha256=expected_sha256,
            content_b64=base64.b64encode(new_content).decode("ascii"),
            state_dir=self.host.state_dir,
            lock_run_id=lock_run_id,
        )
        if release_lock and lock_run_id:
            result, released = self.then_unlock(
                SWAP, args, run_id=lock_run_id, gate=False, timeout=timeout, step="swap"
            )
            return replace(result, lock_released=released)
        return self.run(SWAP, args, timeout=timeout)

    def restore(
        self,
        path: str,
        *,
        pre_sha256: str,
        content: bytes | None = None,
        current_sha256: str | None = None,
        force: bool = False,
        timeout: float,
    ) -> RestoreResult:
        """Put `path` back to the pre-image `pre_sha256`, atomically, and purge its bytecode.

        The bytes come from the host's backup when present and intact, else from `content`
        (the ledger's copy); either must hash to `pre_sha256`. With `current_sha256` (the
        post-image this run wrote) a file that is neither that nor the pre-image is refused
        (`not-our-file`) unless `force`.

        Raises:
            RemoteOperationError: `not-our-file`, `backup-hash-mismatch`, `backup-missing`,
                `write-failed`.
        """
        args = RestoreRequest(
            path=path,
            pre_sha256=pre_sha256,
            content_b64=None if content is None else base64.b64encode(content).decode("ascii"),
            current_sha256=current_sha256,
            force=force,
            state_dir=self.host.state_dir,
        )
        return self.run(RESTORE, args, timeout=timeout)

    # -- the host lock -------------------------------------------------------------------------

    def lock(
        self,
        *,
        run_id: str,
        owner: str | None = None,
        ttl_seconds: float | None = None,
        timeout: float,
    ) -> LockInfo:
        """Take the host's lock (`<state_dir>/lock.json`) for `run_id`, or refresh it.

        An expired lock is taken over (the previous holder is returned); taking it again with
        the same run id extends the expiry.

        Raises:
            LockHeld: another run holds it and it has not expired (owner, run id, expiry in
                `data` and in the message).
        """
        request = self._lock_request(run_id, owner, ttl_seconds, timeout)
        return self.run(LOCK, request, timeout=timeout)

    def _lock_request(
        self,
        run_id: str,
        owner: str | None,
        ttl_seconds: float | None,
        timeout: float,
        *,
        takeover_run: str | None = None,
        takeover_idle: bool = False,
    ) -> LockRequest:
        """The lock taken now by an exec that may run `timeout` seconds: it keeps other runs
        off for `ttl_seconds` (by default `channel.LOCK_HOLD_SECONDS`) and is busy while the
        exec may run plus the run's grace (`channel.lock_times`); every later exec of the run
        re-asserts it (`call_batch_as`, the fence)."""
        ttl, busy = lock_times(timeout, self.lock_grace)
        return LockRequest(
            state_dir=self.host.state_dir,
            owner=owner or default_lock_owner(),
            run_id=run_id,
            ttl_seconds=ttl if ttl_seconds is None else ttl_seconds,
            takeover_run=takeover_run,
            refresh_only=False,
            busy_seconds=busy if ttl_seconds is None else min(busy, ttl_seconds),
            takeover_idle=takeover_idle,
        )

    def begin(
        self,
        module: str | None = None,
        *,
        run_id: str,
        path: str | None = None,
        owner: str | None = None,
        ttl_seconds: float | None = None,
        takeover_run: str | None = None,
        takeover_idle: bool = False,
        timeout: float,
    ) -> tuple[LockInfo, HostInspection]:
        """lock, then inspect, in one exec: how a rollout starts on a host.

        `takeover_run` lets `recover` take the lock still held by the run it recovers: at once
        (a run known to be over), or with `takeover_idle` once no exec of that run can still be
        running there (a run whose controller may be alive, its lease expired). The lock stays
        held if the inspection fails; the caller releases it.
        `timeout` covers both (a rollout passes its playbook's `lock + inspect`).

        Raises:
            LockHeld: another run holds the lock (nothing inspected).
            TargetError, RemoteOperationError: as `inspect` (the lock is then held).
        """
        if (module is None) == (path is None):
            raise ValueError("begin needs exactly one of module or path")
        lock = self._lock_request(
            run_id,
            owner,
            ttl_seconds,
            timeout,
            takeover_run=takeover_run,
            takeover_idle=takeover_idle,
        )
        inspect = InspectRequest(module=module, path=path, server=self._server_hint())
        if self.host.become.enabled:
            locked, inspected = self._begin_raised(lock, inspect, timeout=timeout)
        else:
            lock_reply, inspect_reply = self.call_batch_as(
                [operation_call("lock", lock), operation_call("inspect", inspect)],
                as_user=None,
                timeout=timeout,
                step="begin",
            )
            locked = self.read_result(LOCK, lock_reply, step="begin", request=lock)
            inspected = self.read_result(INSPECT, inspect_reply, step="begin", request=inspect)
        return locked, self._verified_inspection(inspected, "begin")

    def _begin_raised(
        self, lock: LockRequest, inspect: InspectRequest, *, timeout: float
    ) -> tuple[LockInfo, HostInspection]:
        """`begin` with become: the lock as the become user (the first raised exec, so sudo is
        checked before anything else), a probe of every other user the run raises to (root for
        a systemd restart), then the inspection as the login user. The lock stays held if a
        later part fails; the caller releases it."""
        locked = self.run(LOCK, lock, timeout=timeout, step="begin")
        for user in raised_users(self.host)[1:]:
            self.probe_raised(user, timeout=timeout, step="begin")
        inspected = self.run(INSPECT, inspect, timeout=timeout, step="begin")
        return locked, inspected

    def unlock(self, *, run_id: str, force: bool = False, timeout: float) -> UnlockResult:
        """Release the host's lock held by `run_id` (`force` releases anyone's).

        Raises:
            RemoteOperationError: `lock-not-ours`, another run holds it.
        """
        request = UnlockRequest(state_dir=self.host.state_dir, run_id=run_id, force=force)
        return self.run(UNLOCK, request, timeout=timeout)
