"""Drain and admit on scripted hosts behind a small in-process router (its `/workers` control
plane as sglang-router 0.3.2 answers it): the rare paths the real router makes slow or hard to
reach (an admit that never turns healthy, a re-admission whose smoke fails, workers the router
cannot use at the start). The behaviour against the real binary is in test_router_rollout.py.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import replace
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from opspatch.config.fleet import DesiredPatch, DesiredState
from opspatch.core.host import RouterSettings, Unit
from opspatch.core.policy import BatchSize
from opspatch.core.vocabulary import Rotation as RotationWord
from opspatch.core.vocabulary import StepStatus
from opspatch.errors import EXIT_BAD_INPUT, Location, RouterRefused
from opspatch.hosts.agent.facts import host_name, machine_id
from opspatch.hosts.transport.scripted import Refusal, agent_operation
from opspatch.ledger.records import StepRecord
from opspatch.ledger.store import Ledger
from opspatch.runs.commands.apply import apply_to_hosts
from opspatch.runs.commands.recover import recover_hosts
from opspatch.runs.commands.rollback import rollback_hosts
from opspatch.runs.commands.sync import sync_fleet
from opspatch.runs.fleet.rotation import Rotation, rotation_of, taken_out_by
from tests.scriptedkit import (
    ONE,
    PATCH,
    STANDIN,
    FakeHost,
    FakeRouter,
    RoutedFleet,
    RouterState,
    book,
    sha,
    worker_url,
)

pytestmark = pytest.mark.scripted


@pytest.fixture(scope="module")
def router() -> Iterator[FakeRouter]:
    server = FakeRouter()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()


@pytest.fixture
def fleet(router: FakeRouter, tmp_path: Path) -> Iterator[RoutedFleet]:
    router.state = RouterState()
    fakes = {}
    for index in range(3):
        fake = FakeHost.installed(f"h{index + 1}", tmp_path / f"h{index + 1}")
        fakes[fake.name] = fake
    with Ledger.open(tmp_path / "ledger.sqlite3") as ledger:
        yield RoutedFleet(router, fakes, ledger)


def steps_of(outcome: Any) -> list[tuple[str, str]]:
    return [(s.step, str(s.status)) for s in outcome.steps]


def canary_applied_in_rotation(fleet: RoutedFleet) -> Any:
    """h1 alone applied behind the router (h1-h3 registered): its outcome, applied and admitted."""
    fleet.register("h1", "h2", "h3")
    report = apply_to_hosts(
        PATCH, fleet.hosts("h1"), book(), factory=fleet.factory, ledger=fleet.ledger
    )
    (outcome,) = report.hosts
    assert outcome.outcome == "applied" and outcome.rotation == RotationWord.IN_ROTATION
    return outcome


def test_the_drain_is_read_on_the_host_at_the_engine_url_its_smoke_uses(
    fleet: RoutedFleet,
) -> None:
    outcome = canary_applied_in_rotation(fleet)
    (read,) = fleet.drain_reads
    host = fleet.hosts("h1")[0]
    assert read[1]["url"] == host.engine.url != worker_url("h1")
    drain = next(s for s in outcome.steps if s.step == "drain")
    assert "reads of /v1/loads on the host" in (drain.detail or "")


def test_an_admit_the_router_never_lists_healthy_leaves_the_host_out_of_rotation_and_says_so(
    fleet: RoutedFleet,
) -> None:
    fleet.register("h1", "h2", "h3")
    fleet.router.state.adds_turn_healthy = False
    report = apply_to_hosts(
        PATCH, fleet.hosts("h1", "h2"), book(admit=1), factory=fleet.factory, ledger=fleet.ledger
    )
    outcomes = {o.host: o for o in report.hosts}
    canary = outcomes["h1"]
    assert canary.outcome == "applied"  # the change is proven; only the admit failed
    assert canary.rotation == RotationWord.OUT_OF_ROTATION
    assert ("admit", "failed") in steps_of(canary)
    note = canary.note or ""
    assert "out of rotation" in note and "its admit failed" in note, note
    assert f"did not list {worker_url('h1')} healthy within 1s (timeouts.admit)" in note, note
    assert report.halted and outcomes["h2"].outcome == "skipped"
    assert report.exit_code == 1


def test_an_admit_the_router_lists_healthy_at_its_first_look_asks_no_job_status(
    fleet: RoutedFleet,
) -> None:
    canary_applied_in_rotation(fleet)
    calls = fleet.router.state.calls
    assert f"POST /workers {worker_url('h1')}" in calls, calls
    # a worker listed healthy has a registration that did not fail: its job is not asked
    assert not [c for c in calls if c.startswith("GET /workers/")], calls


def test_a_registration_the_router_gave_up_leaves_the_host_out_of_rotation_and_says_why(
    fleet: RoutedFleet,
) -> None:
    fleet.register("h1", "h2", "h3")
    fleet.router.state.adds_turn_healthy = False
    fleet.router.state.jobs_fail = "health check of the worker failed"
    report = apply_to_hosts(
        PATCH, fleet.hosts("h1", "h2"), book(admit=5), factory=fleet.factory, ledger=fleet.ledger
    )
    outcomes = {o.host: o for o in report.hosts}
    canary = outcomes["h1"]
    assert canary.outcome == "applied" and canary.rotation == RotationWord.OUT_OF_ROTATION
    note = canary.note or ""
    assert f"did not register {worker_url('h1')}: health check of the worker failed" in note, note
    calls = fleet.router.state.calls
    assert [c for c in calls if c.startswith("GET /workers/id-")], calls
    assert report.halted and outcomes["h2"].outcome == "skipped"


def test_a_router_gone_after_the_drain_halts_the_run_and_the_next_recover_readmits_the_host(
    fleet: RoutedFleet,
) -> None:
    fleet.register("h1", "h2", "h3")
    fleet.router_dies_at_restart = True
    report = apply_to_hosts(
        PATCH, fleet.hosts("h1", "h2"), book(admit=1), factory=fleet.factory, ledger=fleet.ledger
    )
    outcomes = {o.host: o for o in report.hosts}
    canary = outcomes["h1"]
    assert canary.outcome == "applied" and canary.rotation == RotationWord.OUT_OF_ROTATION
    assert "answered 503" in (canary.note or ""), canary.note
    assert report.halted and "h1 left out of rotation" in (report.halted or "")
    assert outcomes["h2"].outcome == "skipped"

    fleet.router_dies_at_restart = False
    fleet.router.state.down = False  # the router is back, without h1
    assert worker_url("h1") not in fleet.router.state.workers
    recovered = fleet.recover("h1")
    (outcome,) = recovered.hosts
    assert outcome.outcome == "applied" and outcome.rotation == RotationWord.IN_ROTATION, outcome
    done = [s for s, status in steps_of(outcome) if status == "ok"]
    assert done[-2:] == ["smoke", "admit"], done
    assert worker_url("h1") in fleet.router.state.workers


def test_recover_readmits_a_drained_worker_only_after_its_smoke_decode_passes(
    fleet: RoutedFleet,
) -> None:
    """A crashed run left h1 drained (the router does not list it); its engine answers /health.
    A failed smoke keeps it out, said in the outcome and by status; a passing one admits it."""
    fleet.register("h2", "h3")
    fleet.fakes["h1"].smoke_ok = False
    hosts = fleet.hosts("h1")
    failed = fleet.recover("h1")
    (outcome,) = failed.hosts
    assert outcome.rotation == RotationWord.OUT_OF_ROTATION
    assert ("smoke", "failed") in steps_of(outcome)
    assert "admit" not in [s for s, _ in steps_of(outcome)]
    assert "the smoke decode before its re-admission failed" in (outcome.note or ""), outcome
    assert not any(c.startswith("POST") for c in fleet.router.state.calls)
    said = rotation_of(hosts)["h1"]
    assert said[0] == RotationWord.OUT_OF_ROTATION and "does not list it" in said[1]

    fleet.fakes["h1"].smoke_ok = True
    passed = fleet.recover("h1")
    (outcome,) = passed.hosts
    assert outcome.rotation == RotationWord.IN_ROTATION, outcome
    done = [s for s, status in steps_of(outcome) if status == "ok"]
    assert done[-2:] == ["smoke", "admit"], done
    assert rotation_of(hosts)["h1"][0] == RotationWord.IN_ROTATION


def test_recover_readmits_a_units_drained_head_after_its_smoke_decode_passes(
    fleet: RoutedFleet,
) -> None:
    """A unit is a host of several nodes: its head (the router's worker) left drained by a
    crashed run and serving again is re-admitted by recover after a passing smoke decode, as a
    host is (before: a serving unit was left alone, out of rotation)."""
    fleet.register("h2", "h3")
    unit = Unit("u1", ("h1", "h2"))
    head, node = fleet.hosts("h1", "h2")
    hosts = [replace(head, unit=unit), replace(node, unit=unit, router=None)]
    report = recover_hosts(
        ledger=fleet.ledger, hosts=hosts, factory=fleet.factory, playbook=book(), patch=PATCH
    )
    outcome = next(o for o in report.hosts if o.host == "h1")
    assert outcome.rotation == RotationWord.IN_ROTATION, outcome
    done = [s for s, status in steps_of(outcome) if status == "ok"]
    assert done[-2:] == ["smoke", "admit"], done
    assert worker_url("h1") in fleet.router.state.workers
    assert all(not {"stop", "start", "restart"} & set(fleet.fakes[n].requests) for n in unit.hosts)


def test_the_way_back_into_rotation_of_a_units_head_names_the_unit(fleet: RoutedFleet) -> None:
    """A unit is reached as one (`--hosts NODE` of a unit is refused), so status's sentence for
    its head out of rotation names the unit as recover's target. Before, it named the head: a
    command that is refused."""
    (head,) = fleet.hosts("h1")
    said = rotation_of([replace(head, unit=Unit("u1", ("h1", "h2")))])["h1"]
    assert said[0] == RotationWord.OUT_OF_ROTATION
    assert "`opspatch recover --hosts u1`" in said[1], said


def test_a_sync_of_a_host_whose_fix_was_wiped_drains_it_and_readmits_it_after_its_proof(
    fleet: RoutedFleet,
) -> None:
    """`sync` is one of the rotating commands: through the apply pipeline it takes only the
    wiped host out of the router, and admits it back once its smoke decode passed."""
    fleet.register("h1", "h2", "h3")
    applied = apply_to_hosts(
        PATCH, fleet.hosts(), book(), factory=fleet.factory, ledger=fleet.ledger
    )
    assert applied.exit_code == 0, applied
    fleet.fakes["h2"].file.write_bytes((STANDIN / "eagle_worker_v2.py").read_bytes())  # reinstall
    fleet.router.state.calls.clear()
    worker_id = fleet.router.state.workers[worker_url("h2")][0]  # as the apply re-admitted it
    desired = DesiredState(
        "fleet.toml",
        (DesiredPatch(PATCH, ("h1", "h2", "h3"), "", Location("fleet.toml", 1, "patches[0]")),),
        {h.name: h for h in fleet.hosts()},
    )

    report = sync_fleet(
        desired, fleet.hosts(), [], book(), factory=fleet.factory, ledger=fleet.ledger
    )

    (run,) = report.runs
    (outcome,) = run.hosts
    assert (outcome.host, outcome.outcome) == ("h2", "applied"), outcome
    assert outcome.rotation == RotationWord.IN_ROTATION
    done = [step for step, status in steps_of(outcome) if status == "ok"]
    assert done.index("drain") < done.index("restart") < done.index("smoke") < done.index("admit")
    assert done[-1] == "admit", done
    calls = [c for c in fleet.router.state.calls if not c.startswith("GET")]
    assert calls == [f"DELETE /workers/{worker_id}", f"POST /workers {worker_url('h2')}"], calls
    assert fleet.ledger.get_run(run.run_id).summary.command == "sync"
    assert report.exit_code == 0 and not report.after.differing


def test_a_worker_out_of_rotation_with_its_fix_there_is_for_recover_and_sync_leaves_it_alone(
    fleet: RoutedFleet,
) -> None:
    """h1 carries the proven fix but its router lost it (a crashed run's drain, say): the sync
    goal includes a worker in rotation, so the row is `recover`, sync neither drains, writes
    nor admits it (no router call beyond reading), and the recover it names re-admits it."""
    from opspatch.runs.commands.sync import plan_fleet

    fleet.register("h1", "h2", "h3")
    applied = apply_to_hosts(
        PATCH, fleet.hosts(), book(), factory=fleet.factory, ledger=fleet.ledger
    )
    assert applied.exit_code == 0, applied
    del fleet.router.state.workers[worker_url("h1")]
    fleet.router.state.calls.clear()
    desired = DesiredState(
        "fleet.toml",
        (DesiredPatch(PATCH, ("h1", "h2", "h3"), "", Location("fleet.toml", 1, "patches[0]")),),
        {h.name: h for h in fleet.hosts()},
    )

    report = sync_fleet(
        desired, fleet.hosts(), [], book(), factory=fleet.factory, ledger=fleet.ledger
    )

    assert report.runs == ()
    (left,) = report.left_alone
    (skipped,) = left.hosts
    assert (skipped.host, str(skipped.outcome)) == ("h1", "skipped")
    assert skipped.reason == "not-serving", skipped
    assert "`opspatch recover --hosts h1`" in (skipped.error or "")
    assert [c for c in fleet.router.state.calls if not c.startswith("GET")] == []
    assert [(r.host, str(r.action)) for r in report.after.differing] == [("h1", "recover")]
    assert report.exit_code == 1

    recovered = fleet.recover("h1")
    (outcome,) = recovered.hosts
    assert outcome.rotation == RotationWord.IN_ROTATION, outcome
    after = plan_fleet(desired, fleet.hosts(), [], fleet.factory, fleet.ledger)
    assert after.exit_code == 0, after.differing


def test_without_fleet_down_draining_the_last_healthy_worker_is_refused_before_any_change(
    fleet: RoutedFleet,
) -> None:
    """h2 (listed unhealthy) and h3 (the inventory's, not listed) are not part of the run and
    the router cannot use them: h1 is its last healthy worker."""
    fleet.register("h1")
    fleet.register("h2", healthy=False)
    before = sha(fleet.fakes["h1"].file.read_bytes())
    everything = BatchSize(percent=Decimal(100))
    with pytest.raises(RouterRefused) as refused:
        apply_to_hosts(
            PATCH, fleet.hosts("h1"), book(everything), factory=fleet.factory, ledger=fleet.ledger
        )
    assert "has 1 healthy of 3 workers" in refused.value.message
    assert "would leave it no healthy worker" in refused.value.message
    assert "fleet_down = true" in (refused.value.hint or "")
    # the routers are checked once the run holds its leases: the preflight's begin (lock and
    # inspect) ran, its lock was given back, and nothing was changed
    assert fleet.fakes["h1"].requests == ["lock", "inspect", "unlock"]
    assert not (fleet.fakes["h1"].state / "lock.json").exists()
    assert sha(fleet.fakes["h1"].file.read_bytes()) == before

    report = apply_to_hosts(
        PATCH,
        fleet.hosts("h1"),
        book(everything, fleet_down=True),
        factory=fleet.factory,
        ledger=fleet.ledger,
    )
    (outcome,) = report.hosts
    assert outcome.outcome == "applied" and outcome.rotation == RotationWord.IN_ROTATION
    assert sha(fleet.fakes["h1"].file.read_bytes()) != before


def test_a_worker_the_router_lists_unhealthy_is_already_out_and_its_drain_takes_no_room(
    fleet: RoutedFleet,
) -> None:
    fleet.register("h1", "h2")
    fleet.register("h3", healthy=False)
    rotation = Rotation.open(fleet.hosts(), book(BatchSize(count=2)), allow_unregistered=False)
    assert rotation is not None
    sick, well = rotation.of("h3"), rotation.of("h1")
    assert sick is not None and well is not None
    # 2 allowed, 1 of 3 already unavailable: room for one more, and never the last healthy one
    assert well.gate.capacity == 1
    assert sick.out and not sick.usable_at_start
    assert not well.out and well.usable_at_start
    # max_unavailable = 1 is used up by h3 itself, yet patching h3 takes nothing more
    report = apply_to_hosts(
        PATCH, fleet.hosts("h3"), book(ONE), factory=fleet.factory, ledger=fleet.ledger
    )
    (outcome,) = report.hosts
    assert outcome.outcome == "applied" and outcome.rotation == RotationWord.IN_ROTATION
    assert fleet.router.state.workers[worker_url("h3")][1] is True


def test_recover_registers_a_worker_listed_unhealthy_afresh_once_its_smoke_passes(
    fleet: RoutedFleet,
) -> None:
    """Not a second registration of one server: the unhealthy entry goes, then the add."""
    fleet.register("h1", "h2")
    fleet.register("h3", healthy=False)
    report = fleet.recover("h3")
    (outcome,) = report.hosts
    assert outcome.rotation == RotationWord.IN_ROTATION, outcome
    calls = [c for c in fleet.router.state.calls if not c.startswith("GET")]
    assert calls == ["DELETE /workers/start-h3", f"POST /workers {worker_url('h3')}"], calls
    assert fleet.router.state.workers[worker_url("h3")][1] is True


class LoadsServer(ThreadingHTTPServer):
    """An engine's `GET /v1/loads` as SGLang 0.5.23 answers it (two data-parallel ranks):
    busy for the first `busy` reads, idle after; or, with `garbage`, not a load report."""

    daemon_threads = True

    def __init__(self, busy: int, *, garbage: bool = False) -> None:
        super().__init__(("127.0.0.1", 0), _LoadsHandler)
        self.busy = busy
        self.garbage = garbage
        self.reads = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _LoadsHandler(BaseHTTPRequestHandler):
    server: LoadsServer

    def log_message(self, format: str, *args: Any) -> None:
        return None

    def do_GET(self) -> None:
        server = self.server
        server.reads += 1
        running = 1 if server.reads <= server.busy else 0
        ranks = [{"dp_rank": r, "num_running_reqs": running, "num_waiting_reqs": 0} for r in (0, 1)]
        body = b"<html>" if server.garbage else json.dumps({"loads": ranks}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.mark.parametrize(
    ("busy", "garbage", "timeout", "expect"),
    [
        (3, False, 30.0, "idle"),
        (10_000, False, 0.3, "not-drained"),
        (0, True, 30.0, "bad-load-report"),
    ],
)
def test_the_agent_waits_on_the_host_until_every_rank_reads_idle_for_the_settle_time(
    busy: int, garbage: bool, timeout: float, expect: str
) -> None:
    server = LoadsServer(busy, garbage=garbage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        args = {"url": server.url, "timeout": timeout, "settle": 0.05, "poll": 0.01}
        answer = agent_operation("wait_drained", args)
    finally:
        server.shutdown()
    if expect == "idle":
        assert isinstance(answer, dict) and answer["answered"], answer
        assert answer["polls"] >= busy + 2 and server.reads == answer["polls"]
    else:
        assert isinstance(answer, Refusal) and answer.code == expect, answer
        if expect == "not-drained":
            assert "still had 2 running and 0 waiting" in answer.message


def test_an_engine_that_does_not_answer_runs_nothing_so_it_is_drained() -> None:
    server = LoadsServer(0)
    url = server.url
    server.server_close()  # nothing listens there now
    answer = agent_operation(
        "wait_drained", {"url": url, "timeout": 5.0, "settle": 0.05, "poll": 0.01}
    )
    assert isinstance(answer, dict) and answer["answered"] is False


# -- a worker out of rotation by opspatch's own hand (issue 31) ----------------------------------


def rollback_onto_crashing_code(fleet: RoutedFleet, *applied_on: str) -> str:
    """The README tour's step behind a router: the fix is proven on `applied_on` (default h1),
    then h1's rollback restores a pre-image whose server crashes on its first decode, so h1
    ends drained and not re-admitted. Returns the rollback's run id."""
    fleet.register("h1", "h2", "h3")
    applied = apply_to_hosts(
        PATCH,
        fleet.hosts(*(applied_on or ["h1"])),
        book(),
        factory=fleet.factory,
        ledger=fleet.ledger,
    )
    assert applied.exit_code == 0, applied
    fleet.fakes["h1"].smoke_ok = False  # the pre-image crashes
    rolled = rollback_hosts(
        ledger=fleet.ledger,
        hosts=fleet.hosts("h1"),
        factory=fleet.factory,
        playbook=book(),
        patch=PATCH,
    )
    (outcome,) = rolled.hosts
    assert outcome.outcome == "restored-not-serving" and rolled.exit_code == 1, outcome
    assert outcome.rotation == RotationWord.OUT_OF_ROTATION
    assert worker_url("h1") not in fleet.router.state.workers
    fleet.fakes["h1"].smoke_ok = True  # the fix decodes
    fleet.router.state.calls.clear()
    assert rolled.run_id is not None
    return rolled.run_id


@pytest.mark.parametrize("command", ["apply", "sync"])
def test_after_a_rollback_onto_crashing_code_the_fix_goes_back_and_its_admit_brings_the_host_back(
    fleet: RoutedFleet, command: str
) -> None:
    """The documented way back (docs/fleet.md): the router does not list h1 because the
    rollback's own drain took it out, so the run drains nothing there, patches, restarts,
    proves, and admits it (before the fix: refused, "router does not know worker"). As in the
    README's tour, the run selects every host and the others still carry the fix: the one out
    of rotation takes no room, and the ones already right are never drained, so the default
    max_unavailable = 1 (already used up by h1) does not refuse it."""
    rollback = rollback_onto_crashing_code(fleet, "h1", "h2", "h3")
    if command == "apply":
        report = apply_to_hosts(
            PATCH, fleet.hosts(), book(), factory=fleet.factory, ledger=fleet.ledger
        )
    else:
        desired = DesiredState(
            "fleet.toml",
            (DesiredPatch(PATCH, ("h1", "h2", "h3"), "", Location("fleet.toml", 1, "patches[0]")),),
            {h.name: h for h in fleet.hosts()},
        )
        synced = sync_fleet(
            desired, fleet.hosts(), [], book(), factory=fleet.factory, ledger=fleet.ledger
        )
        assert synced.exit_code == 0, synced
        (report,) = synced.runs
    assert report.exit_code == 0, report
    outcome = next(o for o in report.hosts if o.host == "h1")
    assert {o.host: str(o.outcome) for o in report.hosts if o.host != "h1"} in (
        {"h2": "already-applied", "h3": "already-applied"},
        {},  # sync runs only where the fix is missing
    )
    assert outcome.outcome == "applied" and outcome.rotation == RotationWord.IN_ROTATION, outcome
    done = [s for s, status in steps_of(outcome) if status == "ok"]
    assert done.index("swap") < done.index("drain") < done.index("restart") < done.index("smoke")
    assert done[-1] == "admit", done
    drain = next(s for s in outcome.steps if s.step == "drain")
    assert f"did not list it (out of rotation since run {rollback})" in (drain.detail or "")
    calls = [c for c in fleet.router.state.calls if not c.startswith("GET")]
    assert calls == [f"POST /workers {worker_url('h1')}"], calls  # nothing drained, one admit
    assert fleet.router.state.workers[worker_url("h1")][1] is True


def test_a_worker_url_the_ledger_never_saw_drained_is_refused_as_a_wrong_worker_url(
    fleet: RoutedFleet,
) -> None:
    """The rollback took out h1's worker by its URL; an inventory naming another URL for h1 (a
    config error) is not vouched for by that drain: refused, nothing changed."""
    rollback_onto_crashing_code(fleet)
    wrong = [
        replace(h, router=replace(h.router, worker_url="http://h1.internal:30000/"))
        for h in fleet.hosts("h1")
        if h.router is not None
    ]
    before = sha(fleet.fakes["h1"].file.read_bytes())
    with pytest.raises(RouterRefused) as refused:
        apply_to_hosts(PATCH, wrong, book(), factory=fleet.factory, ledger=fleet.ledger)
    assert "does not know worker http://h1.internal:30000/ (host h1)" in refused.value.message
    assert "the ledger shows no run of opspatch taking that worker out" in refused.value.message
    assert "set router.worker_url" in (refused.value.hint or "")
    assert sha(fleet.fakes["h1"].file.read_bytes()) == before
    assert fleet.router.state.calls == ["GET /workers"]


def test_a_worker_whose_run_died_in_its_drain_is_applied_and_admitted(fleet: RoutedFleet) -> None:
    """A controller killed in h1's drain (the ledger has the drain begun, never ended) left it
    out of the router: an apply takes it from there."""
    fleet.register("h2", "h3")
    dead = fleet.ledger.begin_run(
        command="apply",
        patch_id=PATCH.spec.id,
        patch_sha256=None,
        operator="alice@laptop",
        command_line="opspatch apply eagle-init-guard",
        hosts=["h1"],
    )
    fleet.ledger.record_step(dead, "h1", "drain", "started")
    report = apply_to_hosts(
        PATCH, fleet.hosts("h1"), book(), factory=fleet.factory, ledger=fleet.ledger
    )
    (outcome,) = report.hosts
    assert report.exit_code == 0, report
    assert outcome.outcome == "applied" and outcome.rotation == RotationWord.IN_ROTATION, outcome
    assert fleet.router.state.workers[worker_url("h1")][1] is True


def _step(name: str, status: str, detail: str = "") -> StepRecord:
    return StepRecord(0, name, StepStatus(status), None, detail, "")


ROUTER = RouterSettings(url="http://router:30000", worker_url="http://w1:30000")
REMOVED = "removed http://w1:30000 from router http://router:30000; idle [ran as ops]"


@pytest.mark.parametrize(
    ("steps", "expect"),
    [
        ([], None),  # never drained: a wrong worker URL
        ([("r1", _step("drain", "ok", REMOVED)), ("r1", _step("drain", "started"))], "r1"),
        ([("r2", _step("admit", "ok")), ("r1", _step("drain", "ok", REMOVED))], None),  # put back
        ([("r2", _step("admit", "failed")), ("r2", _step("drain", "ok", REMOVED))], "r2"),
        ([("r1", _step("drain", "started"))], "r1"),  # its controller died in the drain
        ([("r1", _step("drain", "failed", "drain: not drained"))], "r1"),
        # a later run found it out already: the run that took it out is further back
        ([("r3", _step("drain", "ok", "router http://router:30000 did not list it")),
          ("r3", _step("drain", "started")),
          ("r2", _step("drain", "ok", REMOVED))], "r2"),
        # a drain of another URL (the inventory's worker_url changed since) vouches for nothing
        ([("r1", _step("drain", "ok", "removed http://w9:30000 from router http://router:30000"))],
         None),
    ],
)  # fmt: skip
def test_who_took_a_worker_out_of_rotation_is_read_from_its_newest_drain_and_admit(
    steps: list[tuple[str, StepRecord]], expect: str | None
) -> None:
    assert taken_out_by(steps, ROUTER) == expect


@pytest.mark.parametrize("command", ["apply", "rollback"])
def test_hosts_another_live_run_holds_are_refused_by_its_lease_before_their_router_is_asked(
    fleet: RoutedFleet, command: str
) -> None:
    """alice's run holds h1 (its worker out of her drain, which her ledger does not show yet):
    bob is told who holds the host (exit 2), not that the router does not know the worker."""
    fleet.register("h2", "h3")
    alice = fleet.ledger.begin_run(
        command="apply",
        patch_id=PATCH.spec.id,
        patch_sha256=None,
        operator="alice@laptop",
        command_line="opspatch apply eagle-init-guard",
        hosts=["h1"],
    )
    identity = f"{machine_id() or 'no-machine-id'}/{host_name()}:{fleet.fakes['h1'].state}"
    assert fleet.ledger.take_leases(alice, {"h1": identity}, expires_after=60).refused == ()
    before = sha(fleet.fakes["h1"].file.read_bytes())
    if command == "apply":
        report = apply_to_hosts(
            PATCH, fleet.hosts("h1"), book(), factory=fleet.factory, ledger=fleet.ledger
        )
    else:
        report = rollback_hosts(
            ledger=fleet.ledger,
            hosts=fleet.hosts("h1"),
            factory=fleet.factory,
            playbook=book(),
            patch=PATCH,
        )
    assert report.refused and report.exit_code == EXIT_BAD_INPUT, report
    assert [h.reason for h in report.hosts] == ["lease-held"], report.hosts
    assert "router" not in (report.halted or "")
    assert sha(fleet.fakes["h1"].file.read_bytes()) == before
    assert not (fleet.fakes["h1"].state / "lock.json").exists()


def test_a_router_refusal_gives_back_the_leases_the_run_took(fleet: RoutedFleet) -> None:
    fleet.register("h2", "h3")  # h1: a worker URL no run ever drained
    with pytest.raises(RouterRefused):
        apply_to_hosts(PATCH, fleet.hosts("h1"), book(), factory=fleet.factory, ledger=fleet.ledger)
    (refused,) = [r for r in fleet.ledger.list_runs() if r.command == "apply"]
    assert fleet.ledger.leases_of([refused.run_id]) == []
    assert not (fleet.fakes["h1"].state / "lock.json").exists()


def test_a_run_that_must_drain_while_its_out_of_rotation_host_holds_the_room_says_run_it_first(
    fleet: RoutedFleet,
) -> None:
    """h1 is out of rotation (the rollback's), h2 and h3 need the fix too: with max_unavailable
    = 1 used up by h1, draining h2 would take a second worker out. Refused before any change,
    naming the way: h1 alone first, whose admit gives the room back; then the rest."""
    rollback_onto_crashing_code(fleet)
    with pytest.raises(RouterRefused) as refused:
        apply_to_hosts(PATCH, fleet.hosts(), book(), factory=fleet.factory, ledger=fleet.ledger)
    assert "1 already unavailable: " + worker_url("h1") in refused.value.message
    assert (refused.value.hint or "").startswith("run h1 alone first (--hosts)"), refused.value
    first = apply_to_hosts(
        PATCH, fleet.hosts("h1"), book(), factory=fleet.factory, ledger=fleet.ledger
    )
    assert first.exit_code == 0, first
    rest = apply_to_hosts(PATCH, fleet.hosts(), book(), factory=fleet.factory, ledger=fleet.ledger)
    assert rest.exit_code == 0, rest
    assert all(o.rotation == RotationWord.IN_ROTATION for o in rest.hosts), rest
