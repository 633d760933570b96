"""The ledger ceremony of a run, written once: check the chain, begin, finish with the outcome."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from opspatch.core.host import Host
from opspatch.core.policy import Playbook, TeamSettings
from opspatch.core.remedy import remedy_text
from opspatch.core.spec import LoadedPatch
from opspatch.core.vocabulary import Command, RunOutcome
from opspatch.errors import InputError, LedgerError, LedgerIntegrityError, LedgerLost
from opspatch.ledger.store import Ledger, operator_identity
from opspatch.runs.fleet.connect import TransportFactory
from opspatch.runs.fleet.fleetrun import FleetRun
from opspatch.runs.fleet.recorder import NullRecorder, Recorder
from opspatch.runs.fleet.session import NoProgress, Progress
from opspatch.runs.report import RunReport


def command_line(argv: Sequence[str] | None = None) -> str:
    args = sys.argv[1:] if argv is None else list(argv)
    return " ".join(shlex.quote(a) for a in ["opspatch", *args])


@contextmanager
def recorded_run(
    ledger: Ledger,
    *,
    command: Command,
    patch: LoadedPatch | None,
    hosts: Sequence[Host],
    playbook: Playbook | None = None,
    parent_run: str | None = None,
    argv: Sequence[str] | None = None,
    approved_by: Sequence[str] | None = None,
) -> Iterator[Recorder]:
    """Begin a run after checking the ledger's chain. Writes are retried until the lease expiry (a
    PostgreSQL restart, a network cut); an empty `hosts` is refused: it would report success for
    doing nothing."""
    if not hosts:
        raise InputError(
            f"{command} selects no host: nothing was done and no run recorded",
            hint="select hosts with --hosts TARGET "
            f"(`{remedy_text(Command.INVENTORY_SHOW, 'INVENTORY')}` lists "
            "them)",
        )
    ledger.ensure_intact()
    ledger = ledger.retrying((playbook.team if playbook else TeamSettings()).lease_expiry)
    run_id = ledger.begin_run(
        command=command,
        patch_id=patch.spec.id if patch else None,
        patch_sha256=patch.sha256 if patch else None,
        operator=operator_identity(),
        command_line=command_line(argv),
        hosts=[h.name for h in hosts],
        playbook=playbook.name if playbook else None,
        parent_run=parent_run,
        inventories={h.name: h.inventory for h in hosts},
        approved_by=approved_by,
    )
    run = Recorder(ledger, run_id)
    try:
        yield run
    except InputError:
        if not run.finished:
            ledger.finish_run(run_id, RunOutcome.REFUSED)
            run.finished = True
        raise
    except LedgerError as exc:
        # The ledger became unwritable part-way (its filesystem filled up, went read-only), or
        # was deleted or replaced: the run stopped before its next change, and may have left
        # hosts locked or changed. Say what to do, and with which ledger.
        if not run.finished and not isinstance(exc, LedgerIntegrityError):
            then = _then_recover(run_id, exc, ledger)
            exc.hint = f"{exc.hint}; {then}" if exc.hint else then
        raise


def _then_recover(run_id: str, exc: LedgerError, ledger: Ledger) -> str:
    part_way = f"the hosts run {run_id} left part-way (locked, or changed and not yet proven)"
    if not isinstance(exc, LedgerLost):
        return f"`{remedy_text(Command.RECOVER)}` then brings {part_way} to a known state"
    recover = remedy_text(Command.RECOVER, run=run_id)
    if exc.rescued is None:  # the run's records are where nobody can read them now
        by_host = remedy_text(Command.RECOVER, hosts="TARGET")
        return f"`{by_host}` reconciles {part_way} from what is on them"
    if exc.rescued != str(ledger.path):
        return f"with --ledger {exc.rescued}, `{recover}` brings {part_way} to a known state"
    return f"`{recover}` brings {part_way} to a known state"


def run_recorded(
    command: Command,
    body: Callable[[FleetRun], RunReport],
    *,
    ledger: Ledger,
    hosts: Sequence[Host],
    factory: TransportFactory,
    playbook: Playbook | None,
    progress: Progress | None = None,
    patch: LoadedPatch | None = None,
    patch_id: str | None = None,
    parent_run: str | None = None,
    approved_by: Sequence[str] | None = None,
    summary: str | None = None,
) -> RunReport:
    """`body` over a recorded run's fleet, the run finished with its report; `patch_id`: the
    fleet's, when no `patch` names it (a rollback of a run); `summary`: told to the progress
    once the run has its id; no `playbook`: none recorded, the fleet runs the default one."""
    progress = progress or NoProgress()
    with recorded_run(
        ledger,
        command=command,
        patch=patch,
        hosts=hosts,
        playbook=playbook,
        parent_run=parent_run,
        approved_by=approved_by,
    ) as run:
        if summary is not None:
            progress.run_started(run.run_id, summary)
        with FleetRun(
            command=command,
            patch_id=patch.spec.id if patch is not None else patch_id,
            hosts=hosts,
            factory=factory,
            playbook=playbook or Playbook(),
            recorder=run,
            progress=progress,
        ) as fleet:
            report = body(fleet)
        # finished once the fleet gave its leases back: the give-back is a step of the open run
        return run.finish(report)


def unrecorded_run(
    command: Command,
    *,
    hosts: Sequence[Host],
    factory: TransportFactory,
    playbook: Playbook,
    progress: Progress | None = None,
    patch_id: str | None = None,
) -> FleetRun:
    """A fleet run with no ledger record (a dry run, a smoke, a judge): no run id, so no lock and
    no lease (`NullRecorder`)."""
    return FleetRun(
        command=command,
        patch_id=patch_id,
        hosts=hosts,
        factory=factory,
        playbook=playbook,
        recorder=NullRecorder(),
        progress=progress or NoProgress(),
    )
