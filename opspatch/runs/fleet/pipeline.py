"""The per-host pipeline of an apply, written once: preflight (begin + plan) and the change
(backup, swap, restart, ready, smoke; on a failure past the swap, the restore), as one template
that every apply (fleet, staged, local file) runs through. `runs.commands.apply` drives it across a fleet.

Per host (architecture.md), each step with a deadline and a ledger record:

```
begin (lock + facts + resolve + read, one exec) -> plan (pure) -> [baseline decode]
  -> backup (the full pre-image into the ledger) -> swap (host: check pre-image, compile with
     the host's Python, backup copy, atomic rename, bytecode purge)
  -> restart -> ready -> smoke (decode + log scan; gives the lock back when it passes)
on a failure after the swap:  restore -> restart -> ready -> smoke (a failed one is a failed
  step, and the note says the server does not serve the restored file)
  restored and ready: `rolled-back`;  restore or its restart failed: `needs-attention` (halts)
```
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from opspatch.core.edit import AlreadyApplied, Applied, NotApplicable, apply_patch, plan_summary
from opspatch.core.gate import version_gate
from opspatch.core.policy import Playbook
from opspatch.core.remedy import CliCommand, remedy_text
from opspatch.core.source import sha256_hex
from opspatch.core.spec import LoadedPatch, PatchSpec, Target
from opspatch.core.vocabulary import Outcome, Step
from opspatch.errors import OpspatchError, PreimageMismatch
from opspatch.hosts.engine import SmokeResult
from opspatch.hosts.operations import HostInspection
from opspatch.hosts.results import file_owner
from opspatch.ledger.records import NewFileVersion
from opspatch.runs.fleet.judging import HostJudge, JudgePlan
from opspatch.runs.fleet.session import (
    HostFailed,
    HostSession,
    describe_error,
)
from opspatch.runs.fleet.steps import (
    effect_unknown,
    prove,
    restore_pre_image,
    undo,
)
from opspatch.runs.report import FileChange, HostOutcome, SetFile

PlanOutcome = Applied | AlreadyApplied | NotApplicable


@dataclass(frozen=True)
class PreparedFile:
    """One target of the patch on a host (a patch set has several): its file as read, the plan
    on its bytes and the version gate's objection, if any."""

    index: int
    """The target's place in the patch (`targets[index]`; 0 for a `[target]` patch)."""
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


@dataclass(frozen=True)
class Prepared:
    """A host after `begin` and `plan`: its lock is held and every target's plan is known.

    A patch set is planned together: it fits a host only if every target fits (`misfit`),
    and only the files whose plan changes them are swapped (`pending`); a set whose files all
    carry it already is `already_applied`."""

    files: tuple[PreparedFile, ...]

    @property
    def inspection(self) -> HostInspection:
        """The first target's inspection (the host's facts, its server)."""
        return self.files[0].inspection

    @property
    def misfit(self) -> PreparedFile | None:
        """The first target that does not fit the host, if any (then nothing is changed)."""
        return next((f for f in self.files if not f.fits), None)

    @property
    def pending(self) -> tuple[PreparedFile, ...]:
        """The files the plan changes, in the patch's order (the order they are swapped in)."""
        return tuple(f for f in self.files if isinstance(f.plan, Applied))

    @property
    def already_applied(self) -> bool:
        return all(isinstance(f.plan, AlreadyApplied) for f in self.files)

    @property
    def is_set(self) -> bool:
        return len(self.files) > 1

    def diff(self) -> str | None:
        diffs = [f.plan.diff for f in self.files if isinstance(f.plan, Applied)]
        return "".join(diffs) or None

    def change(self, live: dict[str, str] | None = None) -> FileChange:
        """The host's file change: the first changed file's hashes and, for a set, every file
        with the bytes it holds (`live`, by path; default: what each plan wrote)."""
        files = self.pending or self.files
        first = files[0]
        before, after = _images(first)
        if not self.is_set:
            return FileChange(first.path, before, (live or {}).get(first.path, after))
        members = []
        for item in self.files:
            pre, post = _images(item)
            members.append(SetFile(item.path, pre, post, (live or {}).get(item.path, post)))
        return FileChange(
            first.path, before, (live or {}).get(first.path, after), set_files=tuple(members)
        )


