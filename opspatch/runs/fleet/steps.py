"""The steps of one host that every run shares, each a recorded step of a `HostSession`."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opspatch.core.reasons import Reason
from opspatch.core.vocabulary import FileAction, Outcome, Step
from opspatch.errors import InputError, RemoteOperationError
from opspatch.hosts.operations import RestoreReply
from opspatch.ledger.records import NewFileVersion
from opspatch.runs.fleet.rotation import admit_step, drain_step
from opspatch.runs.fleet.session import HostFailed, HostSession, describe_error

if TYPE_CHECKING:  # `hosts.engine` is imported where an engine is driven (`HostSession.engine`)
    from opspatch.hosts.engine import (
        Readiness,
        RestartReply,
        ServerGroup,
        SmokeResult,
        StillWaiting,
    )

# The codes of an agent that did not answer, or failed part-way: what it wrote is unknown.
_UNKNOWN_EFFECT_CODES = frozenset({"agent-no-reply", "agent-error"})


def effect_unknown(exc: BaseException) -> bool:
    """Only a refusal the agent replied with says a failed exec wrote nothing."""
    if isinstance(exc, RemoteOperationError):
        return exc.code in _UNKNOWN_EFFECT_CODES
    return not isinstance(exc, InputError)


def restore_pre_image(
    session: HostSession,
    *,
    path: str,
    pre_sha256: str,
    post_sha256: str,
    timeout: float,
    mode: int = 0,
    owner: str = "",
) -> RestoreReply:
    """From the host's own backup, else the ledger's copy; recorded as a file version."""

    def restore(content: bytes | None = None) -> RestoreReply:
        return session.ops.restore(
            path,
            pre_sha256=pre_sha256,
            content=content,
            current_sha256=post_sha256,
            timeout=timeout,
        )

    with session.step(Step.RESTORE) as note:
        try:
            try:
                restored = restore()
            except RemoteOperationError as exc:
                if exc.code not in ("backup-missing", "backup-hash-mismatch"):
                    raise
                content = session.recorder.stored_image(pre_sha256)
                if content is None:
                    raise
                restored = restore(content)
        except Exception as exc:
            if not effect_unknown(exc):
                raise
            # No reply: the restore may or may not have happened. Ask again: the agent reads
            # the file itself, restores it if it is still the post-image, and purges bytecode.
            again = restore()
            restored = {**again, "sha256_before": post_sha256, "changed": True}
            note["detail"] = (
                f"the first restore did not answer ({describe_error(exc)}); asked again: "
                + (
                    "it had worked"
                    if again["source"] == "already"
                    else f"restored from {again['source']}"
                )
            )
        else:
            note["detail"] = f"back to {restored['sha256_after'][:12]} from {restored['source']}"
    if restored["changed"]:
        session.recorder.file_version(
            session.name,
            NewFileVersion(
                path,
                restored["sha256_before"],
                restored["sha256_after"],
                mode,
                owner,
                pre_image=None,  # what it overwrote: the post-image the ledger holds
                action=FileAction.RESTORE,
                container=session.container,
            ),
        )
    return restored


def restart_step(session: HostSession, *, step: Step = Step.RESTART) -> RestartReply:
    drain_step(session)
    with session.failing_step(step) as note:
        result = session.engine.restart(step=step)
        note["detail"] = f"{result['strategy']}: pid {result.get('pid')}"
    return result


def ready_step(
    session: HostSession,
    restart: RestartReply | None,
    *,
    step: Step = Step.READY,
    timeout: float | None = None,
    group: ServerGroup | None = None,
    slice_seconds: float | None = None,
    between: Callable[[], None] | None = None,
) -> Readiness:
    """`HostFailed` when not ready; a unit's head is awaited with its `group`, `between` looking at
    its other nodes."""
    from opspatch.hosts.engine import READY_SLICE_SECONDS

    seconds = float(session.playbook.timeouts.ready if timeout is None else timeout)
    until = _clock(time.time() + seconds)
    session.awaiting = f"{step}: {session.host.engine.url}/health, until {until}"

    said_at = [0.0]  # a line about every 30 s, however short the parts

    def say(still: StillWaiting) -> None:
        if between is not None:
            between()
        if slice_seconds is None or still.waited - said_at[0] >= READY_SLICE_SECONDS:
            said_at[0] = still.waited
            session.progress.notice(
                waiting_line(
                    session.name,
                    step,
                    still,
                    session.progress.after_stop(session.recorder.reported_run_id),
                )
            )

    try:
        with session.failing_step(step) as note:
            ready = session.engine.wait_ready(
                restart,
                step=step,
                timeout=seconds,
                on_waiting=say,
                group=group,
                slice_seconds=slice_seconds,
            )
            note["detail"] = f"/health 200 after {ready.seconds:.1f}s ({ready.polls} polls)"
        return ready
    finally:
        session.awaiting = None


def waiting_line(host: str, step: Step, still: StillWaiting, after: str | None) -> str:
    then = f", then {after}" if after else ""
    return (
        f"{host}: {step}: still waiting for {still.url}/health to answer 200 ({still.last}); "
        f"{still.waited:.0f}s of {still.timeout:.0f}s, gives up at {_clock(still.gives_up_at)}. "
        f"Ctrl-C starts no more hosts and still waits for this one until then; "
        f"Ctrl-C twice stops waiting{then}"
    )


def _clock(epoch: float) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(epoch))


class SmokeFailed(HostFailed):
    def __init__(self, result: SmokeResult) -> None:
        super().__init__(Outcome.FAILED, f"smoke failed: {result.summary()}", Reason.SMOKE_FAILED)
        self.result = result


def smoke_step(
    session: HostSession,
    restart: RestartReply | None,
    *,
    baseline: Sequence[str | None] | None,
    step: Step = Step.SMOKE,
    must_pass: bool = True,
    last: bool = False,
) -> SmokeResult:
    """`last`: a pass gives the lock back in the same exec and admits the host behind a router."""
    try:
        with session.failing_step(step) as note:
            result = session.engine.smoke(
                log_offset=restart.get("log_offset") if restart else None,
                baseline=baseline,
                pid=restart.get("pid") if restart else None,
                step=step,
                # the smoke runs as the login user: with become the lock is a raised user's,
                # so it is released by its own (raised) exec
                release_lock=(
                    session.lock.run_id if last and not session.host.become.enabled else None
                ),
            )
            session.lock.given_back_by(result.lock_released)
            note["detail"] = result.summary() + ("; lock released" if result.lock_released else "")
            if not result.ok:
                raise SmokeFailed(result)
    except SmokeFailed as failed:
        if must_pass:
            raise
        return failed.result
    if last:
        admit_step(session)
    return result


def readmit(session: HostSession, restart: RestartReply | None) -> None:
    """Re-admit a host a crashed run left out of rotation once its smoke passes."""
    rotation = session.rotation
    if rotation is None or not rotation.out:
        return
    try:
        smoke = smoke_step(session, restart, baseline=None, must_pass=False, last=True)
    except HostFailed as failure:
        rotation.why_out = f"no smoke decode before its re-admission: {failure.error}"
        return
    if not smoke.ok:
        rotation.why_out = f"the smoke decode before its re-admission failed: {smoke.summary()}"


def smoke_after_restore(
    session: HostSession, restart: RestartReply, *, step: Step = Step.SMOKE_AFTER_RESTORE
) -> tuple[SmokeResult | None, str | None]:
    """Its result (None: not run) and, unless it passed, why the server does not serve."""
    try:
        smoke = smoke_step(session, restart, baseline=None, step=step, must_pass=False, last=True)
    except HostFailed as failure:
        return None, f"the server does not serve the restored file: {failure.error}"
    if smoke.ok:
        return smoke, None
    return smoke, (
        "the server does not serve the restored file (the original code may be what was "
        f"broken): the smoke decode after the restore failed: {smoke.summary()}"
    )


@dataclass(frozen=True)
class RestoreSteps:
    restart: Step
    ready: Step
    smoke: Step


AFTER_RESTORE = RestoreSteps(
    Step.RESTART_AFTER_RESTORE, Step.READY_AFTER_RESTORE, Step.SMOKE_AFTER_RESTORE
)
"""An undo's steps after a failed proof (and recover's putting a set back)."""
AS_ROLLBACK = RestoreSteps(Step.RESTART, Step.READY, Step.SMOKE)
"""A rollback's steps: the restore is what it is for."""
