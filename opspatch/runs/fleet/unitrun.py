"""A unit (one SGLang server over several hosts) restarted and proven as one.

SGLang's multi-node server is one group: a node restarted alone can never rejoin it, and a
non-head node serves only a dummy `/health`. So a unit's engines are restarted together
(docs/inventory.md, "Units"): the head drained (the only router worker), every node stopped
(in parallel; each answers once its process tree is gone), then started head first, readiness
awaited on the head with its group checked (`/server_info`: node rank 0 of `nnodes`, whose port
opens only once every rank joined), and the smoke decode sent to the head, which runs across
every rank. While the head is awaited, the other nodes are looked at every
`UNIT_LOOK_SECONDS`: a node whose engine exited fails the unit at once, naming it (a group that
lost a node never becomes ready; waiting would only wait out the deadline).

Each node's session records its own `stop` and `start`; a node's `smoke` step records the head's
decode that proved it (the ledger's proof of a change is a smoke that passed after the write).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from opspatch.core.host import Unit
from opspatch.core.vocabulary import Outcome, Step, StepStatus
from opspatch.errors import OpspatchError
from opspatch.hosts.engine import RestartResult, ServerGroup, SmokeResult, StopResult
from opspatch.runs.fleet.rotation import admit_step, drain_step
from opspatch.runs.fleet.session import HostFailed, HostSession, describe_error
from opspatch.runs.fleet.steps import (
    AFTER_RESTORE,
    RestoreSteps,
    ready_step,
    smoke_after_restore,
    smoke_step,
)
from opspatch.runs.report import FileChange, HostOutcome

UNIT_LOOK_SECONDS = 10.0
"""How often the other nodes are looked at while the head is awaited: a node that dies during
the restart is seen within this (plus one exec), not at the readiness deadline."""


@dataclass(frozen=True)
class UnitSessions:
    """A unit's sessions in this run, in node-rank order (the head first)."""

    unit: Unit
    sessions: tuple[HostSession, ...]

    @property
    def head(self) -> HostSession:
        return self.sessions[0]

    @property
    def others(self) -> tuple[HostSession, ...]:
        return self.sessions[1:]

    @property
    def group(self) -> ServerGroup:
        return ServerGroup(nnodes=self.unit.nodes)

    def where(self, session: HostSession) -> str:
        """`unit-01 rank 1`: how a node stands in its unit, for its notes."""
        return self.unit.describe(session.name)


class NodeFailed(HostFailed):
    """A step failed on one node of a unit: the unit's proof fails, naming the node."""

    def __init__(self, node: str, error: str) -> None:
        super().__init__(Outcome.FAILED, f"{node}: {error}")
        self.node = node


_STOP_START = {
    Step.RESTART: (Step.STOP, Step.START),
    Step.RESTART_AFTER_RESTORE: (Step.STOP_AFTER_RESTORE, Step.START_AFTER_RESTORE),
}


def restart_unit(nodes: UnitSessions, step: Step = Step.RESTART) -> dict[str, RestartResult]:
    """Stop every node's engine, then start them head first: each node's start, by name.

    Raises:
        NodeFailed: a node's stop or start failed (nodes started before it keep running: the
            caller restores and restarts the unit as one).
    """
    stop, start = _STOP_START[step]
    drain_step(nodes.head)  # only the head is a router worker
    stopped = _on_every_node(nodes, lambda session: _stop(session, stop))
    return {
        session.name: _start(session, start, stopped[session.name]) for session in nodes.sessions
    }


def _stop(session: HostSession, step: Step) -> StopResult:
    try:
        with session.step(step) as note:
            result = session.engine.stop(step=step)
            pids = ", ".join(str(p) for p in result.stopped) or "none running"
            note["detail"] = f"{result.strategy}: stopped {pids}"
        return result
    except OpspatchError as exc:
        raise NodeFailed(session.name, f"{step}: {describe_error(exc)}") from exc


def _start(session: HostSession, step: Step, stopped: StopResult) -> RestartResult:
    try:
        with session.step(step) as note:
            result = session.engine.start(step=step, stopped=stopped)
            note["detail"] = f"{result.strategy}: pid {result.pid}"
        return result
    except OpspatchError as exc:
        raise NodeFailed(session.name, f"{step}: {describe_error(exc)}") from exc


