"""Faults and truth on the older paths (issue 42, items 12, 14, 15), fast: the scripted hosts of
tests/scriptedkit.py (the real host agent on real files, a scripted engine) and a real SQLite
ledger.

- a ledger deleted under a run stops it before the host's next change, with the run's records
  back where `recover` looks for them;
- `recover --run R` leaves none of R's host locks, even where R recorded nothing and its patch
  is not at hand, and says so when a lock could not be given back; the lock's hint on a node
  of a unit names the unit;
- a Ctrl-C that kept no host from starting does not turn a run whose every host was applied
  into `failed`;
- `recover` of an interrupted `apply --live` finishes it as the live path does (the smoke the
  live path needs, no restart), or takes the fix out and puts the file back;
- `recover` of a rollback killed after its swap restarts a server that still runs the patched
  code (started before the swap), and leaves alone one started after it;
- a file put back without a restart (`rollback --restart never`) whose server still runs the
  fix: `status` says so, `restart` and a second `rollback` restart and prove it (`restored`).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import replace
from typing import Any

import pytest

from opspatch.core.edit import Applied, apply_patch
from opspatch.core.policy import BatchSize, Playbook
from opspatch.core.reasons import Reason
from opspatch.core.vocabulary import FileAction
from opspatch.errors import LedgerLost
from opspatch.hosts.transport.scripted import Refusal, agent_operation
from opspatch.ledger import NewFileVersion
from opspatch.ledger.store import Ledger
from opspatch.runs.commands.apply import apply_to_hosts
from opspatch.runs.commands.recover import recover_hosts, recover_run, run_chain
from opspatch.runs.commands.restart import restart_hosts
from opspatch.runs.commands.rollback import rollback_hosts
from opspatch.runs.commands.status import PatchStatus, fleet_status
from opspatch.runs.fleet.session import NoProgress
from opspatch.runs.report import RunReport
from tests.ledgerkit import begin_and_die
from tests.livekit import LiveEngine, UnitEngine, live_host, live_unit
from tests.scriptedkit import (
    FAKE_PID,
    PRISTINE,
    STANDIN,
    UNIT,
    FakeHost,
    Fleet,
    Units,
    finding_its_server,
    fleet,
    sha,
    units,
)

pytestmark = pytest.mark.scripted

__all__ = ["fleet", "units"]  # the fixtures, used by name

ALL_AT_ONCE = Playbook(canary=0, batch=BatchSize(count=10), max_failures=1)


def locked_by(fake: FakeHost, run_id: str) -> None:
    """`fake`'s lock held by run `run_id` (as a run killed after its `begin` leaves it)."""
    locked = agent_operation(
        "lock",
        {"state_dir": str(fake.state), "owner": "ops@gone", "run_id": run_id, "ttl_seconds": 1800},
    )
    assert isinstance(locked, dict), locked


def lock_of(fake: FakeHost) -> bool:
    return (fake.state / "lock.json").exists()


# -- item 12: a ledger deleted under a run -------------------------------------------------------


def test_a_ledger_deleted_during_the_canarys_swap_stops_the_run_before_its_next_change(
    fleet: Fleet,
) -> None:
    """Before, the run went on into a file nobody could open again and ended `ok (exit 0)`."""
    canary, *others = fleet.hosts
    path = fleet.ledger.path
    assert isinstance(path, os.PathLike)

    def delete_the_ledger(op: str, args: dict[str, Any]) -> None:
        if op == "swap":
            os.unlink(path)  # the ledger alone: its -wal and -shm stay
        return None

    canary.fault = delete_the_ledger
    with pytest.raises(LedgerLost) as caught:
        fleet.apply(Playbook())
    lost = caught.value
    assert lost.exit_code == 3
    assert f"the ledger {path} was deleted or moved away while this process wrote" in lost.message
    assert f"put back at {path}" in lost.message
    # the canary was swapped and left there: nothing after the swap reached it
    assert canary.requests[canary.requests.index("swap") + 1 :] == []
    assert sha(canary.file.read_bytes()) != PRISTINE
    for other in others:  # begun (locked) in the preflight, never changed
        assert "swap" not in other.requests and "restart" not in other.requests
        assert sha(other.file.read_bytes()) == PRISTINE
    # the ledger is back at its path, holding the run up to the swap: what `recover` reads
    with Ledger.open(path) as back:
        assert not back.created and back.verify().ok
        (run,) = back.list_runs()
        record = back.get_run(run.run_id).host(canary.name)
        assert [(s.step, s.status) for s in record.steps][-1] == ("swap", "started")
        assert len(record.file_versions) == 1
    assert f"`opspatch recover --run {run.run_id}` brings the hosts" in (lost.hint or "")


