"""`opspatch restart`: complete a staged patch (`apply --restart never`) host by host.

A staged host carries the patched file but its server still runs the old code. Restarting it is
the risky half of an apply, so it runs under the same playbook policy (canary, batches, halting)
and the same proof: restart, wait until ready, smoke decode; a host that fails is rolled back to
the pre-image the ledger recorded for the staged change, restarted and reported `rolled-back`.
A host where nothing is staged (its file is at the pre-image, or the ledger holds no change) is
left alone; a file that changed since opspatch wrote it is refused, never restarted into.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from opspatch.core.host import Host
from opspatch.core.policy import Playbook, plan_rollout
from opspatch.core.vocabulary import Command, FileAction, Outcome, SetState, Step
from opspatch.errors import OpspatchError
from opspatch.hosts.operations import HostInspection
from opspatch.ledger.store import FileVersion, Ledger
from opspatch.runs.commands.rollback import restore_recorded, restore_set
from opspatch.runs.fleet.connect import TransportFactory
from opspatch.runs.fleet.fleetrun import FleetRun
from opspatch.runs.fleet.recorded import recorded_run
from opspatch.runs.fleet.session import (
    HostSession,
    NoProgress,
    Progress,
)
from opspatch.runs.fleet.steps import prove_or_undo
from opspatch.runs.judgments.patchset import read_set
from opspatch.runs.report import FileChange, HostOutcome, RunReport


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
    """
    progress = progress or NoProgress()
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


def _staged_version(ledger: Ledger, host: str) -> FileVersion | None:
    """The newest change opspatch wrote on the host (a staged one is the newest write)."""
    return next((v for v in ledger.file_history(host) if v.action == FileAction.PATCH), None)


def _restart_host(session: HostSession, ledger: Ledger) -> HostOutcome:
    version = _staged_version(ledger, session.name)
    if version is None:
        return session.outcome(Outcome.SKIPPED, note="the ledger holds no change on this host")
    timeouts = session.playbook.timeouts
    try:
        with session.step(Step.BEGIN) as note:
            _, inspection = session.ops.begin(
                path=version.path,
                run_id=session.lock.taking(),
                timeout=timeouts.lock + timeouts.inspect,
            )
            note["detail"] = f"{inspection.file.realpath} is {inspection.file.sha256[:12]}"
    except OpspatchError as exc:  # unreachable, locked: nothing was done there
        return session.refused(exc)
    live = inspection.file.sha256
    staged_set = _staged_set(ledger, session.name, version)
    if len(staged_set) > 1:
        return _restart_set(session, staged_set, inspection)
    unchanged = FileChange(version.path, live, live)
    if live == version.sha256_before:
        return session.outcome(
            Outcome.SKIPPED,
            file=unchanged,
            note=f"nothing staged: the file is at the pre-image of run {version.run_id}",
        )
    if live != version.sha256_after:
        return session.outcome(
            Outcome.SKIPPED,
            f"refused: {version.path} is {live[:12]}, not the {version.sha256_after[:12]} run "
            f"{version.run_id} wrote (changed since); not restarting into code opspatch did not "
            "write",
            file=unchanged,
        )
    server = inspection.server
    if server is not None and not server.predates(inspection.file):
        return session.outcome(
            Outcome.SKIPPED,
            file=unchanged,
            note=f"nothing staged: the running server (pid {server.pid}) started after the file "
            f"changed, so it already runs run {version.run_id}'s change; left alone",
        )
    return prove_or_undo(
        session,
        change=FileChange(version.path, version.sha256_before, version.sha256_after),
        restore=lambda: restore_recorded(session, version),
        note=f"restarted into run {version.run_id}'s change and proven",
    )


def _staged_set(ledger: Ledger, host: str, newest: FileVersion) -> list[FileVersion]:
    """The changes the newest write's run made on the host, the newest of each path, in the
    order they were written: several for a patch set, which is restarted into together."""
    mine = [
        v
        for v in ledger.file_history(host)
        if v.action == FileAction.PATCH and v.run_id == newest.run_id
    ]
    by_path = {v.path: v for v in sorted(mine, key=lambda v: v.event_id)}
    return list(by_path.values())


def _restart_set(
    session: HostSession, versions: Sequence[FileVersion], inspection: HostInspection
) -> HostOutcome:
    """Restart into a staged patch set: only when every file is the post-image its run wrote
    (a set not whole is left to `recover`); a failed proof restores every file."""
    found = read_set(session, versions, {inspection.file.realpath: inspection.file.sha256})
    run_id = versions[0].run_id
    if found.state == SetState.ALL_OLD:
        return session.outcome(
            Outcome.SKIPPED,
            file=found.change(),
            note=f"nothing staged: every file of run {run_id}'s patch set is at its pre-image",
        )
    if found.state != SetState.ALL_NEW:
        return session.outcome(
            Outcome.SKIPPED,
            f"refused: run {run_id}'s patch set is not whole ({found.describe()}); "
            f"`opspatch recover --hosts {session.name}` makes it whole",
            file=found.change(),
        )
    server = inspection.server
    if server is not None and not server.predates(inspection.file):
        return session.outcome(
            Outcome.SKIPPED,
            file=found.change(),
            note=f"nothing staged: the running server (pid {server.pid}) started after the "
            f"patch set was written, so it already runs run {run_id}'s change; left alone",
        )
    return prove_or_undo(
        session,
        change=found.change(),
        restore=lambda: restore_set(session, found),
        note=f"restarted into run {run_id}'s patch set (all-new) and proven",
    )
