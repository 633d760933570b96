"""The one template of every apply: preflight (begin + plan) per host, the change per node group."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from opspatch.core.edit import AlreadyApplied, Applied, NotApplicable, apply_patch, plan_summary
from opspatch.core.gate import version_gate
from opspatch.core.policy import Playbook
from opspatch.core.reasons import Reason
from opspatch.core.remedy import remedy_text
from opspatch.core.source import sha256_hex
from opspatch.core.spec import LoadedPatch, PatchSpec, Target
from opspatch.core.vocabulary import Command, Outcome, Step
from opspatch.errors import OpspatchError, PreimageMismatch
from opspatch.hosts.operations import HostInspection
from opspatch.ledger.records import ContainerRecord, NewFileVersion
from opspatch.runs.fleet.group import Nodes, applied, prove, undo
from opspatch.runs.fleet.session import HostFailed, HostSession, describe_error, refusal_reason
from opspatch.runs.fleet.steps import effect_unknown, file_version, restore_pre_image
from opspatch.runs.report import FileChange, HostOutcome, SetFile, join_notes

if TYPE_CHECKING:  # a judge is built by a judged run only (`apply._judge_plan`)
    from opspatch.hosts.engine import SmokeResult
    from opspatch.runs.fleet.judging import HostJudge, JudgePlan
    from opspatch.runs.fleet.liveapply import LiveApply

PlanOutcome = Applied | AlreadyApplied | NotApplicable


@dataclass(frozen=True)
class PreparedFile:
    """One target of the patch on a host: the file as read, its plan, the version gate's word."""

    index: int
    """`targets[index]` (0 for a `[target]` patch)."""
    part: PatchSpec
    inspection: HostInspection
    plan: PlanOutcome
    version_problem: str | None

    @property
    def path(self) -> str:
        return self.inspection.file.realpath

    @property
    def fits(self) -> bool:
        return self.version_problem is None and not isinstance(self.plan, NotApplicable)

    @property
    def applied(self) -> Applied:
        assert isinstance(self.plan, Applied)
        return self.plan

    def version(self, container: ContainerRecord | None) -> NewFileVersion:
        """The ledger's record of the planned change, its pre- and post-image with it."""
        plan = self.applied
        return file_version(
            self.inspection.file,
            plan.sha256_before,
            plan.sha256_after,
            pre_image=plan.old_source,
            post_image=plan.new_source,
            container=container,
        )

    @property
    def images(self) -> tuple[str, str]:
        """The pre- and post-image sha256 (an unchanged file: both its own)."""
        if isinstance(self.plan, Applied):
            return self.plan.sha256_before, self.plan.sha256_after
        return self.inspection.file.sha256, self.inspection.file.sha256


@dataclass(frozen=True)
class Prepared:
    """A host after `begin` and `plan`: its lock held, every target planned."""

    files: tuple[PreparedFile, ...]

    @property
    def inspection(self) -> HostInspection:
        return self.files[0].inspection

    @property
    def misfit(self) -> PreparedFile | None:
        return next((f for f in self.files if not f.fits), None)

    @property
    def pending(self) -> tuple[PreparedFile, ...]:
        """The files the plan changes, in swap order."""
        return tuple(f for f in self.files if isinstance(f.plan, Applied))

    @property
    def is_set(self) -> bool:
        return len(self.files) > 1

    def diff(self) -> str | None:
        diffs = [f.plan.diff for f in self.files if isinstance(f.plan, Applied)]
        return "".join(diffs) or None

    def change(self, live: dict[str, str] | None = None) -> FileChange:
        """`live`: the sha256 a file holds when not what its plan wrote."""
        live = live or {}
        first = (self.pending or self.files)[0]
        members = tuple(
            SetFile(f.path, *f.images, live.get(f.path, f.images[1])) for f in self.files
        )
        return FileChange(
            first.path,
            first.images[0],
            live.get(first.path, first.images[1]),
            set_files=members if self.is_set else (),
        )


def gate_inspection(target: Target, inspection: HostInspection) -> str | None:
    """The version gate, and the module's import origin (a symlink's target can live anywhere, its
    origin cannot)."""
    module = inspection.module
    sglang = target.distribution.lower().replace("_", "-") == "sglang"
    installed = inspection.facts.sglang_version if sglang else None
    problem = version_gate(
        target,
        inspection.file.realpath,
        owner=module["distribution"] if module else None,
        owner_version=module["distribution_version"] if module else None,
        installed_version=installed,
    )
    if problem is None and module is not None:
        problem = target.mismatch(module["origin"], None)
    return problem


