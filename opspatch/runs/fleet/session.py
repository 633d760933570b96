"""One host within one run: its transport, operations and engine control, and the step recorder."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol

from opspatch.core.host import Host
from opspatch.core.policy import Playbook
from opspatch.core.reasons import BECOME_REFUSALS, CONTAINER_REFUSALS, Reason
from opspatch.core.remedy import recover_after_stop, remedy_text
from opspatch.core.vocabulary import Command, Outcome, RunStatus, Step, StepStatus
from opspatch.errors import (
    BecomeError,
    ContainerError,
    HostKeyError,
    InputError,
    LeaseHeld,
    LiveRefused,
    LockHeld,
    NotTakenLive,
    OpspatchError,
    PeerNotAllowed,
    RemoteOperationError,
)
from opspatch.hosts.operations import HostOperations
from opspatch.hosts.transport.base import Transport
from opspatch.ledger.records import ContainerRecord
from opspatch.runs.fleet.connect import TransportFactory, become_passwords
from opspatch.runs.fleet.recorder import DETAIL_LIMIT, Recorder
from opspatch.runs.judgments.units import recover_remedy
from opspatch.runs.report import FileChange, HostOutcome, StepResult

if TYPE_CHECKING:
    from opspatch.hosts.engine import EngineControl, SmokeResult
    from opspatch.runs.fleet.rotation import HostRotation


class Progress(Protocol):
    """Where live progress goes (the CLI draws a line per host); `NoProgress` by default."""

    def run_started(self, run_id: str, summary: str) -> None: ...

    def update(self, host: str, step: Step, status: str) -> None: ...

    def notice(self, text: str) -> None:
        """Something the operator must see now (their Ctrl-C was taken, and what happens next)."""

    def after_stop(self, run_id: str | None) -> str | None:
        """What becomes of hosts a second Ctrl-C leaves in flight (a rehearsal tears itself down)."""


class NoProgress:
    """Progress that goes nowhere (library use, tests)."""

    def run_started(self, run_id: str, summary: str) -> None:
        return None

    def update(self, host: str, step: Step, status: str) -> None:
        return None

    def notice(self, text: str) -> None:
        return None

    def after_stop(self, run_id: str | None) -> str | None:
        return recover_after_stop(run_id)


class HostFailed(Exception):
    """Ends a host's pipeline with an outcome, its reason and code."""

    def __init__(self, outcome: Outcome, error: str, reason: Reason = Reason.STEP_FAILED) -> None:
        super().__init__(error)
        self.outcome = outcome
        self.error = error
        self.reason = reason


def describe_error(exc: BaseException) -> str:
    """One line (plus the engine's log lines when the host sent them) saying why a step failed."""
    if isinstance(exc, HostFailed):
        return exc.error
    if isinstance(exc, OpspatchError):
        detail = getattr(exc, "detail", None) or exc.message
        data = getattr(exc, "data", None) or {}
        tail = data.get("log_tail") if isinstance(data, dict) else None
        return f"{detail}\n{tail}" if tail else str(detail)
    return f"{type(exc).__name__}: {exc}"


def refusal_reason(exc: OpspatchError) -> Reason:
    """The one place an error's type becomes a `Reason`: a sudo refusal's and a container's by
    their own `reason`, which is the code (`become-refused` and `runtime-failed` for a word
    that is none of theirs)."""
    if isinstance(exc, LeaseHeld):
        return Reason.LEASE_HELD
    if isinstance(exc, LockHeld):
        return Reason.LOCK_HELD
    if isinstance(exc, RemoteOperationError) and exc.code == "lock-lost":
        return Reason.LOCK_LOST
    if isinstance(exc, HostKeyError):
        return Reason.HOST_KEY_CHANGED if exc.changed else Reason.HOST_KEY_UNKNOWN
    if isinstance(exc, BecomeError):
        return Reason(exc.reason) if exc.reason in BECOME_REFUSALS else Reason.BECOME_REFUSED
    if isinstance(exc, ContainerError):
        return Reason(exc.reason) if exc.reason in CONTAINER_REFUSALS else Reason.RUNTIME_FAILED
    if isinstance(exc, NotTakenLive):
        return Reason.NOT_TAKEN_LIVE
    if isinstance(exc, PeerNotAllowed):
        return Reason.PEER_NOT_ALLOWED
    if isinstance(exc, LiveRefused):
        return Reason.NOT_LISTENING
    if isinstance(exc, InputError):
        return Reason.NOT_APPLICABLE
    return Reason.HOST_ERROR


