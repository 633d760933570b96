"""`apply --live` over a unit, fast: tests/scriptedkit.py's unit u1 (h1 the head, h2; the real
agent on real files, each node its own copy of the file) with a scripted live engine of two
nodes behind the `live` operation: TP ranks 0 and 1 on h1, 2 and 3 on h2, the entry rank (TP0)
answering a take or revert for all four as the plugin does; each node's main process (and the
head's detokenizer) never imports the module.

Each test names a decision of the unit's live path: take through the head and read back from
both nodes with no restart; a rank on h2 that refuses, a rank whose readback disagrees, or a
failed smoke reverted on every rank with both nodes' files restored; a revert that does not
finish everywhere (a rank refuses it, or answers it but its node still lists the fix) followed
by the unit's restart as one; a node whose engine does not listen refusing the run before any
change, as a change whose live form is refused does; `rollback` of a live fix reverting through
the head and reading every node back (a rank that keeps the fix is never said reverted, and
`restart` then restarts the unit it left running the fix).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from opspatch.core.host import Host
from opspatch.core.live import LiveForm, NotLive
from opspatch.core.policy import Playbook
from opspatch.core.spec import PatchSpec
from opspatch.core.vocabulary import NotLiveReason
from opspatch.runs.commands.apply import apply_to_hosts
from opspatch.runs.commands.restart import restart_hosts
from opspatch.runs.commands.rollback import rollback_hosts
from opspatch.runs.fleet.liveapply import LiveFormer, live_former
from opspatch.runs.report import RunReport
from tests.livekit import finding_its_server, live_unit
from tests.scriptedkit import ALWAYS, PRISTINE, Units, sha, units

pytestmark = pytest.mark.scripted

__all__ = ["units"]  # the fixture, used by name

FIX = "eagle-init-guard"


def apply_live(units: Units, former: LiveFormer = live_former) -> RunReport:
    hosts: list[Host] = [replace(h, live=True) for h in units.hosts("h1", "h2")]
    return apply_to_hosts(
        units.patch, hosts, ALWAYS, factory=units.factory, ledger=units.ledger, live=former
    )


def by_host(report: RunReport) -> dict[str, Any]:
    return {o.host: o for o in report.hosts}


def steps(report: RunReport) -> dict[str, list[str]]:
    return {o.host: [str(s.step) for s in o.steps] for o in report.hosts}


def files(units: Units) -> dict[str, str]:
    return {n: sha(units.fakes[n].file.read_bytes()) for n in ("h1", "h2")}


def test_a_live_fix_is_taken_through_the_head_and_read_back_on_every_node(units: Units) -> None:
    engine = live_unit(units)
    report = apply_live(units)
    assert {o.host: o.outcome for o in report.hosts} == {"h1": "applied", "h2": "applied"}
    assert report.exit_code == 0
    assert engine.holding() == {rank: {FIX} for rank in range(4)}  # h2's ranks: their own file
    takes = [node for node, op in engine.asked if op == "take"]
    assert takes == ["h1", "h2"]  # the head's entry rank, then h2's main process
    done = steps(report)
    for node in ("h1", "h2"):
        assert not {"stop", "start", "restart", "drain"} & set(done[node]), done[node]
        assert done[node][-3:] == ["live", "live-readback", "smoke"], done[node]
    outcome = by_host(report)
    head_take = [s.detail for s in outcome["h1"].steps if s.step == "live"][-1]
    assert "scheduler-tp0 (pid 200)" in head_take and "scheduler-tp3 (pid 203)" in head_take
    readback = [s.detail for s in outcome["h2"].steps if s.step == "live-readback"][-1]
    assert readback == f"{FIX}: holds it: scheduler-tp2 (pid 202), scheduler-tp3 (pid 203)"
    assert outcome["h1"].smoke is not None and outcome["h2"].smoke is None
    assert "taken live through the head's entry rank (h1)" in (outcome["h2"].note or "")
    assert files(units)["h1"] == files(units)["h2"] != PRISTINE


@pytest.mark.parametrize(
    ("fault", "said"),
    [
        ({"refusing_rank": 3}, "scheduler-tp3 (pid 203): take-failed"),
        ({"forgetting_rank": 2}, "live-readback: h2: scheduler-tp2 (pid 202): does not hold"),
    ],
    ids=["a-rank-on-h2-refuses", "a-rank-on-h2-does-not-hold-it"],
)
def test_a_rank_on_the_other_node_that_fails_reverts_every_rank_and_restores_both_nodes(
    units: Units, fault: dict[str, int], said: str
) -> None:
    engine = live_unit(units, **fault)
    report = apply_live(units)
    outcome = by_host(report)
    assert {o.host: o.outcome for o in report.hosts} == {"h1": "rolled-back", "h2": "rolled-back"}
    assert report.exit_code == 1
    assert outcome["h1"].error == outcome["h2"].error  # one cause, said the same on both
    assert said in (outcome["h1"].error or ""), outcome["h1"].error
    assert engine.holding() == {rank: set() for rank in range(4)}
    assert files(units) == {"h1": PRISTINE, "h2": PRISTINE}
    done = steps(report)
    for node in ("h1", "h2"):
        assert not {"stop", "start"} & set(done[node]), done[node]  # no restart
        assert done[node][-3:] == ["live-revert", "live-readback", "restore"], done[node]


def test_a_smoke_that_fails_after_the_take_reverts_every_rank_on_both_nodes(
    units: Units,
) -> None:
    units.fakes["h1"].smoke_ok = False
    engine = live_unit(units)
    report = apply_live(units)
    assert {o.host: o.outcome for o in report.hosts} == {"h1": "rolled-back", "h2": "rolled-back"}
    assert engine.holding() == {rank: set() for rank in range(4)}
    assert files(units) == {"h1": PRISTINE, "h2": PRISTINE}


@pytest.mark.parametrize(
    "fault",
    [{"refusing_revert": 2}, {"keeping_rank": 2}],
    ids=["a-rank-refuses-its-revert", "a-rank-answers-its-revert-but-still-lists-it"],
)
def test_a_revert_that_does_not_finish_everywhere_restarts_the_unit_as_one(
    units: Units, fault: dict[str, int]
) -> None:
    engine = live_unit(units, refusing_rank=3, **fault)
    report = apply_live(units)
    assert {o.host: o.outcome for o in report.hosts} == {"h1": "rolled-back", "h2": "rolled-back"}
    assert engine.holding()[2] == {FIX}  # its memory is cleared by the restart that follows
    done = steps(report)
    for node in ("h1", "h2"):
        assert "stop-after-restore" in done[node] and "start-after-restore" in done[node]
    assert files(units) == {"h1": PRISTINE, "h2": PRISTINE}


def test_a_node_whose_engine_does_not_listen_refuses_the_run_before_any_change(
    units: Units,
) -> None:
    engine = live_unit(units, deaf={"h2"})
    report = apply_live(units)
    assert report.exit_code == 2
    assert by_host(report)["h2"].reason == "not-listening"
    # the way out names the unit, the target a command takes (a node alone is refused)
    assert "`opspatch apply eagle-init-guard --hosts u1`" in (by_host(report)["h2"].error or "")
    assert [op for _, op in engine.asked] == ["check", "check"]  # the preflight's, nothing taken
    assert files(units) == {"h1": PRISTINE, "h2": PRISTINE}


def test_a_unit_whose_change_has_no_live_form_is_refused_before_any_change(units: Units) -> None:
    engine = live_unit(units)

    def restart_only(part: PatchSpec, pre: bytes, post: bytes) -> LiveForm | NotLive:
        return NotLive(NotLiveReason.DECLARED_RESTART_ONLY, 'the patch says live = "restart-only"')

    report = apply_live(units, restart_only)
    assert report.exit_code == 2
    assert {o.host: o.reason for o in report.hosts} == dict.fromkeys(("h1", "h2"), "not-taken-live")
    assert all("declared-restart-only" in (o.error or "") for o in report.hosts)
    assert engine.asked == []  # not even asked whether it listens
    assert files(units) == {"h1": PRISTINE, "h2": PRISTINE}


def rollback(units: Units, *, restart: bool) -> RunReport:
    return rollback_hosts(
        ledger=units.ledger,
        hosts=[replace(h, live=True) for h in units.hosts("h1", "h2")],
        factory=units.factory,
        playbook=Playbook(),
        patch=units.patch,
        restart_engine=restart,
    )


@pytest.mark.parametrize(
    ("restart", "outcome", "said"),
    [
        (False, "staged-back", "not reverted in every process: the engine holds it in memory"),
        (True, "restored", "not reverted everywhere; the restart clears it"),
    ],
    ids=["restart-never", "with-a-restart"],
)
def test_a_rollback_whose_revert_a_node_does_not_confirm_never_says_the_fix_reverted(
    units: Units, restart: bool, outcome: str, said: str
) -> None:
    """A rollback of a fix taken live on the unit; rank 2 (on h2) answers its revert ok but still
    lists the fix. Before, rollback reverted each node by itself and trusted the answers: both
    nodes said "reverted in every process of the engine" (with `--restart never`, staged back,
    the rank still running the fix). Now it reverts through `liveapply.revert_on`, apply --live's
    own: the head first, every node read back, and the note says the fix is still held."""
    engine = live_unit(units)
    assert {o.outcome for o in apply_live(units).hosts} == {"applied"}
    engine.keeping_rank = 2
    report = rollback(units, restart=restart)
    outcomes = by_host(report)
    assert {h: str(o.outcome) for h, o in outcomes.items()} == dict.fromkeys(("h1", "h2"), outcome)
    assert engine.holding()[2] == {FIX}
    done = steps(report)
    for node in ("h1", "h2"):
        note = outcomes[node].note or ""
        assert "reverted in every process of the engine" not in note, (node, note)
        assert said in note, (node, note)
        assert done[node].index("live-revert") < done[node].index("live-readback")
        assert done[node].index("live-readback") < done[node].index("restore"), done[node]
        assert bool({"stop", "start", "restart"} & set(done[node])) is restart, done[node]
    readback = [s for s in outcomes["h2"].steps if s.step == "live-readback"][-1]
    assert readback.status == "failed" and f"still holds {FIX}" in (readback.detail or "")
    assert files(units) == {"h1": PRISTINE, "h2": PRISTINE}


def test_a_rollback_of_a_live_fix_on_a_unit_reverts_through_the_head_and_reads_it_back(
    units: Units,
) -> None:
    engine = live_unit(units)
    assert {o.outcome for o in apply_live(units).hosts} == {"applied"}
    report = rollback(units, restart=False)
    outcomes = by_host(report)
    assert {h: str(o.outcome) for h, o in outcomes.items()} == dict.fromkeys(
        ("h1", "h2"), "staged-back"
    )
    assert engine.holding() == {rank: set() for rank in range(4)}
    for node in ("h1", "h2"):
        assert f"live fix {FIX} reverted in every process" in (outcomes[node].note or "")
        done = steps(report)[node]
        assert done[-3:] == ["live-revert", "live-readback", "restore"], done
        assert not {"stop", "start", "restart"} & set(done), done


@pytest.mark.parametrize("keeping", [None, 2], ids=["every-rank-reverted", "a-rank-keeps-it"])
def test_restart_after_a_rollback_with_no_restart_restarts_the_unit_only_where_a_rank_kept_it(
    units: Units, keeping: int | None
) -> None:
    """`rollback --restart never` of a fix taken live on the unit; what the servers run is read
    from the ledger (`running.py`). A revert every node read back: the servers run the file's
    bytes again, and `restart` leaves the unit alone. A node that still lists the fix after its
    revert answered ok: its `live-readback` failed, so it still runs the patched code, and
    `restart` restarts the unit. Before, the ledger's `live-revert` ok was read as done, and
    `restart` left rank 2 running the fix."""
    engine = live_unit(units)
    assert {o.outcome for o in apply_live(units).hosts} == {"applied"}
    engine.keeping_rank = keeping
    back = rollback(units, restart=False)
    assert {str(o.outcome) for o in back.hosts} == {"staged-back"}, back
    for name in ("h1", "h2"):
        fake = units.fakes[name]
        fake.fault = finding_its_server(fake, fake.fault)
        fake.requests.clear()
    hosts = [replace(h, live=True) for h in units.hosts("h1", "h2")]
    report = restart_hosts(
        ledger=units.ledger, hosts=hosts, factory=units.factory, playbook=Playbook()
    )
    restarted = {
        n for n in ("h1", "h2") if {"restart", "stop", "start"} & set(units.fakes[n].requests)
    }
    assert restarted == (set() if keeping is None else {"h1", "h2"}), [
        (o.host, str(o.outcome), o.note) for o in report.hosts
    ]
