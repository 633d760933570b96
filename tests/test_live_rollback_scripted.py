"""`rollback` of a patch applied live, fast: the scripted hosts and scripted live engine of
tests/livekit.py. The rollback sends `revert` of the patch's live fix to every process
before it restores the file, so `--restart never` takes the code out of the running engine too;
a host without `live = true` is never asked.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from opspatch.core.policy import Playbook
from opspatch.runs.commands.rollback import rollback_hosts
from opspatch.runs.report import RunReport
from tests.livekit import LiveEngine, apply_live, steps
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