# -- item 14: recover leaves no lock of the run it recovers ---------------------------------------


@pytest.mark.process
def test_recover_run_without_its_patch_at_hand_removes_every_lock_of_the_run(
    fleet: Fleet,
) -> None:
    """A run killed after its preflight locked every host and recorded no change; its patch is
    not in the workspace. Before, recover said "recorded no change here", exit 0, and left every
    lock, refusing the next command for 30 minutes."""
    dead = begin_and_die(fleet.ledger.path, hosts=[h.name for h in fleet.hosts])
    for fake in fleet.hosts:
        locked_by(fake, dead)
    report = recover_run(
        ledger=fleet.ledger,
        chain=run_chain(fleet.ledger, dead),
        hosts=[h.host() for h in fleet.hosts],
        factory=fleet.factory,
        playbook=Playbook(),
        patch=None,
    )
    assert fleet.outcomes(report) == dict.fromkeys(["h1", "h2", "h3"], "restored"), report
    for outcome in report.hosts:
        assert f"took the lock over from run {dead}" in (outcome.note or ""), outcome
        assert "recorded no change here" in (outcome.note or "")
    assert not any(lock_of(fake) for fake in fleet.hosts)
    assert report.exit_code == 0
    assert fleet.ledger.get_run(dead).summary.status == "recovered"
    again = fleet.apply()  # the next command is not refused by a lock
    assert report.exit_code == 0 and fleet.outcomes(again) == dict.fromkeys(
        ["h1", "h2", "h3"], "applied"
    )


@pytest.mark.process
def test_a_lock_recover_could_not_give_back_is_named_with_how_to_remove_it(fleet: Fleet) -> None:
    dead = begin_and_die(fleet.ledger.path, hosts=["h1"])
    host = fleet.hosts[0]
    locked_by(host, dead)

    def refuse_the_unlock(op: str, args: dict[str, Any]) -> Refusal | None:
        return Refusal("io-error", "the state folder went read-only") if op == "unlock" else None

    host.fault = refuse_the_unlock
    report = recover_run(
        ledger=fleet.ledger,
        chain=run_chain(fleet.ledger, dead),
        hosts=[host.host()],
        factory=fleet.factory,
        playbook=Playbook(),
        patch=None,
    )
    (outcome,) = report.hosts
    assert "this run's lock could not be given back" in (outcome.note or ""), outcome
    assert "`opspatch unlock --hosts h1` removes it once this run is over" in (outcome.note or "")
    assert lock_of(host)


def test_a_unit_node_locked_by_a_finished_run_is_told_to_recover_the_unit(units: Units) -> None:
    """Before, the hint named `recover --hosts h2`, which refuses a node of a unit."""
    finished = units.ledger.begin_run(
        command="apply",
        patch_id="eagle-init-guard",
        patch_sha256="0" * 64,
        operator="ops@elsewhere",
        command_line="opspatch apply eagle-init-guard --hosts u1",
        hosts=["h1", "h2"],
    )
    units.ledger.finish_run(finished, "ok")
    locked_by(units.fakes["h2"], finished)
    report = units.apply("h1", "h2")
    said = {h.host: h for h in report.hosts}["h2"]
    assert said.outcome == "failed" and report.exit_code == 2, said
    assert said.reason == "lock-held", said
    assert (
        f"`opspatch recover --hosts {UNIT.name}` reconciles unit {UNIT.name} and clears the lock"
        in (said.error or "")
    ), said.error
    assert "`opspatch unlock --hosts h2`" in (said.error or "")


# -- item 15: a Ctrl-C that kept no host from starting ---------------------------------------------


def test_a_ctrl_c_while_every_host_was_in_flight_leaves_the_run_ok(fleet: Fleet) -> None:
    """Every host was started when the operator pressed Ctrl-C once, and every one finished
    `applied`: before, `outcome: failed (exit 1)`; exit 1 says a host failed."""
    notices: list[str] = []
    taken = threading.Event()

    class Said(NoProgress):
        def notice(self, text: str) -> None:
            notices.append(text)
            taken.set()

    once = threading.Lock()
    asked: set[str] = set()
    every_host_asked = threading.Event()

    def ctrl_c_at_the_first_smoke(name: str, op: str) -> None:
        asked.add(name)
        if len(asked) == len(fleet.hosts):
            every_host_asked.set()
        if op == "smoke" and once.acquire(blocking=False):  # one Ctrl-C, by the first smoke
            # the case named: every host in flight (on a busy machine the first host can reach
            # its smoke before the executor started the last)
            every_host_asked.wait(timeout=60)
            os.kill(os.getpid(), signal.SIGINT)  # the main thread's handler sets the flag
            taken.wait(timeout=5)  # this host finishes only once the Ctrl-C was taken

    for fake in fleet.hosts:
        fake.fault = lambda op, args, name=fake.name: ctrl_c_at_the_first_smoke(name, op)
    report = apply_to_hosts(
        fleet.patch,
        [h.host() for h in fleet.hosts],
        ALL_AT_ONCE,
        factory=fleet.factory,
        ledger=fleet.ledger,
        progress=Said(),
    )
    assert notices and notices[0].startswith("Ctrl-C: no more hosts will be started"), notices
    assert fleet.outcomes(report) == dict.fromkeys(["h1", "h2", "h3"], "applied"), report
    assert report.halted is None
    assert (report.exit_code, report.outcome) == (0, "ok")
    (run,) = fleet.ledger.list_runs()
    assert run.outcome == "ok"


