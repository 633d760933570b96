"""The per-host pipeline of an apply, written once: preflight (begin + plan) and the change
(backup, swap, restart, ready, smoke; on a failure past the swap, the restore), as one template
that every apply (fleet, staged, local file) runs through. `runs.apply` drives it across a fleet.

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
from dataclasses import dataclass, replace

from opspatch.core.edit import AlreadyApplied, Applied, NotApplicable, apply_patch, plan_summary
from opspatch.core.gate import version_gate
from opspatch.core.policy import Playbook
from opspatch.core.source import sha256_hex
from opspatch.core.spec import LoadedPatch, Target
from opspatch.core.vocabulary import Outcome
from opspatch.errors import OpspatchError, PreimageMismatch
from opspatch.hosts.engine import SmokeResult
from opspatch.hosts.operations import HostInspection
from opspatch.runs.report import FileChange, HostOutcome
from opspatch.runs.session import (
    HostFailed,
    HostSession,
    describe_error,
)
from opspatch.runs.steps import (
    effect_unknown,
    prove,
    restore_pre_image,
    undo,
)

PlanOutcome = Applied | AlreadyApplied | NotApplicable


@dataclass(frozen=True)
class Prepared:
    """A host after `begin` and `plan`: its lock is held and the outcome of the plan is known."""

    inspection: HostInspection
    plan: PlanOutcome
    version_problem: str | None


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


class ApplyPipeline:
    """Apply one patch to one host: the template every apply runs through."""

    def __init__(
        self,
        patch: LoadedPatch,
        playbook: Playbook,
        *,
        restart_engine: bool = True,
        unrestarted: Outcome = Outcome.STAGED,
    ) -> None:
        """`restart_engine=False` swaps the file only; the host's outcome is then `unrestarted`:
        `staged` on a fleet (its server still runs the old code), `applied` for a local file
        (there is no server)."""
        self.patch = patch
        self.playbook = playbook
        self.restart_engine = restart_engine
        self.unrestarted = unrestarted
        # A plan depends on the patch and the file's bytes alone (the version gate, per host, is
        # not part of it): hosts with one pre-image share one plan and its validation.
        self._plans: dict[tuple[str, str], PlanOutcome] = {}
        self._plans_lock = threading.Lock()

    def plan(self, content: bytes) -> PlanOutcome:
        """The plan of the patch on a file of these bytes, made once per pre-image in this
        pipeline; the preflight's threads wait for a plan being made."""
        key = (self.patch.sha256, sha256_hex(content))
        with self._plans_lock:
            plan = self._plans.get(key)
            if plan is None:
                plan = self._plans[key] = apply_patch(content, self.patch.spec)
        return plan

    def reuse(self, plan: Applied) -> None:
        """Take a plan made before this pipeline (`apply --file` plans to ask first): a host whose
        file is still its pre-image gets it without planning again."""
        with self._plans_lock:
            self._plans.setdefault((self.patch.sha256, plan.sha256_before), plan)

    # -- preflight: begin + plan ---------------------------------------------------------

    def prepare(
        self,
        session: HostSession,
        *,
        lock: bool,
        path: str | None = None,
        installed_version: str | None = None,
    ) -> Prepared:
        """Lock (unless a dry run) and inspect the host, then plan the patch on its file.

        The file is the one the engine's interpreter imports for the patch's module, or `path`
        (a local file: `installed_version` then says its distribution's version, if known).
        """
        target = self.patch.spec.target
        module = None if path is not None else target.module
        timeout = self.playbook.timeouts.lock + self.playbook.timeouts.inspect
        with session.step("begin" if lock else "inspect") as note:
            if lock:
                assert session.run_id is not None
                _, inspection = session.ops.begin(
                    module, path=path, run_id=session.run_id, timeout=timeout
                )
            else:
                inspection = session.ops.inspect(module, path=path, timeout=timeout)
            facts = inspection.facts
            note["detail"] = (
                f"{inspection.file.realpath} sha256 {inspection.file.sha256[:12]}; python "
                f"{facts.python_version}, {target.distribution} {facts.sglang_version or '?'}"
            )
        if session.recorded:
            assert session.ledger is not None and session.run_id is not None
            session.ledger.record_facts(session.run_id, session.name, inspection.facts.to_json())
        if path is not None:
            mismatch = version_gate(
                target,
                inspection.file.realpath,
                owner=None,
                owner_version=None,
                installed_version=installed_version,
                version_hint="pass --target-version when no dist-info beside the file says",
            )
        else:
            mismatch = gate_inspection(target, inspection)
        with session.step("plan") as note:
            plan = self.plan(inspection.file.content)
            note["detail"] = plan_summary(plan)
        return Prepared(inspection, plan, mismatch)

    # -- the change ------------------------------------------------------------------------

    def apply(self, session: HostSession, prepared: Prepared) -> HostOutcome:
        """Swap, restart, prove; on failure restore. Returns the host's outcome (never raises
        for a host-level failure)."""
        plan = prepared.plan
        assert isinstance(plan, Applied)
        remote = prepared.inspection.file
        change = FileChange(remote.realpath, plan.sha256_before, plan.sha256_after)
        try:
            baseline, baseline_note = self._baseline(session)
        except HostFailed as refused:
            return self._outcome(session, refused.outcome, refused.error, change, plan)
        ledger, run_id = session.ledger, session.run_id
        try:
            with session.step("backup") as note:
                if ledger is not None and run_id is not None:
                    ledger.record_file_version(
                        run_id,
                        session.name,
                        path=remote.realpath,
                        sha256_before=plan.sha256_before,
                        sha256_after=plan.sha256_after,
                        mode=remote.mode,
                        owner=f"{remote.owner or remote.uid}:{remote.group or remote.gid}",
                        pre_image=plan.old_source,
                        post_image=plan.new_source,
                    )
                note["detail"] = (
                    f"pre-image {plan.sha256_before[:12]} ({len(plan.old_source)} bytes) in the ledger"
                )
            with session.step("swap") as note:
                swapped = session.ops.swap(
                    remote.realpath,
                    expected_sha256=plan.sha256_before,
                    new_content=plan.new_source,
                    lock_run_id=run_id,
                    release_lock=not self.restart_engine,  # no restart: the swap is the last step
                    timeout=self.playbook.timeouts.swap,
                )
                session.lock.given_back_by(swapped.lock_released)
                note["detail"] = (
                    f"{swapped.sha256_before[:12]} -> {swapped.sha256_after[:12]}; "
                    f"purged {len(swapped.purged_bytecode)} pyc"
                    + ("; lock released" if swapped.lock_released else "")
                )
        except PreimageMismatch as exc:
            return self._outcome(
                session,
                Outcome.FAILED,
                f"the file changed since it was read: {exc.detail}",
                change,
                plan,
            )
        except Exception as exc:
            if not effect_unknown(exc):
                return self._outcome(session, Outcome.FAILED, describe_error(exc), change, plan)
            # No reply: the swap may or may not have happened. Look before saying anything.
            return self._reconcile_after_lost_swap(session, change, plan, exc)
        if not self.restart_engine:
            staged_note = (
                "staged: the file is patched; the running server still runs the old code until "
                "`opspatch restart` restarts, proves and (on failure) rolls it back"
                if self.unrestarted == Outcome.STAGED
                else None
            )
            return self._outcome(session, self.unrestarted, None, change, plan, note=staged_note)
        try:
            smoke = prove(session, baseline=baseline)
        except HostFailed as failure:
            rolled = self.roll_back(session, change, plan, failure.error)
            return replace(rolled, note=_join(rolled.note, baseline_note))
        return self._outcome(
            session, Outcome.APPLIED, None, change, plan, smoke=smoke, note=baseline_note
        )

    def _baseline(self, session: HostSession) -> tuple[tuple[str | None, ...] | None, str | None]:
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
            with session.step("baseline") as note:
                result = session.engine.smoke(log_offset=None, checks=False, step="baseline")
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
        self, session: HostSession, change: FileChange, plan: Applied, why: str
    ) -> HostOutcome:
        """Put the pre-image back after a failure past the swap, then restart and prove."""

        def restore() -> FileChange:
            restore_pre_image(
                session,
                path=change.path,
                pre_sha256=plan.sha256_before,
                post_sha256=plan.sha256_after,
                timeout=self.playbook.timeouts.restore,
            )
            return FileChange(change.path, plan.sha256_before, plan.sha256_before)

        undone = undo(session, why, restore=restore, change=change, restart=self.restart_engine)
        return replace(undone, diff=plan.diff)

    def _reconcile_after_lost_swap(
        self, session: HostSession, change: FileChange, plan: Applied, exc: Exception
    ) -> HostOutcome:
        why = f"the swap did not answer: {describe_error(exc)}"
        try:
            with session.step("reconcile") as note:
                live = session.ops.read(change.path, timeout=self.playbook.timeouts.inspect)
                note["detail"] = f"file is {live.sha256[:12]}"
        except OpspatchError as again:
            return self._outcome(
                session,
                Outcome.NEEDS_ATTENTION,
                f"{why}; the host is unreachable ({describe_error(again)})",
                change,
                plan,
            )
        if live.sha256 == plan.sha256_before:
            return self._outcome(
                session, Outcome.FAILED, f"{why}; the file is unchanged", change, plan
            )
        if live.sha256 == plan.sha256_after:
            return self.roll_back(session, change, plan, why)
        return self._outcome(
            session,
            Outcome.NEEDS_ATTENTION,
            f"{why}; the file is neither the pre- nor the post-image",
            change,
            plan,
        )

    def _outcome(
        self,
        session: HostSession,
        outcome: Outcome,
        error: str | None,
        change: FileChange | None,
        plan: Applied | None,
        smoke: SmokeResult | None = None,
        note: str | None = None,
    ) -> HostOutcome:
        return session.outcome(
            outcome,
            error,
            file=change,
            diff=plan.diff if plan is not None else None,
            smoke=smoke,
            note=note,
        )


def _join(*notes: str | None) -> str | None:
    return "; ".join(n for n in notes if n) or None
