"""Reason codes on outcomes that had none (issue 43 item 6): a swap refused for a changed file,
a required baseline that failed, a pre-image the ledger could not record, a bug mid-run,
rollback's nothing to restore, and unlock's refusal of a running run's lock; each code reaches
the ledger, and a refused baseline's other hosts carry it too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from opspatch.core.policy import BatchSize, Playbook, SmokeSettings
from opspatch.core.reasons import Reason
from opspatch.errors import LedgerError
from opspatch.hosts.transport.scripted import Refusal, agent_operation
from opspatch.ledger.store import Ledger
from opspatch.runs.commands.rollback import rollback_hosts
from opspatch.runs.commands.unlock import unlock_hosts
from opspatch.runs.fleet.recorder import Recorder as LedgerRecorder
from opspatch.runs.report import HostOutcome, RunReport
from tests.ledgerkit import begin
from tests.scriptedkit import PRISTINE, Fleet, fleet, sha

__all__ = ["fleet"]  # the fixture, used by name

pytestmark = pytest.mark.scripted


def recorded(fleet: Fleet, report: RunReport, host: str) -> Reason | None:
    return fleet.ledger.get_run(report.run_id or "").host(host).reason


def test_a_swap_refused_for_a_file_changed_since_it_was_read_is_changed_since(
    fleet: Fleet,
) -> None:
    host = fleet.hosts[0]
    fleet.hosts = [host]

    def edit_first(op: str, args: dict[str, Any]) -> None:
        if op == "swap":  # someone edits the file between the read and the swap
            host.file.write_bytes(host.file.read_bytes() + b"# by hand\n")
        return None

    host.fault = edit_first
    report = fleet.apply()
    (outcome,) = report.hosts
    assert outcome.outcome == "failed" and outcome.reason == Reason.CHANGED_SINCE, outcome
    assert recorded(fleet, report, host.name) == Reason.CHANGED_SINCE
    assert report.to_json()["hosts"][0]["reason"] == "changed-since"


def test_a_required_baseline_that_fails_is_baseline_failed_with_nothing_changed(
    fleet: Fleet,
) -> None:
    host = fleet.hosts[0]
    fleet.hosts = [host]

    def no_baseline(op: str, args: dict[str, Any]) -> Refusal | None:
        if op == "smoke":
            return Refusal("engine-not-running", "the engine does not answer")
        return None

    host.fault = no_baseline
    playbook = Playbook(
        canary=0, batch=BatchSize(count=10), smoke=SmokeSettings(baseline="required")
    )
    report = fleet.apply(playbook)
    (outcome,) = report.hosts
    assert outcome.outcome == "failed" and outcome.reason == Reason.BASELINE_FAILED, outcome
    assert "requires a baseline" in (outcome.error or "")  # baseline-failed's wording
    assert sha(host.file.read_bytes()) == PRISTINE
    assert recorded(fleet, report, host.name) == Reason.BASELINE_FAILED


def test_a_pre_image_the_ledger_cannot_record_is_backup_not_recorded(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ledger, not the host, failed (its disk full): before, the host's outcome said
    `host-error`. The run then stops on the ledger's error, so the outcome it tried to record
    is read where it is handed to the recorder."""
    host = fleet.hosts[0]
    fleet.hosts = [host]

    def disk_full(*args: Any, **kwargs: Any) -> None:
        raise LedgerError("cannot write the ledger: database or disk is full")

    handed: list[HostOutcome] = []
    record = LedgerRecorder.outcome

    def keep(recorder: LedgerRecorder, outcome: HostOutcome) -> None:
        handed.append(outcome)
        record(recorder, outcome)

    monkeypatch.setattr(Ledger, "record_file_version", disk_full)
    monkeypatch.setattr(LedgerRecorder, "outcome", keep)
    with pytest.raises(LedgerError):
        fleet.apply()
    (outcome,) = handed
    assert outcome.outcome == "failed" and outcome.reason == Reason.BACKUP_NOT_RECORDED, outcome
    assert host.requests == ["lock", "inspect"]  # nothing swapped
    assert sha(host.file.read_bytes()) == PRISTINE


def test_a_bug_mid_run_is_an_internal_error(fleet: Fleet) -> None:
    host = fleet.hosts[0]
    fleet.hosts = [host]

    def bug(op: str, args: dict[str, Any]) -> None:
        if op == "restart":
            raise RuntimeError("a bug")
        return None

    host.fault = bug
    report = fleet.apply()
    (outcome,) = report.hosts
    assert outcome.outcome == "needs-attention", outcome
    assert outcome.reason == Reason.INTERNAL_ERROR, outcome
    assert recorded(fleet, report, host.name) == Reason.INTERNAL_ERROR


def test_a_rollback_with_nothing_to_restore_is_nothing_to_do(fleet: Fleet) -> None:
    fleet.hosts = fleet.hosts[:1]
    assert fleet.apply().exit_code == 0

    def roll_back() -> RunReport:
        return rollback_hosts(
            ledger=fleet.ledger,
            hosts=[h.host() for h in fleet.hosts],
            factory=fleet.factory,
            playbook=Playbook(),
            patch=fleet.patch,
        )

    assert roll_back().hosts[0].outcome == "restored"
    again = roll_back()
    (outcome,) = again.hosts
    assert outcome.outcome == "skipped" and outcome.reason == Reason.NOTHING_TO_DO, outcome
    assert "nothing to restore" in (outcome.note or "")  # rollback's wording
    assert recorded(fleet, again, outcome.host) == Reason.NOTHING_TO_DO


def test_unlock_refuses_the_lock_of_a_running_run_as_lock_held(fleet: Fleet) -> None:
    host = fleet.hosts[0]
    running = begin(fleet.ledger, hosts=(host.name,))  # this process's run: alive
    locked = agent_operation(
        "lock",
        {
            "state_dir": str(host.state),
            "owner": "someone@here",
            "run_id": running,
            "ttl_seconds": 1800,
        },
    )
    assert isinstance(locked, dict)
    report = unlock_hosts(
        ledger=fleet.ledger, hosts=[host.host()], factory=fleet.factory, playbook=Playbook()
    )
    (outcome,) = report.hosts
    assert outcome.outcome == "skipped" and outcome.reason == Reason.LOCK_HELD, outcome
    assert "which is still running" in (outcome.error or "")
    assert Path(host.state / "lock.json").is_file()