def _images(item: PreparedFile) -> tuple[str, str]:
    """The pre- and post-image sha256 of one file's plan (unchanged: both the file's own)."""
    if isinstance(item.plan, Applied):
        return item.plan.sha256_before, item.plan.sha256_after
    return item.inspection.file.sha256, item.inspection.file.sha256


def gate_inspection(target: Target, inspection: HostInspection) -> str | None:
    """The version gate for a host's file: the owning distribution's version decides
    (`core.gate`); the module's import origin must be the target too (a symlink's target can
    live anywhere, its origin cannot)."""
    module = inspection.module
    installed = inspection.facts.sglang_version if _is_sglang(target.distribution) else None
    problem = version_gate(
        target,
        inspection.file.realpath,
        owner=module.distribution if module else None,
        owner_version=module.distribution_version if module else None,
        installed_version=installed,
    )
    if problem is None and module is not None:
        problem = target.mismatch(module.origin, None)
    return problem


def _is_sglang(distribution: str) -> bool:
    return distribution.lower().replace("_", "-") == "sglang"


class LiveStrategy(Protocol):
    """`apply --live` (`runs/fleet/liveapply.py`): after the swap, in place of PROVE, the fix is
    taken into the running engine (its live form was found in preflight); returns the host's
    outcome."""

    def apply(
        self,
        pipeline: ApplyPipeline,
        session: HostSession,
        prepared: Prepared,
        judge: HostJudge | None,
    ) -> HostOutcome: ...


