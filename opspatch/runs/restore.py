"""Putting hosts back: `rollback` (undo a patch from the ledger) and `recover` (finish or undo
what an interrupted run left behind).

Both restore only what opspatch itself wrote: a host's file is restored to the pre-image the
ledger holds when the live file still hashes to the post-image opspatch recorded; anything else
is refused for that host with the reason, because overwriting a file someone else changed since
(a reinstalled sglang, a hand edit) would lose their change.

A rollback restores, restarts, waits until ready and runs the smoke decode. A host whose file is
back byte-identically and whose server is ready is `restored` (exit 0) and its smoke result is
reported beside it: the original code may be exactly what was broken (the incident's first
decode crashes the unpatched engine).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from opspatch.core.host import Host
from opspatch.core.policy import Playbook
from opspatch.core.spec import LoadedPatch
from opspatch.errors import LockHeld, OpspatchError
from opspatch.ledger.store import FileVersion, Ledger, RunDetail
from opspatch.runs.apply import (
    APPLIED,
    NEEDS_ATTENTION,
    RESTORED,
    ROLLED_BACK,
    SKIPPED,
    FileChange,
    HostFailed,
    HostOutcome,
    HostSession,
    NoProgress,
    Progress,
    RunReport,
    TransportFactory,
    describe_error,
    ready_step,
    record_outcome,
    release,
    restart_step,
    restore_pre_image,
    smoke_step,
)


@dataclass(frozen=True)
class RestoreTarget:
    """What to undo on one host: the ledger's record of the change, or None if there is none."""

    version: FileVersion | None
    module: str | None


def _restore_recorded(session: HostSession, version: FileVersion, *, timeout: float) -> FileChange:
    """Restore `version`'s pre-image (the host's backup, else the ledger's bytes) and record it."""
    restored = restore_pre_image(
        session,
        path=version.path,
        pre_sha256=version.sha256_before,
        post_sha256=version.sha256_after,
        timeout=timeout,
        mode=version.mode,
        owner=version.owner,
    )
    return FileChange(version.path, restored.sha256_before, restored.sha256_after)


def _ensure_running(session: HostSession) -> str:
    """Make sure the server answers /health: wait for it, restart it if it does not come."""
    try:
        with session.step("ready") as note:
            ready = session.engine.wait_ready(None, step="ready")
            note["detail"] = f"/health 200 after {ready.seconds:.1f}s"
        return "already running"
    except OpspatchError:
        restart = restart_step(session, step="restart")
        ready_step(session, restart, step="ready-after-restart")
        return "restarted"


