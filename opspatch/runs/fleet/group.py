"""A node group, the one target of a run: `Nodes(head, others)`, a host by itself a group of one."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opspatch.core.host import Unit
from opspatch.core.reasons import Reason
from opspatch.core.vocabulary import Outcome, Step, StepStatus
from opspatch.errors import OpspatchError
from opspatch.runs.fleet.rotation import admit_step, drain_step
from opspatch.runs.fleet.session import HostFailed, HostSession, describe_error, refusal_reason
from opspatch.runs.fleet.steps import AFTER_RESTORE, RestoreSteps
from opspatch.runs.report import FileChange, HostOutcome

if TYPE_CHECKING:  # `hosts.engine` is imported where an engine is driven (`HostSession.engine`)
    from opspatch.hosts.engine import (
        Readiness,
        RestartReply,
        ServerGroup,
        SmokeResult,
        StillWaiting,
        StopReply,
    )

UNIT_LOOK_SECONDS = 10.0
"""A node that dies during the restart is seen within this (plus one exec), not at the deadline."""


@dataclass(frozen=True)
class Nodes:
    """One server's sessions in node-rank order: the head (which serves requests), then the others."""

    head: HostSession
    others: tuple[HostSession, ...] = ()

    @property
    def sessions(self) -> tuple[HostSession, ...]:
        return (self.head, *self.others)

    @property
    def alone(self) -> bool:
        return not self.others

    @property
    def unit(self) -> Unit | None:
        return None if self.alone else self.head.host.unit

    @property
    def name(self) -> str:
        unit = self.unit
        return unit.name if unit is not None else self.head.name

    @property
    def label(self) -> str:
        """`unit u1` or `host h3`: the group in an outcome's sentence."""
        return f"unit {self.name}" if self.others else f"host {self.name}"

    @property
    def group(self) -> ServerGroup | None:
        from opspatch.hosts.engine import ServerGroup

        return None if self.alone else ServerGroup(nnodes=len(self.sessions))

    def where(self, session: HostSession) -> str:
        unit = self.unit
        assert unit is not None
        return unit.describe(session.name)


class NodeFailed(HostFailed):
    """A step failed on one node of a group of several: the group's proof fails, naming it."""

    def __init__(self, node: str, error: str, reason: Reason = Reason.STEP_FAILED) -> None:
        super().__init__(Outcome.FAILED, f"{node}: {error}", reason)
        self.node = node


@contextmanager
def failing_as(nodes: Nodes, session: HostSession) -> Iterator[None]:
    """A step's failure on `session` as the group's: naming the node when there are several."""
    try:
        yield
    except NodeFailed:
        raise
    except HostFailed as failure:
        if nodes.alone:
            raise
        raise NodeFailed(session.name, failure.error, failure.reason) from failure


GroupJudge = Callable[[Nodes], object]
"""A further proof after the smoke (the judge, a staged plugin); raises `HostFailed`."""

NodeRestore = Callable[[HostSession], FileChange | None]
"""Put back one node's files; the files then (None: nothing to show); raises when it fails."""


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


_STOP_START = {
    Step.RESTART: (Step.STOP, Step.START),
    Step.RESTART_AFTER_RESTORE: (Step.STOP_AFTER_RESTORE, Step.START_AFTER_RESTORE),
}


def restart(nodes: Nodes, step: Step = Step.RESTART) -> dict[str, RestartReply]:
    """One exec for a host by itself; several: every node stopped, then started head first. A
    `NodeFailed` leaves the nodes started before it running: the caller undoes the group as one."""
    if nodes.alone:
        return {nodes.head.name: restart_step(nodes.head, step=step)}
    stop, start = _STOP_START[step]
    with failing_as(nodes, nodes.head):
        drain_step(nodes.head)  # only the head is a router worker

    def stop_one(session: HostSession) -> StopReply:
        with failing_as(nodes, session), session.failing_step(stop) as note:
            result = session.engine.stop(step=stop)
            pids = ", ".join(str(p) for p in result.get("stopped", [])) or "none running"
            note["detail"] = f"{result['strategy']}: stopped {pids}"
        return result

    def start_one(session: HostSession, stopped: StopReply) -> RestartReply:
        with failing_as(nodes, session), session.failing_step(start) as note:
            result = session.engine.start(step=start, stopped=stopped)
            note["detail"] = f"{result['strategy']}: pid {result.get('pid')}"
        return result

    stopped = _on_every_node(nodes, stop_one)
    return {session.name: start_one(session, stopped[session.name]) for session in nodes.sessions}


def _on_every_node(nodes: Nodes, work: Callable[[HostSession], StopReply]) -> dict[str, StopReply]:
    """In parallel: the group is down for the slowest node's stop, not their sum; the first failure
    in rank order is raised once every node answered."""
    with ThreadPoolExecutor(max_workers=len(nodes.sessions), thread_name_prefix="node") as pool:
        futures = {s.name: pool.submit(work, s) for s in nodes.sessions}
        done: dict[str, StopReply] = {}
        failure: BaseException | None = None
        for name, future in futures.items():
            try:
                done[name] = future.result()
            except BaseException as exc:  # noqa: BLE001 - re-raised below, after every node
                failure = failure or exc
    if failure is not None:
        raise failure
    return done


