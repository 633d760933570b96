"""Putting hosts back: `rollback` (undo a patch from the ledger), and what `recover`
(`runs.recover`) shares with it.

Both restore only what opspatch itself wrote: a host's file is restored to the pre-image the
ledger holds when the live file still hashes to the post-image opspatch recorded; anything else
is refused for that host with the reason, because overwriting a file someone else changed since
(a reinstalled sglang, a hand edit) would lose their change.

A rollback restores, restarts, waits until ready and runs the smoke decode. A host whose file is
back byte-identically and whose server is ready is `restored` (exit 0) and its smoke result is
reported beside it: the original code may be exactly what was broken (the incident's first
decode crashes the unpatched engine).

Both run through the fleet executor (`runs.executor`): hosts in parallel up to the playbook's
`max_in_flight`, a host that needs attention halts the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from opspatch.core.edit import NotApplicable, detect, unapply
from opspatch.core.host import Host
from opspatch.core.policy import Playbook
from opspatch.core.source import sha256_hex
from opspatch.core.spec import LoadedPatch
from opspatch.core.vocabulary import Outcome
from opspatch.errors import OpspatchError, RemoteOperationError
from opspatch.hosts.operations import HostInspection
from opspatch.ledger.lineage import (
    AtPostImage,
    AtPreImage,
    PatchedFurther,
    applied_versions,
    locate,
)
from opspatch.ledger.store import FileVersion, Ledger, Machine, RunDetail
from opspatch.runs.connect import TransportFactory
from opspatch.runs.executor import halt_on_attention, one_batch
from opspatch.runs.fleetrun import FleetRun
from opspatch.runs.recorded import recorded_run
from opspatch.runs.report import FileChange, HostOutcome, RunReport
from opspatch.runs.session import (
    HostFailed,
    HostSession,
    NoProgress,
    Progress,
    describe_error,
)
from opspatch.runs.steps import (
    ready_step,
    restart_step,
    restore_pre_image,
    smoke_step,
)


def restore_recorded(session: HostSession, version: FileVersion) -> FileChange:
    """Restore `version`'s pre-image (the host's backup, else the ledger's bytes) and record it."""
    restored = restore_pre_image(
        session,
        path=version.path,
        pre_sha256=version.sha256_before,
        post_sha256=version.sha256_after,
        timeout=session.playbook.timeouts.restore,
        mode=version.mode,
        owner=version.owner,
    )
    return FileChange(version.path, restored.sha256_before, restored.sha256_after)


def ensure_running(session: HostSession) -> str:
    """Make sure the server answers /health: wait for it, restart it if it does not come."""
    try:
        ready_step(session, None, step="ready")
        return "already running"
    except HostFailed:
        restart = restart_step(session, step="restart")
        ready_step(
            session,
            restart,
            step="ready-after-restart",
            timeout=session.playbook.timeouts.restore_ready,
        )
        return "restarted"


def run_restore(
    *,
    command: str,
    ledger: Ledger,
    run_id: str,
    hosts: Sequence[Host],
    factory: TransportFactory,
    playbook: Playbook,
    progress: Progress,
    patch_id: str | None,
    per_host: Callable[[HostSession], HostOutcome],
) -> RunReport:
    """The fleet part of the restore runs (rollback, recover, unlock): one batch, halted by a
    host that needs attention."""
    with FleetRun(
        command=command,
        patch_id=patch_id,
        hosts=hosts,
        factory=factory,
        playbook=playbook,
        ledger=ledger,
        run_id=run_id,
        progress=progress,
    ) as fleet:
        outcomes, halted = fleet.execute(
            per_host,
            batches=one_batch(fleet.names, playbook.max_in_flight),
            halt=halt_on_attention,
        )
        return fleet.report(outcomes, halted=halted)


