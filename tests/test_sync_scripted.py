"""`plan --fleet`, `sync --check` and `drift` decide from what `status` read, fast: the scripted
hosts of tests/scriptedkit.py and a real ledger."""

from __future__ import annotations

import pytest

from opspatch.core.vocabulary import DriftCause, PatchState, SyncAction
from opspatch.runs.commands.sync import plan_fleet
from tests.scriptedkit import PRISTINE, Fleet, desired_everywhere, fleet, sha

pytestmark = pytest.mark.scripted

__all__ = ["fleet"]  # the fixture, used by name


def test_drift_reads_what_status_read_of_a_host_under_a_new_inventory_name(fleet: Fleet) -> None:
    """The host was patched as h1 and its release reinstalled since; the inventory now calls the
    same machine renamed-01. Status finds the patch's record by the machine; drift must read the
    same record: a reinstall, not "never patched". Before, drift read the ledger again by the
    new name alone and said patch-missing."""
    fleet.hosts = fleet.hosts[:1]
    fake = fleet.hosts[0]
    pristine = fake.file.read_bytes()
    assert fleet.outcomes(fleet.apply()) == {"h1": "applied"}
    fake.file.write_bytes(pristine)  # the release reinstalled: the pre-image back
    assert sha(fake.file.read_bytes()) == PRISTINE
    fake.name = "renamed-01"
    desired = desired_everywhere(fleet, fleet.patch)
    plan = plan_fleet(desired, [fake.host()], [], fleet.factory, fleet.ledger)
    (row,) = plan.rows
    assert (row.host, row.state, row.action) == (
        "renamed-01",
        PatchState.NOT_APPLIED,
        SyncAction.APPLY,
    ), row
    assert "back at the pre-image of run" in row.detail, row.detail  # status found the record
    assert row.cause == DriftCause.REINSTALLED, row