# -- item 15: recover after an interrupted `apply --live` ------------------------------------------


class HoldingEngine(LiveEngine):
    """The scripted live engine whose `list` names the file hash each fix was taken from, as the
    plugin's entries do (`sha256`)."""

    def __init__(self, sha256: str) -> None:
        super().__init__()
        self.sha256 = sha256

    def _rank(self, rank: int, fix: dict[str, Any]) -> dict[str, Any]:
        reply = super()._rank(rank, fix)
        reply["took"] = [{**entry, "sha256": self.sha256} for entry in reply["took"]]
        return reply


def _left_by_a_dead_live_apply(fleet: Fleet, host: FakeHost, *, taken: bool) -> tuple[str, str]:
    """What a controller killed during `apply --live` leaves: its run interrupted, the host's
    `live` check, backup and swap recorded, the file patched (its server, started an hour ago,
    never restarted), its lock; with `taken` the take recorded `ok`, else only `started`.
    Returns the run id and the post-image's sha256."""
    dead = begin_and_die(fleet.ledger.path, hosts=[host.name])
    planned = apply_patch(host.file.read_bytes(), fleet.patch.spec)
    assert isinstance(planned, Applied)
    ledger = fleet.ledger
    ledger.record_step(dead, host.name, "live", "ok", 0.1, "takes ...; listening: ...")
    ledger.record_file_version(
        dead,
        host.name,
        NewFileVersion(
            path=str(host.file),
            sha256_before=planned.sha256_before,
            sha256_after=planned.sha256_after,
            mode=0o644,
            owner="root:root",
            pre_image=planned.old_source,
            post_image=planned.new_source,
        ),
    )
    ledger.record_step(dead, host.name, "swap", "ok", 0.1)
    ledger.record_step(dead, host.name, "live", "started")
    if taken:
        ledger.record_step(dead, host.name, "live", "ok", 0.1, "eagle-init-guard: taken")
    locked_by(host, dead)
    host.file.write_bytes(planned.new_source)
    return dead, planned.sha256_after


def recover_live(fleet: Fleet, dead: str, engine: LiveEngine) -> RunReport:
    for fake in fleet.hosts:
        fake.fault = finding_its_server(
            fake, lambda op, args: engine.answer(args) if op == "live" else None
        )
    return recover_run(
        ledger=fleet.ledger,
        chain=run_chain(fleet.ledger, dead),
        hosts=[live_host(h) for h in fleet.hosts],
        factory=fleet.factory,
        playbook=Playbook(),
        patch=fleet.patch,
    )


@pytest.mark.process
def test_recover_finishes_an_interrupted_live_apply_with_the_smoke_not_a_restart(
    fleet: Fleet,
) -> None:
    """The take was done in every process, the controller killed before the smoke. Before,
    recover restarted the engine (the change was `new-stale`), which the operator of a live
    apply did not ask for."""
    fleet.hosts = fleet.hosts[:1]
    (host,) = fleet.hosts
    dead, post = _left_by_a_dead_live_apply(fleet, host, taken=True)
    engine = HoldingEngine(post)
    for rank in (0, 1):
        engine.held[rank]["eagle-init-guard"] = ["EAGLEWorkerV2.spec_disable_batch_threshold"]
    host.requests.clear()
    report = recover_live(fleet, dead, engine)
    (outcome,) = report.hosts
    assert outcome.outcome == "applied", outcome
    assert f"finished run {dead}'s live fix" in (outcome.note or "")
    assert "restart" not in host.requests and "stop" not in host.requests, host.requests
    assert "smoke" in host.requests
    assert [str(s.step) for s in outcome.steps][-2:] == ["live", "smoke"]
    assert sha(host.file.read_bytes()) == post
    assert not lock_of(host)
    assert report.exit_code == 0


