"""`apply --live`: the strategy `ApplyPipeline.apply` runs in place of PROVE once the files are
swapped (so the next restart keeps the fix): the fix taken into the running engine's processes,
read back from each, then proven by the smoke decode, with no restart and so no drain.

Per host:

```
preflight  each pending file's live form (pure: its pre- and post-image, known once the host is
           planned), else the run is refused (exit 2); then the engine's `check` of each take
           (one exec, every process answers; `judgments/live.judge_check`): not every process
           answers -> refused (exit 2); a take that would not be in effect (the module never
           imported, a definition another fix holds, a value read at import, objects built by
           a changed `__init__`, a changed function in a frame that never returns) -> refused
           (exit 2), the reason word and the processes named
swap       as every apply (backup, swap)
LIVE       the forms found in preflight -> `take` (the module, the post-image's sha256, the
           definitions) to every process; each process's answer judged
           (`judgments/live.judge_take`) and kept in the step's detail
smoke      the decode, as the host's last step (it gives the lock back)
on a refusal or a failure: LIVE_REVERT everywhere, the files restored; the host `rolled-back`
           (a revert that did not answer everywhere: the restore's restart clears memory)
```

A file whose live form is refused (changed free variables, a restart-only module), or whose take
would not be in effect, refuses the whole run before any change: an operator who asked for
--live must not get a restart by surprise, nor an "applied" the server does not run; apply
without --live applies it with a restart.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from opspatch.core.edit import Applied
from opspatch.core.host import Host
from opspatch.core.live import LiveForm, NotLive, live_form
from opspatch.core.remedy import CliCommand, remedy_text
from opspatch.core.spec import PatchSpec
from opspatch.core.vocabulary import Outcome, Step
from opspatch.errors import LiveRefused, NotTakenLive, OpspatchError
from opspatch.hosts.live import LiveFix, ask_engine
from opspatch.runs.fleet.judging import HostJudge
from opspatch.runs.fleet.pipeline import ApplyPipeline, Prepared, PreparedFile, live_new, live_old
from opspatch.runs.fleet.rotation import admit_step
from opspatch.runs.fleet.session import HostFailed, HostSession, describe_error
from opspatch.runs.fleet.steps import smoke_step, undo
from opspatch.runs.judgments.live import judge_check, judge_revert, judge_take
from opspatch.runs.report import FileChange, HostOutcome

LiveFormer = Callable[[PatchSpec, bytes, bytes], LiveForm | NotLive]
"""The live form of one target's change: its part of the patch, the pre-image, the post-image."""


def live_former(part: PatchSpec, pre: bytes, post: bytes) -> LiveForm | NotLive:
    """The live form of one target's change, from its pre- and post-image and the patch's
    `live` (pure: `core/live.py`)."""
    return live_form(part.target.module, pre, post, part.live)


def fix_id(patch_id: str, part: PatchSpec, *, in_set: bool) -> str:
    """The name a live fix is taken under in the engine: the patch's id (a set's file: with its
    module, one fix per file)."""
    return f"{patch_id}:{part.target.module}" if in_set else patch_id


