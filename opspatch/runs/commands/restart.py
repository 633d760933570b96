"""`opspatch restart`: complete a staged patch (`apply --restart never`) host by host.

A staged host carries the patched file but its server still runs the old code. Restarting it is
the risky half of an apply, so it runs under the same playbook policy (canary, batches, halting)
and the same proof: restart, wait until ready, smoke decode; a host that fails is rolled back to
the pre-image the ledger recorded for the staged change, restarted and reported `rolled-back`.
A host where nothing is staged (its file is at the pre-image, or the ledger holds no change) is
left alone; a file that changed since opspatch wrote it is refused, never restarted into.

Per host it is a table (`ACTIONS`) over the host's standing (`runs.fleet.standing.read_host`:
the newest write's file, or every file of its patch set, a single file being a set of one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from opspatch.core.host import Host, Unit
from opspatch.core.policy import Playbook, plan_rollout
from opspatch.core.remedy import CliCommand, remedy_text
from opspatch.core.vocabulary import Command, FileAction, Outcome
from opspatch.errors import OpspatchError
from opspatch.ledger.store import FileVersion, Ledger
from opspatch.runs.fleet.connect import TransportFactory
from opspatch.runs.fleet.fleetrun import FleetRun
from opspatch.runs.fleet.recorded import recorded_run
from opspatch.runs.fleet.restore import prove_standing
from opspatch.runs.fleet.session import HostSession, NoProgress, Progress
from opspatch.runs.fleet.standing import HostStanding, begin, read_host
from opspatch.runs.judgments.patchset import Action, Standing, Table
from opspatch.runs.judgments.units import unit_refusal
from opspatch.runs.report import HostOutcome, RunReport

ACTIONS: Table = {
    Standing.NOTHING_RECORDED: Action.LEAVE,
    Standing.ALL_OLD: Action.LEAVE,
    Standing.PARTLY_NEW: Action.REFUSE,
    Standing.NEW_STALE: Action.PROVE_OR_UNDO,
    # a server started after the write already runs it, proven or not: restarting proves nothing
    Standing.NEW_PROVEN: Action.LEAVE,
    Standing.NEW_UNPROVEN: Action.LEAVE,
    Standing.NEW_PROVEN_NO_SERVER: Action.PROVE_OR_UNDO,
    Standing.NEW_UNPROVEN_NO_SERVER: Action.PROVE_OR_UNDO,
    Standing.PATCHED_FURTHER: Action.REFUSE,
    Standing.CHANGED: Action.REFUSE,
}
"""What restart does about each standing of the newest write on a host."""


def restart_hosts(
    *,
    ledger: Ledger,
    hosts: Sequence[Host],
    factory: TransportFactory,
    playbook: Playbook,
    progress: Progress | None = None,
) -> RunReport:
    """Restart, prove and (on failure) roll back every host with a staged change, recorded.

    Raises (before any host is touched):
        LedgerIntegrityError: the ledger's chain is broken.
        UnitRefused: a node of a unit is among the hosts (its nodes would be restarted one by
            one; opspatch cannot restart a unit as one yet).
    """
    progress = progress or NoProgress()
    unit = unit_refusal(hosts, command="restart", restarts=True, whole=None, today=_as_one)
    if unit is not None:
        raise unit
    with (
        recorded_run(
            ledger, command=Command.RESTART, patch=None, hosts=hosts, playbook=playbook
        ) as run,
        FleetRun(
            command=Command.RESTART,
            patch_id=None,
            hosts=hosts,
            factory=factory,
            playbook=playbook,
            recorder=run,
            progress=progress,
        ) as fleet,
    ):
        refused = fleet.lease()
        if refused is not None:
            return run.finish(refused)
        plan = plan_rollout(playbook, fleet.names)

        def halt(outcomes: Mapping[str, HostOutcome]) -> str | None:
            return playbook.halt_reason(
                {n: o.outcome for n, o in outcomes.items()}, canaries=plan.canaries
            )

        outcomes, halted = fleet.execute(
            lambda session: _restart_host(session, ledger), batches=plan.batches, halt=halt
        )
        return run.finish(fleet.report(outcomes, halted=halted))


def _as_one(unit: Unit) -> str:
    """What works today for a unit whose nodes carry a staged change."""
    return (
        f"restart unit {unit.name} as one yourself (every node's engine stopped, then started "
        "again): it then runs what `apply --restart never` staged on every node; "
        f"`{remedy_text(CliCommand.STATUS, hosts=unit.name)}` shows what each node carries"
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


def _restart_host(session: HostSession, ledger: Ledger) -> HostOutcome:
    versions = _staged_versions(ledger, session.name)
    if not versions:
        return session.outcome(Outcome.SKIPPED, note="the ledger holds no change on this host")
    try:
        newest = max(versions, key=lambda v: v.event_id)  # the staged write's own file
        inspection = begin(session, path=newest.path)
    except OpspatchError as exc:  # unreachable, locked: nothing was done there
        return session.refused(exc)
    standing = read_host(session, versions, inspection=inspection)
    action = ACTIONS[standing.standing]
    run_id = versions[0].run_id
    if action == Action.PROVE_OR_UNDO:
        what = "patch set (all-new)" if standing.is_set else "change"
        return prove_standing(
            session, standing, note=f"restarted into run {run_id}'s {what} and proven"
        )
    if action == Action.LEAVE:
        return session.outcome(
            Outcome.SKIPPED, file=standing.unchanged(), note=_left_alone(standing, run_id)
        )
    return session.outcome(
        Outcome.SKIPPED, _refusal(session, standing, run_id), file=standing.unchanged()
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
            f"`{remedy_text(CliCommand.RECOVER, hosts=session.name)}` makes it whole"
        )
    version, live = standing.version, standing.live
    return (
        f"refused: {version.path} is {live[:12]}, not the {version.sha256_after[:12]} run "
        f"{version.run_id} wrote (changed since); not restarting into code opspatch did not "
        "write"
    )
