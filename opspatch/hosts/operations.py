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
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar, cast

from opspatch.core.host import Host
from opspatch.core.source import sha256_hex
from opspatch.errors import RemoteOperationError
from opspatch.hosts.agent.protocol import (
    FileReply,
    InspectReply,
    InspectRequest,
    LockReply,
    LockRequest,
    OperationCall,
    OperationReply,
    ReadRequest,
    ResolveRequest,
    RestoreReply,
    RestoreRequest,
    ServerHint,
    SwapReply,
    SwapRequest,
    UnlockReply,
    UnlockRequest,
    WhoamiReply,
)
from opspatch.hosts.become import BecomePasswords, raised_users
from opspatch.hosts.channel import (
    AGENT_PACKAGE,
    BOOTSTRAP,
    DEFAULT_LOCK_GRACE,
    LOCK_HOLD_SECONDS,
    AgentChannel,
    agent_modules,
    lock_times,
    operation_call,
)
from opspatch.hosts.results import (
    HostFacts,
    HostInspection,
    LockHolder,
    LockInfo,
    RemoteFile,
    ResolvedModule,
    RestoreResult,
    ServerProcess,
    SwapResult,
    UnlockResult,
    read_reply,
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

ReplyT = TypeVar("ReplyT")


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


# ---------------------------------------------------------------------------------------------
# The operations


class HostOperations:
    """Host-side operations on one host, through its transport, under its engine's interpreter.

    Build one per host per run: `HostOperations(transport, host)`. Each method is one exec and
    takes its deadline as `timeout=` (seconds; the playbook's `StepTimeouts` in a rollout).
    Later operations (restart, readiness, smoke, log scan) are added to the agent and
    called through `call`, the same single path every method here uses.
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
        self.channel = AgentChannel(transport, host, passwords=passwords, lock_grace=lock_grace)
        self.ran_as: list[str] = self.channel.ran_as
        """The user each exec ran as (`name`, or `name (sudo)` when raised), oldest first."""

    @property
    def name(self) -> str:
        return self.host.name

    # -- the one path to the host: the channel ----------------------------------------------

    def call(
        self,
        operation: str,
        args: Mapping[str, object],
        *,
        timeout: float,
        step: str | None = None,
    ) -> dict[str, Any]:
        """Run agent operation `operation` with `args` on the host, as the user the inventory
        says runs it (`become`); its `result` on success. See `AgentChannel.call`."""
        return self.channel.call(
            operation,
            args,
            as_user=self.channel.default_user(operation),
            timeout=timeout,
            step=step or operation,
        )

    def call_batch(
        self, calls: Sequence[OperationCall], *, timeout: float, step: str
    ) -> list[OperationReply]:
        """Run `calls` in order in one exec, as the user the inventory says runs them (one user
        for the whole batch); a reply per call (`AgentChannel.call_batch`), the first refusal
        stopping the rest. `channel.result(reply, ...)` reads one.

        Raises:
            ValueError: the calls would run as different users (a batch is one process).
            As `AgentChannel.call_batch` otherwise.
        """
        users = {self.channel.default_user(call["op"]) for call in calls}
        if len(users) != 1:
            raise ValueError(f"a batch runs as one user: {[c['op'] for c in calls]} need {users}")
        (user,) = users
        return self.channel.call_batch(calls, as_user=user, timeout=timeout, step=step)

    def then_unlock(
        self,
        operation: str,
        args: Mapping[str, object],
        *,
        run_id: str,
        gate: bool,
        timeout: float,
        step: str,
    ) -> tuple[dict[str, Any], bool]:
        """`operation`, then give `run_id`'s lock back, in one exec: how a host's last step
        ends. With `gate`, the lock goes back only if the result says `ok` (a smoke that failed
        keeps it: the rollback still needs it). Returns the operation's result and whether the
        lock was given back (False: the caller gives it back with its own exec).

        Raises:
            As `call` for `operation`; nothing about the unlock (it is best effort here).
        """
        unlock = UnlockRequest(state_dir=self.host.state_dir, run_id=run_id, force=False)
        first, then = self.call_batch(
            [operation_call(operation, args, gate=gate), operation_call("unlock", unlock)],
            timeout=timeout,
            step=step,
        )
        result = self.channel.result(first, step=step, args=args)
        released = cast(UnlockReply, then.get("result") or {}).get("released")
        return result, then.get("status") == "done" and bool(released)

    def _typed_call(
        self,
        operation: str,
        request: Mapping[str, object],
        reply_type: type[ReplyT],
        *,
        timeout: float,
        step: str | None = None,
    ) -> ReplyT:
        """`call` with the operation's request and reply shapes from `agent.protocol`: what
        the agent's operation reads and returns, named once for both ends."""
        return cast(ReplyT, self.call(operation, request, timeout=timeout, step=step))

    def probe_raised(self, user: str, *, timeout: float, step: str) -> str:
        """Run the agent's `whoami` as `user` through sudo: proves sudo lets this host's login
        raise to `user` (preflight, for a user no earlier operation raised to). Returns the user
        the agent ran as.

        Raises:
            BecomeError: as for any raised operation.
        """
        reply = cast(
            WhoamiReply,
            self.channel.call("whoami", {}, as_user=user, timeout=timeout, step=step),
        )
        return str(reply.get("user") or user)

    # -- facts, resolve, read, inspect -------------------------------------------------------

    def facts(self, *, timeout: float) -> HostFacts:
        """Python, sglang and torch versions (distribution metadata), GPUs and CUDA as the
        driver reports them (NVML or nvidia-smi; nothing imports torch), hostname."""
        reply = self.call("facts", {}, timeout=timeout)
        return read_reply(HostFacts, reply, host=self.name, step="facts")

    def resolve(self, module: str, *, timeout: float) -> ResolvedModule:
        """The file the engine's interpreter imports for `module` (nothing is imported)."""
        reply = self.call("resolve", dict(ResolveRequest(module=module)), timeout=timeout)
        return read_reply(ResolvedModule, reply, host=self.name, step="resolve")

    def read(self, path: str, *, timeout: float) -> RemoteFile:
        """The file's exact bytes, sha256, mode, owner, mtime and symlink target."""
        reply = self._typed_call("read", ReadRequest(path=path), FileReply, timeout=timeout)
        return self._remote_file(reply, "read")

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
        reply = self._typed_call("inspect", request, InspectReply, timeout=timeout)
        return self._inspection(reply, "inspect")

    def _inspection(self, reply: InspectReply, step: str) -> HostInspection:
        """An inspection (`inspect`, or the inspecting half of `begin`), its parts checked."""
        resolved, server = reply.get("resolved"), reply.get("server")
        return HostInspection(
            facts=read_reply(HostFacts, reply["facts"], host=self.name, step=step),
            module=read_reply(ResolvedModule, resolved, host=self.name, step=step)
            if resolved
            else None,
            file=self._remote_file(reply["file"], step),
            server=read_reply(ServerProcess, server, host=self.name, step=step) if server else None,
        )

    def _server_hint(self) -> ServerHint:
        """Where the agent can find the running engine (its pid file, its URL's port)."""
        return ServerHint(
            pid_file=getattr(self.host.engine.restart, "pid_file", None),
            url=self.host.engine.url,
        )

    def _remote_file(self, data: FileReply | Mapping[str, Any], step: str) -> RemoteFile:
        content = base64.b64decode(data["content_b64"])
        if sha256_hex(content) != data["sha256"]:
            raise RemoteOperationError(
                f"{data['path']} arrived with a different sha256 than the host computed",
                code="read-corrupt",
                host=self.name,
                step=step,
            )
        return RemoteFile(
            path=str(data["path"]),
            realpath=str(data["realpath"]),
            symlink_target=data.get("symlink_target"),
            content=content,
            sha256=str(data["sha256"]),
            size=int(data["size"]),
            mode=int(data["mode"]),
            uid=int(data["uid"]),
            gid=int(data["gid"]),
            owner=data.get("owner"),
            group=data.get("group"),
            mtime_ns=int(data["mtime_ns"]),
            nlink=int(data["nlink"]),
        )

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
                "swap", args, run_id=lock_run_id, gate=False, timeout=timeout, step="swap"
            )
            reply = cast(SwapReply, result)
        else:
            reply, released = self._typed_call("swap", args, SwapReply, timeout=timeout), False
        return SwapResult(
            path=str(reply["path"]),
            realpath=str(reply["realpath"]),
            sha256_before=str(reply["sha256_before"]),
            sha256_after=str(reply["sha256_after"]),
            changed=bool(reply["changed"]),
            backup_path=reply.get("backup_path"),
            purged_bytecode=tuple(reply.get("purged_bytecode") or ()),
            purge_failures=tuple(reply.get("purge_failures") or ()),
            mode=int(reply["mode"]),
            uid=int(reply["uid"]),
            gid=int(reply["gid"]),
            lock_released=released,
        )

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
        reply = self._typed_call("restore", args, RestoreReply, timeout=timeout)
        return RestoreResult(
            path=str(reply["path"]),
            realpath=str(reply["realpath"]),
            sha256_before=str(reply["sha256_before"]),
            sha256_after=str(reply["sha256_after"]),
            changed=bool(reply["changed"]),
            source=reply["source"],
            kept_copy=reply.get("kept_copy"),
            purged_bytecode=tuple(reply.get("purged_bytecode") or ()),
            purge_failures=tuple(reply.get("purge_failures") or ()),
        )

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
        reply = self._typed_call("lock", request, LockReply, timeout=timeout)
        return self._lock_info(reply, "lock")

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
        re-asserts it (`AgentChannel`)."""
        ttl, busy = lock_times(timeout, self.channel.lock_grace)
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

    def _lock_info(self, reply: LockReply, step: str) -> LockInfo:
        previous = reply["previous"]
        return LockInfo(
            holder=read_reply(LockHolder, reply["holder"], host=self.name, step=step),
            refreshed=bool(reply["refreshed"]),
            took_over_from=read_reply(LockHolder, previous, host=self.name, step=step)
            if previous
            else None,
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
            lock_reply, inspect_reply = self.channel.call_batch(
                [operation_call("lock", lock), operation_call("inspect", inspect)],
                as_user=None,
                timeout=timeout,
                step="begin",
            )
            locked = cast(LockReply, self.channel.result(lock_reply, step="begin", args=lock))
            inspected = cast(
                InspectReply, self.channel.result(inspect_reply, step="begin", args=inspect)
            )
        return self._lock_info(locked, "begin"), self._inspection(inspected, "begin")

    def _begin_raised(
        self, lock: LockRequest, inspect: InspectRequest, *, timeout: float
    ) -> tuple[LockReply, InspectReply]:
        """`begin` with become: the lock as the become user (the first raised exec, so sudo is
        checked before anything else), a probe of every other user the run raises to (root for
        a systemd restart), then the inspection as the login user. The lock stays held if a
        later part fails; the caller releases it."""
        locked = self._typed_call("lock", lock, LockReply, timeout=timeout, step="begin")
        for user in raised_users(self.host)[1:]:
            self.probe_raised(user, timeout=timeout, step="begin")
        inspected = self._typed_call(
            "inspect", inspect, InspectReply, timeout=timeout, step="begin"
        )
        return locked, inspected

    def unlock(self, *, run_id: str, force: bool = False, timeout: float) -> UnlockResult:
        """Release the host's lock held by `run_id` (`force` releases anyone's).

        Raises:
            RemoteOperationError: `lock-not-ours`, another run holds it.
        """
        request = UnlockRequest(state_dir=self.host.state_dir, run_id=run_id, force=force)
        reply = self._typed_call("unlock", request, UnlockReply, timeout=timeout)
        previous = reply.get("previous")
        return UnlockResult(
            released=bool(reply["released"]),
            reason=str(reply["reason"]),
            previous=read_reply(LockHolder, previous, host=self.name, step="unlock")
            if previous
            else None,
        )