def refuse_unless_live(hosts: Sequence[Host]) -> None:
    """Refuse (exit 2, nothing changed) a live command over hosts whose inventory does not say
    `live = true`.

    Raises:
        LiveRefused: naming the hosts.
    """
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
        self._forms: dict[str, tuple[LiveForm, ...]] = {}
        """Each checked host's live forms, one per pending file (preflight's threads each
        set their own host's)."""

    def check(self, session: HostSession, prepared: Prepared) -> None:
        """Preflight: every pending file's change has a live form (kept for the take), and the
        host's engine answers the `check` of those takes, each in effect in every process
        (`judge_check`: the module imported, no definition held by another fix, nothing read
        at import, no object already built by a changed `__init__`, no changed function in a
        frame that does not return). Nothing is taken.

        Raises:
            NotTakenLive: a file's live form is refused, or a take would not be in effect (its
                module, the reason and why).
            LiveRefused: not every process answers (not running, the plugin not loaded,
                SGLANG_PLUGINS without it, a plugin that predates `check`).
        """
        with session.step(Step.LIVE) as note:
            forms = self._live_forms(session, prepared)
            takes = [
                self._fix(prepared, item, form)
                for item, form in zip(prepared.pending, forms, strict=True)
            ]
            reply = ask_engine(
                session.ops, LiveFix.check(takes), timeout=self.timeout, step=Step.LIVE
            )
            unit = session.host.unit
            verdict = judge_check(reply, takes, required=unit is None or unit.head == session.name)
            if verdict.unanswered is not None:
                raise LiveRefused(
                    f"{session.name}: its engine does not take live fixes: {verdict.unanswered}",
                    hint=f"`{remedy_text(CliCommand.APPLY, self.patch_id, hosts=session.name)}` "
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
            f"`{remedy_text(CliCommand.APPLY, self.patch_id, hosts=session.name)}`",
        )

    def _live_forms(self, session: HostSession, prepared: Prepared) -> tuple[LiveForm, ...]:
        """Each pending file's live form (pure).

        Raises:
            NotTakenLive: the first file whose live form is refused.
        """
        found = []
        for item in prepared.pending:
            plan = _applied(item)
            form = self.former(item.part, plan.old_source, plan.new_source)
            if isinstance(form, NotLive):
                raise self._not_live(session, item.part.target.module, form)
            found.append(form)
        return tuple(found)

    def forms(self, session: HostSession) -> tuple[LiveForm, ...]:
        """The live forms `check` found on this host, one per pending file."""
        return self._forms[session.name]

    def apply(
        self,
        pipeline: ApplyPipeline,
        session: HostSession,
        prepared: Prepared,
        judge: HostJudge | None = None,
    ) -> HostOutcome:
        """Take the swapped files live and prove it: the host's outcome (`applied`, or
        `rolled-back` with every process reverted and the files restored). With `judge` (the
        playbook's judge of this host) the judge follows the smoke, as after a restart."""
        taken: list[str] = []
        for item, form in zip(prepared.pending, self.forms(session), strict=True):
            fix = self._fix(prepared, item, form)
            try:
                with session.step(Step.LIVE) as note:
                    reply = ask_engine(session.ops, fix, timeout=self.timeout, step=Step.LIVE)
                    verdict = judge_take(reply, [d.name for d in form.definitions])
                    note["detail"] = f"{fix.fix_id}: {verdict.describe()}"
                    if verdict.failure is not None:
                        raise HostFailed(Outcome.FAILED, f"live: {verdict.failure}")
            except (HostFailed, OpspatchError) as failure:
                why = failure.error if isinstance(failure, HostFailed) else describe_error(failure)
                return self.undo(pipeline, session, prepared, [*taken, fix.fix_id], why)
            taken.append(fix.fix_id)
        try:
            smoke = smoke_step(session, None, baseline=None, last=judge is None)
            if judge is not None:  # a fail is a failed proof: reverted like a failed smoke
                judge(session)
                admit_step(session)
        except HostFailed as failure:
            return self.undo(pipeline, session, prepared, taken, failure.error)
        return pipeline.outcome(
            session,
            prepared,
            Outcome.APPLIED,
            None,
            smoke=smoke,
            note="taken live, no restart: every process of the engine holds the fix (frames "
            "already running keep the old code); the file carries it for the next restart",
        )

    def _fix(self, prepared: Prepared, item: PreparedFile, form: LiveForm) -> LiveFix:
        return LiveFix(
            "take",
            fix_id=fix_id(self.patch_id, item.part, in_set=prepared.is_set),
            module=item.part.target.module,
            path=item.path,
            sha256=form.sha256,
            definitions=form.definitions,
            objects=form.objects,
        )

    def undo(
        self,
        pipeline: ApplyPipeline,
        session: HostSession,
        prepared: Prepared,
        fixes: Sequence[str],
        why: str,
    ) -> HostOutcome:
        """Revert `fixes` in every process, then restore the files: `rolled-back`. A revert that
        did not finish everywhere (a process gone, a crash) is followed by the restore's restart,
        which clears every process's memory."""
        reverted = revert_everywhere(session, fixes, timeout=self.timeout)

        def restore() -> FileChange:
            pipeline.restore_files(session, prepared.pending)
            return prepared.change(live_old(prepared))

        undone = undo(
            session,
            why,
            restore=restore,
            change=prepared.change(live_new(prepared, prepared.pending)),
            restart=not reverted,
        )
        return replace(undone, diff=prepared.diff())


def revert_everywhere(session: HostSession, fixes: Sequence[str], *, timeout: float) -> bool:
    """Send a revert of each fix to every process (recorded steps): whether every process
    answered that it no longer holds it."""
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
                problem = judge_revert(reply)
                note["detail"] = f"{fix}: " + (
                    problem or "reverted in " + ", ".join(p.process for p in reply.processes())
                )
                if problem is not None:
                    raise HostFailed(Outcome.FAILED, f"live revert: {problem}")
        except (HostFailed, OpspatchError):
            every = False
    return every


def _applied(item: PreparedFile) -> Applied:
    assert isinstance(item.plan, Applied)  # only pending files (their plan changes them)
    return item.plan
