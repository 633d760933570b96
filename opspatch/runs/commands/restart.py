"""`opspatch restart`: complete a staged patch (`apply --restart never`) host by host.

A staged host carries the patched file but its server still runs the old code. Restarting it is
the risky half of an apply, so it runs under the same playbook policy (canary, batches, halting)
and the same proof: restart, wait until ready, smoke decode; a host that fails is rolled back to
the pre-image the ledger recorded for the staged change, restarted and reported `rolled-back`.
A host where nothing is staged (its file is at the pre-image, or the ledger holds no change) is
left alone; a file that changed since opspatch wrote it is refused, never restarted into.

Per host it is the decision table (`runs.judgments.decisions`, goal: proven where staged) over
the host's standing (`runs.fleet.standing.read_host`: the newest write's file, or every file of
its patch set, a single file being a set of one).

A group (a unit's nodes, a host by itself a group of one) is restarted as one, never a node
alone (`_restart`): every node read first, then one decision for the group. Every node's file
new and some node's server older than it (staged): the group restarted as one and proven
through the head, undone on every node when the proof fails. Nothing staged on any node: every node left alone. A node
restart refuses (its file changed, a set not whole) or that could not be read: no node is
restarted. Nodes that differ (new on one, old on another): no node is restarted, every node
`needs-attention` naming the odd nodes, since the unit would run two versions of its code;
`recover` makes it uniform.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from opspatch.core.host import Host
from opspatch.core.policy import Playbook
from opspatch.core.remedy import remedy_text
from opspatch.core.vocabulary import Action, Command, FileAction, Outcome
from opspatch.errors import OpspatchError
from opspatch.ledger.store import FileVersion, Ledger
from opspatch.runs.commands.live import StagedPlugin, staged_plugin
from opspatch.runs.fleet.connect import TransportFactory
from opspatch.runs.fleet.group import Nodes, failing_as, prove_or_undo, refuse
from opspatch.runs.fleet.recorded import run_in_batches
from opspatch.runs.fleet.restore import restore_standing
from opspatch.runs.fleet.session import HostSession, Progress, target_of
from opspatch.runs.fleet.standing import Change, HostStanding, Unread, read
from opspatch.runs.judgments.decisions import decide
from opspatch.runs.judgments.patchset import ALL_NEW, Standing
from opspatch.runs.judgments.units import require_whole_units
from opspatch.runs.report import HostOutcome, RunReport


def restart_hosts(
    *,
    ledger: Ledger,
    hosts: Sequence[Host],
    factory: TransportFactory,
    playbook: Playbook,
    progress: Progress | None = None,
) -> RunReport:
    """Restart, prove and (on failure) roll back every host with a staged change, recorded; a
    unit's nodes as one (`_restart`).

    Raises (before any host is touched):
        LedgerIntegrityError: the ledger's chain is broken.
        UnitRefused: the hosts take some but not all nodes of a unit.
    """
    require_whole_units(hosts, Command.RESTART)
    return run_in_batches(
        Command.RESTART,
        lambda nodes: _restart(nodes, ledger),
        ledger=ledger,
        hosts=hosts,
        factory=factory,
        playbook=playbook,
        progress=progress,
    )


def _staged_versions(ledger: Ledger, host: str) -> list[FileVersion]:
    """The changes the newest write's run made on the host (a staged one is the newest write),
    the newest of each path, in the order they were written: several for a patch set, which
    is restarted into together; empty when the ledger holds no change here."""
    history = [v for v in ledger.file_history(host) if v.action == FileAction.PATCH]
    if not history:
        return []
    mine = [v for v in history if v.run_id == history[0].run_id]
    by_path = {v.path: v for v in sorted(mine, key=lambda v: v.event_id)}
    return list(by_path.values())


@dataclass(frozen=True)
class _Staged:
    """What restart found on a host: the newest write's run (None: the ledger holds no change
    here, nothing was read) and where it stands."""

    run_id: str | None
    standing: HostStanding

    @property
    def action(self) -> Action:
        return decide(Command.RESTART, self.standing.standing)

    @property
    def new(self) -> bool:
        """Whether every file of the write is its post-image."""
        return self.standing.standing in ALL_NEW

    def left_alone(self, session: HostSession) -> HostOutcome:
        if self.run_id is None:
            return session.outcome(Outcome.SKIPPED, note="the ledger holds no change on this host")
        return session.outcome(
            Outcome.SKIPPED,
            file=self.standing.unchanged(),
            note=_left_alone(self.standing, self.run_id),
        )

    def refused(self, session: HostSession) -> HostOutcome:
        assert self.run_id is not None
        return session.outcome(
            Outcome.SKIPPED,
            _refusal(session, self.standing, self.run_id),
            file=self.standing.unchanged(),
        )

    def what(self) -> str:
        what = "patch set (all-new)" if self.standing.is_set else "change"
        return f"run {self.run_id}'s {what}"


def _change(versions: Sequence[FileVersion]) -> Change:
    """The newest write's files, begun at the staged write's own file."""
    if not versions:
        return Change()
    return Change(versions, begin_at=max(versions, key=lambda v: v.event_id).path)


def _restart(nodes: Nodes, ledger: Ledger) -> list[HostOutcome]:
    """A group restarted as one or not at all (never a node alone): every node read (locked),
    then one decision. A node that could not be read or that restart refuses: no node touched,
    each other node `skipped` naming it. Every node's files new: the group restarted and proven
    as one when some node is staged (its server older than the write), undone on every node
    when the proof fails; left alone otherwise, unless the live plugin is staged there
    (`_restart_plugin`). Nodes that differ (new on some, old on others): every node
    `needs-attention`, naming them; restarting would run two versions of the code in one
    server."""
    versions = {s.name: _staged_versions(ledger, s.name) for s in nodes.sessions}
    try:
        standings = read(nodes, lambda session: _change(versions[session.name]))
    except Unread as unread:  # unreachable, locked: nothing was done there
        refused = unread.session.refused(unread.error)
        return refuse(nodes, {unread.session.name: refused}, "could not be read")
    staged = {n: _Staged(v[0].run_id if v else None, standings[n]) for n, v in versions.items()}
    files = {n: st.standing.unchanged() if st.run_id else None for n, st in staged.items()}
    odd = {
        s.name: staged[s.name].refused(s)
        for s in nodes.sessions
        if staged[s.name].action == Action.REFUSE
    }
    if odd:
        return refuse(nodes, odd, "was refused", files=files)
    new = [n for n, st in staged.items() if st.new]
    if len(new) not in (0, len(staged)):
        old = [n for n in staged if n not in new]
        why = (
            f"the nodes of unit {nodes.name} differ: {', '.join(new)} carry the change and "
            f"{', '.join(old)} do not; no node was restarted (the unit would run two versions of "
            f"its code): `{remedy_text(Command.RECOVER, hosts=nodes.name)}` makes it uniform"
        )
        return [s.outcome(Outcome.NEEDS_ATTENTION, why, file=files[s.name]) for s in nodes.sessions]
    if not any(st.action == Action.PROVE_OR_UNDO for st in staged.values()):
        return _restart_plugin(nodes, ledger, staged)
    return prove_or_undo(
        nodes,
        changes={n: st.change() for n, st in standings.items()},
        restore=lambda session: restore_standing(session, standings[session.name]),
        note=_restarted_into(nodes, staged[nodes.head.name].what(), "proven"),
    )


def _plugin(session: HostSession, ledger: Ledger, staged: _Staged) -> StagedPlugin | None:
    """The live plugin staged on a host where no file change is (`live enable` loads it at the
    next restart: a staged change too); read only where the file's standing leaves the host.

    Raises:
        OpspatchError: the host could not be read or locked.
    """
    if staged.action != Action.LEAVE:
        return None
    return staged_plugin(session, ledger, locked=staged.run_id is not None)


def _restarted_into(nodes: Nodes, what: str, proven: str) -> str:
    if nodes.alone:
        return f"restarted into {what} and {proven}"
    return f"restarted unit {nodes.name} as one into {what} and {proven}"


def _restart_plugin(
    nodes: Nodes, ledger: Ledger, staged: Mapping[str, _Staged]
) -> list[HostOutcome]:
    """A group whose files stage nothing: restarted as one into the live plugin when it is
    staged on every node (`live enable`), proven through the head and on every node's sockets,
    the plugin removed everywhere when the proof fails; left alone otherwise (a plugin staged
    on some nodes only: each such node says so)."""
    plugins: dict[str, StagedPlugin | None] = {}
    for session in nodes.sessions:
        try:
            plugins[session.name] = _plugin(session, ledger, staged[session.name])
        except OpspatchError as exc:
            return refuse(nodes, {session.name: session.refused(exc)}, "could not be read")
    ready = {name: plugin for name, plugin in plugins.items() if plugin is not None}
    if not ready or len(ready) < len(plugins):
        outcomes = [staged[s.name].left_alone(s) for s in nodes.sessions]
        if not ready:
            return outcomes
        enable = remedy_text(Command.LIVE_ENABLE, hosts=nodes.name)
        return [
            replace(o, note=f"{o.note}; the live plugin is staged on {', '.join(ready)} only "
                    f"(`{enable}` stages it on every node, then restart)")
            for o in outcomes
        ]  # fmt: skip

    def listening(nodes: Nodes) -> None:
        for session in nodes.sessions:
            with failing_as(nodes, session):
                ready[session.name].listens(session)

    every = "every process listens" if nodes.alone else "every node's processes listen"
    return prove_or_undo(
        nodes,
        changes={name: plugin.change() for name, plugin in ready.items()},
        restore=lambda session: ready[session.name].remove(session),
        note=_restarted_into(nodes, ready[nodes.head.name].what(), f"proven: {every}"),
        judge=listening,
    )


def _left_alone(standing: HostStanding, run_id: str) -> str:
    """Why nothing is staged: the files are old, or a server started after the write runs them."""
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
    """Why restart does not restart into what it found: a set not whole, or bytes changed."""
    if standing.is_set:
        return (
            f"refused: run {run_id}'s patch set is not whole ({standing.found.describe()}); "
            f"`{remedy_text(Command.RECOVER, hosts=target_of(session.host))}` makes it whole"
        )
    version, live = standing.version, standing.live
    return (
        f"refused: {version.path} is {live[:12]}, not the {version.sha256_after[:12]} run "
        f"{version.run_id} wrote (changed since); not restarting into code opspatch did not "
        "write"
    )
