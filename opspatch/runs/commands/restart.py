"""`opspatch restart`: complete a staged patch (`apply --restart never`) host by host."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial

from opspatch.core.host import Host
from opspatch.core.policy import Playbook
from opspatch.core.reasons import Reason
from opspatch.core.remedy import remedy_text
from opspatch.core.vocabulary import Action, Command, FileAction, Outcome
from opspatch.errors import OpspatchError
from opspatch.ledger.store import FileVersion, Ledger
from opspatch.runs.commands.live import StagedDisable, StagedPlugin, staged_plugin
from opspatch.runs.fleet.connect import TransportFactory
from opspatch.runs.fleet.group import Nodes, failing_as, prove_or_undo, refuse, undo
from opspatch.runs.fleet.recorded import run_recorded
from opspatch.runs.fleet.restore import (
    AS_APPLY,
    prove_standings,
    restart_stale,
    run_in_batches,
    stale_servers,
)
from opspatch.runs.fleet.session import HostSession, Progress
from opspatch.runs.fleet.standing import Change, HostStanding, Unread, read
from opspatch.runs.fleet.steps import AS_ROLLBACK
from opspatch.runs.judgments.decisions import decide, group_action
from opspatch.runs.judgments.patchset import ALL_NEW, Standing
from opspatch.runs.judgments.units import recover_remedy, require_whole_units
from opspatch.runs.report import HostOutcome, RunReport


def restart_hosts(
    *,
    ledger: Ledger,
    hosts: Sequence[Host],
    factory: TransportFactory,
    playbook: Playbook,
    progress: Progress | None = None,
) -> RunReport:
    """Restart, prove and (on failure) roll back every host with a staged change."""
    require_whole_units(hosts, Command.RESTART)
    return run_recorded(
        Command.RESTART,
        lambda fleet: run_in_batches(fleet, partial(_restart, ledger=ledger), AS_APPLY),
        ledger=ledger,
        hosts=hosts,
        factory=factory,
        playbook=playbook,
        progress=progress,
    )


def _staged_versions(ledger: Ledger, host: str) -> list[FileVersion]:
    """The newest write's run's changes here (a staged change is the newest write), the newest
    of each path in write order: a patch set is restarted into together."""
    history = [v for v in ledger.file_history(host) if v.action == FileAction.PATCH]
    if not history:
        return []
    mine = [v for v in history if v.run_id == history[0].run_id]
    by_path = {v.path: v for v in sorted(mine, key=lambda v: v.event_id)}
    return list(by_path.values())


@dataclass(frozen=True)
class _Staged:
    """The newest write's run (None: the ledger holds no change here) and where it stands."""

    run_id: str | None
    standing: HostStanding

    @property
    def refuses(self) -> bool:
        return decide(Command.RESTART, self.standing.standing) == Action.REFUSE

    @property
    def new(self) -> bool:
        return self.standing.standing in ALL_NEW

    def left_alone(self, session: HostSession) -> HostOutcome:
        file, note = None, "the ledger holds no change on this host"
        if self.run_id is not None:
            file, note = self.standing.unchanged(), _left_alone(self.standing, self.run_id)
        return session.outcome(Outcome.SKIPPED, file=file, note=note, reason=Reason.NOTHING_TO_DO)

    def refused(self, session: HostSession) -> HostOutcome:
        assert self.run_id is not None
        return session.outcome(
            Outcome.SKIPPED,
            _refusal(session, self.standing, self.run_id),
            file=self.standing.unchanged(),
            reason=Reason.SET_NOT_WHOLE if self.standing.is_set else Reason.CHANGED_SINCE,
        )

    def what(self) -> str:
        what = "patch set (all-new)" if self.standing.is_set else "change"
        return f"run {self.run_id}'s {what}"


def _change(versions: Sequence[FileVersion]) -> Change:
    if not versions:
        return Change()
    return Change(versions, begin_at=max(versions, key=lambda v: v.event_id).path)


def _restart(nodes: Nodes, ledger: Ledger) -> list[HostOutcome]:
    """One decision for the group: staged new files proven (undone on failure), stale old ones
    restarted, or a staged plugin; nodes that differ need attention (a restart would run two
    versions of the code in one server)."""
    versions = {s.name: _staged_versions(ledger, s.name) for s in nodes.sessions}
    try:
        standings = read(nodes, lambda session: _change(versions[session.name]), ledger=ledger)
    except Unread as unread:  # unreachable, locked: nothing was done there
        refused = unread.session.refused(unread.error)
        return refuse(nodes, {unread.session.name: refused}, "could not be read")
    staged = {n: _Staged(v[0].run_id if v else None, standings[n]) for n, v in versions.items()}
    files = {n: st.standing.unchanged() if st.run_id else None for n, st in staged.items()}
    action = group_action(Command.RESTART, [st.standing for st in standings.values()])
    if action == Action.REFUSE:
        odd = {s.name: staged[s.name].refused(s) for s in nodes.sessions if staged[s.name].refuses}
        return refuse(nodes, odd, "was refused", files=files)
    if action == Action.ATTENTION:  # the nodes differ
        new = [n for n, st in staged.items() if st.new]
        old = [n for n in staged if n not in new]
        why = (
            f"the nodes of unit {nodes.name} differ: {', '.join(new)} carry the change and "
            f"{', '.join(old)} do not; no node was restarted (the unit would run two versions of "
            f"its code): `{recover_remedy(nodes.head.host)}` makes it uniform"
        )
        return [
            s.outcome(
                Outcome.NEEDS_ATTENTION, why, file=files[s.name], reason=Reason.UNIT_NOT_ALIKE
            )
            for s in nodes.sessions
        ]
    if action == Action.PROVE_OR_UNDO:
        what = staged[nodes.head.name].what()
        return prove_standings(nodes, standings, _restarted_into(nodes, what, "proven"))
    if stale_servers(standings):  # put back with no restart since: staged too
        return restart_stale(nodes, standings, files, steps=AS_ROLLBACK)
    return _restart_plugin(nodes, ledger, staged)


