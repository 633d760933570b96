"""`apply --live` under a playbook's `[judge]`: the judge follows the smoke after the take, as
it follows the smoke after a restart, and a `fail` is a failed proof (every process reverted,
the file restored, `rolled-back`). Scripted hosts (tests/livekit.py's live engine,
tests/scriptedkit.py's `measure` answers: the old server's before the swap, the new one's
after it)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from opspatch.core.policy import BatchSize, JudgeSettings, Playbook
from opspatch.core.vocabulary import JudgeHosts, Step
from opspatch.runs.commands.apply import apply_to_hosts
from opspatch.runs.report import RunReport
from tests.livekit import LiveEngine, former, live_host, live_unit
from tests.scriptedkit import JUDGED as UNIT_JUDGED
from tests.scriptedkit import (
    PRISTINE,
    PROMPTS,
    Fleet,
    Units,
    fleet,
    judged_unit,
    sample,
    sha,
    units,
)
from tests.scriptedkit import files as unit_files

pytestmark = pytest.mark.scripted

__all__ = ["fleet", "units"]  # the fixtures, used by name

JUDGED = Playbook(
    canary=0,
    batch=BatchSize(count=10),
    max_failures=1,
    judge=JudgeSettings(count=PROMPTS, hosts=JudgeHosts.ALL),
)


def apply_judged(fleet: Fleet, engine: LiveEngine, *, changed: bool) -> RunReport:
    (fake,) = fleet.hosts

    def answer(op: str, args: dict[str, Any]) -> dict[str, Any] | None:
        if op == "live":
            return engine.answer(args)
        if op == "measure":
            patched = sha(fake.file.read_bytes()) != PRISTINE
            samples = [sample(i, changed=changed and patched) for i in range(PROMPTS)]
            return {"samples": samples, "spec_accept_length": None}
        return None

    fake.fault = answer
    return apply_to_hosts(
        fleet.patch,
        [live_host(fake)],
        replace(JUDGED),
        factory=fleet.factory,
        ledger=fleet.ledger,
        live=former,
    )


def test_a_live_take_is_judged_after_its_smoke_and_applied_when_it_passes(fleet: Fleet) -> None:
    fleet.hosts = fleet.hosts[:1]
    engine = LiveEngine()
    report = apply_judged(fleet, engine, changed=False)
    (outcome,) = report.hosts
    assert outcome.outcome == "applied", outcome
    words = [str(s.step) for s in outcome.steps]
    assert words.index(Step.SMOKE) < words.index(Step.JUDGE)
    assert "restart" not in words
    assert outcome.judgment is not None and not outcome.judgment.failed
    assert engine.held[0] and engine.held[1]  # still taken
    assert report.exit_code == 0


def test_a_live_take_the_judge_fails_is_reverted_everywhere_and_the_file_restored(
    fleet: Fleet,
) -> None:
    fleet.hosts = fleet.hosts[:1]
    engine = LiveEngine()
    report = apply_judged(fleet, engine, changed=True)
    (outcome,) = report.hosts
    assert (outcome.outcome, outcome.reason) == ("rolled-back", "judge-failed"), outcome
    assert "tokens" in (outcome.error or ""), outcome.error
    assert outcome.judgment is not None and outcome.judgment.failed
    assert engine.held == {0: {}, 1: {}}
    assert sha(fleet.hosts[0].file.read_bytes()) == PRISTINE
    words = [str(s.step) for s in outcome.steps]
    assert "live-revert" in words and "restore" in words
    assert report.exit_code == 1


def test_a_unit_whose_live_take_the_judge_fails_is_reverted_on_every_rank_of_both_nodes(
    units: Units,
) -> None:
    engine = live_unit(units)
    servers = judged_unit(units, changed=True)
    for name in ("h1", "h2"):  # the live engine and the measured server, both scripted
        units.fakes[name].fault = lambda op, args, node=name: (
            engine.answer(node, args) if op == "live" else servers.answer(node, op)
        )
    hosts = [replace(h, live=True) for h in units.hosts("h1", "h2")]
    report = apply_to_hosts(
        units.patch,
        hosts,
        replace(UNIT_JUDGED, judge=JudgeSettings(count=PROMPTS, hosts=JudgeHosts.ALL)),
        factory=units.factory,
        ledger=units.ledger,
        live=former,
    )
    outcomes = {o.host: o for o in report.hosts}
    assert {h: o.outcome for h, o in outcomes.items()} == {"h1": "rolled-back", "h2": "rolled-back"}
    assert outcomes["h1"].reason == "judge-failed", outcomes["h1"]
    assert outcomes["h1"].judgment is not None and outcomes["h1"].judgment.failed
    assert engine.holding() == {rank: set() for rank in range(4)}
    assert unit_files(units) == {"h1": PRISTINE, "h2": PRISTINE}
    for node in ("h1", "h2"):
        words = [str(s.step) for s in outcomes[node].steps]
        assert "judge" in words and "live-revert" in words, words
        assert not {"stop", "start"} & set(words), words  # reverted live: no restart
    assert servers.asked == ["h1", "h1"]  # the head's old server, then its new one