def _on_every_node(
    nodes: UnitSessions, work: Callable[[HostSession], StopResult]
) -> dict[str, StopResult]:
    """`work` on every node at once (a stop waits for its process tree to end: in parallel the
    unit is down for the slowest node's stop, not their sum); the first failure, in rank
    order, is raised once every node answered."""
    with ThreadPoolExecutor(max_workers=len(nodes.sessions), thread_name_prefix="node") as pool:
        futures = {s.name: pool.submit(work, s) for s in nodes.sessions}
        done: dict[str, StopResult] = {}
        failure: BaseException | None = None
        for name, future in futures.items():
            try:
                done[name] = future.result()
            except BaseException as exc:  # noqa: BLE001 - re-raised below, after every node
                failure = failure or exc
    if failure is not None:
        raise failure
    return done


def ready_unit(
    nodes: UnitSessions,
    started: dict[str, RestartResult],
    *,
    step: Step = Step.READY,
    timeout: float | None = None,
) -> None:
    """Wait until the head is ready holding the whole group; between looks at the head (every
    `UNIT_LOOK_SECONDS`), each other node's engine must still run.

    Raises:
        NodeFailed: a node's engine exited, or the head was not ready in time.
    """

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

    try:
        ready_step(
            nodes.head,
            started[nodes.head.name],
            step=step,
            timeout=timeout,
            group=nodes.group,
            slice_seconds=UNIT_LOOK_SECONDS,
            between=look,
        )
    except NodeFailed:
        raise
    except HostFailed as failure:
        raise NodeFailed(nodes.head.name, failure.error) from failure
    look()  # a last look: the group joined, and no node left it since


def prove_unit(
    nodes: UnitSessions,
    *,
    baseline: Sequence[str | None] | None = None,
    judge: Callable[[UnitSessions], object] | None = None,
) -> SmokeResult:
    """PROVE a unit's change: restart it as one, wait for the head with its group, smoke-decode
    through the head as its last step (the head's lock given back and the head admitted when it
    passes); each other node records the decode that proved it. With `judge` (the playbook's
    judge of this unit: `judging.judge_through_head`), the judge follows the smoke and the head
    is admitted only after it, as `steps.prove` does for a host.

    Raises:
        NodeFailed: a step failed on a node, or the judge's verdict is `fail` (the caller undoes
            the change on every node).
    """
    started = restart_unit(nodes)
    ready_unit(nodes, started)
    head = nodes.head
    try:
        smoke = smoke_step(head, started[head.name], baseline=baseline, last=judge is None)
    except HostFailed as failure:
        raise NodeFailed(head.name, failure.error) from failure
    proven_through_head(nodes, smoke)
    if judge is not None:
        judge(nodes)
        admit_step(head)
    return smoke


def proven_through_head(nodes: UnitSessions, smoke: SmokeResult, step: Step = Step.SMOKE) -> None:
    """Record on every other node the head's decode that passed: it ran on their ranks too."""
    for session in nodes.others:
        with session.step(step) as note:
            note["detail"] = (
                f"proven by the head's decode ({nodes.head.name}, {nodes.where(session)}): "
                + smoke.summary()
            )


def restart_unit_after_restore(
    nodes: UnitSessions, steps: RestoreSteps = AFTER_RESTORE
) -> dict[str, RestartResult]:
    """Restart the unit after its files were put back, with the restore path's deadline."""
    step = Step.RESTART_AFTER_RESTORE if steps is AFTER_RESTORE else Step.RESTART
    started = restart_unit(nodes, step)
    ready_unit(nodes, started, step=steps.ready, timeout=nodes.head.playbook.timeouts.restore_ready)
    return started


NodeRestore = Callable[[HostSession], FileChange | None]
"""Put back one node's files; the files as they then are (None: nothing to show on a node that
had nothing to put back); raises when a restore fails."""