@pytest.mark.process
def test_recover_of_a_live_apply_whose_smoke_fails_reverts_it_and_puts_the_file_back_unrestarted(
    fleet: Fleet,
) -> None:
    """The take was done everywhere but the smoke fails: the fix is reverted in every process and
    the file put back (`rolled-back`), with no restart, as a failed live apply is."""
    fleet.hosts = fleet.hosts[:1]
    (host,) = fleet.hosts
    dead, post = _left_by_a_dead_live_apply(fleet, host, taken=True)
    engine = HoldingEngine(post)
    for rank in (0, 1):
        engine.held[rank]["eagle-init-guard"] = ["EAGLEWorkerV2.spec_disable_batch_threshold"]
    host.smoke_ok = False
    host.requests.clear()
    report = recover_live(fleet, dead, engine)
    (outcome,) = report.hosts
    assert outcome.outcome == "rolled-back", outcome
    assert outcome.reason == Reason.SMOKE_FAILED, outcome
    assert "revert" in engine.asked and engine.held == {0: {}, 1: {}}
    assert "restart" not in host.requests and "stop" not in host.requests, host.requests
    assert sha(host.file.read_bytes()) == PRISTINE
    assert report.exit_code != 0


@pytest.mark.process
def test_recover_of_a_live_apply_killed_during_its_take_reverts_and_restores_without_a_restart(
    fleet: Fleet,
) -> None:
    fleet.hosts = fleet.hosts[:1]
    (host,) = fleet.hosts
    dead, post = _left_by_a_dead_live_apply(fleet, host, taken=False)
    engine = HoldingEngine(post)
    engine.held[0]["eagle-init-guard"] = ["EAGLEWorkerV2.spec_disable_batch_threshold"]  # one rank
    host.requests.clear()
    report = recover_live(fleet, dead, engine)
    (outcome,) = report.hosts
    assert outcome.outcome == "restored", outcome
    assert f"run {dead} was interrupted before its live fix was taken" in (outcome.note or "")
    assert "revert" in engine.asked and engine.held == {0: {}, 1: {}}
    assert "restart" not in host.requests, host.requests
    assert sha(host.file.read_bytes()) == PRISTINE
    assert report.exit_code == 0


def _left_by_a_dead_live_apply_on_the_unit(units: Units, engine: UnitEngine, *, taken: bool) -> str:
    """`_left_by_a_dead_live_apply` on both nodes of unit u1, every rank holding the fix taken
    from the bytes its node's file now holds; with `taken` each node's take recorded `ok`, else
    only `started`. Returns the run id."""
    dead = begin_and_die(units.ledger.path, hosts=list(UNIT.hosts))
    posts = {}
    for name in UNIT.hosts:
        fake = units.fakes[name]
        planned = apply_patch(fake.file.read_bytes(), units.patch.spec)
        assert isinstance(planned, Applied)
        units.ledger.record_step(dead, name, "live", "ok", 0.1, "takes ...")
        units.ledger.record_file_version(
            dead,
            name,
            NewFileVersion(
                path=str(fake.file),
                sha256_before=planned.sha256_before,
                sha256_after=planned.sha256_after,
                mode=0o644,
                owner="root:root",
                pre_image=planned.old_source,
                post_image=planned.new_source,
            ),
        )
        units.ledger.record_step(dead, name, "swap", "ok", 0.1)
        units.ledger.record_step(dead, name, "live", "started")
        if taken:
            units.ledger.record_step(dead, name, "live", "ok", 0.1, "eagle-init-guard: taken")
        locked_by(fake, dead)
        fake.file.write_bytes(planned.new_source)
        posts[name] = planned.sha256_after
    for rank in range(4):
        engine.held[rank]["eagle-init-guard"] = [
            {"fix_id": "eagle-init-guard", "sha256": posts["h1"], "name": "f", "kind": "function"}
        ]
    for name in UNIT.hosts:
        fake, answer = units.fakes[name], units.fakes[name].fault
        assert answer is not None
        fake.fault = finding_its_server(fake, answer)
        fake.requests.clear()
    return dead


def recover_unit(units: Units, dead: str) -> RunReport:
    return recover_run(
        ledger=units.ledger,
        chain=run_chain(units.ledger, dead),
        hosts=[replace(h, live=True) for h in units.hosts(*UNIT.hosts)],
        factory=units.factory,
        playbook=Playbook(),
        patch=units.patch,
    )