# ---------------------------------------------------------------------------------------------
# rollback


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
    only_path: str | None = None,
) -> RunReport:
    """Restore the pre-images of `patch` (or of the run `source_run`) on `hosts`, recorded.

    Raises (before any host is touched):
        LedgerIntegrityError: the ledger's chain is broken.
    """
    if (patch is None) == (source_run is None):
        raise ValueError("rollback_hosts takes exactly one of patch or source_run")
    patch_id = patch.spec.id if patch else (source_run.summary.patch_id if source_run else None)
    with recorded_run(
        ledger,
        command="rollback",
        patch=patch,
        hosts=hosts,
        playbook=playbook,
        parent_run=source_run.run_id if source_run else None,
    ) as run:
        rollback = _Rollback(ledger, patch, source_run, restart_engine, only_path)
        report = run_restore(
            command="rollback",
            ledger=ledger,
            run_id=run.run_id,
            hosts=hosts,
            factory=factory,
            playbook=playbook,
            progress=progress or NoProgress(),
            patch_id=patch_id,
            per_host=rollback.host,
        )
        return run.finish(report)


class _Rollback:
    """What a rollback does on one host."""

    def __init__(
        self,
        ledger: Ledger,
        patch: LoadedPatch | None,
        source_run: RunDetail | None,
        restart_engine: bool,
        only_path: str | None,
    ) -> None:
        self.ledger = ledger
        self.patch = patch
        self.source_run = source_run
        self.restart_engine = restart_engine
        self.only_path = only_path

    def versions_for(self, host: str) -> list[FileVersion]:
        """The changes to undo on `host`, of one path (the first that has any), newest first:
        every change the patch made there (a patch applied twice is undone one run at a time),
        or the run's own."""
        if self.source_run is not None:
            try:
                record = self.source_run.host(host)
            except KeyError:
                return []
            if record.outcome == Outcome.FAILED:  # nothing changed there (the swap was refused)
                return []
            found = [
                v
                for v in reversed(record.file_versions)
                if v.action == "patch" and self.only_path in (None, v.path)
            ]
            return [v for v in found if v.path == found[0].path]
        assert self.patch is not None
        history = self.ledger.file_history(host, self.only_path)
        paths = list(dict.fromkeys(v.path for v in history if v.patch_id == self.patch.spec.id))
        for path in paths:
            found = applied_versions(self.ledger.file_history(host, path), self.patch.spec.id)
            if found:
                return found
        return []

    def host(self, session: HostSession) -> HostOutcome:
        candidates = self.versions_for(session.name)
        if not candidates and self.source_run is not None:
            return session.outcome(
                Outcome.SKIPPED,
                note=f"the ledger has no change by run {self.source_run.run_id} on this host",
            )
        timeouts = session.playbook.timeouts
        with session.step("begin") as note:
            _, inspection = session.ops.begin(
                None if candidates or self.patch is None else self.patch.spec.target.module,
                path=candidates[0].path if candidates else None,
                run_id=session.run_id or "",
                timeout=timeouts.lock + timeouts.inspect,
            )
            note["detail"] = f"{inspection.file.realpath} is {inspection.file.sha256[:12]}"
        if session.ledger is not None and session.run_id is not None:
            # what the machine is, so later lookups through another inventory find this run
            session.ledger.record_facts(session.run_id, session.name, inspection.facts.to_json())
        path = candidates[0].path if candidates else inspection.file.realpath
        history = self.ledger.file_history(
            session.name,
            path,
            machine=Machine.of(inspection.facts.machine_id, inspection.facts.hostname),
        )
        if self.patch is not None and self.source_run is None:
            # the same machine's changes recorded under another inventory's name count too
            candidates = applied_versions(history, self.patch.spec.id)
        if not candidates:
            assert self.patch is not None
            return self._without_record(session, self.patch, inspection)
        live = inspection.file.sha256
        unchanged = FileChange(path, live, live)
        standing = locate(history, candidates, live)
        if isinstance(standing, AtPreImage):
            return session.outcome(
                Outcome.SKIPPED, file=unchanged, note="already at the pre-image; nothing to restore"
            )
        if isinstance(standing, PatchedFurther):
            return session.outcome(
                Outcome.SKIPPED,
                f"refused: {path} is {live[:12]}: the change of run {standing.version.run_id} was "
                f"{standing.advice()}",
                file=unchanged,
            )
        if not isinstance(standing, AtPostImage):
            version = candidates[0]  # ChangedSince: the newest change was overwritten since
            return session.outcome(
                Outcome.SKIPPED,
                f"refused: {path} is {live[:12]}, not the {version.sha256_after[:12]} opspatch "
                f"wrote in run {version.run_id} (changed since, e.g. sglang reinstalled); not overwriting it",
                file=unchanged,
            )
        version = standing.version
        try:
            change = restore_recorded(session, version)
        except OpspatchError as exc:
            return session.outcome(
                Outcome.NEEDS_ATTENTION, f"restore failed: {describe_error(exc)}"
            )
        return self._restart_and_prove(session, change, note=None)

    def _restart_and_prove(
        self, session: HostSession, change: FileChange, *, note: str | None
    ) -> HostOutcome:
        """After a restore: restart, wait (the restore path's own deadline), smoke-decode. The
        host is `restored` once its file is back and its server ready; the smoke is reported
        beside it (the original code may be exactly what was broken)."""
        if not self.restart_engine:
            return session.outcome(Outcome.RESTORED, file=change, note=note)
        try:
            restart = restart_step(session)
            ready_step(session, restart, timeout=session.playbook.timeouts.restore_ready)
        except HostFailed as failure:
            return session.outcome(
                Outcome.NEEDS_ATTENTION,
                f"restored, but the server does not come back: {failure.error}",
                file=change,
            )
        try:
            smoke = smoke_step(session, restart, baseline=None, must_pass=False, last=True)
        except HostFailed:
            smoke = None
        notes = [note] if note else []
        if smoke is not None and not smoke.ok:
            notes.append(
                "smoke after restore failed (the original code may be what was broken): "
                + smoke.summary()
            )
        return session.outcome(
            Outcome.RESTORED, file=change, smoke=smoke, note="; ".join(notes) or None
        )

    def _without_record(
        self, session: HostSession, patch: LoadedPatch, inspection: HostInspection
    ) -> HostOutcome:
        """Roll back a patch the ledger has no record of on this host (the ledger was deleted,
        or the change was made from another controller): only from the host's own backup.

        The file must carry the patch; taking the patch off the file alone (`unapply`, proven
        by re-applying) names the pre-image, and only a host backup with exactly that sha256
        is written back. Anything less is refused: a rollback that did not happen is never
        reported as done.
        """
        timeouts = session.playbook.timeouts
        live = inspection.file
        unchanged = FileChange(live.realpath, live.sha256, live.sha256)
        if detect(live.content, patch.spec).state != "applied":
            return session.outcome(
                Outcome.SKIPPED,
                file=unchanged,
                note=f"{patch.spec.id} is not on this host (and the ledger has no record of it)",
            )
        pre = unapply(live.content, patch.spec)
        if isinstance(pre, NotApplicable):
            return session.outcome(
                Outcome.SKIPPED,
                f"refused: the ledger has no record of {patch.spec.id} on this host and it cannot "
                f"be taken off the file alone ({pre.reason}); restore the file from your own "
                "backup or reinstall the package",
                file=unchanged,
            )
        pre_sha256 = sha256_hex(pre.old_source)
        try:
            with session.step("restore") as note:
                restored = session.ops.restore(
                    live.realpath,
                    pre_sha256=pre_sha256,
                    current_sha256=live.sha256,
                    timeout=timeouts.restore,
                )
                note["detail"] = f"back to {pre_sha256[:12]} from the host's backup"
        except RemoteOperationError as exc:
            if exc.code not in ("backup-missing", "backup-hash-mismatch"):
                raise
            return session.outcome(
                Outcome.SKIPPED,
                f"refused: the ledger has no record of {patch.spec.id} on this host and the host "
                f"holds no backup of its pre-image {pre_sha256[:12]} ({exc.detail}); nothing was "
                "changed. Use the ledger that recorded the change (--ledger), or restore the file "
                "from your own backup",
                file=unchanged,
            )
        if session.ledger is not None and session.run_id is not None:
            session.ledger.record_file_version(
                session.run_id,
                session.name,
                path=live.realpath,
                sha256_before=live.sha256,
                sha256_after=pre_sha256,
                mode=live.mode,
                owner=f"{live.owner or live.uid}:{live.group or live.gid}",
                pre_image=live.content,
                action="restore",
            )
        change = FileChange(live.realpath, restored.sha256_before, restored.sha256_after)
        how = "restored from the host's own backup (the ledger had no record of this change)"
        return self._restart_and_prove(session, change, note=how)
