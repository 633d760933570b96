"""Host-side operations, controller side: one exec per call, typed results, typed errors."""

from __future__ import annotations

import base64
import getpass
import socket
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, TypeVar, cast

from opspatch.core.host import Host
from opspatch.core.source import sha256_hex
from opspatch.errors import RemoteOperationError
from opspatch.hosts.agent.protocol import (
    InspectRequest,
    LockReply,
    LockRequest,
    NoArgs,
    OperationReply,
    ReadRequest,
    ResolveReply,
    ResolveRequest,
    RestoreReply,
    RestoreRequest,
    ServerHint,
    SwapRequest,
    UnlockReply,
    UnlockRequest,
)
from opspatch.hosts.agentcall import AgentCaller
from opspatch.hosts.become import raised_users
from opspatch.hosts.channel import (
    AGENT_PACKAGE,
    BOOTSTRAP,
    LOCK_HOLD_SECONDS,
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
    Operation,
    RemoteFile,
    SwapResult,
)
from opspatch.hosts.transport.base import Transport
from opspatch.hosts.transport.local import LocalTransport

__all__ = [  # the result values (`opspatch.hosts.results`) and the channel's names, re-exported
    "AGENT_PACKAGE",
    "BOOTSTRAP",
    "HostFacts",
    "HostInspection",
    "HostOperations",
    "LOCK_HOLD_SECONDS",
    "RemoteFile",
    "RestoreReply",
    "SwapResult",
    "agent_modules",
    "default_lock_owner",
    "open_transport",
]

R = TypeVar("R")
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
    from opspatch.hosts.transport.container import ContainerTransport

    # the engine runs in a container: every operation is an exec into it, through the host
    return ContainerTransport(base, host.container)


# ---------------------------------------------------------------------------------------------
# The operations


class HostOperations(AgentCaller):
    """Host-side operations on one host, through its transport, under its engine's interpreter.

    Build one per host per run: `HostOperations(transport, host)`. Each method is one exec and
    takes its deadline as `timeout=` (seconds; the playbook's `StepTimeouts` in a rollout).
    Later operations (restart, readiness, smoke, log scan) are added to the agent and
    called through `call`, the same single path every method here uses: `AgentCaller`
    (`opspatch.hosts.agentcall`) holds it, with the fence that keeps the run's host lock.
    """

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
        return WHOAMI.read(reply, host=self.name, step=step)["user"]

    # -- facts, resolve, read, inspect -------------------------------------------------------

    def facts(self, *, timeout: float) -> HostFacts:
        """Python, sglang and torch versions (distribution metadata), GPUs and CUDA as the
        driver reports them (NVML or nvidia-smi; nothing imports torch), hostname."""
        return self.run(FACTS, NoArgs(), timeout=timeout)

    def resolve(self, module: str, *, timeout: float) -> ResolveReply:
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

    def _server_hint(self) -> ServerHint | None:
        """Where the agent can find the running engine (its pid file, its URL's port); None
        where none serves the files (the look reads the host's whole socket table; issue 44)."""
        if not self.host.engine.serves:
            return None
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
    ) -> RestoreReply:
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
        takeover_run: str | None = None,
        takeover_idle: bool = False,
        timeout: float,
    ) -> LockReply:
        """Take the host's lock (`<state_dir>/lock.json`) for `run_id`, or refresh it.

        An expired lock is taken over (the previous holder is returned); taking it again with
        the same run id extends the expiry. `takeover_run` (recover): the lock that run still
        holds is taken over, as `begin` does.

        Raises:
            LockHeld: another run holds it and it has not expired (owner, run id, expiry in
                `data` and in the message).
        """
        request = self._lock_request(
            run_id,
            owner,
            ttl_seconds,
            timeout,
            takeover_run=takeover_run,
            takeover_idle=takeover_idle,
        )
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
    ) -> tuple[LockReply, HostInspection]:
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
    ) -> tuple[LockReply, HostInspection]:
        """`begin` with become: the lock as the become user (the first raised exec, so sudo is
        checked before anything else), a probe of every other user the run raises to (root for
        a systemd restart), then the inspection as the login user. The lock stays held if a
        later part fails; the caller releases it."""
        locked = self.run(LOCK, lock, timeout=timeout, step="begin")
        for user in raised_users(self.host)[1:]:
            self.probe_raised(user, timeout=timeout, step="begin")
        inspected = self.run(INSPECT, inspect, timeout=timeout, step="begin")
        return locked, inspected

    def unlock(self, *, run_id: str, force: bool = False, timeout: float) -> UnlockReply:
        """Release the host's lock held by `run_id` (`force` releases anyone's).

        Raises:
            RemoteOperationError: `lock-not-ours`, another run holds it.
        """
        request = UnlockRequest(state_dir=self.host.state_dir, run_id=run_id, force=force)
        return self.run(UNLOCK, request, timeout=timeout)
