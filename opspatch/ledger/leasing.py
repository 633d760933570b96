"""The host leases a run holds: taken (refusing a live holder, taking over an expired or dead
one), renewed by its heartbeat, given back, listed."""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence

from opspatch.core.vocabulary import EventKind, Step, StepStatus
from opspatch.ledger import lease_store
from opspatch.ledger.database import Database
from opspatch.ledger.events import require_open_run, select_events
from opspatch.ledger.records import LeaseGrant, LeaseHolder
from opspatch.ledger.transactions import Transactions


def _now_ms() -> int:
    return int(time.time() * 1000)


def _holder(lease: lease_store.Lease, now_ms: int) -> LeaseHolder:
    return LeaseHolder(
        identity=lease.identity,
        host=lease.host,
        run_id=lease.run_id,
        operator=lease.operator,
        controller=lease.controller,
        silent_seconds=lease.silent_ms(now_ms) / 1000,
        expires_after_seconds=lease.expires_after_ms / 1000,
    )


class Leasing(Transactions):
    """The leases of a run: `take_leases`, `renew_leases`, `give_back_leases`, `leases_of`."""

    # -- leases (mutable state beside the history; each change recorded as a step) ---------------

    def take_leases(
        self,
        run_id: str,
        identities: Mapping[str, str],
        *,
        expires_after: float,
        taking_over: Collection[str] = (),
    ) -> LeaseGrant:
        """Lease each host of `identities` (inventory name -> host identity) to `run_id`, which
        must heart-beat (`renew_leases`) more often than every `expires_after` seconds.

        A live lease of another run refuses the whole request (nothing is taken: the grant's
        `refused` names every such holder); an expired one is taken over, and so is one of the
        runs in `taking_over` (the caller knows their controllers are gone: a recover of runs
        this machine saw die). Each lease taken is recorded as a `lease` step of the run in the
        same transaction, naming any run it was taken over from.

        Raises:
            LedgerError: the run is unknown or finished, or the ledger cannot be written.
        """
        if expires_after <= 0:
            raise ValueError(f"expires_after must be positive, got {expires_after}")

        def write(conn: Database) -> LeaseGrant:
            now = _now_ms()  # each try's own: a retried one takes its leases when it does
            start = require_open_run(conn, run_id).data
            current = {
                lease.identity: lease
                for lease in lease_store.leases_on(conn, sorted(set(identities.values())))
            }
            others = {i: lease for i, lease in current.items() if lease.run_id != run_id}
            refused = tuple(
                _holder(lease, now)
                for lease in others.values()
                if lease.live(now) and lease.run_id not in taking_over
            )
            if refused:
                return LeaseGrant(refused=refused)
            taken = [
                lease_store.Lease(
                    identity=identity,
                    host=host,
                    run_id=run_id,
                    operator=str(start["operator"]),
                    controller=str(start["controller"]["hostname"]),
                    taken_at_ms=now,
                    heartbeat_at_ms=now,
                    expires_after_ms=int(expires_after * 1000),
                )
                for host, identity in identities.items()
            ]
            lease_store.put(conn, taken)
            taken_over = []
            for lease in taken:
                before = others.get(lease.identity)
                detail = f"took the lease on {lease.identity}"
                if before is not None:
                    taken_over.append(_holder(before, now))
                    why = (
                        f"expired after {before.expires_after_ms / 1000:g} s"
                        if not before.live(now)
                        else "its controller is gone"
                    )
                    detail += f", taken over from {taken_over[-1].describe()} ({why})"
                body = {
                    "step": Step.LEASE.value,
                    "status": StepStatus.OK.value,
                    "seconds": None,
                    "detail": detail,
                }
                self._append(conn, run_id=run_id, kind=EventKind.STEP, host=lease.host, body=body)
            return LeaseGrant(taken_over=tuple(taken_over))

        return self._write(write)

    def renew_leases(self, run_id: str) -> int:
        """A heartbeat of `run_id`: its leases renewed; how many it still holds (fewer than it
        took means another run took some over after this one went quiet too long).

        Tried once, never again within a run's patience (`retrying`): the heartbeat beats again
        on its own, and says so when one does not get through.

        Raises:
            LedgerError: the ledger cannot be written.
        """
        return self._write(lambda conn: lease_store.renew(conn, run_id, _now_ms()), patient=False)

    def give_back_leases(self, run_id: str) -> int:
        """Remove `run_id`'s leases, each recorded as a `lease` step while the run is open (a
        finished run's leases are removed unrecorded); how many it held.

        Raises:
            LedgerError: the ledger cannot be written.
        """

        def write(conn: Database) -> int:
            held = lease_store.give_back(conn, run_id)
            if held and not select_events(
                conn, f"run_id = ? AND kind = '{EventKind.RUN_FINISHED}'", (run_id,)
            ):
                for lease in held:
                    body = {
                        "step": Step.LEASE.value,
                        "status": StepStatus.OK.value,
                        "seconds": None,
                        "detail": f"gave the lease on {lease.identity} back",
                    }
                    self._append(
                        conn, run_id=run_id, kind=EventKind.STEP, host=lease.host, body=body
                    )
            return len(held)

        return self._write(write)

    def leases_of(self, run_ids: Sequence[str]) -> list[LeaseHolder]:
        """The leases any of `run_ids` holds, live or expired, as this machine's clock judges.

        Raises:
            LedgerError: the ledger cannot be read.
        """
        now = _now_ms()
        with self._reading() as conn:
            return [_holder(lease, now) for lease in lease_store.leases_of(conn, list(run_ids))]