class ApplyPipeline:
    """Apply one patch (a set: all its files together) to a node group."""

    def __init__(
        self,
        patch: LoadedPatch,
        playbook: Playbook,
        *,
        restart_engine: bool = True,
        unrestarted: Outcome = Outcome.STAGED,
        live: LiveApply | None = None,
    ) -> None:
        """`restart_engine=False` swaps only (the outcome `unrestarted`); `live`: taken into the
        running engine instead of a restart."""
        self.patch = patch
        self.playbook = playbook
        self.restart_engine = restart_engine
        self.unrestarted = unrestarted
        self.judges: JudgePlan | None = None
        """Set by the rollout once it knows the canaries."""
        self.live = live
        # A plan depends on the patch and the file's bytes alone (the version gate, per host, is
        # not part of it): hosts with one pre-image share one plan and its validation.
        self._plans: dict[tuple[str, int, str], PlanOutcome] = {}
        self._plans_lock = threading.Lock()

    def plan(self, content: bytes, index: int = 0) -> PlanOutcome:
        key = (self.patch.sha256, index, sha256_hex(content))
        with self._plans_lock:
            plan = self._plans.get(key)
            if plan is None:
                plan = self._plans[key] = apply_patch(content, self.patch.parts[index])
        return plan

    def reuse(self, plan: Applied, index: int = 0) -> None:
        """A plan made before this pipeline (`apply --file` asks first)."""
        with self._plans_lock:
            self._plans.setdefault((self.patch.sha256, index, plan.sha256_before), plan)

    # -- preflight: begin + plan ---------------------------------------------------------

    def prepare(
        self,
        session: HostSession,
        *,
        lock: bool,
        paths: Sequence[str] | None = None,
        installed_version: str | None = None,
    ) -> Prepared:
        """Lock (unless a dry run) and inspect, then plan every target on the file the engine
        imports, or on `paths` (local files, of `installed_version`)."""
        parts = self.patch.parts
        if paths is not None and len(paths) != len(parts):
            raise ValueError("prepare takes one path per target")
        timeout = self.playbook.timeouts.lock + self.playbook.timeouts.inspect
        inspections: list[HostInspection] = []
        with session.step(Step.BEGIN if lock else Step.INSPECT) as note:
            for index, part in enumerate(parts):
                module = None if paths is not None else part.target.module
                path = None if paths is None else paths[index]
                if lock and index == 0:
                    _, inspection = session.ops.begin(
                        module, path=path, run_id=session.lock.taking(), timeout=timeout
                    )
                else:  # the lock, taken with the first file, covers the set's other files
                    inspection = session.ops.inspect(module, path=path, timeout=timeout)
                inspections.append(inspection)
            facts = inspections[0].facts
            note["detail"] = (
                "; ".join(f"{i.file.realpath} sha256 {i.file.sha256[:12]}" for i in inspections)
                + f"; python {facts.python_version}, "
                f"{parts[0].target.distribution} {facts.sglang_version or '?'}"
            )
        session.recorder.facts(session.name, facts)
        files = []
        with session.step(Step.PLAN) as note:
            for index, (part, inspection) in enumerate(zip(parts, inspections, strict=True)):
                files.append(
                    PreparedFile(
                        index,
                        part,
                        inspection,
                        self.plan(inspection.file.content, index),
                        gate_inspection(part.target, inspection)
                        if paths is None
                        else version_gate(
                            part.target,
                            inspection.file.realpath,
                            owner=None,
                            owner_version=None,
                            installed_version=installed_version,
                            version_hint="pass --target-version when no dist-info beside the "
                            "file says",
                        ),
                    )
                )
            note["detail"] = (  # which alternative fit is kept in the ledger (plan_summary)
                plan_summary(files[0].plan)
                if len(files) == 1
                else "; ".join(f"{f.part.target.module} {plan_summary(f.plan)}" for f in files)
            )
        return Prepared(tuple(files))

    # -- the change ------------------------------------------------------------------------

    def apply(self, nodes: Nodes, prepared: Mapping[str, Prepared]) -> list[HostOutcome]:
        """Swap on every node, restart and prove the group once, undo on failure. A set's images
        reach the ledger before the first swap (for `recover`)."""
        head = nodes.head
        changing = [s for s in nodes.sessions if prepared[s.name].pending]
        if not changing:
            return [
                s.outcome(Outcome.ALREADY_APPLIED, file=prepared[s.name].change())
                for s in nodes.sessions
            ]
        try:
            baseline, baseline_note = self.baseline(head)
        except HostFailed as refused:
            mine = prepared[head.name]
            first = self.outcome(
                head, mine, refused.outcome, refused.error, old=mine.pending, reason=refused.reason
            )
            return self._write_failed(nodes, prepared, (), first, who=f"the head {head.name}")
        judge = self.judges.for_host(head.name) if self.judges and self.restart_engine else None
        if judge is not None:
            judge.take_baseline(head)
        written: list[HostSession] = []
        for session in changing:
            failed = self.write(session, prepared[session.name])
            if isinstance(failed, SwapLost):  # the file is new: undone as after a failed proof
                swapped = {s.name: prepared[s.name].pending for s in written}
                swapped[session.name] = failed.swapped
                return self.roll_back(nodes, prepared, failed.why, swapped=swapped)
            if failed is not None:
                return self._write_failed(nodes, prepared, written, failed)
            written.append(session)
        if not self.restart_engine:
            note = (
                "staged: the file is patched; the running server still runs the old code until "
                f"`{remedy_text(Command.RESTART)}` restarts, proves and (on failure) rolls it "
                "back"
                if self.unrestarted == Outcome.STAGED
                else None
            )
            return [
                self.outcome(s, prepared[s.name], self.unrestarted, None, note=note)
                for s in nodes.sessions
            ]
        if self.live is not None:
            return _judged(nodes, self.live.take(self, nodes, prepared, judge), judge)
        try:
            smoke = prove(
                nodes, baseline=baseline, judge=None if judge is None else judge.through_head
            )
        except HostFailed as failure:
            undone = self.roll_back(
                nodes, prepared, failure.error, note=baseline_note, reason=failure.reason
            )
            return _judged(nodes, undone, judge)
        applied = self.applied(
            nodes, prepared, smoke, lambda s: join_notes(baseline_note, _proven_note(nodes, s))
        )
        return _judged(nodes, applied, judge)

    def applied(
        self,
        nodes: Nodes,
        prepared: Mapping[str, Prepared],
        smoke: SmokeResult,
        note: Callable[[HostSession], str | None],
    ) -> list[HostOutcome]:
        return applied(
            nodes,
            smoke,
            {s.name: prepared[s.name].change() for s in nodes.sessions},
            note,
            diffs={s.name: prepared[s.name].diff() for s in nodes.sessions},
        )

    def _write_failed(
        self,
        nodes: Nodes,
        prepared: Mapping[str, Prepared],
        written: Sequence[HostSession],
        failed: HostOutcome,
        *,
        who: str | None = None,
    ) -> list[HostOutcome]:
        """A node failed before the restart (`who`: how the others name it): the nodes swapped
        before it get their files back (their server never ran them)."""
        why = f"{who or failed.host}: {failed.error}"

        def other(session: HostSession) -> HostOutcome:
            mine = prepared[session.name]
            if session not in written:
                return self._put_back(session, mine, (), f"not changed: {why}", failed.reason)
            back = "put back to the pre-image: the unit's server never ran it"
            putting = "putting this node's files back"
            return self._put_back(session, mine, mine.pending, why, failed.reason, putting, back)

        return [failed if s.name == failed.host else other(s) for s in nodes.sessions]

    def write(self, session: HostSession, prepared: Prepared) -> HostOutcome | SwapLost | None:
        """The ledger first, then each swap: None when all are swapped."""
        pending = prepared.pending
        with_path = prepared.is_set
        try:
            with session.step(Step.BACKUP) as note:
                for item in pending:
                    session.recorder.file_version(session.name, item.version(session.container))
                note["detail"] = "; ".join(
                    (f"{item.path} " if with_path else "")
                    + f"pre-image {item.applied.sha256_before[:12]} "
                    f"({len(item.applied.old_source)} bytes) in the ledger"
                    for item in pending
                )
        except Exception as exc:
            why = describe_error(exc)
            return self.outcome(
                session,
                prepared,
                Outcome.FAILED,
                why,
                old=pending,
                reason=Reason.BACKUP_NOT_RECORDED,
            )
        swapped: list[PreparedFile] = []
        for item in pending:
            plan = item.applied
            last = item is pending[-1]
            try:
                with session.step(Step.SWAP) as note:
                    result = session.ops.swap(
                        item.path,
                        expected_sha256=plan.sha256_before,
                        new_content=plan.new_source,
                        lock_run_id=session.lock.run_id,
                        # no restart: the last swap is the host's last step
                        release_lock=not self.restart_engine and last,
                        timeout=self.playbook.timeouts.swap,
                    )
                    session.lock.given_back_by(result.lock_released)
                    note["detail"] = (
                        (f"{item.path} " if with_path else "")
                        + f"{result.sha256_before[:12]} -> {result.sha256_after[:12]}; "
                        f"purged {len(result.purged_bytecode)} pyc"
                        + ("; lock released" if result.lock_released else "")
                    )
            except PreimageMismatch as exc:
                why = f"the file changed since it was read: {exc.detail}"
                return self._swap_refused(
                    session, prepared, item, swapped, why, Reason.CHANGED_SINCE
                )
            except Exception as exc:
                if not effect_unknown(exc):
                    why = describe_error(exc)
                    reason = (
                        refusal_reason(exc) if isinstance(exc, OpspatchError) else Reason.HOST_ERROR
                    )
                    return self._swap_refused(session, prepared, item, swapped, why, reason)
                # No reply: the swap may or may not have happened. Look before saying anything.
                return self._reconcile_after_lost_swap(session, prepared, item, swapped, exc)
            swapped.append(item)
        return None

    def baseline(self, session: HostSession) -> tuple[tuple[str | None, ...] | None, str | None]:
        """Greedy texts from the unpatched server, and a note when not taken; `HostFailed` when the
        playbook requires one."""
        wanted = self.playbook.smoke.baseline
        if not (self.restart_engine and wanted and self.patch.spec.preserves_output):
            return None, None
        problem = ""
        try:
            with session.step(Step.BASELINE) as note:
                result = session.engine.smoke(log_offset=None, checks=False, step=Step.BASELINE)
                complete = all(t is not None for t in result.texts)
                note["detail"] = "taken" if complete else "incomplete: " + result.summary()
            if complete:
                return result.texts, None
            problem = result.summary()
        except OpspatchError as exc:
            problem = describe_error(exc)
        if wanted == "required":
            raise HostFailed(
                Outcome.FAILED,
                f"refused before any change: the playbook requires a baseline and the pre-patch "
                f"decode failed ({problem})",
                Reason.BASELINE_FAILED,
            )
        return None, (
            f"output preservation was not checked: the pre-patch baseline decode failed ({problem})"
        )

    def roll_back(
        self,
        nodes: Nodes,
        prepared: Mapping[str, Prepared],
        why: str,
        *,
        swapped: Mapping[str, Sequence[PreparedFile]] | None = None,
        note: str | None = None,
        restart: bool | None = None,
        reason: Reason = Reason.STEP_FAILED,
    ) -> list[HostOutcome]:
        """Undo past the swap: the pending (or `swapped`) files put back, the group restarted."""

        def files(session: HostSession) -> Sequence[PreparedFile]:
            return (
                prepared[session.name].pending if swapped is None else swapped.get(session.name, ())
            )

        def restore(session: HostSession) -> FileChange:
            mine = prepared[session.name]
            self.restore_files(session, files(session))
            return mine.change({item.path: item.images[0] for item in mine.files})

        undone = undo(
            nodes,
            why,
            restore=restore,
            changes={
                s.name: prepared[s.name].change(live_new(prepared[s.name], files(s)))
                for s in nodes.sessions
            },
            restart=self.restart_engine if restart is None else restart,
            reason=reason,
        )
        return [
            replace(o, diff=prepared[s.name].diff(), note=join_notes(o.note, note))
            for s, o in zip(nodes.sessions, undone, strict=True)
        ]

    def restore_files(self, session: HostSession, files: Sequence[PreparedFile]) -> None:
        for item in reversed(files):
            plan = item.applied
            restore_pre_image(
                session,
                path=item.path,
                pre_sha256=plan.sha256_before,
                post_sha256=plan.sha256_after,
                timeout=self.playbook.timeouts.restore,
            )

    def _swap_refused(
        self,
        session: HostSession,
        prepared: Prepared,
        refused: PreparedFile,
        swapped: Sequence[PreparedFile],
        why: str,
        reason: Reason,
    ) -> HostOutcome:
        """A swap the host refused (nothing written): the set's earlier swaps put back, no restart."""
        if prepared.is_set:
            why = f"{refused.path}: {why}"
        back = ", ".join(item.path for item in swapped)
        whole = f"the set is whole and unchanged: {back} put back to the pre-image"
        putting = "putting back the set's files swapped before it"
        return self._put_back(session, prepared, swapped, why, reason, putting, whole)

    def _put_back(
        self,
        session: HostSession,
        prepared: Prepared,
        files: Sequence[PreparedFile],
        why: str,
        reason: Reason | None,
        putting: str = "",
        note: str | None = None,
    ) -> HostOutcome:
        """A host failed before its restart: `files` swapped put back (its server never ran them),
        `failed`; `needs-attention` when they could not be."""
        try:
            self.restore_files(session, files)
        except (OpspatchError, HostFailed) as exc:
            return self.outcome(
                session,
                prepared,
                Outcome.NEEDS_ATTENTION,
                f"{why}; then {putting} failed: {describe_error(exc)}",
                live=live_new(prepared, files),
                reason=Reason.UNDO_FAILED,
            )
        note = note if files else None
        return self.outcome(
            session, prepared, Outcome.FAILED, why, old=prepared.pending, note=note, reason=reason
        )

    def _reconcile_after_lost_swap(
        self,
        session: HostSession,
        prepared: Prepared,
        item: PreparedFile,
        swapped: Sequence[PreparedFile],
        exc: Exception,
    ) -> HostOutcome | SwapLost:
        why = f"the swap did not answer: {describe_error(exc)}"
        if prepared.is_set:
            why = f"{item.path}: {why}"
        plan = item.applied
        try:
            with session.step(Step.RECONCILE) as note:
                live = session.ops.read(item.path, timeout=self.playbook.timeouts.inspect)
                note["detail"] = f"file is {live.sha256[:12]}"
        except OpspatchError as again:
            return self.outcome(
                session,
                prepared,
                Outcome.NEEDS_ATTENTION,
                f"{why}; the host is unreachable ({describe_error(again)})",
                live=live_new(prepared, swapped),
                reason=Reason.PART_WAY,
            )
        if live.sha256 == plan.sha256_before:
            return self._swap_refused(
                session, prepared, item, swapped, f"{why}; the file is unchanged", Reason.HOST_ERROR
            )
        if live.sha256 == plan.sha256_after:
            return SwapLost(why, (*swapped, item))
        return self.outcome(
            session,
            prepared,
            Outcome.NEEDS_ATTENTION,
            f"{why}; the file is neither the pre- nor the post-image",
            live={**live_new(prepared, swapped), item.path: live.sha256},
            reason=Reason.PART_WAY,
        )

    def outcome(
        self,
        session: HostSession,
        prepared: Prepared,
        outcome: Outcome,
        error: str | None,
        *,
        old: Sequence[PreparedFile] = (),
        live: dict[str, str] | None = None,
        smoke: SmokeResult | None = None,
        note: str | None = None,
        reason: Reason | None = None,
    ) -> HostOutcome:
        """Files at what each plan wrote, except `old` (at the pre-image) and those `live` names."""
        hashes = {item.path: item.images[0] for item in old}
        hashes.update(live or {})
        return session.outcome(
            outcome,
            error,
            file=prepared.change(hashes),
            diff=prepared.diff(),
            smoke=smoke,
            note=note,
            reason=reason,
        )


def live_new(prepared: Prepared, swapped: Sequence[PreparedFile]) -> dict[str, str]:
    done = {item.path for item in swapped}
    return {
        item.path: item.images[1] if item.path in done else item.images[0]
        for item in prepared.pending
    }


def _judged(
    nodes: Nodes, outcomes: list[HostOutcome], judge: HostJudge | None
) -> list[HostOutcome]:
    return outcomes if judge is None else judge.carried(nodes, outcomes)


@dataclass(frozen=True)
class SwapLost:
    """A swap that did not answer, found written: rolled back as after a failed proof."""

    why: str
    swapped: tuple[PreparedFile, ...]


def _proven_note(nodes: Nodes, session: HostSession) -> str | None:
    if session is nodes.head:
        return None
    return f"{nodes.where(session)}: proven by the decode through the head {nodes.head.name}"