def ready(
    nodes: Nodes,
    started: Mapping[str, RestartReply],
    *,
    step: Step = Step.READY,
    timeout: float | None = None,
) -> None:
    """The head ready holding the whole group; between looks at it, each other node must still run."""

    def look() -> None:
        for session in nodes.others:
            try:
                session.engine.still_running(started[session.name], step=step)
            except OpspatchError as exc:
                detail = describe_error(exc)
                session.record(step, StepStatus.FAILED, detail=detail)
                raise NodeFailed(
                    session.name,
                    f"{step}: its engine exited while the head was awaited: {detail}",
                ) from exc

    head = nodes.head
    with failing_as(nodes, head):
        ready_step(
            head,
            started[head.name],
            step=step,
            timeout=timeout,
            group=nodes.group,
            slice_seconds=None if nodes.alone else UNIT_LOOK_SECONDS,
            between=None if nodes.alone else look,
        )
    look()  # a last look: the group joined, and no node left it since


def prove(
    nodes: Nodes,
    *,
    baseline: Sequence[str | None] | None = None,
    judge: GroupJudge | None = None,
) -> SmokeResult:
    """Restart, ready, `proven`: every command that restarts into a change proves it here."""
    started = restart(nodes)
    ready(nodes, started)
    return proven(nodes, started[nodes.head.name], baseline=baseline, judge=judge)


def proven(
    nodes: Nodes,
    restarted: RestartReply | None,
    *,
    baseline: Sequence[str | None] | None = None,
    judge: GroupJudge | None = None,
) -> SmokeResult:
    """The smoke through the head, recorded on every node; with `judge`, the head is admitted only
    after its verdict."""
    head = nodes.head
    with failing_as(nodes, head):
        smoke = smoke_step(head, restarted, baseline=baseline, last=judge is None)
    proven_through_head(nodes, smoke)
    if judge is not None:
        judge(nodes)
        admit_step(head)
    return smoke


def proven_through_head(nodes: Nodes, smoke: SmokeResult, step: Step = Step.SMOKE) -> None:
    through_head(nodes, step, "proven by the head's decode", smoke.summary())


def through_head(nodes: Nodes, step: Step, how: str, said: str, *, failed: bool = False) -> None:
    """Each other node records `step` as the head's (recorded failed where it failed: in the
    node's steps, its progress and the ledger)."""
    for session in nodes.others:
        detail = f"{how} ({nodes.head.name}, {nodes.where(session)}): {said}"
        with suppress(HostFailed), session.step(step) as note:
            if failed:
                raise HostFailed(Outcome.FAILED, detail)
            note["detail"] = detail


def restart_after_restore(
    nodes: Nodes, steps: RestoreSteps = AFTER_RESTORE
) -> dict[str, RestartReply]:
    """The restore's own deadline (`timeouts.restore_ready`): a short `ready` set to catch a
    start-up hang must not turn every slow but healthy restore into needs-attention."""
    started = restart(nodes, steps.restart)
    ready(nodes, started, step=steps.ready, timeout=nodes.head.playbook.timeouts.restore_ready)
    return started


