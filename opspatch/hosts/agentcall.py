"""One exec to a host's agent, controller side: the path every host operation takes."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from opspatch.core.host import Host
from opspatch.errors import InputError, RemoteOperationError, TargetError, TransportError
from opspatch.hosts.agent.protocol import (
    AgentReply,
    AgentRequest,
    LockRequest,
    OperationCall,
    OperationReply,
)
from opspatch.hosts.become import (
    BecomePasswords,
    RunsAs,
    Sudo,
    not_allowed_to_read,
)
from opspatch.hosts.channel import (
    DEFAULT_LOCK_GRACE,
    REFUSAL_ERRORS,
    AgentAnswer,
    AgentEndpoint,
    lock_times,
    operation_call,
)
from opspatch.hosts.resident import open_endpoint
from opspatch.hosts.results import changes_host, descriptor, run_as
from opspatch.hosts.transport.base import Transport

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


class AgentCaller:
    """The one path to a host's agent: one exec per batch, the fence, refusals.

    Every exec goes through `call_batch_as` (`call` and `call_batch` choose the user the
    inventory says runs an operation; `call_as` is a batch of one that returns the result or
    raises the refusal); `ran_as` notes who ran each exec.

    While a run holds the host's lock, every exec it sends as the lock's user re-asserts the lock
    first, in the same exec (`_Fence`), so a live controller keeps it and an exec sent after
    another run took it over does nothing (`lock-lost`): docs/agent.md, "The lock as a fence".
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
        self.notices: list[str] = []
        """What the channel said on the way (the host agent started again), oldest first."""
        self._fence: _Fence | None = None
        sudo = Sudo(host, passwords or BecomePasswords())
        self.endpoint: AgentEndpoint = open_endpoint(transport, host, sudo)

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

    # -- the one path to the host's agent: one exec, the fence, refusals ---------------------

    def default_user(self, operation: str) -> str | None:
        """Who runs `operation` on this host (with `become`, as its descriptor's `runs_as`
        says), or None, the login user."""
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
            and not_allowed_to_read(descriptor(operation).runs_as, reply)
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
        if changes_host(calls) and time.monotonic() + timeout > fence.good_until:
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
            and all(descriptor(call["op"]).runs_as is RunsAs.READ for call in calls)
        )

    def _exchange(
        self, request: AgentRequest, as_user: str | None, timeout: float, step: str
    ) -> AgentAnswer:
        """The one exec; transport failures name this host and step."""
        try:
            answer = self.endpoint.answer(request, as_user=as_user, timeout=timeout)
        except TransportError as exc:
            if exc.step == step and exc.host == self.name:
                raise
            raise exc.at(host=self.name, step=step) from None
        if answer.notice:
            self.notices.append(answer.notice)
        return answer

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
