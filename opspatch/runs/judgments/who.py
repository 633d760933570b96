"""Who ran a run, as `status` names it: its operator, controller machine and approvers."""

from __future__ import annotations

from dataclasses import dataclass

from opspatch.core.codec import Record
from opspatch.errors import InputError
from opspatch.ledger.store import Ledger


@dataclass(frozen=True)
class RunWho(Record):
    run_id: str
    operator: str
    controller: str
    approved_by: tuple[str, ...] = ()

    def describe(self) -> str:
        """`run R by alice@ctl on ctl, approved by bob`."""
        approved = f", approved by {', '.join(self.approved_by)}" if self.approved_by else ""
        return f"run {self.run_id} by {self.operator} on {self.controller}{approved}"


def who_ran(ledger: Ledger, run_id: str) -> RunWho | None:
    """The run's operator, controller and approvers; None when this ledger has no such run."""
    try:
        summary = ledger.run_chain(run_id)[0]
    except (InputError, IndexError):
        return None
    return RunWho(
        summary.run_id, summary.operator, summary.controller.hostname, summary.approved_by or ()
    )