@pytest.mark.process
def test_recover_finishes_an_interrupted_live_apply_on_a_unit_through_its_head_not_a_restart(
    units: Units,
) -> None:
    """The take was done on every rank of both nodes, the controller killed before the smoke.
    Before, a unit was recovered by its own copy of the code, which knew no live path: both
    nodes were stopped and started again (issue 43: a group of one and a unit are one path)."""
    engine = live_unit(units)
    dead = _left_by_a_dead_live_apply_on_the_unit(units, engine, taken=True)
    report = recover_unit(units, dead)
    outcomes = {o.host: o for o in report.hosts}
    assert {h: str(o.outcome) for h, o in outcomes.items()} == dict.fromkeys(UNIT.hosts, "applied")
    assert f"finished run {dead}'s live fix" in (outcomes["h2"].note or "")
    for name in UNIT.hosts:
        requests = units.fakes[name].requests
        assert not {"restart", "stop", "start"} & set(requests), (name, requests)
        assert not lock_of(units.fakes[name])
    assert "smoke" in units.fakes["h1"].requests and "smoke" not in units.fakes["h2"].requests
    assert report.exit_code == 0


@pytest.mark.process
@pytest.mark.parametrize(
    ("taken", "outcome"),
    [(True, "rolled-back"), (False, "restored")],
    ids=["its-smoke-fails", "killed-during-its-take"],
)
def test_recover_of_a_live_apply_on_a_unit_reads_the_revert_back_and_restarts_where_it_did_not_take(
    units: Units, taken: bool, outcome: str
) -> None:
    """Recover takes the fix out (a failed smoke, or a take the kill left part-way) and a rank on
    h2 answers its revert ok but still lists the fix. Before, recover trusted the revert's answer:
    both nodes were reported put back, unrestarted, while that rank still ran the fix; now it reads
    every node back, as apply --live does (`LiveApply.undo`), and restarts the unit as one."""
    engine = live_unit(units, keeping_rank=2)
    dead = _left_by_a_dead_live_apply_on_the_unit(units, engine, taken=taken)
    if taken:
        units.fakes["h1"].smoke_ok = False
    report = recover_unit(units, dead)
    outcomes = {o.host: o for o in report.hosts}
    assert {h: str(o.outcome) for h, o in outcomes.items()} == dict.fromkeys(UNIT.hosts, outcome)
    assert ("h1", "revert") in engine.asked and engine.holding()[2] == {"eagle-init-guard"}
    for name in UNIT.hosts:
        done = [str(s.step) for s in outcomes[name].steps]
        assert done.index("live-revert") < done.index("live-readback") < done.index("restore")
        assert "stop-after-restore" in done and "start-after-restore" in done, (name, done)
        assert sha(units.fakes[name].file.read_bytes()) == PRISTINE
    readback = [s for s in outcomes["h2"].steps if s.step == "live-readback"][-1]
    assert readback.status == "failed" and "still holds eagle-init-guard" in (readback.detail or "")
    assert [str(s.status) for s in outcomes["h1"].steps if s.step == "live-readback"] == ["ok"]


def _killed_run_whose_first_host_cannot_start(fleet: Fleet) -> str:
    """A run killed on every host (each keeps its lock) whose first host's server is down and
    refuses to start again: a recover of it halts there. Returns the run's id."""
    dead = begin_and_die(fleet.ledger.path, hosts=[h.name for h in fleet.hosts])
    for fake in fleet.hosts:
        locked_by(fake, dead)
    first = fleet.hosts[0]
    first.serving = False

    def no_start(op: str, args: dict[str, Any]) -> Refusal | None:
        if op in ("restart", "start"):
            return Refusal("restart-failed", "the start command exited 1")
        return None

    first.fault = no_start
    return dead


@pytest.mark.process
def test_a_halted_recover_names_the_lock_of_the_run_left_on_the_hosts_it_never_started(
    fleet: Fleet,
) -> None:
    """recover --run R, one host at a time, halts at the first, whose server cannot be started.
    The hosts it never started keep R's lock (the halt changes nothing more), and each says so
    and how to clear it; the recover it names reconciles the host and takes the lock over.
    Before, each said only "not started: the run halted", and the lock refused the next
    command for up to 30 minutes."""
    dead = _killed_run_whose_first_host_cannot_start(fleet)
    report = recover_run(
        ledger=fleet.ledger,
        chain=run_chain(fleet.ledger, dead),
        hosts=[h.host() for h in fleet.hosts],
        factory=fleet.factory,
        playbook=Playbook(max_in_flight=1),
        patch=None,
    )
    assert report.halted is not None, report
    never = {h.host: h for h in report.hosts if h.outcome == "skipped"}
    assert set(never) == {"h2", "h3"}, fleet.outcomes(report)
    for name, said in never.items():
        assert said.reason == "not-started", said
        assert f"nothing of run {dead} was reconciled here" in (said.error or ""), said
        assert (
            f"`opspatch recover --hosts {name}` reconciles the host and takes the lock over, or "
            f"`opspatch unlock --hosts {name}` removes it"
        ) in (said.error or ""), said
    assert all(lock_of(f) for f in fleet.hosts if f.name in never)  # kept, and said

    recovered = recover_hosts(
        ledger=fleet.ledger,
        hosts=[f.host() for f in fleet.hosts if f.name in never],
        factory=fleet.factory,
        playbook=Playbook(),
        patch=None,
    )
    assert set(fleet.outcomes(recovered).values()) == {"restored"}, recovered
    assert not any(lock_of(f) for f in fleet.hosts if f.name in never)


