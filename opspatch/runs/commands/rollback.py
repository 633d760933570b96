"""`opspatch rollback`: undo a patch (or a run) from the ledger."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from opspatch.core.edit import NotApplicable, detect, unapply
from opspatch.core.host import Host, Unit
from opspatch.core.policy import Playbook
from opspatch.core.reasons import Reason
from opspatch.core.remedy import remedy_text
from opspatch.core.source import sha256_hex
from opspatch.core.spec import LoadedPatch
from opspatch.core.vocabulary import Action, Command, FileAction, Outcome, Step
from opspatch.errors import OpspatchError, RemoteOperationError
from opspatch.hosts.operations import HostInspection
from opspatch.ledger.lineage import PatchedFurther, applied_versions
from opspatch.ledger.store import FileVersion, Ledger, Machine, RunDetail
from opspatch.runs.commands.live import patch_fixes
from opspatch.runs.fleet.connect import TransportFactory
from opspatch.runs.fleet.group import Nodes, refuse, undo
from opspatch.runs.fleet.liveapply import revert_on
from opspatch.runs.fleet.recorded import run_recorded
from opspatch.runs.fleet.restore import (
    BatchPolicy,
    Examined,
    halt_under_playbook,
    restore_standing,
    run_in_batches,
    stale_note,
)
from opspatch.runs.fleet.session import HostSession, Progress, describe_error
from opspatch.runs.fleet.standing import Change, HostStanding, Lineage, read_host
from opspatch.runs.fleet.steps import AS_ROLLBACK, file_version
from opspatch.runs.judgments.decisions import decide
from opspatch.runs.judgments.live import unanswered
from opspatch.runs.judgments.patchset import Place, Standing, paths_of
from opspatch.runs.judgments.units import recover_remedy, require_whole_units, target_of
from opspatch.runs.report import FileChange, HostOutcome, RunReport, join_notes


def rollback_hosts(
    *,
    ledger: Ledger,
    hosts: Sequence[Host],
    factory: TransportFactory,
    playbook: Playbook,
    patch: LoadedPatch | None = None,
    source_run: RunDetail | None = None,
    progress: Progress | None = None,
    restart_engine: bool = True,
    unrestarted: Outcome = Outcome.STAGED_BACK,
    only_paths: Collection[str] | None = None,
) -> RunReport:
    """Restore the pre-images of `patch` (or of run `source_run`); `restart_engine=False`
    restores files only (each host `unrestarted`); `only_paths`: the files considered."""
    if (patch is None) == (source_run is None):
        raise ValueError("rollback_hosts takes exactly one of patch or source_run")
    patch_id = patch.spec.id if patch else (source_run.summary.patch_id if source_run else None)

    def again(unit: Unit) -> str:
        if patch is not None:
            return remedy_text(Command.ROLLBACK, patch.reference, hosts=unit.name)
        assert source_run is not None
        return remedy_text(Command.ROLLBACK, run=source_run.run_id, hosts=unit.name)

    require_whole_units(hosts, Command.ROLLBACK, whole=again)
    rollback = _Rollback(
        ledger, patch, source_run, restart_engine, unrestarted, only_paths, patch_id
    )
    policy = BatchPolicy(rollout=halt_under_playbook, preflight=rollback.preflight)
    return run_recorded(
        Command.ROLLBACK,
        lambda fleet: run_in_batches(fleet, rollback.group, policy),
        ledger=ledger,
        hosts=hosts,
        factory=factory,
        playbook=playbook,
        progress=progress,
        patch=patch,
        patch_id=patch_id,
        parent_run=source_run.run_id if source_run else None,
    )


@dataclass(frozen=True)
class _Rollback:
    ledger: Ledger
    patch: LoadedPatch | None
    source_run: RunDetail | None
    restart_engine: bool
    unrestarted: Outcome
    only_paths: Collection[str] | None
    patch_id: str | None

    def _considered(self, path: str) -> bool:
        return self.only_paths is None or path in self.only_paths

    def _versions(self, host: str) -> tuple[dict[str, list[FileVersion]], list[FileVersion]]:
        """The changes to undo on `host`, newest first, and by path when they span several (a
        set; else empty): the run's or the set's, or on one path every change the patch made
        (a patch applied twice is undone one run at a time)."""
        if self.source_run is None:
            assert self.patch is not None
            patch_id, history = self.patch.spec.id, self.ledger.file_history(host)
            if not self.patch.is_set:
                paths = dict.fromkeys(
                    v.path for v in history if v.patch_id == patch_id and self._considered(v.path)
                )
                found = (
                    applied_versions(self.ledger.file_history(host, p), patch_id) for p in paths
                )
                return {}, next((versions for versions in found if versions), [])
            changes = [
                v
                for v in history
                if v.patch_id == patch_id
                and v.action == FileAction.PATCH
                and self._considered(v.path)
            ]
        else:
            changes = self._run_versions(host)
        by_path = {path: [v for v in changes if v.path == path] for path in paths_of(changes)}
        if len(by_path) > 1:
            return by_path, [v for vs in by_path.values() for v in vs]
        return {}, changes if self.source_run is not None else []

    def _run_versions(self, host: str) -> list[FileVersion]:
        assert self.source_run is not None
        try:
            record = self.source_run.host(host)
        except KeyError:
            return []
        if record.outcome == Outcome.FAILED:  # nothing changed there (the swap was refused)
            return []
        return [
            v
            for v in reversed(record.file_versions)
            if v.action == FileAction.PATCH and self._considered(v.path)
        ]

    def preflight(self, session: HostSession) -> Examined:
        """Read before any host changes, unlocked: a host refused or left alone is reported
        with its reason whatever halts the run later."""
        try:
            return self._examine(session, lock=False)
        except OpspatchError as exc:
            return Examined(None, decided=session.refused(exc))

    def group(self, nodes: Nodes) -> list[HostOutcome]:
        """Every node read again under its lock (one refused: nothing restored anywhere), then
        put back and proven as one; told not to restart, each node by itself."""
        examined: dict[str, Examined] = {}
        for session in nodes.sessions:
            try:
                examined[session.name] = self._examine(session, lock=True)
            except OpspatchError as exc:  # nothing restored yet: the group refused, a host too
                return refuse(nodes, {session.name: session.refused(exc)}, "could not be read")
        decided = {n: e.decided for n, e in examined.items() if e.decided is not None}
        odd = {n: o for n, o in decided.items() if o.error is not None}
        if odd:
            return refuse(nodes, odd, "was refused", files={n: o.file for n, o in decided.items()})
        if len(decided) == len(examined):
            return [decided[s.name] for s in nodes.sessions]
        if not self.restart_engine:  # no group restart: each node by itself (a host: itself)
            back = [s for s in nodes.sessions if s.name not in decided]
            live = self._revert_live(back)  # the nodes put back as one: a unit's read back
            return [
                o
                for s in nodes.sessions
                for o in (
                    [decided[s.name]]
                    if s.name in decided
                    else self._put_back(Nodes(s), examined, decided, live)
                )
            ]
        return self._put_back(nodes, examined, decided, self._revert_live(nodes.sessions))

    def _put_back(
        self,
        nodes: Nodes,
        examined: Mapping[str, Examined],
        decided: Mapping[str, HostOutcome],
        live: str | None,
    ) -> list[HostOutcome]:
        head = nodes.head
        staged_back = not self.restart_engine and self.unrestarted == Outcome.STAGED_BACK
        why = join_notes(
            *dict.fromkeys(examined[s.name].note for s in nodes.sessions),
            "staged back: the pre-image is in place, the server was not restarted "
            "(--restart never) and runs the code it loaded until it is restarted"
            if staged_back
            else None,
            live,
        )

        tried: list[str] = []

        def restore(session: HostSession) -> FileChange | None:
            put_back = examined[session.name].put_back
            if put_back is None:  # nothing to restore on this node
                left: FileChange | None = decided[session.name].file
                return left
            tried.append(session.name)
            try:
                back: FileChange = put_back()
                return back
            except _NoBackup as missing:  # nothing changed: the group refused, if no node was
                if tried == [session.name]:
                    raise
                raise missing.error from None

        try:
            return undo(
                nodes,
                why,
                restore=restore,
                changes={n: e.found or decided[n].file for n, e in examined.items()},
                restart=self.restart_engine,
                outcome=Outcome.RESTORED if self.restart_engine else self.unrestarted,
                steps=AS_ROLLBACK,
                way_back=self._way_back(nodes.name),
                restore_failed=examined[head.name].restore_failed,
                restart_failed=lambda error: (
                    f"restored, but the server does not come back: {error}"
                ),
            )
        except _NoBackup as missing:
            return refuse(nodes, {missing.outcome.host: missing.outcome}, "was refused")

    def _examine(self, session: HostSession, *, lock: bool) -> Examined:
        by_path, versions = self._versions(session.name)
        if not by_path and self.patch is not None and self.patch.is_set:
            set_id = self.patch.spec.id
            return _nothing_to_do(
                session,
                f"the ledger has no change by the patch set {set_id} on this host (a set is "
                "rolled back from the ledger's record only)",
            )
        if not versions and self.source_run is not None:
            run_id = self.source_run.run_id
            return _nothing_to_do(session, f"the ledger has no change by run {run_id} on this host")
        change = Change(
            versions,
            module=None if versions or self.patch is None else self.patch.spec.target.module,
            lineage=self._lineage(session.name, by_path or None, versions),
            paths=list(by_path) if by_path else None,
        )
        standing = read_host(session, change, ledger=self.ledger, lock=lock)
        inspection = standing.inspection
        assert inspection is not None  # versions, or a patch's module, were read
        action = decide(Command.ROLLBACK, standing.standing)
        if action == Action.RESTORE_FROM_BACKUP:
            assert self.patch is not None
            return self._without_record(session, self.patch, inspection)
        if action == Action.LEAVE:
            return self._at_pre_image(session, standing)
        if action == Action.REFUSE:
            return Examined(
                inspection,
                decided=session.outcome(
                    Outcome.SKIPPED,
                    _refusal(standing),
                    file=standing.unchanged(),
                    reason=_refusal_reason(standing),
                ),
            )
        partly = standing.is_set and standing.standing == Standing.PARTLY_NEW
        failed = f"`{recover_remedy(session.host)}` makes the set whole"
        return Examined(
            inspection,
            put_back=lambda: restore_standing(session, standing),
            found=standing.change(),
            note=f"the set was partly applied ({standing.found.describe()}); now all-old"
            if partly
            else None,
            restore_failed=(
                lambda error: f"restore of the patch set failed part-way: {error}; {failed}"
            )
            if standing.is_set
            else (lambda error: f"restore failed: {error}"),
        )

    def _at_pre_image(self, session: HostSession, standing: HostStanding) -> Examined:
        """Nothing to restore, unless its server started before the file was put back (an
        earlier `--restart never`): then a restarting rollback restarts it."""
        unchanged = standing.unchanged()
        if standing.stale_server and self.restart_engine:
            return Examined(
                standing.inspection,
                put_back=lambda: unchanged,
                found=unchanged,
                note=stale_note(unchanged.path),
            )
        note = (
            "every file of the patch set is already at its pre-image; nothing to restore"
            if standing.is_set
            else "already at the pre-image; nothing to restore"
        )
        if standing.stale_server:  # told not to restart, again
            restart = remedy_text(Command.RESTART, hosts=target_of(session.host))
            note += (
                "; its server started before the file was put back and still runs the "
                f"patched code until it restarts (`{restart}`)"
            )
        return _nothing_to_do(session, note, standing.inspection, unchanged)

    def _lineage(
        self,
        host: str,
        by_path: dict[str, list[FileVersion]] | None,
        versions: Sequence[FileVersion],
    ) -> Lineage:
        """Each path's history on the inspected machine (under any inventory's name) and the
        changes to undo: for a patch, those no run took back since."""

        def lineage(
            path: str, inspection: HostInspection
        ) -> tuple[Sequence[FileVersion], Sequence[FileVersion]]:
            machine = Machine.of(inspection.facts.machine_id, inspection.facts.hostname)
            history = self.ledger.file_history(host, path, machine=machine)
            candidates = by_path[path] if by_path else list(versions)
            if self.patch is not None and self.source_run is None:
                applied = applied_versions(history, self.patch.spec.id)
                candidates = (applied or candidates) if by_path else applied
            return history, candidates

        return lineage

    def _revert_live(self, sessions: Sequence[HostSession]) -> str | None:
        """Revert the patch's live fixes before the restore (with `--restart never` nothing
        else takes them out), through `liveapply.revert_on`, apply --live's own: the head first,
        a unit's nodes read back, so a fix still listed is never said reverted. The note, None
        when none is held."""
        patch_id = self.patch_id
        live = [s for s in sessions if s.host.live]
        if not live or patch_id is None:
            return None
        nodes = Nodes(live[0], tuple(live[1:]))
        fixes: set[str] = set()
        unlisted: list[str] = []  # errors; an engine not heard from only where none is listed
        unheard_at: list[str] = []
        for session in live:
            where = "" if nodes.alone else f"{session.name}: "
            try:
                with session.step(Step.LIVE) as note:
                    held, reply = patch_fixes(session, patch_id)
                    found = sorted({h.fix_id for h in held})
                    heard = (
                        "in memory: " + ", ".join(found) if found else f"no live fix of {patch_id}"
                    )
                    unheard = unanswered(reply)  # a process not heard from may hold the fix
                    note["detail"] = reply.missing or (
                        heard if unheard is None else f"{heard} where asked; not listed: {unheard}"
                    )
            except OpspatchError as error:  # the restore must still happen: say what is unknown
                unlisted.append(f"{where}{describe_error(error)}")
                continue
            fixes.update(found)
            if unheard is not None:
                unheard_at.append(f"{where}{unheard}")
        if not fixes:
            unlisted += unheard_at
        said = (
            f"the engine's live fixes could not be listed ({'; '.join(unlisted)})"
            if unlisted
            else None
        )
        if not fixes:
            return said
        named = ", ".join(sorted(fixes))
        timeout = float(nodes.head.playbook.timeouts.smoke)
        if revert_on(nodes, sorted(fixes), timeout=timeout):
            done = f"live fix {named} reverted in every process of the engine"
        elif self.restart_engine:
            done = f"live fix {named} not reverted everywhere; the restart clears it"
        else:
            done = (
                f"live fix {named} not reverted in every process: the engine holds it in "
                "memory until it restarts"
            )
        return join_notes(said, done)

    def _way_back(self, host: str) -> str:
        patch_id = self.patch.reference if self.patch is not None else self.patch_id
        status = f"`{remedy_text(Command.STATUS, hosts=host)}` shows whether its server runs"
        if patch_id is None:
            return status
        return (
            f"`{remedy_text(Command.APPLY, patch_id, hosts=host)}` puts the change back; {status}"
        )

    def _without_record(
        self, session: HostSession, patch: LoadedPatch, inspection: HostInspection
    ) -> Examined:
        """No record here: only a host backup with exactly the pre-image `unapply` names is
        written back; anything less is refused."""
        live = inspection.file
        unchanged = FileChange(live.realpath, live.sha256, live.sha256)
        if detect(live.content, patch.spec).state != "applied":
            note = f"{patch.spec.id} is not on this host (and the ledger has no record of it)"
            return _nothing_to_do(session, note, inspection, unchanged)
        pre = unapply(live.content, patch.spec)
        if isinstance(pre, NotApplicable):
            return Examined(
                inspection,
                decided=session.outcome(
                    Outcome.SKIPPED,
                    f"refused: the ledger has no record of {patch.spec.id} on this host and it "
                    f"cannot be taken off the file alone ({pre.reason}); restore the file from "
                    "your own backup or reinstall the package",
                    file=unchanged,
                    reason=Reason.NO_RECORD,
                ),
            )
        pre_sha256 = sha256_hex(pre.old_source)

        def put_back() -> FileChange:
            try:
                return self._from_backup(session, inspection, pre_sha256)
            except RemoteOperationError as exc:
                if exc.code not in ("backup-missing", "backup-hash-mismatch"):
                    raise
                refused = session.outcome(
                    Outcome.SKIPPED,
                    f"refused: the ledger has no record of {patch.spec.id} on this host and the "
                    f"host holds no backup of its pre-image {pre_sha256[:12]} ({exc.detail}); "
                    "nothing was changed. Use the ledger that recorded the change (--ledger), or "
                    "restore the file from your own backup",
                    file=unchanged,
                    reason=Reason.NO_RECORD,
                )
                raise _NoBackup(refused, exc) from exc

        return Examined(
            inspection,
            put_back=put_back,
            found=unchanged,
            note="restored from the host's own backup (the ledger had no record of this change)",
        )

    @staticmethod
    def _from_backup(
        session: HostSession, inspection: HostInspection, pre_sha256: str
    ) -> FileChange:
        live = inspection.file
        with session.step(Step.RESTORE) as note:
            restored = session.ops.restore(
                live.realpath,
                pre_sha256=pre_sha256,
                current_sha256=live.sha256,
                timeout=session.playbook.timeouts.restore,
            )
            note["detail"] = f"back to {pre_sha256[:12]} from the host's backup"
        session.recorder.file_version(
            session.name,
            file_version(
                live,
                live.sha256,
                pre_sha256,
                pre_image=live.content,
                action=FileAction.RESTORE,
                container=session.container,
            ),
        )
        return FileChange(live.realpath, restored["sha256_before"], restored["sha256_after"])


class _NoBackup(Exception):
    """The host holds no backup: nothing was changed, the host refused (`outcome`)."""

    def __init__(self, outcome: HostOutcome, error: RemoteOperationError) -> None:
        super().__init__(error.message)
        self.outcome = outcome
        self.error = error


def _nothing_to_do(
    session: HostSession,
    note: str,
    inspection: HostInspection | None = None,
    file: FileChange | None = None,
) -> Examined:
    done = session.outcome(Outcome.SKIPPED, file=file, note=note, reason=Reason.NOTHING_TO_DO)
    return Examined(inspection, decided=done)


def _refusal_reason(standing: HostStanding) -> Reason:
    further = any(file.place == Place.PATCHED_FURTHER for file in standing.files)
    return Reason.PATCHED_FURTHER if further else Reason.CHANGED_SINCE


def _refusal(standing: HostStanding) -> str:
    reasons: list[str] = []
    for file in standing.files:
        path, live, where = file.path, file.sha256, file.located
        if file.place == Place.PATCHED_FURTHER:
            assert isinstance(where, PatchedFurther)
            reasons.append(
                f"{path}: {where.advice()}"
                if standing.is_set
                else f"{path} is {live[:12]}: the change of run {where.version.run_id} was "
                f"{where.advice()}"
            )
        elif file.place == Place.CHANGED:
            assert where is not None
            version = where.version
            tail = ")" if standing.is_set else ", e.g. sglang reinstalled); not overwriting it"
            reasons.append(
                f"{path} is {live[:12]}, not the {version.sha256_after[:12]} opspatch wrote in "
                f"run {version.run_id} (changed since{tail}"
            )
    if standing.is_set:
        return (
            "refused: a patch set is rolled back whole or not at all, and "
            + "; ".join(reasons)
            + "; nothing was restored"
        )
    return f"refused: {reasons[0]}"
