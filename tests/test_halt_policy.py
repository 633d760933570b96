"""The fleet's halt policies are asked over the outcomes that may halt a run, and no other: each
of opspatch's policies answers over those alone as it would over every outcome, so a run of N
hosts asks them N times over the few hosts that went wrong, not over all the N decided."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st

from opspatch.core.policy import Batch, BatchSize, Playbook
from opspatch.core.vocabulary import Outcome, Rotation
from opspatch.runs.fleet.executor import (
    HaltPolicy,
    halt_as_apply,
    halt_on_attention,
    may_halt,
    run_fleet,
)
from opspatch.runs.fleet.fleetrun import _weight
from opspatch.runs.fleet.restore import halt_on_attention_or_not_serving, halt_under_playbook
from opspatch.runs.fleet.rotation import halt_on_out_of_rotation
from opspatch.runs.report import HostOutcome

pytestmark = pytest.mark.pure

PLAYBOOK = Playbook(canary=0, batch=BatchSize(count=10), max_failures=3)
CANARIES = ("h0", "h1")
POLICIES: dict[str, HaltPolicy] = {
    "apply": halt_as_apply(PLAYBOOK, CANARIES),
    "attention": halt_on_attention,
    "restore": halt_on_attention_or_not_serving,
    "rollback under the playbook": halt_under_playbook(PLAYBOOK, CANARIES),
    "out of rotation": halt_on_out_of_rotation,
}

outcome_of = st.builds(
    HostOutcome,
    st.sampled_from([f"h{i}" for i in range(12)]),
    st.sampled_from(list(Outcome)),
    rotation=st.sampled_from([None, *Rotation]),
)


def the_run(outcomes: list[HostOutcome]) -> dict[str, HostOutcome]:
    return {o.host: o for o in outcomes}


@given(st.lists(outcome_of, max_size=20))
def test_each_policy_answers_over_the_outcomes_that_may_halt_as_over_all(
    outcomes: list[HostOutcome],
) -> None:
    every = the_run(outcomes)
    halting = {name: o for name, o in every.items() if may_halt(o)}
    for name, policy in POLICIES.items():
        assert policy(halting) == policy(every), name


@given(outcome_of, outcome_of)
def test_a_group_is_counted_by_a_node_that_may_halt_before_one_that_may_not(
    one: HostOutcome, other: HostOutcome
) -> None:
    """`FleetRun.counted` keeps a group's heaviest node: over the halting outcomes it keeps the
    same one wherever one may halt."""
    if may_halt(one) and not may_halt(other):
        assert _weight(one) > _weight(other)


def test_the_executor_asks_the_policy_over_the_outcomes_that_may_halt_only() -> None:
    asked: list[Mapping[str, HostOutcome]] = []
    ended = {
        "h1": HostOutcome("h1", Outcome.APPLIED, rotation=Rotation.IN_ROTATION),
        "h2": HostOutcome("h2", Outcome.FAILED),
        "h3": HostOutcome("h3", Outcome.APPLIED, rotation=Rotation.OUT_OF_ROTATION),
        "h4": HostOutcome("h4", Outcome.ALREADY_APPLIED),
    }

    def halt(outcomes: Mapping[str, HostOutcome]) -> str | None:
        asked.append(dict(outcomes))
        return None

    result = run_fleet(
        [Batch(tuple(ended), False, 1)],
        lambda name: ended[name],
        halt=halt,
        already={"h0": HostOutcome("h0", Outcome.SKIPPED)},
    )
    assert result.outcomes == ended
    assert [list(seen) for seen in asked] == [[], [], ["h2"], ["h2", "h3"], ["h2", "h3"]]


def test_a_halt_over_the_outcomes_that_may_halt_stops_where_it_stopped_over_all() -> None:
    hosts = tuple(f"h{i}" for i in range(8))
    failing = {"h2", "h4", "h5"}

    def work(name: str) -> HostOutcome:
        return HostOutcome(name, Outcome.FAILED if name in failing else Outcome.APPLIED)

    result = run_fleet([Batch(hosts, False, 1)], work, halt=halt_as_apply(PLAYBOOK, canaries=()))
    assert list(result.outcomes) == ["h0", "h1", "h2", "h3", "h4", "h5"]
    assert result.not_started == ("h6", "h7")
    assert result.halted == ("3 hosts failed (h2, h4, h5); the playbook halts at max_failures = 3")
