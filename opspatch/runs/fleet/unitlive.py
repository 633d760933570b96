"""`apply --live` over a unit (one SGLang server over several hosts): every node swapped as
`UnitApply` does, then the fix taken once, through the head's entry rank, read back from every
node and proven by the head's decode, with no restart (docs/live.md, "Units").

SGLang's TP group spans the nodes: the entry rank (TP0, on the head) broadcasts what it
received to every TP rank of every node at a scheduling boundary, so one take there reaches each
node's scheduler ranks, each taking its own node's copy of the file (`LiveFix.paths`); the other
nodes' main processes apply it themselves, as a host's do.

```
after every node's swap (UnitApply):
live           the head: take (every TP rank of every node at one boundary, the head's main and
               detokenizer); then each other node: take (its own main process; its ranks took
               it through the head)
live-readback  every node: `list`, each of its processes holds the fix as it took it (its value
               or code hash, the file's sha256); every rank that took it is listed by a node
smoke          the head's decode, recorded on every node as the decode that proved it
on a refusal or a failure: live-revert through the head and on each other node, live-readback
  on every node (no process holds it), the files put back on every node: every node
  `rolled-back`; a revert or readback that did not answer everywhere: the unit restarted as one
  (`undo_unit`), which clears every process's memory
```
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from opspatch.core.live import LiveForm
from opspatch.core.vocabulary import Outcome, Step
from opspatch.errors import OpspatchError
from opspatch.hosts.live import LiveFix, ask_engine
from opspatch.runs.fleet.judging import HostJudge, judge_through_head
from opspatch.runs.fleet.liveapply import LiveApply, fix_id, revert_everywhere
from opspatch.runs.fleet.pipeline import Prepared, PreparedFile
from opspatch.runs.fleet.rotation import admit_step
from opspatch.runs.fleet.session import HostFailed, HostSession, describe_error
from opspatch.runs.fleet.steps import smoke_step
from opspatch.runs.fleet.unitrun import UnitSessions, proven_through_head
from opspatch.runs.judgments.live import judge_gone, judge_held, judge_take
from opspatch.runs.report import HostOutcome

if TYPE_CHECKING:
    from opspatch.runs.fleet.unitapply import UnitApply

Took = Mapping[str, Sequence[Mapping[str, Any]]]
"""What each process reported taking, by process name (`scheduler-tp2`, `main`)."""


class UnitLive:
    """The live half of a unit's apply: take through the head, read back everywhere, revert."""

    def __init__(self, live: LiveApply) -> None:
        self.live = live

    def take(
        self, nodes: UnitSessions, units: UnitApply, judge: HostJudge | None = None
    ) -> list[HostOutcome]:
        """Take the swapped files live on the unit and prove it: every node's outcome (the live
        forms are the head's, found in preflight: the nodes are alike). With `judge` (the
        playbook's judge of this unit) the judge follows the smoke, as after a restart."""
        head = _prepared(units, nodes.head)
        forms = self.live.forms(nodes.head)
        taken: list[str] = []
        for item, form in zip(head.pending, forms, strict=True):
            fix = self._fix(nodes, units, item, form)
            try:
                self._take(nodes, fix, [d.name for d in form.definitions])
            except (HostFailed, OpspatchError) as failure:
                why = failure.error if isinstance(failure, HostFailed) else describe_error(failure)
                return self.undo(nodes, units, [*taken, fix.fix_id], why)
            taken.append(fix.fix_id)
        try:
            smoke = smoke_step(nodes.head, None, baseline=None, last=judge is None)
            proven_through_head(nodes, smoke)
            if judge is not None:  # a fail is a failed proof: reverted like a failed smoke
                judge_through_head(nodes, judge)
                admit_step(nodes.head)
        except HostFailed as failure:
            return self.undo(nodes, units, taken, failure.error)
        return [
            units.pipeline.outcome(
                session,
                _prepared(units, session),
                Outcome.APPLIED,
                None,
                smoke=smoke if session is nodes.head else None,
                note=_taken_note(nodes, session),
            )
            for session in nodes.sessions
        ]

    def _fix(
        self, nodes: UnitSessions, units: UnitApply, item: PreparedFile, form: LiveForm
    ) -> LiveFix:
        """The head's take, naming the file on every other node too (each node's ranks take
        their own copy, swapped to the same sha256)."""
        head = _prepared(units, nodes.head)
        others = (_prepared(units, s).files[item.index].path for s in nodes.others)
        return LiveFix(
            "take",
            fix_id=fix_id(self.live.patch_id, item.part, in_set=head.is_set),
            module=item.part.target.module,
            path=item.path,
            sha256=form.sha256,
            definitions=form.definitions,
            paths=tuple(dict.fromkeys(p for p in others if p != item.path)),
        )

    def _ask(self, session: HostSession, fix: LiveFix, step: Step) -> Any:
        return ask_engine(session.ops, fix, timeout=self.live.timeout, step=step)

    def _take(self, nodes: UnitSessions, fix: LiveFix, names: Sequence[str]) -> None:
        """Take `fix` through the head, then on every other node's own processes, then read it
        back from every node.

        Raises:
            HostFailed: a process refused or did not answer, or does not hold it as it took it.
        """
        head = nodes.head
        with head.step(Step.LIVE) as note:
            verdict = judge_take(self._ask(head, fix, Step.LIVE), names)
            note["detail"] = f"{fix.fix_id}: through the entry rank: {verdict.describe()}"
            if verdict.failure is not None:
                raise HostFailed(Outcome.FAILED, f"live: {head.name}: {verdict.failure}")
        ranks = {p.process: p.took for p in verdict.took if p.process.startswith("scheduler-")}
        took: dict[str, Took] = {head.name: {p.process: p.took for p in verdict.took}}
        not_loaded = {p.process for p in verdict.not_loaded}
        for session in nodes.others:
            with session.step(Step.LIVE) as note:
                own = judge_take(self._ask(session, fix, Step.LIVE), names, required=False)
                note["detail"] = (
                    f"{fix.fix_id}: its ranks took it through the head's entry rank "
                    f"({head.name}); {own.describe()}"
                )
                if own.failure is not None:
                    raise HostFailed(Outcome.FAILED, f"live: {session.name}: {own.failure}")
            took[session.name] = {**ranks, **{p.process: p.took for p in own.took}}
            not_loaded |= {p.process for p in own.not_loaded if p.process.startswith("sched")}
        listed: set[str] = set()
        for session in nodes.sessions:
            with session.step(Step.LIVE_READBACK) as note:
                listing = self._ask(session, LiveFix("list"), Step.LIVE_READBACK)
                held = judge_held(
                    listing, fix.fix_id, took=took[session.name], not_loaded=not_loaded
                )
                note["detail"] = f"{fix.fix_id}: {held.describe()}"
                if held.failure is not None:
                    raise HostFailed(
                        Outcome.FAILED, f"live-readback: {session.name}: {held.failure}"
                    )
            listed.update(held.ranks)
        unlisted = sorted(set(ranks) - listed)
        if unlisted:
            raise HostFailed(
                Outcome.FAILED,
                f"live-readback: {', '.join(unlisted)} took the fix, but no node of the unit "
                "lists it",
            )

    def undo(
        self, nodes: UnitSessions, units: UnitApply, fixes: Sequence[str], why: str
    ) -> list[HostOutcome]:
        """Revert `fixes` through the head (every rank of every node) and on each other node's
        own processes, read back on every node that none holds them, then put every node's
        files back: `rolled-back` everywhere. A revert or readback that did not answer
        everywhere: the unit is restarted as one after the restore, clearing every process."""
        reverted = True
        for session in nodes.sessions:  # the head first: its entry rank reverts every rank
            reverted = revert_everywhere(session, fixes, timeout=self.live.timeout) and reverted
        if fixes and reverted:
            for session in nodes.sessions:
                reverted = self._gone(session, fixes) and reverted
        return units.roll_back(nodes, why, restart=not reverted)

    def _gone(self, session: HostSession, fixes: Sequence[str]) -> bool:
        """Whether `session`'s processes hold none of `fixes` (a recorded readback)."""
        try:
            with session.step(Step.LIVE_READBACK) as note:
                listing = self._ask(session, LiveFix("list"), Step.LIVE_READBACK)
                problem = judge_gone(listing, fixes)
                note["detail"] = problem or (
                    f"no process holds {', '.join(fixes)}: "
                    + ", ".join(p.process for p in listing.processes())
                )
                if problem is not None:
                    raise HostFailed(Outcome.FAILED, f"live-readback: {problem}")
        except (HostFailed, OpspatchError):
            return False
        return True


def _prepared(units: UnitApply, session: HostSession) -> Prepared:
    item = units.prepared[session.name]
    assert isinstance(item, Prepared), "a unit's every node is prepared (the preflight)"
    return item


def _taken_note(nodes: UnitSessions, session: HostSession) -> str:
    where = "" if session is nodes.head else f"{nodes.where(session)}: "
    return (
        f"{where}taken live through the head's entry rank ({nodes.head.name}), no restart: "
        "every process of every node holds the fix, read back on each (frames already running "
        "keep the old code); the file carries it for the next restart"
    )
