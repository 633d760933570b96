"""`apply --live`: the swapped fix taken into the running processes and proven, no restart."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from opspatch.core.host import Host
from opspatch.core.live import LiveForm, NotLive, live_form
from opspatch.core.reasons import Reason
from opspatch.core.remedy import remedy_text
from opspatch.core.spec import PatchSpec
from opspatch.core.vocabulary import Command, Outcome, Step
from opspatch.errors import LiveRefused, NotTakenLive, OpspatchError, PeerNotAllowed
from opspatch.hosts.live import LiveFix, ask_engine
from opspatch.runs.fleet.group import Nodes, proven
from opspatch.runs.fleet.judging import HostJudge
from opspatch.runs.fleet.pipeline import ApplyPipeline, Prepared, PreparedFile
from opspatch.runs.fleet.session import HostFailed, HostSession, describe_error
from opspatch.runs.judgments.live import judge_check, judge_gone, judge_held, judge_take, unanswered
from opspatch.runs.judgments.units import target_of
from opspatch.runs.report import HostOutcome

Took = Mapping[str, Sequence[Mapping[str, Any]]]

LiveFormer = Callable[[PatchSpec, bytes, bytes], LiveForm | NotLive]


def live_former(part: PatchSpec, pre: bytes, post: bytes) -> LiveForm | NotLive:
    return live_form(part.target.module, pre, post, part.live)


def refuse_unless_live(hosts: Sequence[Host]) -> None:
    off = [host.name for host in hosts if not host.live]
    if off:
        raise LiveRefused(
            f"live fixes are off on {', '.join(off)}: the inventory does not say live = true",
            hint="set live = true for these hosts (defaults, a group or the host) once "
            "`opspatch live enable` has installed the plugin and the engine was restarted",
        )


class LiveApply:
    """The live half of an apply: check in preflight, take after the swap, revert on failure."""

    def __init__(self, patch_id: str, former: LiveFormer, *, timeout: float) -> None:
        self.patch_id = patch_id
        self.former = former
        self.timeout = timeout
        self._forms: dict[str, tuple[LiveForm, ...]] = {}  # by host, one per pending file

    def check(self, session: HostSession, prepared: Prepared) -> None:
        """Preflight: `NotTakenLive` unless every process says its take would be in effect,
        `LiveRefused` when not every process answers."""
        with session.step(Step.LIVE) as note:
            forms = self._live_forms(session, prepared)
            takes = [
                self._fix(prepared.is_set, item, form)
                for item, form in zip(prepared.pending, forms, strict=True)
            ]
            reply = ask_engine(
                session.ops, LiveFix.check(takes), timeout=self.timeout, step=Step.LIVE
            )
            unit = session.host.unit
            verdict = judge_check(reply, takes, required=unit is None or unit.head == session.name)
            if verdict.unanswered is not None and reply.peer_refused:
                raise PeerNotAllowed(
                    f"{session.name}: its engine listens for live fixes but refuses the agent's "
                    f"user: {verdict.unanswered}",
                    hint="run the agent as root or as the engine's user (the inventory's "
                    "`become`, `become_user`)",
                )
            if verdict.unanswered is not None:
                raise LiveRefused(
                    f"{session.name}: its engine does not take live fixes: {verdict.unanswered}",
                    hint=f"`{remedy_text(Command.APPLY, self.patch_id, hosts=target_of(session.host))}` "
                    "without --live restarts it instead",
                )
            if verdict.refusal is not None:
                modules = ", ".join(dict.fromkeys(take.module for take in takes))
                raise self._not_live(session, modules, verdict.refusal)
            self._forms[session.name] = forms
            said = ", ".join(d.name for form in forms for d in form.definitions)
            note["detail"] = f"takes {said}; checked in effect in every process: " + ", ".join(
                p.process for p in verdict.answered
            )

    def _not_live(self, session: HostSession, module: str, refusal: NotLive) -> NotTakenLive:
        return NotTakenLive(
            f"{session.name}: {module} cannot be taken live: {refusal.reason}: {refusal.text}",
            hint="apply without --live to apply it with a restart: "
            f"`{remedy_text(Command.APPLY, self.patch_id, hosts=target_of(session.host))}`",
        )

    def _live_forms(self, session: HostSession, prepared: Prepared) -> tuple[LiveForm, ...]:
        found = []
        for item in prepared.pending:
            plan = item.applied
            form = self.former(item.part, plan.old_source, plan.new_source)
            if isinstance(form, NotLive):
                raise self._not_live(session, item.part.target.module, form)
            found.append(form)
        return tuple(found)

    def take(
        self,
        pipeline: ApplyPipeline,
        nodes: Nodes,
        prepared: Mapping[str, Prepared],
        judge: HostJudge | None = None,
    ) -> list[HostOutcome]:
        """The head's forms (a group's nodes are alike); a failure reverts every process and
        restores."""
        head = prepared[nodes.head.name]
        taken: list[str] = []
        for item, form in zip(head.pending, self._forms[nodes.head.name], strict=True):
            others = (prepared[s.name].files[item.index].path for s in nodes.others)
            fix = self._fix(head.is_set, item, form, paths=others)
            try:
                self._take(nodes, fix, [d.name for d in form.definitions])
            except (HostFailed, OpspatchError) as failure:
                if isinstance(failure, HostFailed):
                    why, reason = failure.error, failure.reason
                else:
                    why, reason = describe_error(failure), Reason.STEP_FAILED
                fixes = [*taken, fix.fix_id]
                return self.undo(pipeline, nodes, prepared, fixes, why, reason)
            taken.append(fix.fix_id)
        try:  # a judge's fail is a failed proof: reverted like a failed smoke
            smoke = proven(nodes, None, judge=None if judge is None else judge.through_head)
        except HostFailed as failure:
            return self.undo(pipeline, nodes, prepared, taken, failure.error, failure.reason)
        return pipeline.applied(nodes, prepared, smoke, lambda s: _taken_note(nodes, s))

    def _fix(
        self, in_set: bool, item: PreparedFile, form: LiveForm, *, paths: Iterable[str] = ()
    ) -> LiveFix:
        module = item.part.target.module
        return LiveFix(
            "take",
            fix_id=f"{self.patch_id}:{module}" if in_set else self.patch_id,  # one per file
            module=module,
            path=item.path,
            sha256=form.sha256,
            definitions=form.definitions,
            objects=form.objects,
            paths=tuple(dict.fromkeys(p for p in paths if p != item.path)),
        )

    def _ask(self, session: HostSession, fix: LiveFix, step: Step) -> Any:
        return ask_engine(session.ops, fix, timeout=self.timeout, step=step)

    def _take(self, nodes: Nodes, fix: LiveFix, names: Sequence[str]) -> None:
        """Through the head (its broadcast reaches every rank), then each other node's own
        processes, read back from every node."""
        head = nodes.head
        through, who = ("", "") if nodes.alone else ("through the entry rank: ", f"{head.name}: ")
        with head.step(Step.LIVE) as note:
            verdict = judge_take(self._ask(head, fix, Step.LIVE), names)
            note["detail"] = f"{fix.fix_id}: {through}{verdict.describe()}"
            if verdict.failure is not None:
                raise HostFailed(Outcome.FAILED, f"live: {who}{verdict.failure}")
        if nodes.alone:
            return
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
        self,
        pipeline: ApplyPipeline,
        nodes: Nodes,
        prepared: Mapping[str, Prepared],
        fixes: Sequence[str],
        why: str,
        reason: Reason,
    ) -> list[HostOutcome]:
        """A revert not answered everywhere, or not read back, is followed by a restart, which
        clears every memory."""
        reverted = revert_on(nodes, fixes, timeout=self.timeout)
        return pipeline.roll_back(nodes, prepared, why, restart=not reverted, reason=reason)


def _taken_note(nodes: Nodes, session: HostSession) -> str:
    where = "" if session is nodes.head else f"{nodes.where(session)}: "
    return (
        f"{where}taken live through the head's entry rank ({nodes.head.name}), no restart: "
        "every process of every node holds the fix (frames already running keep the old code); "
        "the file carries it for the next restart"
    )


def revert_on(nodes: Nodes, fixes: Sequence[str], *, timeout: float) -> bool:
    """`fixes` reverted on every node, the head first (its entry rank reverts every rank), then on
    a unit read back from every node; False where some process did not answer its revert or a node
    still lists one of them: what the caller restarts (`apply --live`'s undo, `recover`)."""
    reverted = True
    for session in nodes.sessions:
        reverted = revert_everywhere(session, fixes, timeout=timeout) and reverted
    if fixes and reverted and not nodes.alone:  # the head's entry rank answered for every rank
        for session in nodes.sessions:
            reverted = _gone(session, fixes, timeout=timeout) and reverted
    return reverted


def _gone(session: HostSession, fixes: Sequence[str], *, timeout: float) -> bool:
    """The node's `list` read back: no process holds any of `fixes`."""
    try:
        with session.step(Step.LIVE_READBACK) as note:
            listing = ask_engine(
                session.ops, LiveFix("list"), timeout=timeout, step=Step.LIVE_READBACK
            )
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


def revert_everywhere(session: HostSession, fixes: Sequence[str], *, timeout: float) -> bool:
    every = True
    for fix in reversed(fixes):
        try:
            with session.step(Step.LIVE_REVERT) as note:
                reply = ask_engine(
                    session.ops,
                    LiveFix("revert", fix_id=fix),
                    timeout=timeout,
                    step=Step.LIVE_REVERT,
                )
                problem = unanswered(reply)  # a revert is done where each process answered ok
                note["detail"] = f"{fix}: " + (
                    problem or "reverted in " + ", ".join(p.process for p in reply.processes())
                )
                if problem is not None:
                    raise HostFailed(Outcome.FAILED, f"live revert: {problem}")
        except (HostFailed, OpspatchError):
            every = False
    return every