@pytest.mark.process
def test_a_halted_recover_leaves_its_run_interrupted_until_a_recover_reconciles_every_host(
    fleet: Fleet,
) -> None:
    """recover --run R halts at its first host (its server cannot be started), so R's other
    hosts are never reconciled: R stays `interrupted` (not `recovered`, which would be a false
    green), and a later recover --run R finishes every host and marks it recovered. Before, the
    halted recover marked R recovered by itself."""
    dead = _killed_run_whose_first_host_cannot_start(fleet)
    first = fleet.hosts[0]
    names = [h.host() for h in fleet.hosts]

    def recover() -> RunReport:
        return recover_run(
            ledger=fleet.ledger,
            chain=run_chain(fleet.ledger, dead),
            hosts=names,
            factory=fleet.factory,
            playbook=Playbook(max_in_flight=1),
            patch=None,
        )

    halted = recover()
    assert halted.halted is not None and halted.exit_code == 3, fleet.outcomes(halted)
    never = [h for h in halted.hosts if h.outcome == "skipped"]
    assert {h.host for h in never} == {"h2", "h3"}
    summary = fleet.ledger.get_run(dead).summary
    assert (summary.status, summary.recovered_by) == ("interrupted", None), summary
    assert all(h.reason == "not-started" for h in never), never
    again = f"run {dead} stays interrupted until `opspatch recover --run {dead}` reconciles"
    assert all(again in (h.error or "") for h in never), never
    assert fleet.ledger.get_run(halted.run_id or "").summary.status == "finished"

    first.fault = None
    finished = recover()
    assert finished.exit_code == 0, fleet.outcomes(finished)
    assert set(fleet.outcomes(finished).values()) == {"restored"}, finished
    assert not any(lock_of(f) for f in fleet.hosts)
    summary = fleet.ledger.get_run(dead).summary
    assert (summary.status, summary.recovered_by) == ("recovered", finished.run_id), summary


# -- a rollback killed after its swap -----------------------------------------------------------


def _left_by_a_dead_rollback(fleet: Fleet, host: FakeHost) -> str:
    """What a controller killed during `rollback` right after its swap leaves: the host applied
    (and restarted) ten minutes ago, the rollback's restore and swap recorded, the file back at
    its pre-image (written now), the server never restarted, the lock held. Returns the run."""
    applied = fleet.apply()
    assert fleet.outcomes(applied) == {host.name: "applied"}, applied
    host.started_at = time.time() - 600  # the apply's restart, before the rollback's write
    post = host.file.read_bytes()
    pristine = (STANDIN / "eagle_worker_v2.py").read_bytes()
    dead = begin_and_die(
        fleet.ledger.path,
        command="rollback",
        command_line=f"opspatch rollback eagle-init-guard --hosts {host.name}",
        hosts=[host.name],
    )
    fleet.ledger.record_file_version(
        dead,
        host.name,
        NewFileVersion(
            path=str(host.file),
            sha256_before=sha(post),
            sha256_after=PRISTINE,
            mode=0o644,
            owner="root:root",
            pre_image=post,
            post_image=pristine,
            action=FileAction.RESTORE,
        ),
    )
    fleet.ledger.record_step(dead, host.name, "swap", "ok", 0.1)
    locked_by(host, dead)
    host.file.write_bytes(pristine)
    host.requests.clear()
    host.fault = finding_its_server(host)
    return dead


@pytest.mark.process
@pytest.mark.parametrize("by_run", [False, True], ids=["hosts", "run"])
def test_recover_of_a_rollback_killed_after_its_swap_restarts_the_server_still_running_the_fix(
    fleet: Fleet, by_run: bool
) -> None:
    """Before, recover found the file at its pre-image and the server answering, said
    `restored` and left the server started before the swap running the patched code."""
    fleet.hosts = fleet.hosts[:1]
    (host,) = fleet.hosts
    dead = _left_by_a_dead_rollback(fleet, host)
    report = fleet.recover(host, run=dead if by_run else None)
    (outcome,) = report.hosts
    assert outcome.outcome == "restored", outcome
    assert "restart" in host.requests and "smoke" in host.requests, host.requests
    assert "started before" in (outcome.note or ""), outcome
    assert host.started_at is not None and host.started_at > host.file.stat().st_mtime
    assert sha(host.file.read_bytes()) == PRISTINE
    assert not lock_of(host)
    assert report.exit_code == 0