class HostLock:
    """The only place that knows whether this run may still hold a host's lock."""

    def __init__(self, session: HostSession) -> None:
        self._session = session
        self._sent = False
        self._given_back = False

    @property
    def run_id(self) -> str:
        """The id the lock is taken under: the run's."""
        return self._session.recorder.run_id

    @property
    def may_be_held(self) -> bool:
        return self._sent and not self._given_back

    def taking(self) -> str:
        """From now on the lock may be held (an exec with no reply may have taken it)."""
        run_id = self.run_id
        self._sent = True
        self._given_back = False
        return run_id

    def given_back_by(self, released: bool) -> None:
        """An exec reported whether it gave the lock back in the same breath."""
        self._given_back = self._given_back or released

    def take(self) -> None:
        """Again, for a halted rollout's rollback; `LockHeld` when another run holds it."""
        session = self._session
        session.ops.lock(run_id=self.taking(), timeout=session.playbook.timeouts.lock)

    def release(self) -> str | None:
        """Best effort (it expires on its own); a sentence for the note when it may still be held."""
        if not self.may_be_held:
            return None
        session = self._session
        try:
            with session.step(Step.RELEASE):
                session.ops.unlock(run_id=self.run_id, timeout=session.playbook.timeouts.lock)
            self._given_back = True
        except OpspatchError as exc:
            unlock = remedy_text(Command.UNLOCK, hosts=session.name)
            return (
                f"this run's lock could not be given back ({describe_error(exc)}): it keeps "
                f"other runs off until it expires; `{unlock}` removes it once this run is over"
            )
        return None


