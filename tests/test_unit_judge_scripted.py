"""The playbook's judge over a unit, fast: tests/scriptedkit.py's unit u1 (h1 the head, h2; the
real agent on real files) and h3, a host by itself, with a scripted `measure` on the head: its
old server's answers while h1's file is the pristine one, the changed server's once it is not.

Each test names a decision of the unit's judge: measured on the head only, its old server the
baseline; a pass recorded on every node; a `fail` undoes the change on every node (files
restored, the unit restarted as one) and halts the run naming the metric; an old server that
cannot answer gives `no-baseline`, never a pass; a host of the unit's build is never a unit's
baseline, nor a unit's node a host's. `opspatch judge` judges a unit by its head and refuses a
node that is not the head.
"""

from __future__ import annotations

from typing import cast

import pytest

from opspatch.core.host import Unit
from opspatch.core.policy import JudgeSettings
from opspatch.core.vocabulary import JudgeHosts, Step
from opspatch.errors import EXIT_BAD_INPUT, UnitRefused
from opspatch.runs.commands.judge import judge_hosts
from opspatch.runs.commands.judge import servers as judge_servers
from opspatch.runs.fleet.judging import JudgePlan
from opspatch.runs.fleet.session import HostSession
from opspatch.runs.report import HostOutcome, RunReport
from tests.scriptedkit import JUDGED, PRISTINE, Units, files, judged_unit, units

pytestmark = pytest.mark.scripted

__all__ = ["units"]  # the fixture, used by name


def by_host(report: RunReport) -> dict[str, HostOutcome]:
    return {o.host: o for o in report.hosts}


def judge_step(outcome: HostOutcome) -> tuple[str, str]:
    (step,) = [s for s in outcome.steps if s.step == Step.JUDGE]
    return str(step.status), step.detail


def ledger_judge(units: Units, host: str) -> list[tuple[str, str]]:
    return [
        (str(r.status), r.detail)
        for _, r in units.ledger.host_steps(host, [Step.JUDGE])
        if r.status != "started"
    ]


def test_a_canary_unit_that_passes_is_judged_on_its_head_against_its_old_server(
    units: Units,
) -> None:
    servers = judged_unit(units)
    report = units.apply("h1", "h2", "h3", playbook=JUDGED)
    outcome = by_host(report)
    assert {o.host: o.outcome for o in report.hosts} == {
        "h1": "applied", "h2": "applied", "h3": "applied"
    }  # fmt: skip
    assert servers.asked == ["h1", "h1"]  # the head's old server, then its new one; h3 not judged
    head = outcome["h1"].judgment
    assert head is not None and head.verdict == "pass"
    assert head.baseline == "this host's old server, before the swap"
    assert outcome["h2"].judgment is None and outcome["h3"].judgment is None
    steps = [str(s.step) for s in outcome["h1"].steps]
    assert steps.index("judge-baseline") < steps.index("swap") < steps.index("smoke")
    assert steps.index("smoke") < steps.index("judge")
    status, detail = judge_step(outcome["h2"])
    assert status == "ok"
    assert detail == "judged through the head (h1, u1 rank 1): judge: pass against " + (
        "this host's old server, before the swap"
    )
    assert ledger_judge(units, "h2") == [(status, detail)]  # the ledger says what the JSON says
    assert ledger_judge(units, "h1")[0][1].startswith("judge: pass")
    assert Step.JUDGE not in [s.step for s in outcome["h3"].steps]