@pytest.mark.process
def test_recover_of_a_rollback_killed_after_its_swap_leaves_a_server_started_since_alone(
    fleet: Fleet,
) -> None:
    fleet.hosts = fleet.hosts[:1]
    (host,) = fleet.hosts
    dead = _left_by_a_dead_rollback(fleet, host)
    host.restarted()  # someone restarted it after the write: it runs the pre-image
    report = fleet.recover(host, run=dead)
    (outcome,) = report.hosts
    assert outcome.outcome == "restored", outcome
    assert "restart" not in host.requests, host.requests
    assert sha(host.file.read_bytes()) == PRISTINE
    assert report.exit_code == 0


# -- a file put back, its server still running the fix ------------------------------------------


def _staged_back(fleet: Fleet, host: FakeHost) -> RunReport:
    """`apply`, then `rollback --restart never` on `host`: the file back at its pre-image
    (written now), the server started (by the apply's restart) ten minutes before that write,
    still running the fix. Returns the apply's report."""
    applied = fleet.apply()
    assert fleet.outcomes(applied) == {host.name: "applied"}, applied
    host.started_at = time.time() - 600
    back = rollback_hosts(
        ledger=fleet.ledger,
        hosts=[host.host()],
        factory=fleet.factory,
        playbook=Playbook(),
        patch=fleet.patch,
        restart_engine=False,
    )
    assert fleet.outcomes(back) == {host.name: "staged-back"}, back
    assert sha(host.file.read_bytes()) == PRISTINE
    host.fault = finding_its_server(host)
    host.requests.clear()
    return applied


def _status(fleet: Fleet, host: FakeHost) -> PatchStatus:
    (said,) = fleet_status([host.host()], [fleet.patch], fleet.factory, fleet.ledger)
    return said


def _rollback(fleet: Fleet, host: FakeHost, run: str | None) -> RunReport:
    """`rollback eagle-init-guard`, or with `run` `rollback --run RUN`, on `host`."""
    return rollback_hosts(
        ledger=fleet.ledger,
        hosts=[host.host()],
        factory=fleet.factory,
        playbook=Playbook(),
        patch=None if run else fleet.patch,
        source_run=fleet.ledger.get_run(run) if run else None,
    )


def _restarted_and_proven(fleet: Fleet, host: FakeHost, report: RunReport) -> None:
    """The host `restored` by a restart and a passing smoke, said alike by the outcome, the
    ledger, the exit code and `status`."""
    (outcome,) = report.hosts
    assert outcome.outcome == "restored" and outcome.error is None, outcome
    assert "started before" in (outcome.note or ""), outcome
    assert "restart" in host.requests and "smoke" in host.requests, host.requests
    assert host.started_at is not None and host.started_at > host.file.stat().st_mtime
    assert sha(host.file.read_bytes()) == PRISTINE
    recorded = fleet.ledger.get_run(report.run_id or "").host(host.name)
    assert recorded.outcome == "restored", recorded
    steps = {s.step: s.status for s in recorded.steps}
    assert steps.get("restart") == "ok" and steps.get("smoke") == "ok", recorded.steps
    assert report.exit_code == 0
    assert not lock_of(host)
    said = _status(fleet, host)
    assert said.state == "not-applied" and "started before" not in said.detail, said


def test_status_of_a_file_put_back_without_a_restart_says_its_server_still_runs_the_fix(
    fleet: Fleet,
) -> None:
    """Before, status said only "back at the pre-image of run R": nothing said the server
    still runs the patched code, nor how to finish."""
    fleet.hosts = fleet.hosts[:1]
    (host,) = fleet.hosts
    applied = _staged_back(fleet, host)
    said = _status(fleet, host)
    assert said.state == "not-applied", said
    assert said.detail.startswith(f"back at the pre-image of run {applied.run_id}"), said
    assert f"pid {FAKE_PID}" in said.detail and "started before" in said.detail, said
    assert "opspatch restart --hosts h1" in said.detail, said