class HostSession:
    """Everything one run does on one host goes through here: one transport, reused."""

    def __init__(
        self,
        host: Host,
        factory: TransportFactory,
        playbook: Playbook,
        *,
        recorder: Recorder,
        progress: Progress,
        rotation: HostRotation | None = None,
    ) -> None:
        self.host = host
        self.rotation = rotation
        """Behind a router (in a run that restarts engines): drained, admitted, or neither."""
        self.playbook = playbook
        self.recorder = recorder
        self.progress = progress
        self.steps: list[StepResult] = []
        self.lock = HostLock(self)
        self.awaiting: str | None = None
        """What a readiness wait awaits and until when, for the first Ctrl-C's line."""
        self._factory = factory
        self._transport: Transport | None = None
        self._ops: HostOperations | None = None

    def __enter__(self) -> HostSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def name(self) -> str:
        return self.host.name

    @property
    def ops(self) -> HostOperations:
        if self._ops is None:
            self._transport = self._factory(self.host)
            self._ops = HostOperations(
                self._transport,
                self.host,
                passwords=become_passwords(self._factory),
                lock_grace=self.playbook.team.lease_expiry,  # how long a lock stays busy past an exec
            )
        return self._ops

    @property
    def engine(self) -> EngineControl:
        # imported on first use: `apply --file` has no engine (tests/test_startup.py)
        from opspatch.hosts.engine import EngineControl

        return EngineControl(self.ops, self.host, self.playbook)

    @property
    def container(self) -> ContainerRecord | None:
        """Its id and creation time as first seen in this run; None for an engine on the host."""
        seen = self._transport.container if self._transport is not None else None
        if seen is None:
            return None
        return ContainerRecord(seen.runtime, seen.name, seen.id, seen.created, seen.image)

    @property
    def exec_count(self) -> int:
        return self._transport.exec_count if self._transport is not None else 0

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def outcome(
        self,
        outcome: Outcome,
        error: str | None = None,
        *,
        file: FileChange | None = None,
        diff: str | None = None,
        smoke: SmokeResult | None = None,
        note: str | None = None,
        reason: Reason | None = None,
    ) -> HostOutcome:
        """A host left out of rotation says so in its note, never silently."""
        rotation = self.rotation
        if rotation is not None and rotation.out:
            out = rotation.out_note(self.host)
            note = f"{note}; {out}" if note else out
        return HostOutcome(
            self.name,
            outcome,
            error,
            reason=reason,
            note=note,
            file=file,
            steps=tuple(self.steps),
            diff=diff,
            smoke=smoke,
            rotation=rotation.word if rotation is not None else None,
        )

    def refused(self, exc: OpspatchError) -> HostOutcome:
        """Raised before anything changed: `skipped` or `failed` by the error's kind."""
        reason = refusal_reason(exc)
        if isinstance(exc, LockHeld):
            text = f"refused: {exc.detail}{self._way_out(exc)}"
            return self.outcome(Outcome.FAILED, text, reason=reason)
        if isinstance(exc, InputError):  # what to do is the hint: an operator's input refused
            text = exc.message if not exc.hint else f"{exc.message} ({exc.hint})"
            return self.outcome(Outcome.SKIPPED, text, reason=reason)
        return self.outcome(Outcome.FAILED, describe_error(exc), reason=reason)

    def _way_out(self, held: LockHeld) -> str:
        """A lock outliving its run blocks every run on the host until it expires, unless the
        operator is told how to clear it."""
        holder = str(held.data.get("run_id") or "")
        status = self.recorder.run_status(holder) if holder else None
        if status == RunStatus.INTERRUPTED:
            recover = remedy_text(Command.RECOVER)
            return f"; run {holder} was interrupted: `{recover}` finishes or undoes it"
        if status == RunStatus.UNKNOWN:  # begun on another controller, which may be alive
            until = held.data.get("busy_until_iso") or held.data.get("expires_at_iso")
            return (
                f"; run {holder}'s controller may still be at work here (a command it sent may "
                f"still be running until {until}): nothing was changed here; once then, "
                f"`{remedy_text(Command.RECOVER, run=holder)}` takes the host over"
            )
        if status in (RunStatus.FINISHED, RunStatus.RECOVERED):
            unit = self.host.unit  # a unit is recovered whole: a node alone is refused
            reconciled = (
                f"unit {unit.name} and clears the lock"
                if unit is not None
                else "the host and clears it"
            )
            return (
                f"; run {holder} is over ({status}) but its lock outlived it: "
                f"`{recover_remedy(self.host)}` "
                f"reconciles {reconciled}, or `{remedy_text(Command.UNLOCK, hosts=self.name)}`"
            )
        return ""

    def record(
        self, step: Step, status: StepStatus, seconds: float | None = None, detail: str = ""
    ) -> None:
        self.recorder.step(self.name, step, status, seconds, detail)

    @contextmanager
    def step(self, name: Step) -> Iterator[dict[str, str]]:
        """The body may set `note["detail"]`; the users its execs ran as are appended."""
        note: dict[str, str] = {"detail": ""}
        self.progress.update(self.name, name, "running")
        self.record(name, StepStatus.STARTED)
        started = time.monotonic()
        execs_before = len(self._ops.ran_as) if self._ops is not None else 0
        notices_before = len(self._ops.notices) if self._ops is not None else 0
        status, detail = StepStatus.FAILED, ""
        try:
            yield note
            status, detail = StepStatus.OK, note["detail"]
        except BaseException as exc:
            detail = describe_error(exc)
            raise
        finally:
            seconds = time.monotonic() - started
            ran_as = self._ran_as_since(execs_before)
            detail = self._with_notices(detail, notices_before)
            self.steps.append(StepResult(name, status, seconds, detail, ran_as))
            self.record(name, status, seconds, with_users(detail, ran_as))
            self.progress.update(self.name, name, "ok" if status == StepStatus.OK else "failed")

    @contextmanager
    def failing_step(self, name: Step) -> Iterator[dict[str, str]]:
        """`step`, an error failing the host (`HostFailed` naming the step)."""
        try:
            with self.step(name) as note:
                yield note
        except OpspatchError as exc:
            raise HostFailed(Outcome.FAILED, f"{name}: {describe_error(exc)}") from exc

    def _with_notices(self, detail: str, count: int) -> str:
        said = self._ops.notices[count:] if self._ops is not None else []
        for notice in said:
            self.progress.notice(f"{self.name}: {notice}")
        return "; ".join([detail, *said] if detail else said)

    def _ran_as_since(self, count: int) -> tuple[str, ...]:
        """The distinct users of the execs made since the first `count`, in order."""
        if self._ops is None:
            return ()
        return tuple(dict.fromkeys(self._ops.ran_as[count:]))


def with_users(detail: str, ran_as: tuple[str, ...]) -> str:
    """A step's ledger detail ending with the users its execs ran as (within the length kept)."""
    if not ran_as:
        return detail
    suffix = f"[ran as {', '.join(ran_as)}]"
    room = DETAIL_LIMIT - len(suffix) - 1
    return f"{detail[:room]} {suffix}" if detail else suffix