def undo_unit(
    nodes: UnitSessions,
    why: str,
    *,
    restore: NodeRestore,
    changes: Mapping[str, FileChange | None],
    outcome: Outcome = Outcome.ROLLED_BACK,
    steps: RestoreSteps = AFTER_RESTORE,
    way_back: str | None = None,
    restart: bool = True,
) -> list[HostOutcome]:
    """UNDO on a unit, as `steps.undo` on a host: every node's files put back (`restore`), the
    unit restarted as one with the restore path's deadline and proven through the head
    (`steps`: the steps' names, a rollback's own or those after a failed proof).

    `outcome` on every node once its files are back: `rolled-back` (a failed proof undone: `why`
    is its error, a smoke that failed after it the note) or `restored` (the restore is the point:
    `why` its note; a smoke that failed makes it `restored-not-serving`, the error saying so and
    `way_back`). A restore that failed on a node leaves the unit's nodes differing: nothing is
    restarted, every node `needs-attention` (`changes`: each node's file as it was before); so
    does a failed restart. `restart=False` (a live fix reverted in every process of the unit):
    the files put back are the undo, `outcome` once they are."""
    restored: dict[str, FileChange | None] = {}
    broken: dict[str, str] = {}
    for session in nodes.sessions:
        try:
            restored[session.name] = restore(session)
        except (OpspatchError, HostFailed) as exc:
            broken[session.name] = describe_error(exc)
    if broken:
        said = "; ".join(f"{name}: {text}" for name, text in broken.items())
        error = f"{why}; then the restore failed ({said}): the unit's nodes may differ, and it was not restarted"
        return [
            s.outcome(Outcome.NEEDS_ATTENTION, error, file=restored.get(s.name, changes[s.name]))
            for s in nodes.sessions
        ]
    if not restart:
        if outcome == Outcome.ROLLED_BACK:
            return [s.outcome(outcome, why, file=restored[s.name]) for s in nodes.sessions]
        return [s.outcome(outcome, file=restored[s.name], note=why) for s in nodes.sessions]
    try:
        started = restart_unit_after_restore(nodes, steps)
    except HostFailed as failure:
        error = f"{why}; then the unit's restart after the restore failed: {failure.error}"
        return [
            s.outcome(Outcome.NEEDS_ATTENTION, error, file=restored[s.name]) for s in nodes.sessions
        ]
    smoke, not_serving = smoke_after_restore(nodes.head, started[nodes.head.name], step=steps.smoke)
    if smoke is not None and smoke.ok:
        proven_through_head(nodes, smoke, steps.smoke)

    def one(session: HostSession) -> HostOutcome:
        shown = smoke if session is nodes.head else None
        if outcome == Outcome.ROLLED_BACK:
            return session.outcome(
                outcome, why, file=restored[session.name], smoke=shown, note=not_serving
            )
        if not_serving is not None:
            return session.outcome(
                Outcome.RESTORED_NOT_SERVING,
                f"{not_serving}; {way_back}" if way_back else not_serving,
                file=restored[session.name],
                smoke=shown,
                note=why,
            )
        return session.outcome(outcome, file=restored[session.name], smoke=shown, note=why)

    return [one(session) for session in nodes.sessions]


def prove_or_undo_unit(
    nodes: UnitSessions,
    *,
    changes: Mapping[str, FileChange],
    restore: NodeRestore,
    note: str,
    judge: Callable[[UnitSessions], object] | None = None,
) -> list[HostOutcome]:
    """PROVE a change already on every node (restart the unit, ready, smoke through the head):
    `applied` everywhere, or UNDO it on every node when the proof fails. `judge`: a further
    proof after the smoke (`prove_unit`)."""
    try:
        smoke = prove_unit(nodes, judge=judge)
    except HostFailed as failure:
        return undo_unit(nodes, failure.error, restore=restore, changes=changes)
    return [
        s.outcome(
            Outcome.APPLIED,
            file=changes[s.name],
            smoke=smoke if s is nodes.head else None,
            note=note,
        )
        for s in nodes.sessions
    ]


def unit_answers(nodes: UnitSessions) -> bool:
    """Whether the unit serves now: its head ready holding the whole group (one short look)."""
    try:
        nodes.head.engine.wait_ready(
            None, timeout=UNIT_LOOK_SECONDS, group=nodes.group, step=Step.READY
        )
    except OpspatchError:
        return False
    return True


def refuse_unit(
    nodes: UnitSessions,
    odd: Mapping[str, HostOutcome],
    why: str,
    *,
    files: Mapping[str, FileChange | None] | None = None,
) -> list[HostOutcome]:
    """Every node's outcome when the nodes of `odd` (each with its own outcome: refused,
    unreadable) keep the unit from being touched: nothing is changed or restarted on any node,
    since a node restarted alone cannot rejoin and a node changed alone runs other code. Each
    other node is `skipped`, naming the odd nodes, `why` and what they said (`files`: each
    node's file as it was found)."""
    said = "; ".join(f"{name}: {o.error or o.note or o.outcome}" for name, o in odd.items())
    text = (
        f"refused: unit {nodes.unit.name}'s node {', '.join(odd)} {why} ({said}); nothing was "
        "changed or restarted on any node of the unit"
    )
    found = files or {}
    return [
        odd.get(s.name) or s.outcome(Outcome.SKIPPED, text, file=found.get(s.name))
        for s in nodes.sessions
    ]