@dataclass
class RollbackFleet:
    """Restore the pre-images of a patch (or of one run) on the selected hosts."""

    ledger: Ledger
    run_id: str
    hosts: Sequence[Host]
    factory: TransportFactory
    playbook: Playbook
    patch: LoadedPatch | None = None
    source_run: RunDetail | None = None
    progress: Progress = field(default_factory=NoProgress)
    restart_engine: bool = True
    only_path: str | None = None

    def _versions_for(self, host: str) -> list[FileVersion]:
        if self.source_run is not None:
            try:
                record = self.source_run.host(host)
            except KeyError:
                return []
            return [v for v in record.file_versions if v.action == "patch"]
        assert self.patch is not None
        history = self.ledger.file_history(host, self.only_path)
        paths = []
        for version in history:
            if version.patch_id == self.patch.spec.id and version.path not in paths:
                paths.append(version.path)
        found = [self.ledger.last_applied(host, path, self.patch.spec.id) for path in paths]
        return [v for v in found if v is not None]

    def run(self) -> RunReport:
        outcomes: dict[str, HostOutcome] = {}
        halted: str | None = None
        sessions: list[HostSession] = []
        workers = self.playbook.max_in_flight or len(self.hosts) or 1
        try:
            with ThreadPoolExecutor(max_workers=max(1, min(workers, len(self.hosts) or 1))) as pool:
                pending = list(self.hosts)
                running: dict[Future[HostOutcome], str] = {}
                while pending or running:
                    while pending and len(running) < workers and not halted:
                        host = pending.pop(0)
                        session = HostSession(
                            host,
                            self.factory,
                            self.playbook,
                            ledger=self.ledger,
                            run_id=self.run_id,
                            progress=self.progress,
                        )
                        sessions.append(session)
                        running[pool.submit(self._one, session)] = host.name
                    if not running:
                        break
                    done, _ = wait(list(running), return_when=FIRST_COMPLETED)
                    for future in done:
                        name = running.pop(future)
                        outcomes[name] = future.result()
                        self._record(outcomes[name])
                        if outcomes[name].outcome == NEEDS_ATTENTION:
                            halted = f"{name} needs attention"
                    if halted:
                        pending.clear()
        finally:
            for session in sessions:
                session.close()
        for host in self.hosts:
            if host.name not in outcomes:
                outcomes[host.name] = HostOutcome(host.name, SKIPPED, f"not started: {halted}")
                self._record(outcomes[host.name])
        patch_id = (
            self.patch.spec.id
            if self.patch
            else (self.source_run.summary.patch_id if self.source_run else None)
        )
        return RunReport(
            self.run_id,
            "rollback",
            patch_id,
            tuple(outcomes[h.name] for h in self.hosts),
            halted=halted,
        )

    def _record(self, outcome: HostOutcome) -> None:
        record_outcome(self.ledger, self.run_id, outcome)

    def _one(self, session: HostSession) -> HostOutcome:
        try:
            return self._rollback_host(session)
        except OpspatchError as exc:
            return session.refused(exc)
        finally:
            release(session)

    def _rollback_host(self, session: HostSession) -> HostOutcome:
        versions = self._versions_for(session.name)
        what = (
            f"run {self.source_run.run_id}"
            if self.source_run
            else f"patch {self.patch.spec.id if self.patch else '?'}"
        )
        if not versions:
            return HostOutcome(
                session.name, SKIPPED, None, note=f"the ledger has no change by {what} on this host"
            )
        version = versions[0]
        with session.step("begin") as note:
            _, inspection = session.ops.begin(
                path=version.path,
                run_id=self.run_id,
                timeout=self.playbook.timeouts.lock + self.playbook.timeouts.inspect,
            )
            note["detail"] = f"{inspection.file.realpath} is {inspection.file.sha256[:12]}"
        live = inspection.file.sha256
        if live == version.sha256_before:
            return HostOutcome(
                session.name,
                SKIPPED,
                None,
                FileChange(version.path, live, live),
                tuple(session.steps),
                note="already at the pre-image; nothing to restore",
            )
        if live != version.sha256_after:
            return HostOutcome(
                session.name,
                SKIPPED,
                f"refused: {version.path} is {live[:12]}, not the {version.sha256_after[:12]} opspatch "
                f"wrote in run {version.run_id} (changed since, e.g. sglang reinstalled); not overwriting it",
                FileChange(version.path, live, live),
                tuple(session.steps),
            )
        try:
            change = _restore_recorded(session, version, timeout=self.playbook.timeouts.restore)
        except OpspatchError as exc:
            return HostOutcome(
                session.name,
                NEEDS_ATTENTION,
                f"restore failed: {describe_error(exc)}",
                steps=tuple(session.steps),
            )
        if not self.restart_engine:
            return HostOutcome(session.name, RESTORED, None, change, tuple(session.steps))
        try:
            restart = restart_step(session)
            ready_step(session, restart)
        except HostFailed as failure:
            return HostOutcome(
                session.name,
                NEEDS_ATTENTION,
                f"restored, but the server does not come back: {failure.error}",
                change,
                tuple(session.steps),
            )
        try:
            smoke = smoke_step(session, restart, baseline=None, must_pass=False)
        except HostFailed:
            smoke = None
        note_text = None
        if smoke is not None and not smoke.ok:
            note_text = f"smoke after restore failed (the original code may be what was broken): {smoke.summary()}"
        return HostOutcome(
            session.name, RESTORED, None, change, tuple(session.steps), smoke=smoke, note=note_text
        )


