"""Units (multi-node servers) on scripted hosts: no command changes or restarts part of a unit,
none restarts a unit's nodes one by one (apply, restart, rollback and recover take a whole unit
as one: every node stopped, then started head first, proven through the head), and
`apply --restart never` over a unit stages every node once they are alike (same release, same
pre-image of every target file), else it is refused naming the odd node (issue 33).

The hosts are `tests/scriptedkit.py`'s: the real host agent on real files, the engine scripted.
Units `u1` (h1 the head, h2) and a host by itself, h3.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from opspatch.config.fleet import DesiredPatch, DesiredState
from opspatch.core.host import Host
from opspatch.core.policy import BatchSize, Playbook
from opspatch.core.reasons import Reason
from opspatch.core.vocabulary import RestartPolicy
from opspatch.errors import EXIT_BAD_INPUT, Location, TransportError, UnitRefused
from opspatch.hosts.transport.scripted import Refusal, agent_operation
from opspatch.runs.commands.recover import recover_hosts
from opspatch.runs.commands.restart import restart_hosts
from opspatch.runs.commands.rollback import rollback_hosts
from opspatch.runs.commands.sync import sync_fleet
from opspatch.runs.report import RunReport
from tests.scriptedkit import ALWAYS, UNIT, Units, units

__all__ = ["units"]  # the fixtures, used by name

pytestmark = pytest.mark.scripted

NEVER = replace(ALWAYS, restart=RestartPolicy.NEVER)


def refused(call: Any, units: Units) -> UnitRefused:
    """`call()` raises UnitRefused (exit 2) and nothing was begun, changed or recorded."""
    before = units.files()
    with pytest.raises(UnitRefused) as caught:
        call()
    assert caught.value.exit_code == EXIT_BAD_INPUT
    assert units.files() == before
    assert units.requests() == {"h1": [], "h2": [], "h3": []}  # no host was even reached
    assert units.ledger.list_runs() == []
    return caught.value


# -- part of a unit: refused, whatever the command ----------------------------------------------


@pytest.mark.parametrize("playbook", [ALWAYS, NEVER], ids=["restart", "restart-never"])
def test_an_apply_to_one_node_of_a_unit_is_refused_naming_the_unit(
    units: Units, playbook: Playbook
) -> None:
    error = refused(lambda: units.apply("h2", "h3", playbook=playbook), units)
    assert "apply would change part of a multi-node server" in error.message
    assert "unit u1 is h1 (head), h2, and the selection leaves out h1" in error.message
    assert "a node restarted alone cannot rejoin its group" in error.message
    assert (
        error.hint == "select every node of the unit: `opspatch apply eagle-init-guard --hosts u1`"
    )


def test_restart_rollback_and_recover_of_one_node_of_a_unit_are_refused(units: Units) -> None:
    one = units.hosts("h1")
    restart = refused(
        lambda: restart_hosts(
            ledger=units.ledger, hosts=one, factory=units.factory, playbook=ALWAYS
        ),
        units,
    )
    assert "restart would change part of a multi-node server" in restart.message
    assert "leaves out h2" in restart.message
    assert restart.hint == "select every node of the unit: `opspatch restart --hosts u1`"

    rollback = refused(
        lambda: rollback_hosts(
            ledger=units.ledger,
            hosts=one,
            factory=units.factory,
            playbook=ALWAYS,
            patch=units.patch,
            restart_engine=False,
        ),
        units,
    )
    assert "leaves out h2" in rollback.message
    assert rollback.hint == (
        "select every node of the unit: `opspatch rollback eagle-init-guard --hosts u1`"
    )

    recover = refused(
        lambda: recover_hosts(
            ledger=units.ledger,
            hosts=one,
            factory=units.factory,
            playbook=ALWAYS,
            patch=units.patch,
        ),
        units,
    )
    assert "recover would change part of a multi-node server" in recover.message
    assert recover.hint == "select every node of the unit: `opspatch recover --hosts u1`"


def test_a_sync_over_part_of_a_unit_is_refused_before_reading_any_host(units: Units) -> None:
    hosts = units.hosts("h1", "h3")
    desired = _desired(units, hosts)
    error = refused(
        lambda: sync_fleet(desired, hosts, [], NEVER, factory=units.factory, ledger=units.ledger),
        units,
    )
    assert "sync would change part of a multi-node server" in error.message
    assert error.hint == "select every node of the unit: `opspatch sync --hosts u1`"


# -- a whole unit: never restarted one node at a time ---------------------------------------------


def steps(report: RunReport, host: str) -> list[str]:
    return [str(s.step) for s in next(h for h in report.hosts if h.host == host).steps]


def test_an_apply_over_a_whole_unit_restarts_and_proves_it_as_one(units: Units) -> None:
    """Every node swapped, then every node stopped before any starts (the head first),
    readiness and the smoke decode on the head only; a host by itself restarts as ever."""
    pristine = units.files()
    report = units.apply("h1", "h2", "h3")
    assert {h.host: str(h.outcome) for h in report.hosts} == dict.fromkeys(
        ("h1", "h2", "h3"), "applied"
    )
    assert report.exit_code == 0
    after = units.files()
    assert after["h1"] == after["h2"] == after["h3"] != pristine["h1"]
    for name in UNIT.hosts:
        assert "restart" not in units.fakes[name].requests  # never one node alone
    # both swaps before any stop, both stops before any start, the head's start first
    order = [(n, op) for n in UNIT.hosts for op in units.fakes[n].requests]
    assert [op for _, op in order].count("stop") == 2
    assert steps(report, "h1") == [
        "begin",
        "plan",
        "backup",
        "swap",
        "stop",
        "start",
        "ready",
        "smoke",
    ]
    assert steps(report, "h2") == ["begin", "plan", "backup", "swap", "stop", "start", "smoke"]
    assert "smoke" not in units.fakes["h2"].requests  # proven through the head's decode
    h2 = next(h for h in report.hosts if h.host == "h2")
    assert h2.note == "u1 rank 1: proven by the decode through the head h1"
    assert "restart" in units.fakes["h3"].requests


def test_a_failed_smoke_on_the_head_rolls_back_every_node_and_restarts_the_unit(
    units: Units,
) -> None:
    pristine = units.files()
    units.fakes["h1"].smoke_ok = False
    report = units.apply("h1", "h2")
    assert {h.host: str(h.outcome) for h in report.hosts} == {
        "h1": "rolled-back",
        "h2": "rolled-back",
    }
    assert report.exit_code == 1
    assert units.files() == pristine  # every node back, byte for byte
    for name in UNIT.hosts:  # stopped and started twice: the change, then the restore
        assert units.fakes[name].requests.count("stop") == 2
        assert units.fakes[name].requests.count("start") == 2
        assert "restart" not in units.fakes[name].requests
    h2 = next(h for h in report.hosts if h.host == "h2")
    assert h2.reason == "smoke-failed" and (h2.error or "").startswith("h1: "), h2


def test_a_node_whose_engine_exits_while_the_head_is_awaited_is_named_and_the_unit_restored(
    units: Units,
) -> None:
    pristine = units.files()
    node = units.fakes["h2"]
    starts = []

    def exits_after_first_start(op: str, args: dict[str, Any]) -> dict[str, Any] | Refusal | None:
        if op == "start":
            starts.append(op)
        if op == "wait_ready" and len(starts) == 1:
            return Refusal("engine-exited", "the engine (pid 4242) exited before it was ready")
        return None

    node.fault = exits_after_first_start
    report = units.apply("h1", "h2")
    outcomes = {h.host: h for h in report.hosts}
    assert {h: str(o.outcome) for h, o in outcomes.items()} == {
        "h1": "rolled-back",
        "h2": "rolled-back",
    }
    assert outcomes["h1"].reason == "step-failed", outcomes["h1"]
    assert (outcomes["h1"].error or "").startswith("h2: ready: ")
    assert units.files() == pristine


def test_a_swap_refused_on_one_node_puts_the_others_back_without_a_restart(
    units: Units,
) -> None:
    pristine = units.files()

    def refuse_swap(op: str, args: dict[str, Any]) -> dict[str, Any] | Refusal | None:
        return Refusal("write-failed", "disk full") if op == "swap" else None

    units.fakes["h2"].fault = refuse_swap
    report = units.apply("h1", "h2")
    outcomes = {h.host: h for h in report.hosts}
    assert {h: str(o.outcome) for h, o in outcomes.items()} == {"h1": "failed", "h2": "failed"}
    assert {o.reason for o in outcomes.values()} == {Reason.HOST_ERROR}
    assert outcomes["h1"].note == "put back to the pre-image: the unit's server never ran it"
    assert "disk full" in (outcomes["h1"].error or "")
    assert units.files() == pristine
    for name in UNIT.hosts:
        assert not {"stop", "start", "restart"} & set(units.fakes[name].requests)


def test_a_node_whose_swap_reply_was_lost_after_the_write_rolls_back_the_unit_as_one(
    units: Units,
) -> None:
    """h2's swap wrote the file and its reply was lost: read back, the file is new, so the unit
    is undone as after a failed proof, restarted as one. Before, h2 was rolled back by a host's
    own copy of the undo: restarted alone, which a node of a unit can never rejoin."""
    pristine = units.files()

    def lose_the_reply(op: str, args: dict[str, Any]) -> dict[str, Any] | Refusal | None:
        if op == "swap":
            agent_operation(op, args)  # the file is written...
            raise TransportError("the connection broke", host="h2", step="exec")
        return None

    units.fakes["h2"].fault = lose_the_reply
    report = units.apply("h1", "h2")
    outcomes = {h.host: h for h in report.hosts}
    assert {h: str(o.outcome) for h, o in outcomes.items()} == {
        "h1": "rolled-back",
        "h2": "rolled-back",
    }
    assert {o.reason for o in outcomes.values()} == {Reason.STEP_FAILED}
    assert units.files() == pristine
    for name in UNIT.hosts:  # put back, then the unit restarted once, as one
        assert "restart" not in units.fakes[name].requests, units.fakes[name].requests
        assert units.fakes[name].requests.count("stop") == 1


def restart(units: Units, *names: str) -> RunReport:
    return restart_hosts(
        ledger=units.ledger, hosts=units.hosts(*names), factory=units.factory, playbook=ALWAYS
    )


def rollback(units: Units, *names: str, restart_engine: bool = True) -> RunReport:
    return rollback_hosts(
        ledger=units.ledger,
        hosts=units.hosts(*names),
        factory=units.factory,
        playbook=ALWAYS,
        patch=units.patch,
        restart_engine=restart_engine,
    )


def outcomes(report: RunReport) -> dict[str, str]:
    return {h.host: str(h.outcome) for h in report.hosts}


def clear(units: Units) -> None:
    for fake in units.fakes.values():
        fake.requests.clear()


def stopped_and_started_once(units: Units) -> bool:
    """Every node of u1 stopped once and started once, and never restarted alone."""
    return all(
        units.fakes[n].requests.count("stop") == 1
        and units.fakes[n].requests.count("start") == 1
        and "restart" not in units.fakes[n].requests
        for n in UNIT.hosts
    )


def test_restart_of_a_staged_unit_proves_it_as_one(units: Units) -> None:
    """`apply --restart never`, then `restart`: every node stopped, then started head first,
    readiness and the smoke decode on the head, `applied` on every node; a host by itself
    with nothing staged is left alone."""
    assert units.apply("h1", "h2", playbook=NEVER).exit_code == 0
    staged = units.files()
    clear(units)
    report = restart(units, "h1", "h2", "h3")
    assert outcomes(report) == {"h1": "applied", "h2": "applied", "h3": "skipped"}
    assert report.hosts[2].reason == Reason.NOTHING_TO_DO, report.hosts[2]
    assert report.exit_code == 0
    assert units.files() == staged
    assert stopped_and_started_once(units)
    assert steps(report, "h1") == ["begin", "stop", "start", "ready", "smoke"]
    assert steps(report, "h2") == ["begin", "stop", "start", "smoke"]
    assert "smoke" not in units.fakes["h2"].requests  # proven through the head's decode
    assert "restarted unit u1 as one into run" in (report.hosts[0].note or "")


def test_restart_of_a_staged_unit_whose_head_fails_its_smoke_undoes_every_node(
    units: Units,
) -> None:
    pristine = units.files()
    assert units.apply("h1", "h2", playbook=NEVER).exit_code == 0
    units.fakes["h1"].smoke_ok = False
    clear(units)
    report = restart(units, "h1", "h2")
    assert outcomes(report) == {"h1": "rolled-back", "h2": "rolled-back"}
    assert units.files() == pristine
    for name in UNIT.hosts:  # the proof, then the undo: each as one
        assert units.fakes[name].requests.count("stop") == 2
        assert "restart" not in units.fakes[name].requests


def test_restart_of_a_unit_whose_nodes_differ_restarts_no_node(units: Units) -> None:
    """h2's file was put back by hand after the staging: the unit would run two versions of
    its code, so no node is restarted, and every node needs attention naming the odd one."""
    before = units.fakes["h2"].file.read_bytes()
    assert units.apply("h1", "h2", playbook=NEVER).exit_code == 0
    units.fakes["h2"].file.write_bytes(before)
    clear(units)
    report = restart(units, "h1", "h2")
    assert outcomes(report) == {"h1": "needs-attention", "h2": "needs-attention"}
    assert {h.reason for h in report.hosts} == {Reason.UNIT_NOT_ALIKE}
    error = report.hosts[0].error or ""
    assert "`opspatch recover --hosts u1` makes it uniform" in error
    assert all(not {"stop", "start", "restart"} & set(units.fakes[n].requests) for n in UNIT.hosts)


def test_rollback_of_an_applied_unit_restores_every_node_and_restarts_it_as_one(
    units: Units,
) -> None:
    pristine = units.files()
    assert units.apply("h1", "h2").exit_code == 0
    clear(units)
    report = rollback(units, "h1", "h2")
    assert outcomes(report) == {"h1": "restored", "h2": "restored"}
    assert report.exit_code == 0
    assert units.files() == pristine  # every node back, byte for byte
    assert stopped_and_started_once(units)
    # read in the preflight, then locked and read again; the decode on the head only
    assert steps(report, "h1") == ["inspect", "begin", "restore", "stop", "start", "ready", "smoke"]
    assert steps(report, "h2") == ["inspect", "begin", "restore", "stop", "start", "smoke"]
    smoke = next(s for s in report.hosts[1].steps if s.step == "smoke")
    assert "proven by the head's decode (h1, u1 rank 1)" in (smoke.detail or "")


def test_rollback_of_a_unit_whose_head_fails_the_decode_is_not_serving_on_every_node(
    units: Units,
) -> None:
    assert units.apply("h1", "h2").exit_code == 0
    units.fakes["h1"].smoke_ok = False  # the original code is what was broken
    report = rollback(units, "h1", "h2")
    assert outcomes(report) == {"h1": "restored-not-serving", "h2": "restored-not-serving"}
    assert "`opspatch apply eagle-init-guard --hosts u1` puts the change back" in (
        report.hosts[1].error or ""
    )


def test_a_node_refused_in_rollbacks_preflight_refuses_the_whole_unit(units: Units) -> None:
    """h2's file was changed by hand since the apply: nothing is restored on any node, and
    the head says which node stopped it and why."""
    assert units.apply("h1", "h2").exit_code == 0
    odd = units.fakes["h2"]
    odd.file.write_bytes(odd.file.read_bytes() + b"# a hand edit on one node\n")
    before = units.files()
    clear(units)
    report = rollback(units, "h1", "h2")
    assert outcomes(report) == {"h1": "skipped", "h2": "skipped"}
    assert units.files() == before
    head, node = report.hosts
    assert node.reason == "changed-since", node
    assert head.reason == "changed-since", head  # the unit refused for its node's reason
    assert (head.error or "").startswith("refused: unit u1's node h2 was refused (h2: refused: ")
    assert "nothing was changed or restarted on any node of the unit" in (head.error or "")
    for name in UNIT.hosts:  # read only: neither locked nor restored nor restarted
        assert {"inspect"} >= set(units.fakes[name].requests) - {"read_set", "facts"}


def test_a_node_changed_after_the_preflight_refuses_the_unit_under_its_lock(
    units: Units,
) -> None:
    """The preflight found both nodes to restore; by the time the unit is locked h2 was
    changed: the unit is refused as one, nothing restored on h1 either."""
    assert units.apply("h1", "h2").exit_code == 0
    odd = units.fakes["h2"]

    def edited_after_preflight(op: str, args: dict[str, Any]) -> dict[str, Any] | Refusal | None:
        if op == "lock" and b"hand edit" not in odd.file.read_bytes():  # h1's, before h2's
            odd.file.write_bytes(odd.file.read_bytes() + b"# a hand edit on one node\n")
        return None

    units.fakes["h1"].fault = edited_after_preflight
    applied = units.fakes["h1"].file.read_bytes()
    clear(units)
    report = rollback(units, "h1", "h2")
    assert outcomes(report) == {"h1": "skipped", "h2": "skipped"}
    assert units.fakes["h1"].file.read_bytes() == applied
    assert report.hosts[0].reason == "changed-since", report.hosts[0]
    assert all(not {"stop", "start", "restart"} & set(units.fakes[n].requests) for n in UNIT.hosts)


def test_rollback_of_a_unit_restores_a_node_with_nothing_to_restore_with_the_rest(
    units: Units,
) -> None:
    """h2 is already at its pre-image (put back by hand): the unit is still restored and
    restarted as one, never h1 alone."""
    pristine = units.files()
    assert units.apply("h1", "h2").exit_code == 0
    units.fakes["h2"].file.write_bytes((units.fakes["h3"].file).read_bytes())
    clear(units)
    report = rollback(units, "h1", "h2")
    assert outcomes(report) == {"h1": "restored", "h2": "restored"}
    assert units.files() == pristine
    assert stopped_and_started_once(units)


def recover(units: Units, *names: str) -> RunReport:
    return recover_hosts(
        ledger=units.ledger,
        hosts=units.hosts(*names),
        factory=units.factory,
        playbook=ALWAYS,
        patch=units.patch,
    )


def test_recover_of_a_unit_whose_nodes_differ_puts_back_the_new_node_and_restarts_as_one(
    units: Units,
) -> None:
    """A run stopped between the two nodes' swaps: h1 new, h2 old. Recover puts h1 back and
    restarts the unit as one: both `restored`, uniform at the pre-image."""
    pristine = units.files()
    h2 = units.fakes["h2"]
    before = h2.file.read_bytes()
    assert units.apply("h1", "h2", playbook=NEVER).exit_code == 0
    h2.file.write_bytes(before)  # as if its swap never came
    for fake in units.fakes.values():
        fake.requests.clear()
    report = recover(units, "h1", "h2")
    assert {h.host: str(h.outcome) for h in report.hosts} == {"h1": "restored", "h2": "restored"}
    assert units.files() == pristine
    for name in UNIT.hosts:
        assert units.fakes[name].requests.count("stop") == 1
        assert "restart" not in units.fakes[name].requests
    note = next(h for h in report.hosts if h.host == "h1").note or ""
    assert "the change was partly applied on unit u1 (new files on h1)" in note


def test_recover_of_a_unit_with_a_node_changed_by_hand_writes_nothing(units: Units) -> None:
    """h2's file edited by hand after the staging: every node `needs-attention`, `changed-since`
    (the odd node and the ones it holds back), nothing written or restarted."""
    assert units.apply("h1", "h2", playbook=NEVER).exit_code == 0
    h2 = units.fakes["h2"]
    h2.file.write_bytes(h2.file.read_bytes() + b"# by hand\n")
    staged = units.files()
    clear(units)
    report = recover(units, "h1", "h2")
    assert {h.host: str(h.outcome) for h in report.hosts} == {
        "h1": "needs-attention",
        "h2": "needs-attention",
    }
    assert {h.reason for h in report.hosts} == {Reason.CHANGED_SINCE}
    assert units.files() == staged
    assert all(not {"stop", "start", "restart"} & set(units.fakes[n].requests) for n in UNIT.hosts)


def test_recover_of_a_staged_unit_proves_it_as_one(units: Units) -> None:
    assert units.apply("h1", "h2", playbook=NEVER).exit_code == 0
    staged = units.files()
    report = recover(units, "h1", "h2")
    assert {h.host: str(h.outcome) for h in report.hosts} == {"h1": "applied", "h2": "applied"}
    assert units.files() == staged
    assert all("restart" not in units.fakes[n].requests for n in UNIT.hosts)
    again = recover(units, "h1", "h2")  # proven and serving: left alone, nothing restarted
    assert {h.host: str(h.outcome) for h in again.hosts} == {"h1": "applied", "h2": "applied"}
    assert all(units.fakes[n].requests.count("stop") == 1 for n in UNIT.hosts)


@pytest.mark.parametrize("names", [("h3",), ("h1", "h2")], ids=["host", "unit"])
def test_recover_of_a_group_at_rest_that_does_not_serve_restarts_and_smoke_tests_it(
    units: Units, names: tuple[str, ...]
) -> None:
    """Rolled back, then the server died: recover restarts the group as one and proves it with
    the smoke decode; the restored code failing it is `restored-not-serving` (`not-serving`),
    a host as a unit (before: a host by itself was restarted unproven and said `restored`)."""
    assert units.apply(*names).exit_code == 0
    assert rollback(units, *names).exit_code == 0
    for name in names:
        units.fakes[name].serving = False
    units.fakes[names[0]].smoke_ok = False
    clear(units)
    report = recover(units, *names)
    assert outcomes(report) == dict.fromkeys(names, "restored-not-serving")
    assert {h.reason for h in report.hosts} == {Reason.NOT_SERVING}
    assert "smoke" in units.fakes[names[0]].requests
    assert report.exit_code == 1


@pytest.mark.parametrize("names", [("h3",), ("h1", "h2")], ids=["host", "unit"])
def test_recover_awaits_a_group_still_starting_its_ready_deadline_and_leaves_it_alone(
    units: Units, names: tuple[str, ...]
) -> None:
    """A server that needs a minute to come up (a crashed run's restart still loading) is
    awaited up to the `ready` deadline, never restarted under it, a unit as a host (before: a
    unit's head got a 10 s look, then every node was stopped and started again)."""
    assert units.apply(*names).exit_code == 0

    def loading(op: str, args: dict[str, Any]) -> dict[str, Any] | Refusal | None:
        if op == "wait_ready" and float(args.get("total") or args["timeout"]) < 60:
            return Refusal("ready-timeout", "/health did not answer 200 in time")
        return None

    units.fakes[names[0]].fault = loading
    clear(units)
    report = recover(units, *names)
    assert outcomes(report) == dict.fromkeys(names, "applied")
    assert all("left alone" in (h.note or "") for h in report.hosts)
    assert all(not {"stop", "start", "restart"} & set(units.fakes[n].requests) for n in names)


def test_a_sync_applies_a_whole_unit_as_one(units: Units) -> None:
    hosts = units.hosts("h1", "h2", "h3")
    report = sync_fleet(
        _desired(units, hosts), hosts, [], ALWAYS, factory=units.factory, ledger=units.ledger
    )
    (run,) = report.runs
    assert {h.host: str(h.outcome) for h in run.hosts} == dict.fromkeys(
        ("h1", "h2", "h3"), "applied"
    )
    assert all("restart" not in units.fakes[n].requests for n in UNIT.hosts)


# -- apply --restart never: every node staged, once the nodes are alike ---------------------------


def test_apply_restart_never_stages_every_node_of_a_uniform_unit(units: Units) -> None:
    pristine = units.files()
    report = units.apply("h1", "h2", "h3", playbook=NEVER)
    assert {h.host: str(h.outcome) for h in report.hosts} == dict.fromkeys(
        ("h1", "h2", "h3"), "staged"
    )
    assert report.exit_code == 0
    after = units.files()
    assert after["h1"] == after["h2"] != pristine["h1"]
    assert all("restart" not in fake.requests for fake in units.fakes.values())

    # and back, files only, on every node
    back = rollback_hosts(
        ledger=units.ledger,
        hosts=units.hosts("h1", "h2"),
        factory=units.factory,
        playbook=ALWAYS,
        patch=units.patch,
        restart_engine=False,
    )
    assert {h.host: str(h.outcome) for h in back.hosts} == {
        "h1": "staged-back",
        "h2": "staged-back",
    }
    assert units.files()["h1"] == units.files()["h2"] == pristine["h1"]
    assert all("restart" not in fake.requests for fake in units.fakes.values())


def test_a_sync_under_restart_never_stages_every_node_of_a_unit(units: Units) -> None:
    hosts = units.hosts("h1", "h2")
    report = sync_fleet(
        _desired(units, hosts), hosts, [], NEVER, factory=units.factory, ledger=units.ledger
    )
    (run,) = report.runs
    assert {h.host: str(h.outcome) for h in run.hosts} == {"h1": "staged", "h2": "staged"}


def test_a_unit_whose_node_holds_another_pre_image_is_refused_naming_it(units: Units) -> None:
    odd = units.fakes["h2"]
    odd.file.write_bytes(odd.file.read_bytes() + b"# a hand edit on one node\n")
    before = units.files()
    report = units.apply("h1", "h2", "h3", playbook=NEVER)
    assert report.refused and report.exit_code == EXIT_BAD_INPUT
    assert report.halted is not None
    said = (
        f"unit u1: h2: sglang.srt.speculative.eagle_worker_v2 pre-image sha256 {before['h2']}, "
        f"the others (h1) {before['h1']}"
    )
    assert said in report.halted, report.halted
    outcomes = {h.host: h for h in report.hosts}
    assert str(outcomes["h2"].outcome) == "skipped"
    assert outcomes["h2"].reason == "unit-not-alike"
    assert outcomes["h1"].error is None
    assert units.files() == before  # nothing swapped, h3 neither
    assert all("swap" not in fake.requests for fake in units.fakes.values())
    (run,) = units.ledger.list_runs()  # the refused run, and nothing else
    assert run.run_id == report.run_id
    detail = units.ledger.get_run(run.run_id)
    assert all(not h.file_versions for h in detail.hosts)


def test_a_unit_whose_node_runs_another_release_is_refused_naming_it(units: Units) -> None:
    odd = units.fakes["h2"]

    def newer_release(op: str, args: dict[str, Any]) -> dict[str, Any] | Refusal | None:
        if op != "inspect":
            return None
        answer = odd.real(op, args)
        if isinstance(answer, dict) and answer.get("resolved"):
            answer["resolved"]["distribution_version"] = "0.5.24"
            answer.setdefault("facts", {})["sglang_version"] = "0.5.24"
        return answer

    odd.fault = newer_release
    report = units.apply("h1", "h2", playbook=NEVER)
    assert report.refused and report.halted is not None
    assert "unit u1: h2: release 0.5.24, the others (h1) 0.5.23" in report.halted, report.halted
    assert all("swap" not in fake.requests for fake in units.fakes.values())


def _desired(units: Units, hosts: list[Host]) -> DesiredState:
    """A fleet file that wants the patch on every one of `hosts`."""
    by_name = {h.name: h for h in hosts}
    entry = DesiredPatch(units.patch, tuple(by_name), "", Location("fleet.toml", 1, "patches[0]"))
    return DesiredState("fleet.toml", (entry,), by_name)


# -- status and drift: a unit whose nodes differ is never `applied` ------------------------------


def test_a_unit_with_one_node_reinstalled_is_partial_on_every_node_naming_it(
    units: Units,
) -> None:
    """The unit was staged on both nodes and restarted as one (both `applied`), then h2 was
    reinstalled: status gives every node `partial`, naming h2; drift blames h2's file only."""
    from opspatch.runs.commands.status import fleet_status
    from opspatch.runs.commands.sync import plan_fleet

    pristine = units.fakes["h2"].file.read_bytes()
    assert units.apply("h1", "h2", playbook=NEVER).exit_code == 0
    for name in UNIT.hosts:  # the operator restarts the unit as one
        units.fakes[name].restarted()
    hosts = units.hosts("h1", "h2", "h3")
    states = {
        s.host: str(s.state)
        for s in fleet_status(hosts, [units.patch], units.factory, units.ledger)
    }
    assert states == {"h1": "applied", "h2": "applied", "h3": "not-applied"}

    units.fakes["h2"].file.write_bytes(pristine)  # pip install --force-reinstall on one node
    said = {s.host: s for s in fleet_status(hosts, [units.patch], units.factory, units.ledger)}
    assert {h: str(s.state) for h, s in said.items()} == {
        "h1": "partial",
        "h2": "partial",
        "h3": "not-applied",  # a server by itself: its own word
    }
    differ = "unit u1's nodes differ (h2 is not-applied; the others (h1) applied)"
    assert said["h1"].detail.startswith(differ + "; this node is applied")
    assert said["h2"].detail.startswith(differ + "; this node is not-applied")
    assert (said["h1"].node_state, said["h2"].node_state) == ("applied", "not-applied")

    plan = plan_fleet(_desired(units, hosts), hosts, [], units.factory, units.ledger)
    rows = {r.host: r for r in plan.rows}
    assert {h: str(r.action) for h, r in rows.items()} == {
        "h1": "by-hand",
        "h2": "by-hand",
        "h3": "apply",
    }
    assert rows["h1"].cause is None  # its file is what opspatch wrote
    assert str(rows["h2"].cause) == "reinstalled"


def test_the_canary_is_a_whole_unit_and_its_failure_halts_the_rest(units: Units) -> None:
    """canary = 1 counts servers: the canary is unit u1 (both nodes at once), and when its
    proof fails both nodes are rolled back and h3, the next batch, is never started."""
    pristine = units.files()
    units.fakes["h1"].smoke_ok = False
    book = Playbook(canary=1, batch=BatchSize(count=1), max_failures=5)
    report = units.apply("h1", "h2", "h3", playbook=book)
    assert {h.host: str(h.outcome) for h in report.hosts} == {
        "h1": "rolled-back",
        "h2": "rolled-back",
        "h3": "skipped",
    }
    assert report.halted is not None and "canary h1" in report.halted
    assert units.files() == pristine
    assert "swap" not in units.fakes["h3"].requests  # begun in the preflight, its lock given back


def test_max_failures_counts_a_failed_unit_once(units: Units) -> None:
    """max_failures = 2 counts servers, as canaries and batches do: unit u1 rolled back is one
    failure, so h3, the next batch, is still applied. Before, its two nodes were two failures
    and halted the run."""
    units.fakes["h1"].smoke_ok = False
    book = Playbook(canary=0, batch=BatchSize(count=1), max_failures=2)
    report = units.apply("h1", "h2", "h3", playbook=book)
    assert {h.host: str(h.outcome) for h in report.hosts} == {
        "h1": "rolled-back",
        "h2": "rolled-back",
        "h3": "applied",
    }
    assert report.halted is None


def test_rollback_restart_never_of_a_unit_with_a_refused_node_restores_no_node(
    units: Units,
) -> None:
    """Files only, and still as one: a node changed by hand keeps every node's file as it is."""
    assert units.apply("h1", "h2", playbook=NEVER).exit_code == 0
    odd = units.fakes["h2"]
    odd.file.write_bytes(odd.file.read_bytes() + b"# a hand edit on one node\n")
    before = units.files()
    report = rollback(units, "h1", "h2", restart_engine=False)
    assert outcomes(report) == {"h1": "skipped", "h2": "skipped"}
    assert units.files() == before
    assert report.hosts[0].reason == "changed-since", report.hosts[0]


def read_fails_under_the_lock() -> Any:
    """A fault: the first read (the preflight's) answers; the read under the lock gets no reply."""
    locked: list[str] = []

    def fault(op: str, args: dict[str, Any]) -> dict[str, Any] | Refusal | None:
        if op == "lock":
            locked.append(op)
        if op == "inspect" and locked:
            raise TransportError("the connection broke", host="h", step="exec")
        return None

    return fault


@pytest.mark.parametrize("names", [("h3",), ("h1", "h2")], ids=["host", "unit"])
def test_a_rollback_whose_read_under_the_lock_fails_is_refused_as_nothing_changed(
    units: Units, names: tuple[str, ...]
) -> None:
    """A host is a group of one: a read that fails before any restore changed nothing, so the
    group is refused (`failed`/`skipped`, exit 1), never `needs-attention` (before: a host by
    itself said needs-attention, part-way)."""
    assert units.apply(*names).exit_code == 0
    units.fakes[names[-1]].fault = read_fails_under_the_lock()
    applied = units.files()
    report = rollback(units, *names)
    odd = next(h for h in report.hosts if h.host == names[-1])
    assert str(odd.outcome) == "failed", odd
    assert odd.reason == Reason.HOST_ERROR, odd
    assert all(str(h.outcome) in ("failed", "skipped") for h in report.hosts)
    assert units.files() == applied
    assert report.exit_code == 1


@pytest.mark.parametrize("names", [("h3",), ("h1", "h2")], ids=["host", "unit"])
def test_a_rollback_from_backups_refuses_the_group_when_the_first_restore_finds_none(
    units: Units, names: tuple[str, ...], tmp_path: Path
) -> None:
    """No ledger record, and the host's own backup missing on the first node restored: nothing
    changed anywhere, so the group is refused (`no-record`, exit 2), a host as a unit (before:
    a unit's nodes said needs-attention though no byte moved)."""
    from opspatch.ledger.store import Ledger

    assert units.apply(*names).exit_code == 0
    applied = units.files()

    def no_backup(op: str, args: dict[str, Any]) -> dict[str, Any] | Refusal | None:
        return Refusal("backup-missing", "no backup of that pre-image") if op == "restore" else None

    for name in names:
        units.fakes[name].fault = no_backup
    fresh = Ledger.open(tmp_path / "fresh.sqlite3")
    try:
        report = rollback_hosts(
            ledger=fresh, hosts=units.hosts(*names), factory=units.factory, playbook=ALWAYS,
            patch=units.patch,
        )  # fmt: skip
    finally:
        fresh.close()
    assert outcomes(report) == dict.fromkeys(names, "skipped")
    assert {h.reason for h in report.hosts} == {Reason.NO_RECORD}
    assert report.exit_code == 2
    assert units.files() == applied


# -- hints: a unit is reached by its name, never by one node's ----------------------------------


def _status_of(units: Units, *names: str) -> dict[str, Any]:
    from opspatch.runs.commands.status import fleet_status

    hosts = units.hosts(*names)
    return {s.host: s for s in fleet_status(hosts, [units.patch], units.factory, units.ledger)}


def test_status_of_a_staged_unit_names_the_unit_as_restarts_target(units: Units) -> None:
    """`--hosts NODE` of a unit is refused by every command that changes it, so the restart that
    finishes a staged unit is named over the unit. Before, status named `restart --hosts h1`."""
    staged = units.apply("h1", "h2", playbook=NEVER)
    assert staged.exit_code == 0, staged
    said = _status_of(units, "h1", "h2")
    for name in UNIT.hosts:
        assert str(said[name].state) == "staged", said[name]
        assert "`opspatch restart --hosts u1`" in said[name].detail, said[name].detail
        assert f"--hosts {name}`" not in said[name].detail


def test_status_and_recover_of_a_unit_never_proven_name_the_unit_as_recovers_target(
    units: Units,
) -> None:
    """The head vanished during its smoke decode, so the unit could be neither proven nor put
    back: status's "never proven" sentence names the unit as recover's target, and recover over
    the unit works. Before, it named `recover --hosts h1`, which is refused."""

    def vanish_at_the_smoke(op: str, args: dict[str, Any]) -> dict[str, Any] | Refusal | None:
        if op == "smoke":
            units.fakes["h1"].gone = True
            raise TransportError("the connection broke", host="h1", step="exec")
        return None

    units.fakes["h1"].fault = vanish_at_the_smoke
    report = units.apply("h1", "h2")
    assert report.exit_code != 0, report
    units.fakes["h1"].fault, units.fakes["h1"].gone = None, False
    said = _status_of(units, "h1", "h2")
    unproven = [s for s in said.values() if "never proven" in s.detail]
    assert unproven, said
    for status in unproven:
        assert "`opspatch recover --hosts u1`" in status.detail, status.detail
        assert "recover --hosts h1`" not in status.detail and "recover --hosts h2`" not in (
            status.detail
        )


def test_sync_names_the_unit_in_a_unit_nodes_commands(units: Units) -> None:
    """A unit carries the fix and its server is down: sync's row for each node names recover
    over the unit. Before, each row named `recover --hosts NODE`, which is refused."""
    from opspatch.runs.commands.sync import plan_fleet

    assert units.apply("h1", "h2").exit_code == 0
    for name in UNIT.hosts:
        units.fakes[name].serving = False
    hosts = units.hosts("h1", "h2")
    plan = plan_fleet(_desired(units, hosts), hosts, [], units.factory, units.ledger)
    rows = {r.host: r for r in plan.rows}
    assert {h: str(r.action) for h, r in rows.items()} == {"h1": "recover", "h2": "recover"}
    for row in rows.values():
        assert row.command == "opspatch recover --hosts u1", row
        assert "`opspatch recover --hosts u1`" in row.detail, row.detail


def test_a_sync_stopped_before_a_units_patch_names_the_sync_of_the_unit(
    units: Units, tmp_path: Path
) -> None:
    """The first desired patch fails on h3 and stops the sync: the unit's nodes, left with the
    second patch unapplied, each name the sync over the unit. Before, `sync --hosts NODE`,
    which is refused."""
    from opspatch.runs.commands.sync import sync_fleet
    from tests.scriptedkit import mark_patch

    mark = mark_patch(tmp_path)
    hosts = units.hosts("h3", "h1", "h2")
    by_name = {h.name: h for h in hosts}
    first = DesiredPatch(units.patch, ("h3",), "", Location("fleet.toml", 1, "patches[0]"))
    second = DesiredPatch(mark, ("h1", "h2"), "", Location("fleet.toml", 4, "patches[1]"))
    units.fakes["h3"].smoke_ok = False
    report = sync_fleet(
        DesiredState("fleet.toml", (first, second), by_name),
        hosts,
        [],
        ALWAYS,
        factory=units.factory,
        ledger=units.ledger,
    )
    (left,) = report.left_alone
    assert {h.host for h in left.hosts} == {"h1", "h2"}, left
    for host in left.hosts:
        assert host.reason == "not-started", host
        assert "`opspatch sync --hosts u1`" in (host.error or ""), host.error