def test_status_reads_a_put_back_file_once_as_the_commands_read_it(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """status reads through `standing.read_inspected`, the reading restart and rollback decide
    from: the file's history is read once. Before, status read it, then `server_stale` read it
    again beside it."""
    fleet.hosts = fleet.hosts[:1]
    (host,) = fleet.hosts
    _staged_back(fleet, host)
    reads: list[object] = []
    history = fleet.ledger.file_history

    def counted(*args: Any, **kwargs: Any) -> Any:
        reads.append(args)
        return history(*args, **kwargs)

    monkeypatch.setattr(fleet.ledger, "file_history", counted)
    said = _status(fleet, host)
    assert "started before it was put back" in said.detail, said
    assert len(reads) == 1, reads


def test_restart_of_a_file_put_back_without_a_restart_restarts_and_proves_it(
    fleet: Fleet,
) -> None:
    """Before, restart said "nothing staged: the file is at the pre-image" (exit 2) and left
    the server running the fix the rollback took out of the file."""
    fleet.hosts = fleet.hosts[:1]
    (host,) = fleet.hosts
    _staged_back(fleet, host)
    report = restart_hosts(
        ledger=fleet.ledger, hosts=[host.host()], factory=fleet.factory, playbook=Playbook()
    )
    _restarted_and_proven(fleet, host, report)


@pytest.mark.parametrize("by_run", [False, True], ids=["patch", "run"])
def test_a_second_rollback_of_a_file_put_back_without_a_restart_restarts_and_proves_it(
    fleet: Fleet, by_run: bool
) -> None:
    """Before, a second rollback said "already at the pre-image; nothing to restore" (exit 2)
    over a server still running the fix."""
    fleet.hosts = fleet.hosts[:1]
    (host,) = fleet.hosts
    applied = _staged_back(fleet, host)
    report = _rollback(fleet, host, applied.run_id if by_run else None)
    _restarted_and_proven(fleet, host, report)


def test_restart_and_rollback_leave_a_put_back_file_whose_server_started_since_alone(
    fleet: Fleet,
) -> None:
    fleet.hosts = fleet.hosts[:1]
    (host,) = fleet.hosts
    _staged_back(fleet, host)
    host.restarted()  # someone restarted it after the put-back: it runs the pre-image
    assert "started before" not in _status(fleet, host).detail
    restarted = restart_hosts(
        ledger=fleet.ledger, hosts=[host.host()], factory=fleet.factory, playbook=Playbook()
    )
    rolled = _rollback(fleet, host, None)
    for report in (restarted, rolled):
        assert fleet.outcomes(report) == {host.name: "skipped"}, report
        assert report.exit_code == 0, report  # the goal stands: nothing staged, all old
    assert "restart" not in host.requests and "smoke" not in host.requests, host.requests


def test_a_second_rollback_told_not_to_restart_says_its_server_still_runs_the_fix(
    fleet: Fleet,
) -> None:
    fleet.hosts = fleet.hosts[:1]
    (host,) = fleet.hosts
    _staged_back(fleet, host)
    report = rollback_hosts(
        ledger=fleet.ledger,
        hosts=[host.host()],
        factory=fleet.factory,
        playbook=Playbook(),
        patch=fleet.patch,
        restart_engine=False,
    )
    (outcome,) = report.hosts
    assert outcome.outcome == "skipped", outcome
    assert "still runs the patched code" in (outcome.note or ""), outcome
    assert "opspatch restart --hosts h1" in (outcome.note or ""), outcome
    assert "restart" not in host.requests, host.requests


@pytest.mark.parametrize("command", ["restart", "rollback"])
def test_a_unit_put_back_without_a_restart_is_restarted_as_one(units: Units, command: str) -> None:
    """Every node's file back at its pre-image, every server still running the fix: restart
    (or a second rollback) restarts the unit as one and proves it through the head, `restored`
    on both nodes."""
    hosts = units.hosts("h1", "h2")
    assert [o.outcome for o in units.apply("h1", "h2").hosts] == ["applied", "applied"]
    back = rollback_hosts(
        ledger=units.ledger,
        hosts=hosts,
        factory=units.factory,
        playbook=ALL_AT_ONCE,
        patch=units.patch,
        restart_engine=False,
    )
    assert [o.outcome for o in back.hosts] == ["staged-back", "staged-back"], back
    for name in ("h1", "h2"):
        fake = units.fakes[name]
        fake.started_at = time.time() - 600
        fake.fault = finding_its_server(fake)
        fake.requests.clear()
    if command == "restart":
        report = restart_hosts(
            ledger=units.ledger, hosts=hosts, factory=units.factory, playbook=ALL_AT_ONCE
        )
    else:
        report = rollback_hosts(
            ledger=units.ledger,
            hosts=hosts,
            factory=units.factory,
            playbook=ALL_AT_ONCE,
            patch=units.patch,
        )
    assert [o.outcome for o in report.hosts] == ["restored", "restored"], report
    assert report.exit_code == 0
    requests = units.requests()
    assert all("stop" in requests[n] and "start" in requests[n] for n in ("h1", "h2")), requests
    assert "smoke" in requests["h1"], requests