def _restarted_into(nodes: Nodes, what: str, proven: str) -> str:
    return f"restarted {nodes.label} as one into {what} and {proven}"


def _restart_plugin(
    nodes: Nodes, ledger: Ledger, staged: Mapping[str, _Staged]
) -> list[HostOutcome]:
    """Files stage nothing: restarted into the plugin staged on every node (removed if the
    proof fails), or out of it; else left alone."""
    plugins: dict[str, StagedPlugin | StagedDisable | None] = {}
    for session in nodes.sessions:
        try:
            locked = staged[session.name].run_id is not None
            plugins[session.name] = staged_plugin(session, ledger, locked=locked)
        except OpspatchError as exc:
            return refuse(nodes, {session.name: session.refused(exc)}, "could not be read")
    disabled = {n: p for n, p in plugins.items() if isinstance(p, StagedDisable)}
    if disabled and len(disabled) == len(plugins):
        return _restart_out(nodes, disabled)
    ready = {n: p for n, p in plugins.items() if isinstance(p, StagedPlugin)}
    if not ready or len(ready) < len(plugins):
        outcomes = [staged[s.name].left_alone(s) for s in nodes.sessions]
        if not ready:
            return outcomes
        if disabled:
            command, what = Command.LIVE_DISABLE, f"its removal is staged on {', '.join(disabled)}"
        else:
            command, what = Command.LIVE_ENABLE, f"it is staged on {', '.join(ready)}"
        again = remedy_text(command, hosts=nodes.name)
        return [
            replace(o, note=f"{o.note}; the live plugin: {what} only "
                    f"(`{again}` stages it on every node, then restart)")
            for o in outcomes
        ]  # fmt: skip

    def listening(nodes: Nodes) -> None:
        for session in nodes.sessions:
            with failing_as(nodes, session):
                ready[session.name].listens(session)

    return prove_or_undo(
        nodes,
        changes={name: plugin.change() for name, plugin in ready.items()},
        restore=lambda session: ready[session.name].remove(session),
        note=_restarted_into(
            nodes, ready[nodes.head.name].what(), "proven: every process of every node listens"
        ),
        judge=listening,
    )


def _restart_out(nodes: Nodes, disabled: Mapping[str, StagedDisable]) -> list[HostOutcome]:
    what = disabled[nodes.head.name].what()
    return undo(
        nodes,
        _restarted_into(nodes, "the engine without the live plugin", f"proven (after {what})"),
        restore=lambda session: disabled[session.name].disabled,
        changes={name: staged.disabled for name, staged in disabled.items()},
        outcome=Outcome.RESTORED,
        steps=AS_ROLLBACK,
        way_back="nothing is put back (the live plugin's files were removed by the disable): "
        f"`{remedy_text(Command.DIAGNOSE, hosts=nodes.head.name)}` says why it does not serve",
    )


def _left_alone(standing: HostStanding, run_id: str) -> str:
    if standing.standing == Standing.NOTHING_RECORDED:
        return "the ledger holds no change on this host"
    if standing.standing == Standing.ALL_OLD:
        if standing.is_set:
            return f"nothing staged: every file of run {run_id}'s patch set is at its pre-image"
        return f"nothing staged: the file is at the pre-image of run {run_id}"
    server = standing.inspection.server if standing.inspection else None
    pid = server.pid if server is not None else None
    when = "the patch set was written" if standing.is_set else "the file changed"
    return (
        f"nothing staged: the running server (pid {pid}) started after {when}, so it already "
        f"runs run {run_id}'s change; left alone"
    )


def _refusal(session: HostSession, standing: HostStanding, run_id: str) -> str:
    if standing.is_set:
        return (
            f"refused: run {run_id}'s patch set is not whole ({standing.found.describe()}); "
            f"`{recover_remedy(session.host)}` makes it whole"
        )
    version, live = standing.version, standing.live
    return (
        f"refused: {version.path} is {live[:12]}, not the {version.sha256_after[:12]} run "
        f"{version.run_id} wrote (changed since); not restarting into code opspatch did not "
        "write"
    )