@dataclass
class RecoverRun:
    """Bring every host of an interrupted run to a known state.

    Per host, from the ledger and the live file: patched and proven -> `applied`; patched but not
    proven -> restart, ready, smoke, and `applied` or restored (`rolled-back`); at the pre-image ->
    make sure the server is up, `restored`; anything else -> `needs-attention`. The patch is never
    applied twice: recover only finishes or undoes what the run already wrote.
    """

    ledger: Ledger
    run_id: str
    interrupted: RunDetail
    hosts: Sequence[Host]
    factory: TransportFactory
    playbook: Playbook
    patch: LoadedPatch | None
    progress: Progress = field(default_factory=NoProgress)

    def run(self) -> RunReport:
        outcomes = []
        for host in self.hosts:
            session = HostSession(
                host,
                self.factory,
                self.playbook,
                ledger=self.ledger,
                run_id=self.run_id,
                progress=self.progress,
            )
            try:
                outcome = self._recover_host(session)
            except LockHeld as exc:
                outcome = session.refused(exc)
            except OpspatchError as exc:
                outcome = HostOutcome(
                    host.name, NEEDS_ATTENTION, describe_error(exc), steps=tuple(session.steps)
                )
            finally:
                release(session)
                session.close()
            outcomes.append(outcome)
            record_outcome(self.ledger, self.run_id, outcome)
        patch_id = self.interrupted.summary.patch_id
        return RunReport(self.run_id, "recover", patch_id, tuple(outcomes))

    def _recover_host(self, session: HostSession) -> HostOutcome:
        try:
            record = self.interrupted.host(session.name)
        except KeyError:
            record = None
        versions = [v for v in (record.file_versions if record else ()) if v.action == "patch"]
        restores = [v for v in (record.file_versions if record else ()) if v.action == "restore"]
        takeover = self.interrupted.run_id
        if versions:
            version = versions[-1]
            with session.step("begin") as note:
                _, inspection = session.ops.begin(
                    path=version.path,
                    run_id=self.run_id,
                    takeover_run=takeover,
                    timeout=self.playbook.timeouts.lock + self.playbook.timeouts.inspect,
                )
                note["detail"] = f"{version.path} is {inspection.file.sha256[:12]}"
        else:
            module = self.patch.spec.target.module if self.patch else None
            if module is None:
                return HostOutcome(
                    session.name, SKIPPED, None, note="the interrupted run changed nothing here"
                )
            with session.step("begin") as note:
                _, inspection = session.ops.begin(
                    module,
                    run_id=self.run_id,
                    takeover_run=takeover,
                    timeout=self.playbook.timeouts.lock + self.playbook.timeouts.inspect,
                )
                note["detail"] = (
                    f"{inspection.file.realpath} is {inspection.file.sha256[:12]}; no change recorded"
                )
            how = _ensure_running(session)
            return HostOutcome(
                session.name,
                RESTORED,
                None,
                FileChange(
                    inspection.file.realpath, inspection.file.sha256, inspection.file.sha256
                ),
                tuple(session.steps),
                note=f"the interrupted run changed nothing here; server {how}",
            )
        live = inspection.file.sha256
        change = FileChange(version.path, version.sha256_before, live)
        if live == version.sha256_before:
            how = _ensure_running(session)
            state = "the file is at its pre-image" + (" (restored by the run)" if restores else "")
            return HostOutcome(
                session.name,
                RESTORED,
                None,
                change,
                tuple(session.steps),
                note=f"{state}; server {how}",
            )
        if live != version.sha256_after:
            return HostOutcome(
                session.name,
                NEEDS_ATTENTION,
                f"{version.path} is {live[:12]}: neither the pre-image {version.sha256_before[:12]} nor the "
                f"post-image {version.sha256_after[:12]} of run {version.run_id}",
                change,
                tuple(session.steps),
            )
        proven = any(
            s.step == "smoke" and s.status == "ok" for s in (record.steps if record else ())
        )
        if proven:
            return HostOutcome(
                session.name,
                APPLIED,
                None,
                change,
                tuple(session.steps),
                note="patched and smoke-tested before the interruption",
            )
        try:
            restart = restart_step(session)
            ready_step(session, restart)
            smoke = smoke_step(session, restart, baseline=None)
            return HostOutcome(
                session.name,
                APPLIED,
                None,
                change,
                tuple(session.steps),
                smoke=smoke,
                note="finished: restarted and smoke-tested",
            )
        except HostFailed as failure:
            try:
                restored = _restore_recorded(
                    session, version, timeout=self.playbook.timeouts.restore
                )
                restart = restart_step(session, step="restart-after-restore")
                ready_step(session, restart, step="ready-after-restore")
            except (OpspatchError, HostFailed) as exc:
                return HostOutcome(
                    session.name,
                    NEEDS_ATTENTION,
                    f"{failure.error}; then the restore failed: {describe_error(exc)}",
                    change,
                    tuple(session.steps),
                )
            return HostOutcome(
                session.name, ROLLED_BACK, failure.error, restored, tuple(session.steps)
            )
