"""An apply over a unit (one SGLang server over several hosts): every node swapped, the unit
restarted and proven as one, and on any failure every node restored and the unit restarted as
one (docs/inventory.md, "Units").

```
baseline (head; the judge's too, when the playbook's `[judge]` judges this unit)
-> per node, head first: backup + swap
  a swap refused or lost on a node: the nodes swapped before it put back (no restart: the
  server never ran them); every node `failed`, naming the node
-> restart the unit (every node stopped, started head first) -> ready (head, group; the other
   nodes watched) -> smoke (head; recorded on every node as the decode that proved it)
   [-> judge (head, against its old server; recorded on every node): a `fail` fails the proof]
on a failure: restore every node -> restart the unit -> ready -> smoke (the truth about what
  runs): every node `rolled-back`, naming the node that failed; `needs-attention` when a
  restore or the unit's restart after it failed
```

A node's outcome carries its own file and steps; the head's carries the smoke decode and the
judge's verdict.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from opspatch.core.vocabulary import Outcome
from opspatch.errors import OpspatchError
from opspatch.runs.fleet.judging import HostJudge, judge_through_head
from opspatch.runs.fleet.pipeline import ApplyPipeline, Prepared, live_new, live_old
from opspatch.runs.fleet.session import HostFailed, HostSession, describe_error
from opspatch.runs.fleet.unitrun import NodeFailed, UnitSessions, prove_unit, undo_unit
from opspatch.runs.report import FileChange, HostOutcome

if TYPE_CHECKING:
    from opspatch.runs.fleet.unitlive import UnitLive


class UnitApply:
    """`ApplyPipeline`'s change, for the nodes of one unit at once."""

    def __init__(
        self,
        pipeline: ApplyPipeline,
        prepared: Mapping[str, Prepared | object],
        *,
        live: UnitLive | None = None,
    ):
        """`live`: the swapped files are taken into the running unit through its head instead
        of a restart (`apply --live`: `unitlive.UnitLive`)."""
        self.pipeline = pipeline
        self.prepared = prepared
        self.live = live

    def _of(self, session: HostSession) -> Prepared:
        item = self.prepared[session.name]
        assert isinstance(item, Prepared), "a unit's every node is prepared (the preflight)"
        return item

    def apply(self, nodes: UnitSessions) -> list[HostOutcome]:
        """Swap on every node, restart and prove the unit as one; on failure restore it as one."""
        pipeline, head = self.pipeline, nodes.head
        changing = [s for s in nodes.sessions if self._of(s).pending]
        if not changing:
            return [
                s.outcome(Outcome.ALREADY_APPLIED, file=self._of(s).change())
                for s in nodes.sessions
            ]
        try:
            baseline, baseline_note = pipeline.baseline(head)
        except HostFailed as refused:
            return self._unchanged(nodes, refused.error)
        judge = pipeline.judges.for_host(head.name) if pipeline.judges else None
        if judge is not None:
            judge.take_baseline(head)
        written: list[HostSession] = []
        for session in changing:
            failed = pipeline.write(session, self._of(session))
            if failed is not None:
                return self._write_failed(nodes, written, failed)
            written.append(session)
        if self.live is not None:
            return _with_judgment(nodes, self.live.take(nodes, self, judge), judge)
        try:
            smoke = prove_unit(nodes, baseline=baseline, judge=_judged_by(judge))
        except NodeFailed as failure:
            undone = self.roll_back(nodes, failure.error, note=baseline_note)
            return _with_judgment(nodes, undone, judge)
        applied = [
            pipeline.outcome(
                session,
                self._of(session),
                Outcome.APPLIED,
                None,
                smoke=smoke if session is head else None,
                note=_join(baseline_note, self._proven_note(nodes, session)),
            )
            for session in nodes.sessions
        ]
        return _with_judgment(nodes, applied, judge)

    @staticmethod
    def _proven_note(nodes: UnitSessions, session: HostSession) -> str | None:
        if session is nodes.head:
            return None
        return f"{nodes.where(session)}: proven by the decode through the head {nodes.head.name}"

    def _unchanged(self, nodes: UnitSessions, why: str) -> list[HostOutcome]:
        """Every node `failed`, nothing changed on any (the head's required baseline failed)."""
        return [
            self.pipeline.outcome(
                session,
                self._of(session),
                Outcome.FAILED,
                why if session is nodes.head else f"not changed: the head {nodes.head.name}: {why}",
                old=self._of(session).pending,
            )
            for session in nodes.sessions
        ]

    def _write_failed(
        self, nodes: UnitSessions, written: Sequence[HostSession], failed: HostOutcome
    ) -> list[HostOutcome]:
        """A node's swap failed (its outcome `failed` says how it stands): the nodes swapped
        before it are put back, files only (the server never ran them)."""
        why = f"{failed.host}: {failed.error}"
        outcomes: list[HostOutcome] = []
        for session in nodes.sessions:
            prepared = self._of(session)
            if session.name == failed.host:
                outcomes.append(failed)
            elif session in written:
                try:
                    self.pipeline.restore_files(session, prepared.pending)
                except (OpspatchError, HostFailed) as exc:
                    outcomes.append(
                        self.pipeline.outcome(
                            session,
                            prepared,
                            Outcome.NEEDS_ATTENTION,
                            f"{why}; then putting this node's files back failed: "
                            f"{describe_error(exc)}",
                        )
                    )
                    continue
                outcomes.append(
                    self.pipeline.outcome(
                        session,
                        prepared,
                        Outcome.FAILED,
                        why,
                        old=prepared.pending,
                        note="put back to the pre-image: the unit's server never ran it",
                    )
                )
            else:
                outcomes.append(
                    self.pipeline.outcome(
                        session,
                        prepared,
                        Outcome.FAILED,
                        f"not changed: {why}",
                        old=prepared.pending,
                    )
                )
        return outcomes

    def roll_back(
        self, nodes: UnitSessions, why: str, *, note: str | None = None, restart: bool = True
    ) -> list[HostOutcome]:
        """UNDO on a unit (`unitrun.undo_unit`): every node's files put back, the unit
        restarted as one and proven through the head; `rolled-back` on every node.
        `restart=False`: a live fix reverted in every process, the files are the undo."""

        def restore(session: HostSession) -> FileChange:
            prepared = self._of(session)
            self.pipeline.restore_files(session, prepared.pending)
            return prepared.change(live_old(prepared))

        changes = {
            s.name: self._of(s).change(live_new(self._of(s), self._of(s).pending))
            for s in nodes.sessions
        }
        undone = undo_unit(nodes, why, restore=restore, changes=changes, restart=restart)
        return [
            replace(o, diff=self._of(s).diff(), note=_join(o.note, note))
            for s, o in zip(nodes.sessions, undone, strict=True)
        ]


def _join(*notes: str | None) -> str | None:
    return "; ".join(n for n in notes if n) or None


def _judged_by(judge: HostJudge | None) -> Callable[[UnitSessions], object] | None:
    """The unit's judge as `prove_unit` calls it, after the smoke (None: not judged)."""
    if judge is None:
        return None
    return lambda nodes: judge_through_head(nodes, judge)


def _with_judgment(
    nodes: UnitSessions, outcomes: list[HostOutcome], judge: HostJudge | None
) -> list[HostOutcome]:
    """The head's outcome carries the judge's verdict (its JSON `judgment`), once given."""
    if judge is None or judge.judgment is None:
        return outcomes
    return [
        replace(o, judgment=judge.judgment) if o.host == nodes.head.name else o for o in outcomes
    ]
