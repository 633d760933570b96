"""`recover` and `unlock`: bring hosts that a run left behind to a known state.

A run's controller can die at any step (killed, the laptop closed, the SSH connection lost), and
so can the `recover` meant to finish it. Recover therefore works from two things only: what the
ledger holds for each host (every file version any run recorded there) and what is on the host's
disk now. It never trusts a run's own account of where it got to.

- `recover_run(chain)`: the interrupted run and every run it descends from through `parent_run`
  (a recover of a recover recovers the original run too). Hosts: every host of the chain. Locks
  held by a run of the chain that is over (interrupted: its controller is seen dead) are taken
  over at once; the lock of a run begun elsewhere whose lease expired once it is idle, no exec
  of that run still running on the host (its controller re-asserts the lock with every exec
  while it lives, busy to that exec's deadline: `hosts.channel`).
- `recover_hosts(hosts)`: the hosts named, whatever run touched them last (for a lock left by a
  finished run after a lost connection, or a run that is not in this ledger). Locks are taken
  over only from runs this ledger knows to be over. A bare `recover` with no interrupted run
  reaches the hosts recent runs left `needs-attention` (`hosts_left_needing_attention`).
- `unlock_hosts(hosts)`: remove a host lock whose run is over, recorded in the ledger; a lock
  whose run is alive (or unknown here and not expired) is refused.

Per host: the live file matches the post-image of a recorded patch → proven (`runs.judgments.proof`, as
`status` says it) and its server started after the write: `applied`, left alone (a second
recover restarts nothing); proven and its server gone: started again, `applied`; else restart,
ready, smoke → `applied`, or restore → `rolled-back`; it
matches a recorded pre-image → make sure the server answers → `restored`; no run recorded a
change here → make sure the server answers → `restored`; anything else → `needs-attention`
(someone else changed it). The patch is never applied twice: recover only finishes or undoes
what a run wrote.

A patch set (the newest run recorded several files on the host) is made whole: all new ->
finished as above (proven, or proven now; a failed proof restores every file); partly applied
(a run stopped between two swaps) -> its new files restored, restarted and smoked: `restored`,
the set all-old; all old -> `restored`; a file neither -> `needs-attention`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from opspatch.core.host import Host
from opspatch.core.policy import Playbook
from opspatch.core.spec import LoadedPatch
from opspatch.core.vocabulary import Command, FileAction, Outcome, RunStatus, SetState, Step
from opspatch.errors import InputError, LockHeld
from opspatch.hosts.operations import HostInspection
from opspatch.ledger.store import FileVersion, Ledger, RunDetail
from opspatch.runs.commands.rollback import (
    ensure_running,
    restore_recorded,
    restore_set,
    run_restore,
)
from opspatch.runs.fleet.connect import TransportFactory
from opspatch.runs.fleet.host_leases import lease_held, refusal
from opspatch.runs.fleet.recorded import recorded_run
from opspatch.runs.fleet.session import HostSession, NoProgress, Progress
from opspatch.runs.fleet.steps import prove_or_undo, undo
from opspatch.runs.judgments.patchset import paths_of, read_set
from opspatch.runs.judgments.proof import change_proof, describe
from opspatch.runs.report import FileChange, HostOutcome, RunReport

_OVER = (RunStatus.FINISHED, RunStatus.INTERRUPTED, RunStatus.RECOVERED)


def run_chain(ledger: Ledger, run_id: str) -> list[RunDetail]:
    """The run and its ancestors through `parent_run`, newest first, with their records."""
    return [ledger.get_run(summary.run_id) for summary in ledger.run_chain(run_id)]


@dataclass(frozen=True)
class _Scope:
    """What a recover may use: file versions by host (oldest first), the runs whose host locks
    it may take over at once (None: any run this ledger knows to be over), and those whose
    locks it may take once idle (no exec of theirs can still be running on the host)."""

    versions: dict[str, list[FileVersion]]
    takeover: frozenset[str] | None
    what: str
    takeover_idle: frozenset[str] = frozenset()


def require_recoverable(ledger: Ledger, detail: RunDetail) -> None:
    """Whether `recover --run` may take `detail`'s run over: interrupted (its controller process
    is gone: this machine began it and sees it dead), or begun on another controller whose
    leases all expired (the heartbeat is what another machine can judge). A live lease of a
    controller that may be alive is never broken.

    Raises:
        LeaseHeld: the run still heart-beats; names its operator and controller.
        InputError: the run is finished, or running here, or unknown here and holds no lease.
    """
    status = detail.summary.status
    held = ledger.leases_of([detail.run_id])
    live = [lease for lease in held if lease.live and status != RunStatus.INTERRUPTED]
    if live:
        raise lease_held(live, what=f"run {detail.run_id} is alive: its lease is live")
    if status == RunStatus.INTERRUPTED or (status == RunStatus.UNKNOWN and held):
        return
    raise InputError(
        f"run {detail.run_id} is {status}, not interrupted",
        hint="recover --run is for runs whose controller died part-way; "
        "`opspatch recover --hosts TARGET` reconciles hosts whatever run touched them",
    )


def recover_run(
    *,
    ledger: Ledger,
    chain: Sequence[RunDetail],
    hosts: Sequence[Host],
    factory: TransportFactory,
    playbook: Playbook,
    patch: LoadedPatch | None,
    progress: Progress | None = None,
) -> RunReport:
    """Recover the interrupted run `chain[0]` and the runs it descends from (`run_chain`),
    taking over their leases.

    Raises (before anything is begun):
        LeaseHeld: a run of the chain still heart-beats (its controller lives, wherever it is).
    """
    dead = frozenset(d.run_id for d in chain if d.summary.status in _OVER)
    held = ledger.leases_of([d.run_id for d in chain])
    live = [lease for lease in held if lease.live and lease.run_id not in dead]
    if live:
        raise lease_held(live, what=f"run {live[0].run_id} is alive: its lease is live")
    versions: dict[str, list[FileVersion]] = {}
    for detail in reversed(chain):  # oldest run first
        for record in detail.hosts:
            if record.outcome == Outcome.FAILED:  # nothing changed there (the swap was refused)
                continue
            versions.setdefault(record.host, []).extend(
                v for v in record.file_versions if v.action == FileAction.PATCH
            )
    runs = ", ".join(d.run_id for d in chain)
    # A host lock is taken over at once only from a run known to be over; that of a run whose
    # lease expired but whose controller may be alive (cut off from the ledger, still reaching
    # its hosts) once idle: every exec that controller sends keeps it busy to its deadline.
    alive = frozenset(d.run_id for d in chain) - dead
    scope = _Scope(versions, dead, f"run {runs}", takeover_idle=alive)
    names = {h.name for h in hosts}
    return _recover(
        ledger,
        scope,
        hosts,
        factory,
        playbook,
        patch,
        progress,
        parent_run=chain[0].run_id,
        leases={lease.host: lease.identity for lease in held if lease.host in names},
        taking_over=dead,
    )


_CHANGED_NOTHING = frozenset({Outcome.FAILED, Outcome.SKIPPED})
"""Host outcomes of runs that did nothing on the host (refused: its lock held, say), so they
do not settle what an earlier run left there."""


def hosts_left_needing_attention(ledger: Ledger, *, runs: int = 50) -> dict[str, str]:
    """The hosts the newest `runs` runs left `needs-attention` (a connection lost mid-swap, its
    lock still held) that no later run settled, each with the inventory that run took it from
    (empty when unknown): what a bare `recover` reaches when no run is interrupted.

    Raises:
        LedgerError: the ledger cannot be read.
    """
    settled: set[str] = set()
    left: dict[str, str] = {}
    for summary in ledger.list_runs(limit=runs):  # newest first
        for record in ledger.get_run(summary.run_id).hosts:
            if record.host in settled or record.outcome is None:
                continue
            if record.outcome in _CHANGED_NOTHING:
                continue
            settled.add(record.host)
            if record.outcome == Outcome.NEEDS_ATTENTION:
                left[record.host] = (summary.inventories or {}).get(record.host, "")
    return left


def recover_hosts(
    *,
    ledger: Ledger,
    hosts: Sequence[Host],
    factory: TransportFactory,
    playbook: Playbook,
    patch: LoadedPatch | None,
    progress: Progress | None = None,
) -> RunReport:
    """Recover the named hosts from every file version this ledger holds for them."""
    versions = {
        host.name: [
            v for v in reversed(ledger.file_history(host.name)) if v.action == FileAction.PATCH
        ]
        for host in hosts
    }
    scope = _Scope(versions, None, "any recorded run")
    return _recover(ledger, scope, hosts, factory, playbook, patch, progress, parent_run=None)


def _recover(
    ledger: Ledger,
    scope: _Scope,
    hosts: Sequence[Host],
    factory: TransportFactory,
    playbook: Playbook,
    patch: LoadedPatch | None,
    progress: Progress | None,
    *,
    parent_run: str | None,
    leases: Mapping[str, str] | None = None,
    taking_over: Collection[str] = (),
) -> RunReport:
    with recorded_run(
        ledger,
        command=Command.RECOVER,
        patch=patch,
        hosts=hosts,
        playbook=playbook,
        parent_run=parent_run,
    ) as run:
        recover = _RecoverHost(ledger, scope, patch)
        report = run_restore(
            command=Command.RECOVER,
            recorder=run,
            hosts=hosts,
            factory=factory,
            playbook=playbook,
            progress=progress or NoProgress(),
            patch_id=patch.spec.id if patch else None,
            per_host=recover.host,
            leases=leases,
            taking_over=taking_over,
        )
        return run.finish(report)


def begin_taking_over(
    session: HostSession,
    ledger: Ledger,
    scope: _Scope,
    *,
    module: str | None = None,
    path: str | None = None,
) -> HostInspection:
    """`begin` (lock + inspect) on a host, taking over a lock held by a run we may take over:
    at once from one of `scope.takeover` (when None: any run this ledger knows to be over),
    once idle from one of `scope.takeover_idle`.

    Raises:
        LockHeld: the lock belongs to a run that may still be alive, or to one of
            `scope.takeover_idle` whose last exec there may still be running.
    """
    timeouts = session.playbook.timeouts
    run_id = session.lock.taking()
    with session.step(Step.BEGIN) as note:
        try:
            _, inspection = session.ops.begin(
                module, path=path, run_id=run_id, timeout=timeouts.lock + timeouts.inspect
            )
        except LockHeld as held:
            holder = str(held.data.get("run_id") or "")
            idle = holder in scope.takeover_idle
            if not holder or not (idle or _may_take_over(ledger, holder, scope.takeover)):
                raise
            _, inspection = session.ops.begin(
                module,
                path=path,
                run_id=run_id,
                takeover_run=holder,
                takeover_idle=idle,
                timeout=timeouts.lock + timeouts.inspect,
            )
            idly = " (no command of it still running here)" if idle else ""
            note["detail"] = f"took the lock over from run {holder}{idly}; "
        note["detail"] += f"{inspection.file.realpath} is {inspection.file.sha256[:12]}"
    return inspection


def _may_take_over(ledger: Ledger, holder: str, takeover: Collection[str] | None) -> bool:
    if takeover is not None:
        return holder in takeover
    try:
        return ledger.get_run(holder).summary.status in _OVER
    except InputError:
        return False  # not a run of this ledger: it may be alive elsewhere


class _RecoverHost:
    """What a recover does on one host."""

    def __init__(self, ledger: Ledger, scope: _Scope, patch: LoadedPatch | None) -> None:
        self.ledger = ledger
        self.scope = scope
        self.patch = patch

    def host(self, session: HostSession) -> HostOutcome:
        versions = self.scope.versions.get(session.name, [])
        newest_run = [v for v in versions if v.run_id == versions[-1].run_id] if versions else []
        if len(paths_of(newest_run)) > 1:
            return self._recover_set(session, versions, paths_of(newest_run))
        if versions:
            inspection = begin_taking_over(session, self.ledger, self.scope, path=versions[-1].path)
        elif self.patch is not None:
            inspection = begin_taking_over(
                session, self.ledger, self.scope, module=self.patch.spec.target.module
            )
        else:
            return session.outcome(
                Outcome.SKIPPED, note=f"{self.scope.what} recorded no change here"
            )
        live = inspection.file.sha256
        path = inspection.file.realpath
        patched = next((v for v in reversed(versions) if v.sha256_after == live), None)
        if patched is not None:
            return self._finish_patched(session, patched, inspection)
        at_pre_image = next((v for v in reversed(versions) if v.sha256_before == live), None)
        if at_pre_image is not None or not versions:
            how = ensure_running(session)
            state = (
                f"the file is at the pre-image of run {at_pre_image.run_id}"
                if at_pre_image is not None
                else f"{self.scope.what} recorded no change here"
            )
            return session.outcome(
                Outcome.RESTORED, file=FileChange(path, live, live), note=f"{state}; server {how}"
            )
        newest = versions[-1]
        return session.outcome(
            Outcome.NEEDS_ATTENTION,
            f"{path} is {live[:12]}: none of the {len(versions)} version(s) the ledger holds for it "
            f"(newest: pre-image {newest.sha256_before[:12]}, post-image "
            f"{newest.sha256_after[:12]} of run {newest.run_id}); someone else changed it",
            file=FileChange(path, newest.sha256_before, live),
        )

    def _recover_set(
        self, session: HostSession, versions: Sequence[FileVersion], paths: Sequence[str]
    ) -> HostOutcome:
        """Make a patch set whole on a host: every file new (proven, or proven now), or every
        file old. A set a run left partly applied (stopped between two files' swaps) is put
        back to its pre-images, never completed: the run never proved its new code, and a
        fresh `apply` of an all-old set is an ordinary one."""
        inspection = begin_taking_over(session, self.ledger, self.scope, path=paths[0])
        mine = [v for v in versions if v.path in paths]
        found = read_set(session, mine, {inspection.file.realpath: inspection.file.sha256})
        state = found.state
        if state == SetState.CHANGED:
            return session.outcome(
                Outcome.NEEDS_ATTENTION,
                f"a file of the patch set is none of the versions the ledger holds for it "
                f"({found.describe()}); someone else changed it: nothing was written",
                file=found.change(),
            )
        if state == SetState.ALL_OLD:
            how = ensure_running(session)
            return session.outcome(
                Outcome.RESTORED,
                file=found.change(),
                note=f"every file of the patch set is at its pre-image (all-old); server {how}",
            )

        if state == SetState.PARTLY_APPLIED:
            why = (
                f"the patch set was partly applied ({found.describe()}): its swapped files "
                "were put back, so the set is whole at its pre-images (all-old)"
            )
            undone = undo(
                session, why, restore=lambda: restore_set(session, found), change=found.change()
            )
            if undone.outcome != Outcome.ROLLED_BACK:
                return undone
            # Making the set whole is what this recover is for: restored (or not serving).
            outcome = Outcome.RESTORED if undone.note is None else Outcome.RESTORED_NOT_SERVING
            return replace(undone, outcome=outcome, error=undone.note, note=why)
        proofs = [change_proof(self.ledger, session.name, m.version) for m in found.members]
        server = inspection.server
        stale = server is not None and server.predates(inspection.file)
        if all(p.proven for p in proofs) and not stale:
            how = ensure_running(session)
            return session.outcome(
                Outcome.APPLIED,
                file=found.change(),
                note=f"every file of the patch set is new (all-new); {describe(proofs[0])}; "
                f"server {how}",
            )
        return prove_or_undo(
            session,
            change=found.change(),
            restore=lambda: restore_set(session, found),
            note=f"finished run {found.members[0].version.run_id}'s patch set (all-new): "
            "restarted and smoke-tested",
        )

    def _finish_patched(
        self, session: HostSession, version: FileVersion, inspection: HostInspection
    ) -> HostOutcome:
        change = FileChange(version.path, version.sha256_before, version.sha256_after)
        proof = change_proof(self.ledger, session.name, version)
        server = inspection.server
        stale = server is not None and server.predates(inspection.file)
        if proof.proven and not stale:
            # Proven, and no server older than the change runs: make sure one answers (it may
            # have gone since: a crash, a reboot) and otherwise leave it alone. Restarting an
            # already reconciled host again would prove nothing new and drop its requests.
            how = ensure_running(session)
            if how == "already running" and server is not None:
                pid = f" (pid {server.pid})" if server.pid is not None else ""
                how = f"already running{pid}, started after the change was written: left alone"
            return session.outcome(
                Outcome.APPLIED, file=change, note=f"{describe(proof)}; server {how}"
            )
        return prove_or_undo(
            session,
            change=change,
            restore=lambda: restore_recorded(session, version),
            note=f"finished run {version.run_id}'s change: restarted and smoke-tested",
        )


# ---------------------------------------------------------------------------------------------
# unlock


def unlock_hosts(
    *,
    ledger: Ledger,
    hosts: Sequence[Host],
    factory: TransportFactory,
    playbook: Playbook,
    force_unknown: bool = False,
    progress: Progress | None = None,
) -> RunReport:
    """Remove host locks whose run is over, as a recorded `unlock` run.

    A lock whose run this ledger knows to be running is refused (`skipped`, exit 2); so are one
    whose run holds a live lease (its controller heart-beats, wherever it is) and one whose run
    this ledger does not know (another controller's), unless `force_unknown` (--force).
    """
    with recorded_run(
        ledger, command=Command.UNLOCK, patch=None, hosts=hosts, playbook=playbook
    ) as run:
        unlock = _UnlockHost(ledger, force_unknown)
        report = run_restore(
            command=Command.UNLOCK,
            recorder=run,
            hosts=hosts,
            factory=factory,
            playbook=playbook,
            progress=progress or NoProgress(),
            patch_id=None,
            per_host=unlock.host,
        )
        return run.finish(report)


class _UnlockHost:
    def __init__(self, ledger: Ledger, force_unknown: bool) -> None:
        self.ledger = ledger
        self.force_unknown = force_unknown

    def host(self, session: HostSession) -> HostOutcome:
        timeout = session.playbook.timeouts.lock
        run_id = session.lock.taking()
        with session.step(Step.LOCK) as note:
            try:
                info = session.ops.lock(run_id=run_id, timeout=timeout)
            except LockHeld as held:
                holder = str(held.data.get("run_id") or "")
                held_by = held.detail
                note["detail"] = f"held by run {holder or '?'} ({held_by})"
            else:
                previous = info.took_over_from
                note["detail"] = (
                    f"the lock of run {previous.run_id} had expired" if previous else "no lock held"
                )
                return session.outcome(Outcome.SKIPPED, note=f"{note['detail']}; nothing to remove")
        status = self._status_of(holder)
        if status == RunStatus.RUNNING:
            return session.outcome(
                Outcome.SKIPPED,
                f"refused: the lock belongs to run {holder}, which is still running",
            )
        live = [lease for lease in self.ledger.leases_of([holder] if holder else []) if lease.live]
        if live and not self.force_unknown:  # its controller heart-beats: it may be changing it
            return session.outcome(
                Outcome.SKIPPED,
                f"refused: the lock belongs to run {holder}, whose lease is live: "
                f"{refusal(live)}; or re-run with --force",
            )
        if status is None and not self.force_unknown:
            return session.outcome(
                Outcome.SKIPPED,
                f"refused: the lock belongs to run {holder or '(unnamed)'}, which this ledger does "
                f"not know ({held_by}); it may be alive on another controller. Ask its owner, "
                "wait for it to expire, or re-run with --force",
            )
        with session.step(Step.UNLOCK) as note:
            result = session.ops.unlock(run_id=holder, force=not holder, timeout=timeout)
            note["detail"] = (
                f"removed the lock of run {holder}" if result.released else result.reason
            )
        return session.outcome(Outcome.UNLOCKED, note=f"removed the lock of run {holder}")

    def _status_of(self, run_id: str) -> RunStatus | None:
        if not run_id:
            return None
        try:
            return RunStatus(self.ledger.get_run(run_id).summary.status)
        except InputError:
            return None
