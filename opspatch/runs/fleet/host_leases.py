"""Leases keep a second operator's run off a run's hosts and let a third take a dead controller's
run over (docs/team.md)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from opspatch.core.host import Host
from opspatch.core.remedy import remedy_text
from opspatch.core.vocabulary import Command
from opspatch.errors import LeaseHeld, LedgerError, LockHeld
from opspatch.hosts.results import HostFacts
from opspatch.ledger.records import LeaseHolder
from opspatch.runs.fleet.recorder import Recorder
from opspatch.runs.fleet.session import Progress

HEARTBEATS_PER_EXPIRY = 3
"""Heartbeats sent within one expiry interval: a late one or two do not lose the lease."""


def lease_held(holders: Sequence[LeaseHolder], *, what: str) -> LeaseHeld:
    """The refusal naming every holder (its run, operator, controller) and what to do."""
    first = holders[0]
    return LeaseHeld(
        f"{what}: {held_by(holders)}",
        hint="nothing was changed; wait until that run finishes "
        f"(`{remedy_text(Command.LEDGER_SHOW, first.run_id)}`), or ask {first.operator}; "
        "if its controller is gone, "
        f"`{remedy_text(Command.RECOVER, run=first.run_id)}` takes it over once its lease "
        "expired "
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
    """None: an old-style lock, a run of another ledger, or one whose controller went quiet."""
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
        f"`{remedy_text(Command.RECOVER, run=first.run_id)}` may take it over)"
    )


def host_identity(host: Host, facts: HostFacts) -> str:
    """What a host is, for its lease: `<machine id>/<hostname>:<opspatch state folder>`."""
    return f"{facts.machine_id or 'no-machine-id'}/{facts.hostname}:{host.state_dir}"


class Heartbeat:
    """A beat the ledger refuses is said and retried; none through for the whole expiry, or a
    takeover, and the leases are `lost`: the fleet run starts no more hosts."""

    def __init__(
        self, recorder: Recorder, expires_after: float, progress: Progress, *, held: int
    ) -> None:
        self._recorder = recorder
        self._expires_after = expires_after
        self._interval = expires_after / HEARTBEATS_PER_EXPIRY
        self._progress = progress
        self._held = held
        self._renewed = time.monotonic()
        self._failing: str | None = None
        self._taken_over = False
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="opspatch-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join()

    @property
    def lost(self) -> str | None:
        """Why this run may no longer hold its leases; None while it does."""
        if self._taken_over:
            return "another run took this run's leases over (its heartbeat was silent too long)"
        silent = time.monotonic() - self._renewed
        if self._failing is not None and silent > self._expires_after:
            return (
                f"this run's leases could not be renewed for {silent:.0f} s (longer than their "
                f"{self._expires_after:g} s expiry): {self._failing}"
            )
        return None

    def _beat(self) -> None:
        while not self._stopped.wait(self._interval):
            try:
                held = self._recorder.renew_leases()
            except LedgerError as exc:
                if self._failing is None:  # said once per outage, not every beat
                    self._progress.notice(
                        f"the ledger did not take this run's lease heartbeat ({exc.message}); "
                        f"retrying; if none gets through within {self._expires_after:g} s the "
                        "leases expire, another operator may take the run over, and no more "
                        "hosts are started"
                    )
                self._failing = exc.message
                continue
            self._renewed = time.monotonic()
            if self._failing is not None:
                self._progress.notice("the ledger takes this run's lease heartbeat again")
                self._failing = None
            if held < self._held and not self._taken_over:
                self._taken_over = True
                self._progress.notice(
                    f"{self._held - held} of this run's {self._held} leases were taken over by "
                    "another run; no more hosts are started"
                )