def test_a_unit_the_judge_fails_is_rolled_back_on_every_node_and_the_run_halts(
    units: Units,
) -> None:
    servers = judged_unit(units, changed=True)
    report = units.apply("h1", "h2", "h3", playbook=JUDGED)
    outcome = by_host(report)
    assert {o.host: o.outcome for o in report.hosts} == {
        "h1": "rolled-back", "h2": "rolled-back", "h3": "skipped"
    }  # fmt: skip
    assert report.exit_code == 1 and report.halted == "canary h1 failed"
    assert files(units) == {"h1": PRISTINE, "h2": PRISTINE}  # every node's files put back
    for node in ("h1", "h2"):  # and the unit restarted as one, proven through the head
        done = [str(s.step) for s in outcome[node].steps]
        after = ["judge", "restore", "stop-after-restore", "start-after-restore"]
        assert [done.index(step) for step in after] == sorted(done.index(s) for s in after)
        assert done[-1] == "smoke-after-restore", done
        assert outcome[node].reason == "judge-failed", outcome[node]
        assert outcome[node].error == outcome["h1"].error  # one cause, said the same on both
    head = outcome["h1"].judgment
    assert head is not None and head.verdict == "fail"
    assert judge_step(outcome["h1"])[0] == "failed"
    status, detail = judge_step(outcome["h2"])
    assert status == "failed"
    assert detail.startswith("judged through the head (h1, u1 rank 1): judge: fail against")
    assert "tokens fail" in detail
    assert ledger_judge(units, "h2")[0][0] == "failed"
    assert servers.asked == ["h1", "h1"]  # never a node that serves no prompts


@pytest.mark.parametrize(
    ("old", "why"),
    [
        ("no answer: connection refused", "this host's old server could not be asked"),
        ("the server crashed: ValueError", "the old server failed the judge's prompts"),
    ],
    ids=["no-old-server", "the-old-server-crashes"],
)
def test_a_unit_whose_old_server_cannot_answer_is_judged_without_a_baseline(
    units: Units, old: str, why: str
) -> None:
    judged_unit(units, old=old)
    report = units.apply("h1", "h2", playbook=JUDGED)
    outcome = by_host(report)
    assert {o.host: o.outcome for o in report.hosts} == {"h1": "applied", "h2": "applied"}
    head = outcome["h1"].judgment
    assert head is not None and head.verdict == "no-baseline" and head.baseline is None
    assert why in (head.why_no_baseline or "")
    assert "judge: no baseline" in judge_step(outcome["h2"])[1]


def test_a_unit_is_judged_only_by_its_head_and_never_a_baseline_for_a_host() -> None:
    unit = Unit("u1", ("h1", "h2"))
    names = ("h1", "h2", "h3", "h4")
    sessions = cast(dict[str, HostSession], {n: object() for n in names})  # identities only
    build = {n: "0.5.23/abc" for n in sessions}
    plan = JudgePlan(
        JudgeSettings(hosts=JudgeHosts.ALL),
        canaries=["h3", "h1"],
        changing=["h1", "h2", "h3", "h4"],
        builds=build,
        sessions=sessions,
        units={"h1": unit, "h2": unit},
    )
    assert plan.judged == ["h1", "h3", "h4"]  # h2 serves no prompts: its unit's head is judged
    assert plan.peers["h1"] == []  # a unit's baseline is its own old server only
    assert plan.peers["h3"] == [sessions["h4"]]  # a host's peers: hosts by themselves


# -- `opspatch judge --hosts UNIT` --------------------------------------------------------------


def test_judge_of_a_unit_measures_its_head_once_against_a_host(units: Units) -> None:
    servers = judged_unit(units)
    report = judge_hosts(
        units.hosts("h1", "h2"),
        JUDGED,
        baseline=units.hosts("h3")[0],
        factory=units.factory,
    )
    assert [(h.host, h.unit) for h in report.hosts] == [("h1", "u1")]
    assert report.hosts[0].to_json()["unit"] == "u1"
    # in turns with the baseline, the baseline first; h2 serves no prompts and is never asked
    assert servers.asked[0] == "h3" and set(servers.asked) == {"h3", "h1"}
    assert report.exit_code == 0


def test_judge_of_a_node_that_is_not_its_units_head_is_refused_naming_the_head(
    units: Units,
) -> None:
    servers = judged_unit(units)
    with pytest.raises(UnitRefused) as refused:
        judge_hosts(units.hosts("h2"), JUDGED, baseline=None, factory=units.factory)
    assert refused.value.exit_code == EXIT_BAD_INPUT
    assert refused.value.message.startswith("judge: h2 is u1 rank 1, whose head is h1: ")
    assert refused.value.hint == "judge the unit: `opspatch judge --hosts u1`"
    assert servers.asked == [] and units.requests() == {"h1": [], "h2": [], "h3": []}
    assert judge_servers(units.hosts("h1", "h2", "h3")) == units.hosts("h1", "h3")
