"""Putting hosts back: `rollback` (undo a patch from the ledger), and what `recover`
(`runs.commands.recover`) shares with it.

Both restore only what opspatch itself wrote: a host's file is restored to the pre-image the
ledger holds when the live file still hashes to the post-image opspatch recorded; anything else
is refused for that host with the reason, because overwriting a file someone else changed since
(a reinstalled sglang, a hand edit) would lose their change.

A rollback restores, restarts, waits until ready and runs the smoke decode. A host whose file is
back byte-identically and whose server is ready and decodes is `restored` (exit 0); when the
smoke fails it is `restored-not-serving` (exit 1), with the smoke's failures and the way back:
the original code may be exactly what was broken (the incident's first decode crashes the
unpatched engine, so the rollback's decode leaves it down). The decode is sent all the same
(docs/architecture.md, "Proving a restore"): it is the only proof of what the host serves, and a
server that would crash on the first request is better found down by the rollback than by the
first user. So a rollback runs under the playbook as an apply does (canary first, then its
batches, `max_failures`; `restored-not-serving` counts as failed): under the default playbook a
host whose restored file is not served halts the run, as a failed canary halts an apply, since
rolling more hosts back the same way would take their servers down too; an operator's playbook
that allows more is honoured. A rollback's preflight reads every host first, so that a host it
refuses (its file changed since) is reported with its reason whatever halts the run.
Told not to restart (`--restart never`, for a host whose inventory sets no engine restart), a
rollback restores the files only (in the playbook's batches; no server is restarted), and each
host is `staged-back` (exit 0) once its files are back.

Both run through the fleet executor (`runs.fleet.executor`): hosts in parallel up to the playbook's
`max_in_flight`; for recover and unlock, one batch that a host that needs attention, or whose
restored file is not served, halts.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from opspatch.core.edit import NotApplicable, detect, unapply
from opspatch.core.host import Host
from opspatch.core.policy import Playbook, plan_rollout
from opspatch.core.source import sha256_hex
from opspatch.core.spec import LoadedPatch
from opspatch.core.vocabulary import Command, FileAction, Outcome, SetState, Step
from opspatch.errors import OpspatchError, RemoteOperationError
from opspatch.hosts.engine import RestartResult
from opspatch.hosts.operations import HostInspection
from opspatch.ledger.lineage import (
    AtPostImage,
    AtPreImage,
    PatchedFurther,
    applied_versions,
    locate,
)
from opspatch.ledger.store import FileVersion, Ledger, Machine, RunDetail
from opspatch.runs.fleet.connect import TransportFactory
from opspatch.runs.fleet.executor import HaltPolicy, halt_on_attention, one_batch
from opspatch.runs.fleet.fleetrun import FleetRun
from opspatch.runs.fleet.host_leases import host_identity
from opspatch.runs.fleet.recorded import recorded_run
from opspatch.runs.fleet.recorder import Recorder
from opspatch.runs.fleet.session import (
    HostFailed,
    HostSession,
    NoProgress,
    Progress,
    describe_error,
)
from opspatch.runs.fleet.steps import (
    readmit,
    ready_step,
    restart_step,
    restore_pre_image,
    smoke_after_restore,
)
from opspatch.runs.judgments.patchset import Member, SetOnHost, paths_of, read_live
from opspatch.runs.report import FileChange, HostOutcome, RunReport


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


def restore_set(session: HostSession, found: SetOnHost) -> FileChange:
    """Put every new file of a patch set back at its recorded pre-image, the last swapped
    first; the set as it then is (all-old).

    Raises:
        OpspatchError: a restore failed (the files restored before it stay restored).
    """
    for member in reversed(found.new):
        restore_recorded(session, member.version)
    return found.all_old()


def ensure_running(session: HostSession) -> str:
    """Make sure the server answers /health: wait for it, restart it if it does not come.
    Behind a router, a worker that a crashed run left drained is re-admitted only once it is
    ready and its smoke decode passes (`readmit`); otherwise it stays out, and the answer (and
    the host's outcome) says why."""
    restart: RestartResult | None = None
    try:
        ready_step(session, None, step=Step.READY)
        how = "already running"
    except HostFailed:
        restart = restart_step(session, step=Step.RESTART)
        ready_step(
            session,
            restart,
            step=Step.READY_AFTER_RESTART,
            timeout=session.playbook.timeouts.restore_ready,
        )
        how = "restarted"
    readmit(session, restart)
    return how


def halt_on_attention_or_not_serving(outcomes: Mapping[str, HostOutcome]) -> str | None:
    """The restore runs' halt policy: a host that needs attention, or one whose restored file
    its server does not serve (the same restore elsewhere would take those servers down too)."""
    attention = halt_on_attention(outcomes)
    if attention:
        return attention
    down = not_serving(outcomes)
    if down:
        return f"the restored file is not served on {down} (its smoke decode failed); " + LEFT
    return None


LEFT = "the other hosts were left as they are"


def not_serving(outcomes: Mapping[str, HostOutcome]) -> str | None:
    """The hosts whose restored file their server does not serve, as text (None: none)."""
    down = sorted(n for n, o in outcomes.items() if o.outcome == Outcome.RESTORED_NOT_SERVING)
    return ", ".join(down) if down else None


def halt_under_playbook(playbook: Playbook, canaries: Collection[str]) -> HaltPolicy:
    """A rollback's halt policy: the playbook's, as for an apply (a host that needs attention,
    a failed canary, `max_failures` failed hosts; `restored-not-serving` counts as failed), the
    reason saying which restored files are not served. The default playbook (one canary,
    `max_failures = 1`) halts at the first host whose restored file is not served; an operator's
    playbook with more room is honoured."""

    def halt(outcomes: Mapping[str, HostOutcome]) -> str | None:
        reason = playbook.halt_reason(
            {n: o.outcome for n, o in outcomes.items()}, canaries=canaries
        )
        down = not_serving(outcomes)
        if reason is None or down is None or halt_on_attention(outcomes):
            return reason
        return (
            f"the restored file is not served on {down} (its smoke decode failed): {reason}; {LEFT}"
        )

    return halt


def run_restore(
    *,
    command: Command,
    recorder: Recorder,
    hosts: Sequence[Host],
    factory: TransportFactory,
    playbook: Playbook,
    progress: Progress,
    patch_id: str | None,
    per_host: Callable[[HostSession], HostOutcome],
    preflight: Callable[[HostSession], Examined] | None = None,
    under_playbook: bool = False,
    leases: Mapping[str, str] | None = None,
    taking_over: Collection[str] = (),
) -> RunReport:
    """The fleet part of the restore runs (rollback, recover, unlock), halted by a host that
    needs attention or whose restored file its server does not serve.

    `preflight` (a rollback): read every host first, changing nothing; a host it decides there
    (a refusal, nothing to restore, unreadable) is reported and recorded with that outcome
    whatever halts the run later, and is never started (`FleetRun.decide`); every host it read
    is leased by the identity it read (the lease check comes first), and only the others are
    looked for at their router. `under_playbook` (a rollback): the other
    hosts go in the playbook's batches, canaries first, halted as an apply is
    (`halt_under_playbook`); otherwise in one batch, halted at the first host that needs
    attention or whose restored file is not served. The hosts are leased to this run first
    (`FleetRun.lease`; unlock leases nothing); `leases` (host name -> identity): the ones a
    recover --run takes over from the runs it recovers (expired, or of `taking_over`, runs
    this machine saw die)."""
    with FleetRun(
        command=command,
        patch_id=patch_id,
        hosts=hosts,
        factory=factory,
        playbook=playbook,
        recorder=recorder,
        progress=progress,
    ) as fleet:
        known = dict(leases or {})
        decided: dict[str, HostOutcome] = {}
        if preflight is not None:
            examined = fleet.preflight(preflight)
            if examined is None:
                return fleet.cancelled_report()
            for name, seen in examined.items():
                if seen.decided is not None:
                    decided[name] = seen.decided
                if seen.inspection is not None:  # a decided host too: the lease check comes first
                    known[name] = host_identity(fleet.sessions[name].host, seen.inspection.facts)
            fleet.decide(decided)
        names = [name for name in fleet.names if name not in decided]
        refused = fleet.lease(known, taking_over=taking_over, restarting=names)
        if refused is not None:
            return refused
        policy: HaltPolicy = halt_on_attention_or_not_serving
        if under_playbook:
            plan = plan_rollout(playbook, names)
            batches = plan.batches
            policy = halt_under_playbook(playbook, plan.canaries)
        else:
            batches = one_batch(names, playbook.max_in_flight)

        def halt(outcomes: Mapping[str, HostOutcome]) -> str | None:
            # what the preflight decided changed nothing: it stops no restore elsewhere
            return policy({n: o for n, o in outcomes.items() if n not in decided})

        outcomes, halted = fleet.execute(per_host, batches=batches, halt=halt)
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
    unrestarted: Outcome = Outcome.STAGED_BACK,
    only_paths: Collection[str] | None = None,
) -> RunReport:
    """Restore the pre-images of `patch` (or of the run `source_run`) on `hosts`, recorded.

    `restart_engine=False` restores the files only: a restored host is then `unrestarted`
    (`staged-back` on a fleet, whose servers still run the code they loaded; `restored` for
    local files, which have no server). `only_paths`: the files to consider (local files: the
    one file, or a tree's files), all of the host's otherwise.

    Raises (before any host is touched):
        LedgerIntegrityError: the ledger's chain is broken.
    """
    if (patch is None) == (source_run is None):
        raise ValueError("rollback_hosts takes exactly one of patch or source_run")
    patch_id = patch.spec.id if patch else (source_run.summary.patch_id if source_run else None)
    with recorded_run(
        ledger,
        command=Command.ROLLBACK,
        patch=patch,
        hosts=hosts,
        playbook=playbook,
        parent_run=source_run.run_id if source_run else None,
    ) as run:
        rollback = _Rollback(
            ledger,
            patch,
            source_run,
            restart_engine,
            unrestarted,
            frozenset(only_paths) if only_paths is not None else None,
        )
        report = run_restore(
            command=Command.ROLLBACK,
            recorder=run,
            hosts=hosts,
            factory=factory,
            playbook=playbook,
            progress=progress or NoProgress(),
            patch_id=patch_id,
            per_host=rollback.host,
            preflight=rollback.preflight,
            under_playbook=True,
        )
        return run.finish(report)


