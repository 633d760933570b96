"""A run's leases on its hosts: what keeps a second operator's run off them, and lets a third take
a dead controller's run over (docs/team.md).

A host is leased by what it is (`host_identity`: its machine id, its hostname, and the folder its
opspatch lock lives in, so two stand-in engines on one machine are two hosts and one machine
reached through two inventories is one), in the preflight, after every host was inspected and
before any is changed. The `Heartbeat` renews the run's leases every third of the playbook's
`[team] lease_expiry`; `FleetRun` gives them back when the run ends. A lease whose heartbeat
went silent longer than that has expired: the controller is gone (killed, laptop closed, network
cut) and `recover --run R` may take the run over. A live lease is never broken.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from opspatch.core.host import Host
from opspatch.errors import LeaseHeld, LedgerError, LockHeld
from opspatch.hosts.results import HostFacts
from opspatch.ledger.records import LeaseHolder
from opspatch.runs.recorder import Recorder

HEARTBEATS_PER_EXPIRY = 3
"""Heartbeats sent within one expiry interval: a late one or two do not lose the lease."""


def lease_held(holders: Sequence[LeaseHolder], *, what: str) -> LeaseHeld:
    """The refusal naming every holder (its run, operator, controller) and what to do."""
    first = holders[0]
    return LeaseHeld(
        f"{what}: {held_by(holders)}",
        hint="nothing was changed; wait until that run finishes (`opspatch ledger show "
        f"{first.run_id}`), or ask {first.operator}; if its controller is gone, "
        f"`opspatch recover --run {first.run_id}` takes it over once its lease expired "
        f"({first.expires_after_seconds:g} s after its last heartbeat)",
    )


def held_by(holders: Sequence[LeaseHolder]) -> str:
    """`gpu-1 is leased to run R of alice@ctl (controller ctl), last heartbeat 2 s ago; ...`."""
    by_run: dict[str, dict[str, LeaseHolder]] = {}
    for holder in holders:  # a lease named twice (by two refused hosts) is said once
        by_run.setdefault(holder.run_id, {})[holder.identity] = holder
    return "; ".join(
        f"{', '.join(sorted(h.host for h in held.values()))} "
        f"{'is' if len(held) == 1 else 'are'} leased to {next(iter(held.values())).describe()}"
        for held in by_run.values()
    )


def live_holders(recorder: Recorder, held: LockHeld) -> list[LeaseHolder]:
    """The live leases of the run whose host lock refused this one (none: an old-style lock, a
    run of another ledger, or a run whose controller went quiet)."""
    holder = str(held.data.get("run_id") or "")
    if not holder:
        return []
    return [lease for lease in recorder.leases_of([holder]) if lease.live]


def refusal(holders: Sequence[LeaseHolder]) -> str:
    """Why a run is refused, for its report: who holds the hosts and what to do."""
    first = holders[0]
    return (
        f"{held_by(holders)}; wait until that run finishes or ask {first.operator} (its lease "
        f"expires {first.expires_after_seconds:g} s after its last heartbeat; then "
        f"`opspatch recover --run {first.run_id}` may take it over)"
    )


def host_identity(host: Host, facts: HostFacts) -> str:
    """What a host is, for its lease: `<machine id>/<hostname>:<opspatch state folder>`."""
    return f"{facts.machine_id or 'no-machine-id'}/{facts.hostname}:{host.state_dir}"


class Heartbeat:
    """Renews a run's leases from a daemon thread until `stop()`; a ledger that cannot be
    written is retried on the next beat (the lease expires only if every beat fails)."""

    def __init__(self, recorder: Recorder, expires_after: float) -> None:
        self._recorder = recorder
        self._interval = expires_after / HEARTBEATS_PER_EXPIRY
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="opspatch-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join()

    def _beat(self) -> None:
        while not self._stopped.wait(self._interval):
            try:
                self._recorder.renew_leases()
            except LedgerError:
                continue  # the next beat tries again; the run's own writes report the ledger
