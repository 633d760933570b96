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

Both run through the fleet executor (`runs.executor`): hosts in parallel up to the playbook's
`max_in_flight`, a host that needs attention halts the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import ExitStack

from opspatch.core.host import Host
from opspatch.core.policy import Playbook
from opspatch.core.spec import LoadedPatch
from opspatch.core.vocabulary import Outcome, StepStatus
from opspatch.errors import LockHeld, OpspatchError
from opspatch.ledger.store import FileVersion, Ledger, RunDetail
from opspatch.runs.connect import TransportFactory
from opspatch.runs.executor import halt_on_attention, one_batch, run_fleet
from opspatch.runs.recorded import recorded_run
from opspatch.runs.report import FileChange, HostOutcome, RunReport
from opspatch.runs.session import (
    HostFailed,
    HostSession,
    NoProgress,
    Progress,
    describe_error,
    record_outcome,
)
from opspatch.runs.steps import (
    ready_step,
    release,
    restart_after_restore,
    restart_step,
    restore_pre_image,
    smoke_step,
)


def _restore_recorded(session: HostSession, version: FileVersion) -> FileChange:
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


def _ensure_running(session: HostSession) -> str:
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


def _run_restore(
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
    """The fleet part both restore runs share: sessions, the executor, the ledger records."""
    with ExitStack() as stack:
        sessions = {
            host.name: stack.enter_context(
                HostSession(
                    host, factory, playbook, ledger=ledger, run_id=run_id, progress=progress
                )
            )
            for host in hosts
        }

        def one(name: str) -> HostOutcome:
            session = sessions[name]
            try:
                return per_host(session)
            except LockHeld as exc:
                return session.refused(exc)
            except OpspatchError as exc:
                return session.outcome(Outcome.NEEDS_ATTENTION, describe_error(exc))
            except Exception as exc:  # a bug must not lose the other hosts' outcomes
                return session.outcome(
                    Outcome.NEEDS_ATTENTION, f"internal error: {describe_error(exc)}"
                )
            finally:
                release(session)

        names = [h.name for h in hosts]
        result = run_fleet(
            one_batch(names, playbook.max_in_flight),
            one,
            halt=halt_on_attention,
            on_outcome=lambda o: record_outcome(ledger, run_id, o),
        )
    outcomes = dict(result.outcomes)
    for name in result.not_started:
        outcomes[name] = HostOutcome(name, Outcome.SKIPPED, f"not started: {result.halted}")
        record_outcome(ledger, run_id, outcomes[name])
    return RunReport(
        run_id, command, patch_id, tuple(outcomes[n] for n in names), halted=result.halted
    )


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
        report = _run_restore(
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

    def host(self, session: HostSession) -> HostOutcome:
        versions = self.versions_for(session.name)
        what = (
            f"run {self.source_run.run_id}"
            if self.source_run
            else f"patch {self.patch.spec.id if self.patch else '?'}"
        )
        if not versions:
            return session.outcome(
                Outcome.SKIPPED, note=f"the ledger has no change by {what} on this host"
            )
        version = versions[0]
        timeouts = session.playbook.timeouts
        with session.step("begin") as note:
            _, inspection = session.ops.begin(
                path=version.path,
                run_id=session.run_id or "",
                timeout=timeouts.lock + timeouts.inspect,
            )
            note["detail"] = f"{inspection.file.realpath} is {inspection.file.sha256[:12]}"
        live = inspection.file.sha256
        if live == version.sha256_before:
            return session.outcome(
                Outcome.SKIPPED,
                file=FileChange(version.path, live, live),
                note="already at the pre-image; nothing to restore",
            )
        if live != version.sha256_after:
            return session.outcome(
                Outcome.SKIPPED,
                f"refused: {version.path} is {live[:12]}, not the {version.sha256_after[:12]} opspatch "
                f"wrote in run {version.run_id} (changed since, e.g. sglang reinstalled); not overwriting it",
                file=FileChange(version.path, live, live),
            )
        try:
            change = _restore_recorded(session, version)
        except OpspatchError as exc:
            return session.outcome(
                Outcome.NEEDS_ATTENTION, f"restore failed: {describe_error(exc)}"
            )
        if not self.restart_engine:
            return session.outcome(Outcome.RESTORED, file=change)
        try:
            restart = restart_step(session)
            ready_step(session, restart, timeout=timeouts.restore_ready)
        except HostFailed as failure:
            return session.outcome(
                Outcome.NEEDS_ATTENTION,
                f"restored, but the server does not come back: {failure.error}",
                file=change,
            )
        try:
            smoke = smoke_step(session, restart, baseline=None, must_pass=False)
        except HostFailed:
            smoke = None
        note_text = None
        if smoke is not None and not smoke.ok:
            note_text = f"smoke after restore failed (the original code may be what was broken): {smoke.summary()}"
        return session.outcome(Outcome.RESTORED, file=change, smoke=smoke, note=note_text)


# ---------------------------------------------------------------------------------------------
# recover


def recover_run(
    *,
    ledger: Ledger,
    interrupted: RunDetail,
    hosts: Sequence[Host],
    factory: TransportFactory,
    playbook: Playbook,
    patch: LoadedPatch | None,
    progress: Progress | None = None,
) -> RunReport:
    """Bring every host of an interrupted run to a known state, as a recorded `recover` run.

    Per host, from the ledger and the live file: patched and proven -> `applied`; patched but not
    proven -> restart, ready, smoke, and `applied` or restored (`rolled-back`); at the pre-image
    -> make sure the server is up, `restored`; anything else -> `needs-attention`. The patch is
    never applied twice: recover only finishes or undoes what the run already wrote.
    """
    with recorded_run(
        ledger,
        command="recover",
        patch=patch,
        hosts=hosts,
        playbook=playbook,
        parent_run=interrupted.run_id,
    ) as run:
        recover = _Recover(interrupted, patch)
        report = _run_restore(
            command="recover",
            ledger=ledger,
            run_id=run.run_id,
            hosts=hosts,
            factory=factory,
            playbook=playbook,
            progress=progress or NoProgress(),
            patch_id=interrupted.summary.patch_id,
            per_host=recover.host,
        )
        return run.finish(report)


class _Recover:
    """What a recover does on one host of an interrupted run."""

    def __init__(self, interrupted: RunDetail, patch: LoadedPatch | None) -> None:
        self.interrupted = interrupted
        self.patch = patch

    def host(self, session: HostSession) -> HostOutcome:
        try:
            record = self.interrupted.host(session.name)
        except KeyError:
            record = None
        versions = [v for v in (record.file_versions if record else ()) if v.action == "patch"]
        restores = [v for v in (record.file_versions if record else ()) if v.action == "restore"]
        takeover = self.interrupted.run_id
        timeouts = session.playbook.timeouts
        begin_timeout = timeouts.lock + timeouts.inspect
        if versions:
            version = versions[-1]
            with session.step("begin") as note:
                _, inspection = session.ops.begin(
                    path=version.path,
                    run_id=session.run_id or "",
                    takeover_run=takeover,
                    timeout=begin_timeout,
                )
                note["detail"] = f"{version.path} is {inspection.file.sha256[:12]}"
        else:
            module = self.patch.spec.target.module if self.patch else None
            if module is None:
                return session.outcome(
                    Outcome.SKIPPED, note="the interrupted run changed nothing here"
                )
            with session.step("begin") as note:
                _, inspection = session.ops.begin(
                    module,
                    run_id=session.run_id or "",
                    takeover_run=takeover,
                    timeout=begin_timeout,
                )
                note["detail"] = (
                    f"{inspection.file.realpath} is {inspection.file.sha256[:12]}; no change recorded"
                )
            how = _ensure_running(session)
            live = inspection.file.sha256
            return session.outcome(
                Outcome.RESTORED,
                file=FileChange(inspection.file.realpath, live, live),
                note=f"the interrupted run changed nothing here; server {how}",
            )
        live = inspection.file.sha256
        change = FileChange(version.path, version.sha256_before, live)
        if live == version.sha256_before:
            how = _ensure_running(session)
            state = "the file is at its pre-image" + (" (restored by the run)" if restores else "")
            return session.outcome(Outcome.RESTORED, file=change, note=f"{state}; server {how}")
        if live != version.sha256_after:
            return session.outcome(
                Outcome.NEEDS_ATTENTION,
                f"{version.path} is {live[:12]}: neither the pre-image {version.sha256_before[:12]} nor the "
                f"post-image {version.sha256_after[:12]} of run {version.run_id}",
                file=change,
            )
        proven = any(
            s.step == "smoke" and s.status == StepStatus.OK
            for s in (record.steps if record else ())
        )
        if proven:
            return session.outcome(
                Outcome.APPLIED,
                file=change,
                note="patched and smoke-tested before the interruption",
            )
        try:
            restart = restart_step(session)
            ready_step(session, restart)
            smoke = smoke_step(session, restart, baseline=None)
            return session.outcome(
                Outcome.APPLIED,
                file=change,
                smoke=smoke,
                note="finished: restarted and smoke-tested",
            )
        except HostFailed as failure:
            try:
                restored = _restore_recorded(session, version)
                restart_after_restore(session)
            except (OpspatchError, HostFailed) as exc:
                return session.outcome(
                    Outcome.NEEDS_ATTENTION,
                    f"{failure.error}; then the restore failed: {describe_error(exc)}",
                    file=change,
                )
            return session.outcome(Outcome.ROLLED_BACK, failure.error, file=restored)