@dataclass(frozen=True)
class Examined:
    """What a restore run found on one host before changing it: the inspection (None: decided
    from the ledger alone, or the host could not be read) and either the outcome it decided
    there (nothing to restore, or a refusal with its reason) or the restore to make."""

    inspection: HostInspection | None
    decided: HostOutcome | None = None
    restore: Callable[[], HostOutcome] | None = None

    @classmethod
    def left(cls, outcome: HostOutcome) -> Examined:
        """Decided without reading the host."""
        return cls(None, decided=outcome)


class _Rollback:
    """What a rollback does on one host."""

    def __init__(
        self,
        ledger: Ledger,
        patch: LoadedPatch | None,
        source_run: RunDetail | None,
        restart_engine: bool,
        unrestarted: Outcome,
        only_paths: frozenset[str] | None,
    ) -> None:
        self.ledger = ledger
        self.patch = patch
        self.source_run = source_run
        self.restart_engine = restart_engine
        self.unrestarted = unrestarted
        self.only_paths = only_paths

    def _considered(self, path: str) -> bool:
        return self.only_paths is None or path in self.only_paths

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
                if v.action == FileAction.PATCH and self._considered(v.path)
            ]
            return [v for v in found if v.path == found[0].path]
        assert self.patch is not None
        history = self.ledger.file_history(host)
        paths = list(
            dict.fromkeys(
                v.path
                for v in history
                if v.patch_id == self.patch.spec.id and self._considered(v.path)
            )
        )
        for path in paths:
            found = applied_versions(self.ledger.file_history(host, path), self.patch.spec.id)
            if found:
                return found
        return []

    def set_versions(self, host: str) -> dict[str, list[FileVersion]]:
        """A patch set's changes to undo on `host`, by path (two or more paths; else empty):
        the run's own, or every change the set's patch made to each of its files."""
        if self.source_run is not None:
            try:
                record = self.source_run.host(host)
            except KeyError:
                return {}
            if record.outcome == Outcome.FAILED:
                return {}
            found = [v for v in reversed(record.file_versions) if v.action == FileAction.PATCH]
        elif self.patch is not None and self.patch.is_set:
            found = [
                v
                for v in self.ledger.file_history(host)
                if v.patch_id == self.patch.spec.id and v.action == FileAction.PATCH
            ]
        else:
            return {}
        found = [v for v in found if self._considered(v.path)]
        by_path: dict[str, list[FileVersion]] = {}
        for path in paths_of(found):
            by_path[path] = [v for v in found if v.path == path]
        return by_path if len(by_path) > 1 else {}

    def preflight(self, session: HostSession) -> Examined:
        """What the rollback will do on this host, read before any host is changed (no lock
        taken): a host it would refuse (its file changed since, patched further) or leave alone
        is decided here, so that it is reported with its reason whatever halts the run later."""
        try:
            return self._examine(session, lock=False)
        except OpspatchError as exc:
            return Examined(None, decided=session.refused(exc))

    def host(self, session: HostSession) -> HostOutcome:
        """Lock, read the file again (it may have changed since the preflight), restore, prove."""
        examined = self._examine(session, lock=True)
        if examined.restore is None:
            assert examined.decided is not None
            return examined.decided
        return examined.restore()

    def _inspect(
        self, session: HostSession, module: str | None, path: str | None, *, lock: bool
    ) -> HostInspection:
        """The host's file (and facts): `begin` (lock + inspect in one exec) when about to
        change it, a plain `inspect` in the preflight; the preflight records the facts."""
        timeouts = session.playbook.timeouts
        with session.step(Step.BEGIN if lock else Step.INSPECT) as note:
            if lock:
                _, inspection = session.ops.begin(
                    module,
                    path=path,
                    run_id=session.lock.taking(),
                    timeout=timeouts.lock + timeouts.inspect,
                )
            else:
                inspection = session.ops.inspect(module, path=path, timeout=timeouts.inspect)
            note["detail"] = f"{inspection.file.realpath} is {inspection.file.sha256[:12]}"
        if not lock:
            # what the machine is, so later lookups through another inventory find this run
            session.recorder.facts(session.name, inspection.facts)
        return inspection

    def _examine(self, session: HostSession, *, lock: bool) -> Examined:
        by_path = self.set_versions(session.name)
        if by_path:
            return self._examine_set(session, by_path, lock=lock)
        if self.patch is not None and self.patch.is_set:
            return Examined.left(
                session.outcome(
                    Outcome.SKIPPED,
                    note=f"the ledger has no change by the patch set {self.patch.spec.id} on "
                    "this host (a set is rolled back from the ledger's record only)",
                )
            )
        candidates = self.versions_for(session.name)
        if not candidates and self.source_run is not None:
            return Examined.left(
                session.outcome(
                    Outcome.SKIPPED,
                    note=f"the ledger has no change by run {self.source_run.run_id} on this host",
                )
            )
        inspection = self._inspect(
            session,
            None if candidates or self.patch is None else self.patch.spec.target.module,
            candidates[0].path if candidates else None,
            lock=lock,
        )
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
            return Examined(
                inspection,
                decided=session.outcome(
                    Outcome.SKIPPED,
                    file=unchanged,
                    note="already at the pre-image; nothing to restore",
                ),
            )
        if isinstance(standing, PatchedFurther):
            return Examined(
                inspection,
                decided=session.outcome(
                    Outcome.SKIPPED,
                    f"refused: {path} is {live[:12]}: the change of run "
                    f"{standing.version.run_id} was {standing.advice()}",
                    file=unchanged,
                ),
            )
        if not isinstance(standing, AtPostImage):
            version = candidates[0]  # ChangedSince: the newest change was overwritten since
            return Examined(
                inspection,
                decided=session.outcome(
                    Outcome.SKIPPED,
                    f"refused: {path} is {live[:12]}, not the {version.sha256_after[:12]} "
                    f"opspatch wrote in run {version.run_id} (changed since, e.g. sglang "
                    "reinstalled); not overwriting it",
                    file=unchanged,
                ),
            )
        found = standing.version

        def restore() -> HostOutcome:
            try:
                change = restore_recorded(session, found)
            except OpspatchError as exc:
                return session.outcome(
                    Outcome.NEEDS_ATTENTION, f"restore failed: {describe_error(exc)}"
                )
            return self._restart_and_prove(session, change, note=None)

        return Examined(inspection, restore=restore)

    def _examine_set(
        self, session: HostSession, by_path: dict[str, list[FileVersion]], *, lock: bool
    ) -> Examined:
        """Roll a patch set back on one host: every file it changed is restored, or none.

        Each file must be at a post-image the set recorded (restored) or at its pre-image (left
        alone: a set a run left partly applied is made whole); a file patched further or
        changed since refuses the whole host, with nothing written."""
        paths = list(by_path)
        inspection = self._inspect(session, None, paths[0], lock=lock)
        machine = Machine.of(inspection.facts.machine_id, inspection.facts.hostname)
        live = read_live(session, paths, {inspection.file.realpath: inspection.file.sha256})
        members: list[Member] = []
        refusals: list[str] = []
        for path in paths:
            history = self.ledger.file_history(session.name, path, machine=machine)
            candidates = by_path[path]
            if self.source_run is None and self.patch is not None:
                candidates = applied_versions(history, self.patch.spec.id) or candidates
            standing = locate(history, candidates, live[path])
            if isinstance(standing, (AtPostImage, AtPreImage)):
                members.append(Member(standing.version, live[path]))
            elif isinstance(standing, PatchedFurther):
                members.append(Member(standing.version, live[path]))
                refusals.append(f"{path}: {standing.advice()}")
            else:
                version = candidates[0]
                members.append(Member(version, live[path]))
                refusals.append(
                    f"{path} is {live[path][:12]}, not the {version.sha256_after[:12]} opspatch "
                    f"wrote in run {version.run_id} (changed since)"
                )
        found = SetOnHost(tuple(members))
        if refusals:
            return Examined(
                inspection,
                decided=session.outcome(
                    Outcome.SKIPPED,
                    "refused: a patch set is rolled back whole or not at all, and "
                    + "; ".join(refusals)
                    + "; nothing was restored",
                    file=found.change(),
                ),
            )
        if not found.new:
            return Examined(
                inspection,
                decided=session.outcome(
                    Outcome.SKIPPED,
                    file=found.change(),
                    note="every file of the patch set is already at its pre-image; nothing to "
                    "restore",
                ),
            )

        def restore() -> HostOutcome:
            try:
                restored = restore_set(session, found)
            except OpspatchError as exc:
                return session.outcome(
                    Outcome.NEEDS_ATTENTION,
                    f"restore of the patch set failed part-way: {describe_error(exc)}; "
                    f"`opspatch recover --hosts {session.name}` makes the set whole",
                    file=found.change(),
                )
            partly = (
                f"the set was partly applied ({found.describe()}); now all-old"
                if found.state == SetState.PARTLY_APPLIED
                else None
            )
            return self._restart_and_prove(session, restored, note=partly)

        return Examined(inspection, restore=restore)

    def _restart_and_prove(
        self, session: HostSession, change: FileChange, *, note: str | None
    ) -> HostOutcome:
        """After a restore: restart, wait (the restore path's own deadline), smoke-decode. The
        host is `restored` once its file is back and its server ready and decoding; a failed
        smoke makes it `restored-not-serving` (exit 1): the original code may be exactly what
        was broken, and a server the decode crashed is down. Told not to restart, the host is
        `unrestarted` once its files are back."""
        if not self.restart_engine:
            if self.unrestarted == Outcome.STAGED_BACK:
                note = _join_notes(
                    note,
                    "staged back: the pre-image is in place, the server was not restarted "
                    "(--restart never) and runs the code it loaded until it is restarted",
                )
            return session.outcome(self.unrestarted, file=change, note=note)
        try:
            restart = restart_step(session)
            ready_step(session, restart, timeout=session.playbook.timeouts.restore_ready)
        except HostFailed as failure:
            return session.outcome(
                Outcome.NEEDS_ATTENTION,
                f"restored, but the server does not come back: {failure.error}",
                file=change,
            )
        smoke, not_serving = smoke_after_restore(session, restart, step=Step.SMOKE)
        if not_serving is not None:
            return session.outcome(
                Outcome.RESTORED_NOT_SERVING,
                f"{not_serving}; {self._way_back(session.name)}",
                file=change,
                smoke=smoke,
                note=note,
            )
        return session.outcome(Outcome.RESTORED, file=change, smoke=smoke, note=note)

    def _way_back(self, host: str) -> str:
        patch_id = self.patch.spec.id if self.patch else None
        if patch_id is None and self.source_run is not None:
            patch_id = self.source_run.summary.patch_id
        status = f"`opspatch status --hosts {host}` shows whether its server runs"
        if patch_id is None:
            return status
        return f"`opspatch apply {patch_id} --hosts {host}` puts the change back; {status}"

    def _without_record(
        self, session: HostSession, patch: LoadedPatch, inspection: HostInspection
    ) -> Examined:
        """Roll back a patch the ledger has no record of on this host (the ledger was deleted,
        or the change was made from another controller): only from the host's own backup.

        The file must carry the patch; taking the patch off the file alone (`unapply`, proven
        by re-applying) names the pre-image, and only a host backup with exactly that sha256
        is written back. Anything less is refused: a rollback that did not happen is never
        reported as done.
        """
        live = inspection.file
        unchanged = FileChange(live.realpath, live.sha256, live.sha256)
        if detect(live.content, patch.spec).state != "applied":
            return Examined(
                inspection,
                decided=session.outcome(
                    Outcome.SKIPPED,
                    file=unchanged,
                    note=f"{patch.spec.id} is not on this host (and the ledger has no record of "
                    "it)",
                ),
            )
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
                ),
            )
        pre_sha256 = sha256_hex(pre.old_source)
        return Examined(
            inspection,
            restore=lambda: self._restore_from_backup(session, patch, inspection, pre_sha256),
        )

    def _restore_from_backup(
        self,
        session: HostSession,
        patch: LoadedPatch,
        inspection: HostInspection,
        pre_sha256: str,
    ) -> HostOutcome:
        """The file back at `pre_sha256` from the host's own backup, recorded, then proven."""
        timeouts = session.playbook.timeouts
        live = inspection.file
        unchanged = FileChange(live.realpath, live.sha256, live.sha256)
        try:
            with session.step(Step.RESTORE) as note:
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
        session.recorder.file_version(
            session.name,
            path=live.realpath,
            sha256_before=live.sha256,
            sha256_after=pre_sha256,
            mode=live.mode,
            owner=f"{live.owner or live.uid}:{live.group or live.gid}",
            pre_image=live.content,
            action=FileAction.RESTORE,
            container=session.container,
        )
        change = FileChange(live.realpath, restored.sha256_before, restored.sha256_after)
        how = "restored from the host's own backup (the ledger had no record of this change)"
        return self._restart_and_prove(session, change, note=how)


def _join_notes(*notes: str | None) -> str | None:
    return "; ".join(n for n in notes if n) or None
