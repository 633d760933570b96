"""`rollback` of a patch applied live, fast: the scripted hosts and scripted live engine of
tests/livekit.py. The rollback sends `revert` of the patch's live fix to every process
before it restores the file, so `--restart never` takes the code out of the running engine too;
a host without `live = true` is never asked.
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from opspatch.core.policy import Playbook
from opspatch.runs.commands.recover import recover_hosts
from opspatch.runs.commands.restart import restart_hosts
from opspatch.runs.commands.rollback import rollback_hosts
from opspatch.runs.commands.status import PatchStatus, fleet_status
from opspatch.runs.report import RunReport
from tests.livekit import LiveEngine, apply_live, serving, steps
from tests.scriptedkit import PRISTINE, Fleet, fleet, sha

pytestmark = pytest.mark.scripted

__all__ = ["fleet"]  # the fixture, used by name


def rollback(fleet: Fleet, *, restart: bool, live: bool = True) -> RunReport:
    return rollback_hosts(
        ledger=fleet.ledger,
        hosts=[replace(h.host(), live=live) for h in fleet.hosts],
        factory=fleet.factory,
        playbook=Playbook(max_in_flight=1),
        patch=fleet.patch,
        restart_engine=restart,
    )


def test_rollback_restart_never_of_a_live_fix_reverts_it_in_every_process(fleet: Fleet) -> None:
    fleet.hosts = fleet.hosts[:1]
    engine = LiveEngine()
    apply_live(fleet, engine)
    assert engine.held[0] and engine.held[1]
    report = rollback(fleet, restart=False)
    (outcome,) = report.hosts
    assert outcome.outcome == "staged-back", outcome
    assert engine.held == {0: {}, 1: {}}
    assert engine.asked[-2:] == ["list", "revert"]
    assert "live fix eagle-init-guard reverted in every process" in (outcome.note or "")
    assert steps(report).index("live-revert") < steps(report).index("restore")
    assert sha(fleet.hosts[0].file.read_bytes()) == PRISTINE


def test_rollback_with_a_restart_reverts_too_then_restarts(fleet: Fleet) -> None:
    fleet.hosts = fleet.hosts[:1]
    engine = LiveEngine()
    apply_live(fleet, engine)
    report = rollback(fleet, restart=True)
    (outcome,) = report.hosts
    assert outcome.outcome == "restored", outcome
    assert engine.held == {0: {}, 1: {}}
    assert "restart" in steps(report) or "restart-after-restore" in steps(report)


def test_a_host_without_live_true_is_never_asked(fleet: Fleet) -> None:
    fleet.hosts = fleet.hosts[:1]
    engine = LiveEngine()
    apply_live(fleet, engine)
    asked = len(engine.asked)
    report = rollback(fleet, restart=False, live=False)
    (outcome,) = report.hosts
    assert outcome.outcome == "staged-back", outcome
    assert len(engine.asked) == asked
    assert "live" not in steps(report)


def test_an_engine_whose_live_fixes_could_not_be_listed_is_said_not_taken_as_none(
    fleet: Fleet,
) -> None:
    fleet.hosts = fleet.hosts[:1]
    engine = LiveEngine()
    apply_live(fleet, engine)
    engine.listening = False  # the fix may still be in memory: nobody could be asked
    report = rollback(fleet, restart=False)
    (outcome,) = report.hosts
    assert outcome.outcome == "staged-back", outcome
    assert "live fixes could not be listed (nobody listens)" in (outcome.note or ""), outcome
    (live,) = [s for s in outcome.steps if s.step == "live"]
    assert "no live fix" not in live.detail and "nobody listens" in live.detail


# -- what the server runs after a rollback with no restart: stale only when it runs the fix ----


def _status(fleet: Fleet) -> PatchStatus:
    hosts = [replace(h.host(), live=True) for h in fleet.hosts]
    (said,) = fleet_status(hosts, [fleet.patch], fleet.factory, fleet.ledger)
    return said


def _restart_and_recover(fleet: Fleet) -> list[RunReport]:
    hosts = [replace(h.host(), live=True) for h in fleet.hosts]
    common = {"ledger": fleet.ledger, "hosts": hosts, "factory": fleet.factory}
    restarted = restart_hosts(**common, playbook=Playbook())
    recovered = recover_hosts(**common, playbook=Playbook(), patch=fleet.patch)
    return [restarted, recovered]


def test_a_live_fix_rolled_back_with_no_restart_leaves_no_stale_server(fleet: Fleet) -> None:
    """Before, its server (started before the file was put back) read as stale: `status` said
    it "still runs the patched code" and `restart` and `recover` restarted it, though the
    rollback's revert took the fix out of every process."""
    fleet.hosts = fleet.hosts[:1]
    (host,) = fleet.hosts
    engine = LiveEngine()
    apply_live(fleet, engine)
    back = rollback(fleet, restart=False)
    assert [o.outcome for o in back.hosts] == ["staged-back"] and engine.held == {0: {}, 1: {}}
    serving(host, engine)
    host.requests.clear()
    said = _status(fleet)
    assert said.state == "not-applied", said
    assert "started before" not in said.detail and "patched code" not in said.detail, said
    for report in _restart_and_recover(fleet):
        assert report.exit_code == 0, report
        assert [o.note for o in report.hosts if "started before" in (o.note or "")] == []
    assert "restart" not in host.requests and "smoke" not in host.requests, host.requests


def test_a_fix_applied_with_a_restart_then_put_back_with_none_is_stale_on_a_live_host(
    fleet: Fleet,
) -> None:
    """`rollback --restart never` of a fix no process holds live (its `list` finds none, a
    change of nothing): the server still runs the patched code, said so and restarted."""
    fleet.hosts = fleet.hosts[:1]
    (host,) = fleet.hosts
    assert fleet.outcomes(fleet.apply()) == {"h1": "applied"}
    host.started_at = time.time() - 600  # the apply's restart, ten minutes before the rollback
    engine = LiveEngine()
    serving(host, engine)
    back = rollback(fleet, restart=False)
    assert [o.outcome for o in back.hosts] == ["staged-back"], back
    assert engine.asked == ["list"]
    said = _status(fleet)
    assert said.state == "not-applied" and "still runs the patched code" in said.detail, said
    host.requests.clear()
    restarted, _ = _restart_and_recover(fleet)
    (outcome,) = restarted.hosts
    assert outcome.outcome == "restored" and "started before" in (outcome.note or ""), outcome
    assert "restart" in host.requests and "smoke" in host.requests, host.requests