def undo(
    nodes: Nodes,
    why: str | None,
    *,
    restore: NodeRestore,
    changes: Mapping[str, FileChange | None],
    restart: bool = True,
    outcome: Outcome = Outcome.ROLLED_BACK,
    steps: RestoreSteps = AFTER_RESTORE,
    way_back: str | None = None,
    restore_failed: Callable[[str], str] | None = None,
    restart_failed: Callable[[str], str] | None = None,
    reason: Reason | None = None,
) -> list[HostOutcome]:
    """Every node's files put back, the group restarted and smoke-tested. `outcome`: `rolled-back`
    (`why` its error) or `restored` (`why` its note). A failed restore or restart:
    `needs-attention`."""
    restored: dict[str, FileChange | None] = {}
    broken: dict[str, OpspatchError | HostFailed] = {}

    def attention(error: str, why_not: Reason = Reason.UNDO_FAILED) -> list[HostOutcome]:
        files = {**changes, **restored}
        return [
            s.outcome(Outcome.NEEDS_ATTENTION, error, file=files[s.name], reason=why_not)
            for s in nodes.sessions
        ]

    for session in nodes.sessions:
        try:
            restored[session.name] = restore(session)
        except (OpspatchError, HostFailed) as exc:
            broken[session.name] = exc
    lost = [name for name, exc in broken.items() if lock_lost(exc)]
    if lost:  # not an undo that failed: one this run may no longer try
        return attention(
            f"{f'{why}; ' if why else ''}the undo was refused as well: this run no longer holds "
            f"the lock of {', '.join(lost)} (the run that took it over finishes or undoes the "
            f"change); {nodes.label} was not restarted",
            Reason.LOCK_LOST,
        )
    if broken:
        said = "; ".join(f"{name}: {describe_error(e)}" for name, e in broken.items())
        error = (restore_failed or _then(why, "the restore"))(said)
        return attention(f"{error}; {nodes.label} was not restarted")
    undone = outcome == Outcome.ROLLED_BACK
    head = nodes.head
    smoke: SmokeResult | None = None
    not_serving: str | None = None
    if restart:
        try:
            started = restart_after_restore(nodes, steps)
        except (OpspatchError, HostFailed) as exc:
            restarting = _then(why, f"the restart of {nodes.label} after the restore")
            said = (restart_failed or restarting)(describe_error(exc))
            return attention(said, Reason.LOCK_LOST if lock_lost(exc) else Reason.UNDO_FAILED)
        smoke, not_serving = smoke_after_restore(head, started[head.name], step=steps.smoke)
        if smoke is not None and smoke.ok:
            proven_through_head(nodes, smoke, steps.smoke)

    def one(session: HostSession) -> HostOutcome:
        shown = smoke if session is head else None
        file = restored[session.name]
        if undone:
            return session.outcome(
                outcome, why, file=file, smoke=shown, note=not_serving, reason=reason
            )
        if not_serving is not None:
            error = f"{not_serving}; {way_back}" if way_back else not_serving
            return session.outcome(
                Outcome.RESTORED_NOT_SERVING,
                error,
                file=file,
                smoke=shown,
                note=why,
                reason=Reason.NOT_SERVING,
            )
        return session.outcome(outcome, file=file, smoke=shown, note=why)

    return [one(session) for session in nodes.sessions]


def lock_lost(exc: BaseException | None) -> bool:
    """Another run took the host's lock over (here or as the cause): this run may do nothing more
    there."""
    while exc is not None:
        if isinstance(exc, OpspatchError) and refusal_reason(exc) == Reason.LOCK_LOST:
            return True
        exc = exc.__cause__
    return False


def _then(why: str | None, what: str) -> Callable[[str], str]:
    return lambda text: f"{why}; then {what} failed: {text}"


def prove_or_undo(
    nodes: Nodes,
    *,
    changes: Mapping[str, FileChange],
    restore: NodeRestore,
    note: str,
    judge: GroupJudge | None = None,
    restart: bool = True,
    revert: Callable[[], bool] | None = None,
) -> list[HostOutcome]:
    """How `restart` and `recover` finish a change a run wrote but never proved. `restart=False`:
    one the running server already holds (a live fix), smoke-tested as it runs; `revert` takes it
    out before the files go back, and the undo restarts only where it could not (False)."""
    try:
        smoke = prove(nodes, judge=judge) if restart else proven(nodes, None, judge=judge)
    except HostFailed as failure:
        reverted = revert() if revert is not None else True
        return undo(
            nodes,
            failure.error,
            restore=restore,
            changes=changes,
            restart=restart or not reverted,
            reason=failure.reason,
        )
    return applied(nodes, smoke, changes, note)


def applied(
    nodes: Nodes,
    smoke: SmokeResult,
    files: Mapping[str, FileChange | None],
    note: str | Callable[[HostSession], str | None] | None,
    *,
    diffs: Mapping[str, str | None] | None = None,
) -> list[HostOutcome]:
    """`applied` on every node, the smoke on the head's outcome alone (the others recorded it as
    the head's); `note`: one for all, or each node's."""
    return [
        s.outcome(
            Outcome.APPLIED,
            file=files[s.name],
            diff=None if diffs is None else diffs[s.name],
            smoke=smoke if s is nodes.head else None,
            note=note(s) if callable(note) else note,
        )
        for s in nodes.sessions
    ]


def serves(nodes: Nodes) -> bool:
    """The head ready within `ready` (a server still starting is awaited, not restarted); a head a
    crashed run left drained is re-admitted."""
    try:
        ready_step(nodes.head, None, step=Step.READY, group=nodes.group)
    except HostFailed:
        return False
    readmit(nodes.head, None)
    return True


def refuse(
    nodes: Nodes,
    odd: Mapping[str, HostOutcome],
    why: str,
    *,
    files: Mapping[str, FileChange | None] | None = None,
) -> list[HostOutcome]:
    """The nodes of `odd` keep the group untouched (a node restarted alone cannot rejoin, one
    changed alone runs other code): the others `skipped`, naming them."""
    said = "; ".join(f"{name}: {o.error or o.note or o.outcome}" for name, o in odd.items())
    text = (
        f"refused: unit {nodes.name}'s node {', '.join(odd)} {why} ({said}); nothing was "
        "changed or restarted on any node of the unit"
    )
    found = files or {}
    reason = next((o.reason for o in odd.values() if o.reason is not None), None)
    return [
        odd.get(s.name) or s.outcome(Outcome.SKIPPED, text, file=found.get(s.name), reason=reason)
        for s in nodes.sessions
    ]