class ApplyPipeline:
    """Apply one patch (a patch set: all its files together) to one host: the template every
    apply runs through."""

    def __init__(
        self,
        patch: LoadedPatch,
        playbook: Playbook,
        *,
        restart_engine: bool = True,
        unrestarted: Outcome = Outcome.STAGED,
        live: LiveStrategy | None = None,
    ) -> None:
        """`restart_engine=False` swaps the file only; the host's outcome is then `unrestarted`:
        `staged` on a fleet (its server still runs the old code), `applied` for a local file
        (there is no server). `live`: the swapped files are taken into the running engine
        instead of a restart (`apply --live`)."""
        self.patch = patch
        self.playbook = playbook
        self.restart_engine = restart_engine
        self.unrestarted = unrestarted
        self.judges: JudgePlan | None = None
        """The playbook's judge, when it has one: set by the rollout once it knows the canaries."""
        self.live = live
        # A plan depends on the patch and the file's bytes alone (the version gate, per host, is
        # not part of it): hosts with one pre-image share one plan and its validation.
        self._plans: dict[tuple[str, int, str], PlanOutcome] = {}
        self._plans_lock = threading.Lock()

    def plan(self, content: bytes, index: int = 0) -> PlanOutcome:
        """The plan of the patch's target `index` on a file of these bytes, made once per
        pre-image in this pipeline; the preflight's threads wait for a plan being made."""
        key = (self.patch.sha256, index, sha256_hex(content))
        with self._plans_lock:
            plan = self._plans.get(key)
            if plan is None:
                plan = self._plans[key] = apply_patch(content, self.patch.parts[index])
        return plan

    def reuse(self, plan: Applied, index: int = 0) -> None:
        """Take a plan made before this pipeline (`apply --file` plans to ask first): a host whose
        file is still its pre-image gets it without planning again."""
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
        """Lock (unless a dry run) and inspect the host, then plan every target on its file.

        Each file is the one the engine's interpreter imports for its target's module, or the
        target's entry of `paths` (local files: `installed_version` then says their
        distribution's version, if known).
        """
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
                        self._gate(part.target, inspection, paths, installed_version),
                    )
                )
            note["detail"] = (  # which alternative fit is kept in the ledger (plan_summary)
                plan_summary(files[0].plan)
                if len(files) == 1
                else "; ".join(f"{f.part.target.module} {plan_summary(f.plan)}" for f in files)
            )
        return Prepared(tuple(files))

    @staticmethod
    def _gate(
        target: Target,
        inspection: HostInspection,
        paths: Sequence[str] | None,
        installed_version: str | None,
    ) -> str | None:
        if paths is None:
            return gate_inspection(target, inspection)
        return version_gate(
            target,
            inspection.file.realpath,
            owner=None,
            owner_version=None,
            installed_version=installed_version,
            version_hint="pass --target-version when no dist-info beside the file says",
        )

    # -- the change ------------------------------------------------------------------------

    def apply(self, session: HostSession, prepared: Prepared) -> HostOutcome:
        """Swap every pending file, restart once, prove once; on failure restore them all.
        Returns the host's outcome (never raises for a host-level failure).

        A set's files are recorded in the ledger (pre- and post-images) before the first swap,
        so a controller killed between two swaps leaves the ledger naming every file of the set:
        `recover` puts the swapped ones back (docs/design.md, "Patch sets")."""
        pending = prepared.pending
        assert pending, "apply needs a plan that changes a file"
        try:
            baseline, baseline_note = self.baseline(session)
        except HostFailed as refused:
            return self.outcome(session, prepared, refused.outcome, refused.error, old=pending)
        judge = self.judges.for_host(session.name) if self.judges and self.restart_engine else None
        if judge is not None:
            judge.take_baseline(session)
        failed = self.write(session, prepared)
        if failed is not None:
            return failed
        if not self.restart_engine:
            staged_note = (
                "staged: the file is patched; the running server still runs the old code until "
                f"`{remedy_text(CliCommand.RESTART)}` restarts, proves and (on failure) rolls it "
                "back"
                if self.unrestarted == Outcome.STAGED
                else None
            )
            return self.outcome(session, prepared, self.unrestarted, None, note=staged_note)
        if self.live is not None:
            taken = self.live.apply(self, session, prepared, judge)
            return replace(taken, judgment=judge.judgment if judge is not None else None)
        try:
            smoke = prove(session, baseline=baseline, judge=judge)
        except HostFailed as failure:
            rolled = self.roll_back(session, prepared, failure.error)
            judged = judge.judgment if judge is not None else None
            return replace(rolled, note=_join(rolled.note, baseline_note), judgment=judged)
        applied = self.outcome(
            session, prepared, Outcome.APPLIED, None, smoke=smoke, note=baseline_note
        )
        return replace(applied, judgment=judge.judgment if judge is not None else None)

    def write(self, session: HostSession, prepared: Prepared) -> HostOutcome | None:
        """Record every pending file's images in the ledger, then swap each: None when all are
        swapped, else the host's outcome (the set whole and unchanged where the host refused a
        swap; what it is, read back, where a swap did not answer)."""
        pending = prepared.pending
        with_path = prepared.is_set
        try:
            with session.step(Step.BACKUP) as note:
                for item in pending:
                    self._record_backup(session, item)
                note["detail"] = "; ".join(
                    (f"{item.path} " if with_path else "")
                    + f"pre-image {_plan(item).sha256_before[:12]} "
                    f"({len(_plan(item).old_source)} bytes) in the ledger"
                    for item in pending
                )
        except Exception as exc:
            return self.outcome(session, prepared, Outcome.FAILED, describe_error(exc), old=pending)
        swapped: list[PreparedFile] = []
        for item in pending:
            plan = _plan(item)
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
                return self._swap_refused(session, prepared, item, swapped, why)
            except Exception as exc:
                if not effect_unknown(exc):
                    why = describe_error(exc)
                    return self._swap_refused(session, prepared, item, swapped, why)
                # No reply: the swap may or may not have happened. Look before saying anything.
                return self._reconcile_after_lost_swap(session, prepared, item, swapped, exc)
            swapped.append(item)
        return None

    def _record_backup(self, session: HostSession, item: PreparedFile) -> None:
        plan, remote = _plan(item), item.inspection.file
        session.recorder.file_version(
            session.name,
            NewFileVersion(
                remote.realpath,
                plan.sha256_before,
                plan.sha256_after,
                remote.mode,
                file_owner(remote),
                pre_image=plan.old_source,
                post_image=plan.new_source,
                container=session.container,
            ),
        )

    def baseline(self, session: HostSession) -> tuple[tuple[str | None, ...] | None, str | None]:
        """Greedy texts from the unpatched server, if the playbook and the patch ask for it,
        and a note when it could not be taken (output preservation then goes unchecked).

        Raises:
            HostFailed: the playbook requires the baseline (`baseline = "required"`) and it
                could not be taken; nothing has been changed on the host yet.
        """
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
            )
        return None, (
            f"output preservation was not checked: the pre-patch baseline decode failed ({problem})"
        )

    def roll_back(
        self,
        session: HostSession,
        prepared: Prepared,
        why: str,
        *,
        swapped: Sequence[PreparedFile] | None = None,
    ) -> HostOutcome:
        """Put the pre-images back after a failure past the swap (every pending file, or the
        `swapped` ones), then restart once and prove."""
        files = prepared.pending if swapped is None else tuple(swapped)

        def restore() -> FileChange:
            self.restore_files(session, files)
            return prepared.change(live_old(prepared))

        undone = undo(
            session,
            why,
            restore=restore,
            change=prepared.change(live_new(prepared, files)),
            restart=self.restart_engine,
        )
        return replace(undone, diff=prepared.diff())

    def restore_files(self, session: HostSession, files: Sequence[PreparedFile]) -> None:
        """Restore the pre-image of each file, the last swapped first."""
        for item in reversed(files):
            plan = _plan(item)
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
    ) -> HostOutcome:
        """A swap the host refused (it wrote nothing): the host is unchanged once the set's
        files swapped before it are put back (no restart: the server never ran them)."""
        if prepared.is_set:
            why = f"{refused.path}: {why}"
        if not swapped:
            return self.outcome(session, prepared, Outcome.FAILED, why, old=prepared.pending)
        try:
            self.restore_files(session, swapped)
        except (OpspatchError, HostFailed) as exc:
            return self.outcome(
                session,
                prepared,
                Outcome.NEEDS_ATTENTION,
                f"{why}; then putting back the set's files swapped before it failed: "
                f"{describe_error(exc)}",
                live=live_new(prepared, swapped),
            )
        back = ", ".join(item.path for item in swapped)
        return self.outcome(
            session,
            prepared,
            Outcome.FAILED,
            why,
            old=prepared.pending,
            note=f"the set is whole and unchanged: {back} put back to the pre-image",
        )

    def _reconcile_after_lost_swap(
        self,
        session: HostSession,
        prepared: Prepared,
        item: PreparedFile,
        swapped: Sequence[PreparedFile],
        exc: Exception,
    ) -> HostOutcome:
        why = f"the swap did not answer: {describe_error(exc)}"
        if prepared.is_set:
            why = f"{item.path}: {why}"
        plan = _plan(item)
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
            )
        if live.sha256 == plan.sha256_before:
            return self._swap_refused(
                session, prepared, item, swapped, f"{why}; the file is unchanged"
            )
        if live.sha256 == plan.sha256_after:
            return self.roll_back(session, prepared, why, swapped=(*swapped, item))
        return self.outcome(
            session,
            prepared,
            Outcome.NEEDS_ATTENTION,
            f"{why}; the file is neither the pre- nor the post-image",
            live={**live_new(prepared, swapped), item.path: live.sha256},
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
    ) -> HostOutcome:
        """The host's outcome; its files are what each plan wrote, except the `old` ones (left
        at or put back to their pre-image) and those `live` names."""
        hashes = {item.path: _images(item)[0] for item in old}
        hashes.update(live or {})
        return session.outcome(
            outcome,
            error,
            file=prepared.change(hashes),
            diff=prepared.diff(),
            smoke=smoke,
            note=note,
        )


def _plan(item: PreparedFile) -> Applied:
    assert isinstance(item.plan, Applied)
    return item.plan


def live_old(prepared: Prepared) -> dict[str, str]:
    """Every file at its pre-image (after a restore)."""
    return {item.path: _images(item)[0] for item in prepared.files}


def live_new(prepared: Prepared, swapped: Sequence[PreparedFile]) -> dict[str, str]:
    """The `swapped` files at their post-image, the other pending files still at their pre-image."""
    done = {item.path for item in swapped}
    return {
        item.path: _images(item)[1] if item.path in done else _images(item)[0]
        for item in prepared.pending
    }


def _join(*notes: str | None) -> str | None:
    return "; ".join(n for n in notes if n) or None
