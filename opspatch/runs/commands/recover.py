"""`recover`: bring hosts that a run left behind to a known state."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

from opspatch.core.host import Host
from opspatch.core.policy import Playbook
from opspatch.core.reasons import Reason
from opspatch.core.remedy import remedy_text
from opspatch.core.spec import LoadedPatch
from opspatch.core.vocabulary import (
    Action,
    Command,
    FileAction,
    Outcome,
    RunStatus,
    Step,
    StepStatus,
)
from opspatch.errors import HostError, InputError, LockHeld
from opspatch.ledger.store import FileVersion, Ledger, RunDetail
from opspatch.runs.commands.live import patch_fixes
from opspatch.runs.fleet.connect import TransportFactory
from opspatch.runs.fleet.group import Nodes, prove_or_undo, serves, undo
from opspatch.runs.fleet.host_leases import lease_held
from opspatch.runs.fleet.liveapply import revert_on
from opspatch.runs.fleet.recorded import run_recorded
from opspatch.runs.fleet.restore import (
    ONE_BATCH,
    BatchPolicy,
    RunTakeover,
    prove_standings,
    restart_stale,
    restore_standing,
    run_in_batches,
    stale_servers,
)
from opspatch.runs.fleet.session import (
    HostSession,
    Progress,
    describe_error,
)
from opspatch.runs.fleet.standing import (
    Change,
    HostStanding,
    Takeover,
    Unread,
    read,
    taking_lock,
)
from opspatch.runs.judgments.decisions import decide, group_action
from opspatch.runs.judgments.live import unanswered
from opspatch.runs.judgments.patchset import ALL_NEW, Standing, paths_of
from opspatch.runs.judgments.proof import describe
from opspatch.runs.judgments.units import recover_remedy, require_whole_units
from opspatch.runs.report import FileChange, HostOutcome, RunReport

_OVER = (RunStatus.FINISHED, RunStatus.INTERRUPTED, RunStatus.RECOVERED)


def run_chain(ledger: Ledger, run_id: str) -> list[RunDetail]:
    """The run and its ancestors (`parent_run`), newest first."""
    return [ledger.get_run(summary.run_id) for summary in ledger.run_chain(run_id)]


@dataclass(frozen=True)
class _Scope:
    """File versions by host (oldest first); the runs whose host locks may be taken over at
    once (None: any run known to be over), and those only once idle."""

    versions: dict[str, list[FileVersion]]
    takeover: frozenset[str] | None
    what: str
    takeover_idle: frozenset[str] = frozenset()


def require_recoverable(ledger: Ledger, detail: RunDetail) -> None:
    """`recover --run` takes over a run seen dead here, or begun elsewhere with every lease
    expired; a live lease is never broken (LeaseHeld), any other run is InputError."""
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
        f"`{remedy_text(Command.RECOVER, hosts='TARGET')}` reconciles hosts whatever run touched them",
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
    """Recover the interrupted run `chain[0]` and its ancestors, taking over their leases
    (LeaseHeld, before anything is begun: one still heart-beats)."""
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
        policy=BatchPolicy(
            takeover=RunTakeover(
                identities={lease.host: lease.identity for lease in held if lease.host in names},
                runs=dead,
                not_started=partial(_never_reached, scope, chain[0].run_id),
            )
        ),
    )


_CHANGED_NOTHING = frozenset({Outcome.FAILED, Outcome.SKIPPED})
"""Outcomes that changed nothing, so do not settle what an earlier run left on the host."""


def hosts_left_needing_attention(ledger: Ledger, *, runs: int = 50) -> dict[str, str]:
    """What a bare `recover` reaches: the hosts the newest `runs` runs left `needs-attention`
    that no later run settled, each with its inventory ('' when unknown)."""
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
    policy: BatchPolicy = ONE_BATCH,
) -> RunReport:
    require_whole_units(hosts, Command.RECOVER)
    return run_recorded(
        Command.RECOVER,
        lambda fleet: run_in_batches(fleet, _RecoverHost(ledger, scope, patch).group, policy),
        ledger=ledger,
        hosts=hosts,
        factory=factory,
        playbook=playbook,
        progress=progress,
        patch=patch,
        parent_run=parent_run,
    )


def _never_reached(scope: _Scope, parent_run: str, session: HostSession, why: str) -> HostOutcome:
    """`not-started` keeps the recovered runs interrupted in the ledger (`recovered_by`)."""
    unlock = remedy_text(Command.UNLOCK, hosts=session.name)
    again = remedy_text(Command.RECOVER, run=parent_run)
    return session.outcome(
        Outcome.SKIPPED,
        f"not started: {why}; nothing of {scope.what} was reconciled here, and its lock, if it "
        f"took one here, is still held: `{recover_remedy(session.host)}` reconciles the host "
        f"and takes the lock over, or `{unlock}` removes it; run {parent_run} stays "
        f"interrupted until `{again}` reconciles every host of it",
        reason=Reason.NOT_STARTED,
    )


def _takeover(ledger: Ledger, scope: _Scope) -> Takeover:
    def may(held: LockHeld) -> tuple[str, bool] | None:
        holder = str(held.data.get("run_id") or "")
        idle = holder in scope.takeover_idle
        if not holder or not (idle or _may_take_over(ledger, holder, scope.takeover)):
            return None
        return holder, idle

    return may


def _may_take_over(ledger: Ledger, holder: str, takeover: Collection[str] | None) -> bool:
    if takeover is not None:
        return holder in takeover
    try:
        return ledger.get_run(holder).summary.status in _OVER
    except InputError:
        return False  # not a run of this ledger: it may be alive elsewhere


@dataclass(frozen=True)
class _RecoverHost:
    ledger: Ledger
    scope: _Scope
    patch: LoadedPatch | None

    def change(self, session: HostSession) -> Change:
        versions = self.scope.versions.get(session.name, [])
        newest_run = [v for v in versions if v.run_id == versions[-1].run_id] if versions else []
        paths = paths_of(newest_run)
        return Change(
            [v for v in versions if v.path in paths],
            module=self.patch.spec.target.module if self.patch is not None else None,
            paths=paths,
        )

    def _locked(self, session: HostSession) -> str:
        """Lock a host with no file to read, taking a recovered run's lock over."""
        timeout = session.playbook.timeouts.lock
        with session.step(Step.LOCK) as note:
            _, took = taking_lock(
                session,
                _takeover(self.ledger, self.scope),
                lambda run_id, holder, idle: session.ops.lock(
                    run_id=run_id, takeover_run=holder, takeover_idle=idle, timeout=timeout
                ),
            )
            note["detail"] = took.removesuffix("; ") or "no lock of another run held"
        return note["detail"]

    def group(self, nodes: Nodes) -> list[HostOutcome]:
        """The nodes made uniform: all new, proven (or finished live); all old, made sure to
        serve; differing, put back. A node changed by someone else: nothing written anywhere."""
        try:
            takeover = _takeover(self.ledger, self.scope)
            standings = read(nodes, self.change, ledger=self.ledger, prove=True, takeover=takeover)
        except Unread as unread:  # as any host's failure: `fleetrun.guarded` says it
            raise unread.error from None
        if all(st.inspection is None for st in standings.values()):
            return self._not_read(nodes)
        action = group_action(Command.RECOVER, [st.standing for st in standings.values()])
        if action == Action.ATTENTION:
            odd = [
                n for n, st in standings.items() if decide(Command.RECOVER, st.standing) == action
            ]
            return self._changed_group(nodes, standings, odd)
        if action == Action.ENSURE_RUNNING:
            if stale_servers(standings):  # a rollback killed after its swap: file back, server not
                return restart_stale(
                    nodes, standings, {n: st.unchanged() for n, st in standings.items()}
                )
            return self._serving(nodes, standings)
        if action == Action.PROVE_OR_UNDO:
            takes = self._live_takes(nodes, standings)
            if takes is not None:  # `apply --live`: its server holds the fix, or part of it
                return self._finish_live(nodes, standings, taken=takes)
            head = standings[nodes.head.name]
            what = "patch set (all-new)" if head.is_set else "change"
            note = (
                f"finished run {head.version.run_id}'s {what} on {nodes.label}: restarted as one "
                "and smoke-tested"
            )
            return prove_standings(nodes, standings, note)
        # restore: the nodes differ, or a set is partly new
        new = {n for n, st in standings.items() if st.standing in ALL_NEW}
        changes = {n: st.change() if n in new else st.unchanged() for n, st in standings.items()}

        def restore(session: HostSession) -> FileChange:
            standing = standings[session.name]
            return (
                restore_standing(session, standing)
                if session.name in new or standing.standing == Standing.PARTLY_NEW
                else changes[session.name]
            )

        partly = sorted(n for n, st in standings.items() if st.standing != Standing.ALL_OLD)
        why = (
            f"the change was partly applied on {nodes.label} (new files on {', '.join(partly)}): "
            "every new file was put back, so it is whole at its pre-images (all-old)"
        )
        return undo(nodes, why, restore=restore, changes=changes, outcome=Outcome.RESTORED)

    def _serving(self, nodes: Nodes, standings: Mapping[str, HostStanding]) -> list[HostOutcome]:
        head = standings[nodes.head.name]
        if head.standing in ALL_NEW:  # all new: all proven (`group_action`)
            changes = {n: st.change() for n, st in standings.items()}
            proof = describe(head.proofs[0], nodes.head.host)
            return _left_if_serving(
                nodes,
                proof,
                changes,
                Outcome.APPLIED,
                lambda why: prove_standings(nodes, standings, f"{why} and smoke-tested"),
            )
        at_rest = (
            f"{self.scope.what} recorded no change here"
            if head.standing == Standing.NOTHING_RECORDED
            else f"every file on {nodes.label} is at its pre-image"
        )
        return _at_rest(nodes, at_rest, {n: st.unchanged() for n, st in standings.items()})

    def _not_read(self, nodes: Nodes) -> list[HostOutcome]:
        said = "; ".join(f"{s.name}: {self._locked(s)}" for s in nodes.sessions)
        why = f"{self.scope.what} recorded no change here ({said})"
        return _at_rest(nodes, why, dict.fromkeys(s.name for s in nodes.sessions))

    def _changed_group(
        self, nodes: Nodes, standings: Mapping[str, HostStanding], odd: Sequence[str]
    ) -> list[HostOutcome]:
        outcomes = []
        for session in nodes.sessions:
            standing = standings[session.name]
            if session.name in odd:
                text, file = self._changed(session, standing), self._changed_file(standing)
            else:
                text = (
                    f"unit {nodes.name}'s node {', '.join(odd)} was changed by someone "
                    "else: nothing was written on any node of the unit"
                )
                file = standing.unchanged()
            outcomes.append(
                session.outcome(
                    Outcome.NEEDS_ATTENTION, text, file=file, reason=Reason.CHANGED_SINCE
                )
            )
        return outcomes

    def _live_takes(self, nodes: Nodes, standings: Mapping[str, HostStanding]) -> bool | None:
        """Whether an `apply --live` change (`new-stale`) was taken live for every file on every
        node; None for any other change."""
        taken = True
        for session in nodes.sessions:
            standing = standings[session.name]
            if standing.standing != Standing.NEW_STALE:
                return None
            try:
                steps = self.ledger.get_run(standing.version.run_id).host(session.name).steps
            except KeyError:
                return None
            swaps = [index for index, step in enumerate(steps) if step.step == Step.SWAP]
            if not swaps or not any(step.step == Step.LIVE for step in steps[: swaps[0]]):
                return None
            takes = [
                step.status
                for step in steps[swaps[-1] + 1 :]
                if step.step == Step.LIVE and step.status != StepStatus.STARTED
            ]
            taken = taken and len(takes) >= len(standing.found.new)
            taken = taken and all(t == StepStatus.OK for t in takes)
        return taken

    def _finish_live(
        self, nodes: Nodes, standings: Mapping[str, HostStanding], *, taken: bool
    ) -> list[HostOutcome]:
        """Finish an `apply --live` as the live path would, never by an unasked-for restart:
        smoke-proven when every process holds the fix, else reverted (and on a unit read back:
        `revert_on`, apply --live's own) and put back, restarted only where that failed."""
        head = standings[nodes.head.name]
        run_id, patch_id = head.version.run_id, head.version.patch_id or ""
        fixes: set[str] = set()
        whole, unheard = taken, False
        said: list[str] = []
        for session in nodes.sessions:
            held, heard, holds, detail = self._held(session, standings[session.name], patch_id)
            fixes |= held
            whole, unheard = whole and heard and holds, unheard or not heard
            said.append(f"{session.name}: {detail}")
        listed = "; ".join(said)
        changes = {n: st.change() for n, st in standings.items()}
        timeout = float(nodes.head.playbook.timeouts.smoke)  # as apply --live's (`LiveApply`)

        def restore(session: HostSession) -> FileChange:
            return restore_standing(session, standings[session.name])

        if whole:
            return prove_or_undo(
                nodes,
                changes=changes,
                restore=restore,
                note=(
                    f"finished run {run_id}'s live fix: every process of the engine holds it and "
                    "the smoke decode proves it, no restart; the file carries it for the next one"
                ),
                restart=False,
                revert=lambda: revert_on(nodes, sorted(fixes), timeout=timeout),
            )
        why = (
            f"run {run_id} was interrupted before its live fix was taken in every process "
            f"({listed}): the fix was taken out and the files put back, as a failed live apply "
            f"is; `{remedy_text(Command.APPLY, patch_id, hosts=nodes.name)}` with --live "
            "takes it again"
        )
        reverted = revert_on(nodes, sorted(fixes), timeout=timeout)
        restart = unheard or not reverted  # a process not heard from may hold the fix
        return undo(
            nodes, why, restore=restore, changes=changes, restart=restart, outcome=Outcome.RESTORED
        )

    @staticmethod
    def _held(
        session: HostSession, standing: HostStanding, patch_id: str
    ) -> tuple[set[str], bool, bool, str]:
        """The fixes held, whether every process answered, whether they hold the new bytes."""
        posts = {member.version.sha256_after for member in standing.found.new}
        try:
            with session.step(Step.LIVE) as listed:
                held, reply = patch_fixes(session, patch_id)
                fixes = {h.fix_id for h in held}
                unheard = reply.missing or unanswered(reply)
                listed["detail"] = (
                    f"in memory: {', '.join(sorted(fixes)) or 'no live fix of ' + patch_id}"
                )
                if unheard:
                    listed["detail"] += f"; not heard from: {unheard}"
        except HostError as exc:  # what the engine holds is not known: a restart clears it
            return (
                set(),
                False,
                False,
                f"its live fixes could not be listed ({describe_error(exc)})",
            )
        holds = {h.sha256 for h in held} == posts
        return fixes, unheard is None, holds, listed["detail"]

    def _changed(self, session: HostSession, standing: HostStanding) -> str:
        if standing.is_set:
            return (
                f"a file of the patch set is none of the versions the ledger holds for it "
                f"({standing.found.describe()}); someone else changed it: nothing was written"
            )
        newest, live = standing.version, standing.live
        held = self.scope.versions.get(session.name, [])
        return (
            f"{newest.path} is {live[:12]}: none of the {len(held)} version(s) the ledger holds "
            f"for it (newest: pre-image {newest.sha256_before[:12]}, post-image "
            f"{newest.sha256_after[:12]} of run {newest.run_id}); someone else changed it"
        )

    @staticmethod
    def _changed_file(standing: HostStanding) -> FileChange:
        if standing.is_set:
            return standing.found.change()
        newest = standing.version
        return FileChange(newest.path, newest.sha256_before, standing.live)


def _left_if_serving(
    nodes: Nodes,
    why: str,
    changes: Mapping[str, FileChange | None],
    outcome: Outcome,
    restarted: Callable[[str], list[HostOutcome]],
) -> list[HostOutcome]:
    """Left alone when it serves (a restart would prove nothing new and drop requests), else
    `restarted` (given why)."""
    if serves(nodes):
        note = f"{why}; {nodes.label} serves: left alone"
        return [s.outcome(outcome, file=changes[s.name], note=note) for s in nodes.sessions]
    return restarted(f"{why}; {nodes.label} was not serving: restarted as one")


def _at_rest(nodes: Nodes, why: str, changes: Mapping[str, FileChange | None]) -> list[HostOutcome]:
    return _left_if_serving(
        nodes,
        why,
        changes,
        Outcome.RESTORED,
        lambda text: undo(
            nodes,
            text,
            restore=lambda s: changes[s.name],
            changes=changes,
            outcome=Outcome.RESTORED,
        ),
    )
