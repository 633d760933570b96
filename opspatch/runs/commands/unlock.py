"""`opspatch unlock`: remove a host lock whose run is over, recorded in the ledger."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from opspatch.core.host import Host
from opspatch.core.policy import Playbook
from opspatch.core.reasons import Reason
from opspatch.core.vocabulary import Command, Outcome, RunStatus, Step
from opspatch.errors import InputError, LockHeld
from opspatch.ledger.store import Ledger
from opspatch.runs.fleet.connect import TransportFactory
from opspatch.runs.fleet.fleetrun import per_node
from opspatch.runs.fleet.host_leases import refusal
from opspatch.runs.fleet.recorded import run_recorded
from opspatch.runs.fleet.restore import run_in_batches
from opspatch.runs.fleet.session import HostSession, Progress
from opspatch.runs.report import HostOutcome, RunReport


def unlock_hosts(
    *,
    ledger: Ledger,
    hosts: Sequence[Host],
    factory: TransportFactory,
    playbook: Playbook,
    force_unknown: bool = False,
    progress: Progress | None = None,
) -> RunReport:
    """Remove host locks whose run is over. A running run's lock is refused; so, unless
    `force_unknown`, are one whose lease is live and one whose run this ledger does not know."""
    unlock = per_node(_UnlockHost(ledger, force_unknown).host)
    return run_recorded(
        Command.UNLOCK,
        lambda fleet: run_in_batches(fleet, unlock),
        ledger=ledger,
        hosts=hosts,
        factory=factory,
        playbook=playbook,
        progress=progress,
    )


@dataclass(frozen=True)
class _UnlockHost:
    ledger: Ledger
    force_unknown: bool

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
                previous = info["previous"]
                note["detail"] = (
                    f"the lock of run {previous.get('run_id')} had expired"
                    if previous
                    else "no lock held"
                )
                text = f"{note['detail']}; nothing to remove"
                return session.outcome(Outcome.SKIPPED, note=text, reason=Reason.NOTHING_TO_DO)
        status = self._status_of(holder)
        if status == RunStatus.RUNNING:
            return session.outcome(
                Outcome.SKIPPED,
                f"refused: the lock belongs to run {holder}, which is still running",
                reason=Reason.LOCK_HELD,
            )
        live = [lease for lease in self.ledger.leases_of([holder] if holder else []) if lease.live]
        if live and not self.force_unknown:  # its controller heart-beats: it may be changing it
            return session.outcome(
                Outcome.SKIPPED,
                f"refused: the lock belongs to run {holder}, whose lease is live: "
                f"{refusal(live)}; or re-run with --force",
                reason=Reason.LEASE_HELD,
            )
        if status is None and not self.force_unknown:
            return session.outcome(
                Outcome.SKIPPED,
                f"refused: the lock belongs to run {holder or '(unnamed)'}, which this ledger does "
                f"not know ({held_by}); it may be alive on another controller. Ask its owner, "
                "wait for it to expire, or re-run with --force",
                reason=Reason.UNKNOWN_HOLDER,
            )
        with session.step(Step.UNLOCK) as note:
            result = session.ops.unlock(run_id=holder, force=not holder, timeout=timeout)
            note["detail"] = (
                f"removed the lock of run {holder}" if result["released"] else result["reason"]
            )
        return session.outcome(Outcome.UNLOCKED, note=f"removed the lock of run {holder}")

    def _status_of(self, run_id: str) -> RunStatus | None:
        if not run_id:
            return None
        try:
            return RunStatus(self.ledger.get_run(run_id).summary.status)
        except InputError:
            return None
