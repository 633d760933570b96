"""The pipeline's rare paths, fast: every host is a `ScriptedTransport` whose file operations run
the real host agent on real files in a temporary folder, while the engine (restart, readiness,
smoke) and the faults under test are scripted. No engine, no sshd: each test takes well under a
second, so every rare branch of the apply, rollback and recover pipelines gets one.

The real-process tests (test_rollout.py) prove the same pipeline end to end; these pin down the
branches that are hard to provoke there: a swap whose reply is lost after the write, a host that
vanishes in the middle, a restore that fails, a lock taken away mid-run, halting and
on_halt = rollback-run.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from opspatch.config.patches import load_patch
from opspatch.core.filechange import FileChange
from opspatch.core.policy import BatchSize, Playbook
from opspatch.core.reasons import Reason
from opspatch.errors import TransportError
from opspatch.hosts.operations import LOCK_HOLD_SECONDS
from opspatch.hosts.transport.scripted import Refusal, agent_operation
from opspatch.ledger import NewFileVersion
from opspatch.runs.commands.apply import apply_to_hosts
from opspatch.runs.commands.rollback import rollback_hosts
from opspatch.runs.commands.unlock import unlock_hosts
from opspatch.runs.report import RunReport
from tests.scriptedkit import (
    PRISTINE,
    REPO,
    STANDIN,
    FakeHost,
    Fleet,
    Notices,
    desired_everywhere,
    fleet,
    mark_patch,
    sha,
)

__all__ = ["fleet"]  # the fixtures, used by name

pytestmark = pytest.mark.scripted


def test_a_swap_whose_reply_is_lost_after_the_write_is_read_back_and_rolled_back(
    fleet: Fleet,
) -> None:
    host = fleet.hosts[0]
    fleet.hosts = [host]

    def lose_the_swap_reply(op: str, args: dict[str, Any]) -> None:
        if op == "swap":
            agent_operation(op, args)  # the file is written...
            raise TransportError("the connection broke", host=host.name, step="exec")
        return None

    host.fault = lose_the_swap_reply
    report = fleet.apply()
    (outcome,) = report.hosts
    assert outcome.outcome == "rolled-back", outcome
    assert outcome.reason == Reason.STEP_FAILED, outcome
    assert sha(host.file.read_bytes()) == PRISTINE
    steps = [s.step for s in outcome.steps]
    assert steps[steps.index("swap") + 1 : steps.index("swap") + 3] == ["reconcile", "restore"]
    assert report.exit_code == 1


def test_a_restart_whose_ready_was_answered_by_the_old_server_is_rolled_back_saying_so(
    fleet: Fleet,
) -> None:
    """`stale-server`: the stop missed the old server, which answered /health while the new one
    loaded. Never `applied`: the host rolls back, and its outcome, ledger step and report say why."""
    from opspatch.runs.commands.status import fleet_status

    host = fleet.hosts[0]
    fleet.hosts = [host]
    said = "http://127.0.0.1:30000 was answered by pid 4100, not by the engine just started"
    asked = {"ready": 0}

    def old_server_answers(op: str, args: dict[str, Any]) -> Refusal | None:
        if op == "wait_ready":
            asked["ready"] += 1
            if asked["ready"] == 1:  # the apply's; the rollback's restart is then ready
                return Refusal("stale-server", said)
        return None

    host.fault = old_server_answers
    report = fleet.apply()
    (outcome,) = report.hosts
    assert outcome.outcome == "rolled-back", outcome
    assert said in (outcome.error or ""), outcome
    assert sha(host.file.read_bytes()) == PRISTINE
    ready = next(s for s in outcome.steps if s.step == "ready")
    assert ready.status == "failed" and said in (ready.detail or ""), ready
    recorded = fleet.ledger.get_run(report.run_id or "").host(host.name)
    assert recorded.outcome == "rolled-back" and said in (recorded.error or ""), recorded
    assert report.exit_code == 1
    (status,) = fleet_status([host.host()], [fleet.patch], fleet.factory, fleet.ledger)
    assert status.state == "not-applied", status


def test_a_swap_that_gave_no_reply_and_wrote_nothing_is_failed_with_the_file_unchanged(
    fleet: Fleet,
) -> None:
    host = fleet.hosts[0]
    fleet.hosts = [host]

    def drop_before_the_write(op: str, args: dict[str, Any]) -> None:
        if op == "swap":
            raise TransportError("the connection broke", host=host.name, step="exec")
        return None

    host.fault = drop_before_the_write
    (outcome,) = fleet.apply().hosts
    assert outcome.outcome == "failed"
    assert outcome.reason == Reason.HOST_ERROR, outcome
    assert "reconcile" in [s.step for s in outcome.steps]
    assert sha(host.file.read_bytes()) == PRISTINE


def test_an_agent_that_printed_no_reply_during_the_swap_is_not_taken_as_nothing_changed(
    fleet: Fleet,
) -> None:
    """No reply at all (the channel closed with no exit status, say) is an unknown effect, not
    a refusal: before, the host was reported `failed` while its file was the post-image."""
    host = fleet.hosts[0]
    fleet.hosts = [host]

    def write_then_die(op: str, args: dict[str, Any]) -> dict[str, Any] | Refusal | None:
        if op == "swap":
            agent_operation(op, args)
            return Refusal("agent-no-reply", "the host agent gave no reply (exit -1)")
        return None

    host.fault = write_then_die
    (outcome,) = fleet.apply().hosts
    assert outcome.outcome == "rolled-back"
    assert sha(host.file.read_bytes()) == PRISTINE


def test_a_host_that_vanishes_after_a_lost_swap_needs_attention_and_halts(fleet: Fleet) -> None:
    first = fleet.hosts[0]

    def vanish(op: str, args: dict[str, Any]) -> None:
        if op == "swap":
            agent_operation(op, args)
            first.gone = True
            raise TransportError("the connection broke", host=first.name, step="exec")
        return None

    first.fault = vanish
    report = fleet.apply(Playbook(canary=1, batch=BatchSize(count=10), max_failures=1))
    outcomes = fleet.outcomes(report)
    assert outcomes == {"h1": "needs-attention", "h2": "skipped", "h3": "skipped"}
    assert report.hosts[0].reason == Reason.PART_WAY, report.hosts[0]
    assert report.exit_code == 3
    for other in fleet.hosts[1:]:
        assert sha(other.file.read_bytes()) == PRISTINE
        assert "swap" not in other.requests


def test_a_restore_that_fails_needs_attention_and_keeps_the_backup(fleet: Fleet) -> None:
    host = fleet.hosts[0]
    fleet.hosts = [host]
    host.smoke_ok = False

    def restore_fails(op: str, args: dict[str, Any]) -> Refusal | None:
        if op == "restore":
            return Refusal("write-failed", "cannot write: the directory is read-only")
        return None

    host.fault = restore_fails
    report = fleet.apply()
    (outcome,) = report.hosts
    assert outcome.outcome == "needs-attention"
    assert outcome.reason == Reason.UNDO_FAILED, outcome
    assert "then the restore failed" in (outcome.error or "")  # undo-failed's wording
    assert report.exit_code == 3
    assert (host.state / "backups" / PRISTINE).is_file()


def test_a_lock_taken_away_mid_run_refuses_the_swap_and_changes_nothing(fleet: Fleet) -> None:
    host = fleet.hosts[0]
    fleet.hosts = [host]

    def steal_the_lock(op: str, args: dict[str, Any]) -> None:
        if op == "swap":
            lock = host.state / "lock.json"
            holder = json.loads(lock.read_text())
            lock.write_text(json.dumps({**holder, "run_id": "20260101T000000Z-other0"}))
        return None

    host.fault = steal_the_lock
    report = fleet.apply()
    (outcome,) = report.hosts
    assert outcome.outcome == "failed" and outcome.reason == "lock-lost", outcome
    assert fleet.ledger.get_run(report.run_id or "").host(host.name).reason == "lock-lost"
    assert sha(host.file.read_bytes()) == PRISTINE


def test_a_lock_lost_mid_restart_ends_lock_lost_not_undo_failed(fleet: Fleet) -> None:
    """A lock another run took between the swap and the restart: the restart's exec is refused
    before it ran, and so is the undo's restore; the host ends `lock-lost` (the other run now
    holds it), not `undo-failed` for a restore that was refused for the same reason."""
    host = fleet.hosts[0]
    fleet.hosts = [host]

    def steal_the_lock(op: str, args: dict[str, Any]) -> None:
        if op == "restart":
            lock = host.state / "lock.json"
            holder = json.loads(lock.read_text())
            lock.write_text(json.dumps({**holder, "run_id": "20260101T000000Z-other0"}))
        return None

    host.fault = steal_the_lock
    report = fleet.apply()
    (outcome,) = report.hosts
    assert outcome.outcome == "needs-attention" and outcome.reason == Reason.LOCK_LOST, outcome
    assert "this run no longer holds the lock of h1" in (outcome.error or ""), outcome
    assert fleet.ledger.get_run(report.run_id or "").host(host.name).reason == "lock-lost"


def test_a_lock_lost_in_the_restart_after_the_restore_ends_lock_lost(fleet: Fleet) -> None:
    """The undo's own restart refused for a lock another run took over: `lock-lost`, with the
    refusal's words, not `undo-failed`."""
    host = fleet.hosts[0]
    fleet.hosts = [host]
    host.smoke_ok = False
    restarts = []

    def steal_the_lock_at_the_second_restart(op: str, args: dict[str, Any]) -> None:
        if op == "restart":
            restarts.append(op)
        if len(restarts) == 2:
            lock = host.state / "lock.json"
            holder = json.loads(lock.read_text())
            lock.write_text(json.dumps({**holder, "run_id": "20260101T000000Z-other0"}))
        return None

    host.fault = steal_the_lock_at_the_second_restart
    (outcome,) = fleet.apply().hosts
    assert outcome.outcome == "needs-attention" and outcome.reason == Reason.LOCK_LOST, outcome
    assert "no longer holds the host's lock" in (outcome.error or ""), outcome
    assert sha(host.file.read_bytes()) == PRISTINE  # restored before the lock was lost


def test_a_failed_canary_halts_and_the_rest_is_not_started(fleet: Fleet) -> None:
    fleet.hosts[0].smoke_ok = False
    report = fleet.apply(Playbook(canary=1, batch=BatchSize(count=10), max_failures=5))
    outcomes = fleet.outcomes(report)
    assert outcomes == {"h1": "rolled-back", "h2": "skipped", "h3": "skipped"}
    assert report.halted is not None and "canary h1 failed" in report.halted
    assert all(sha(h.file.read_bytes()) == PRISTINE for h in fleet.hosts)
    assert "swap" not in fleet.hosts[1].requests


def test_on_halt_rollback_run_restores_the_hosts_this_run_applied(fleet: Fleet) -> None:
    fleet.hosts[1].smoke_ok = False
    playbook = Playbook(
        canary=0, batch=BatchSize(count=10), max_in_flight=1, max_failures=1, on_halt="rollback-run"
    )
    report = fleet.apply(playbook)
    outcomes = fleet.outcomes(report)
    assert outcomes == {"h1": "rolled-back", "h2": "rolled-back", "h3": "skipped"}
    assert [h.reason for h in report.hosts] == [
        Reason.HALTED,
        Reason.SMOKE_FAILED,
        Reason.NOT_STARTED,
    ]
    assert "on_halt = rollback-run" in (report.hosts[0].error or "")  # halted's wording
    assert all(sha(h.file.read_bytes()) == PRISTINE for h in fleet.hosts)


def test_every_host_step_of_apply_takes_its_deadline_from_the_playbook(fleet: Fleet) -> None:
    fleet.hosts = fleet.hosts[:1]
    playbook = Playbook(canary=0, batch=BatchSize(count=10))
    from dataclasses import replace

    timeouts = replace(playbook.timeouts, swap=7.0, smoke=11.0, lock=3.0, inspect=5.0)
    fleet.apply(replace(playbook, timeouts=timeouts))
    calls = fleet.transports["h1"].calls
    deadlines = {c.op: c.timeout for c in calls if c.op != "lock"}
    assert deadlines["inspect"] == 8.0  # begin: lock + inspect, one exec
    assert deadlines["swap"] == 7.0
    assert deadlines["smoke"] > 11.0  # the host-side deadline plus the exec's margin
    # every exec after begin re-asserts the lock first: busy for the exec's deadline plus the
    # lease expiry, keeping other runs off for LOCK_HOLD_SECONDS after it; the passing smoke
    # gave it back in its own exec: no exec for the unlock
    assert fleet.transports["h1"].execs == [
        ("lock", "inspect"),
        ("lock", "swap"),
        ("lock", "restart"),
        ("lock", "wait_ready"),
        ("lock", "smoke", "unlock"),
    ]
    grace = playbook.team.lease_expiry
    locks = [c for c in calls if c.op == "lock"]
    assert [c.args["ttl_seconds"] for c in locks] == [LOCK_HOLD_SECONDS] * 5
    assert [c.args["busy_seconds"] - c.timeout for c in locks] == [grace] * 5
    assert [c.args["refresh_only"] for c in locks] == [False, True, True, True, True]
    assert not (fleet.hosts[0].state / "lock.json").exists()


def test_a_failed_smoke_keeps_the_lock_it_would_have_given_back(fleet: Fleet) -> None:
    """The smoke's exec carries the unlock behind a gate: a smoke that fails stops it there, so
    the roll-back that follows still holds the host's lock."""
    fleet.hosts = fleet.hosts[:1]
    fleet.hosts[0].smoke_ok = False
    report = fleet.apply(Playbook(canary=0, batch=BatchSize(count=10)))
    assert fleet.outcomes(report) == {"h1": "rolled-back"}
    transport = fleet.transports["h1"]
    first_smoke = transport.execs.index(("lock", "smoke", "unlock"))
    ran = [c.op for c in transport.calls if c.exec_index == first_smoke]
    assert ran == ["lock", "smoke"]  # the unlock was not run: the lock stayed for the roll-back
    assert "restore" in transport.ops[transport.ops.index("smoke") :]
    assert not (fleet.hosts[0].state / "lock.json").exists()  # given back once it was done


def _left_by_a_dead_run(fleet: Fleet, host: FakeHost) -> str:
    """What a controller killed right after the swap leaves: its run interrupted in the ledger
    with the file version recorded, the host's file patched and never restarted, its lock."""
    from opspatch.core.edit import Applied, apply_patch
    from tests.ledgerkit import begin_and_die

    run_id = begin_and_die(fleet.ledger.path, hosts=[host.name])
    planned = apply_patch(host.file.read_bytes(), fleet.patch.spec)
    assert isinstance(planned, Applied)
    fleet.ledger.record_file_version(
        run_id,
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
    locked = agent_operation(
        "lock",
        {"state_dir": str(host.state), "owner": "ops@gone", "run_id": run_id, "ttl_seconds": 1800},
    )
    assert isinstance(locked, dict)
    host.file.write_bytes(planned.new_source)
    return run_id


@pytest.mark.process
def test_recover_hosts_finishes_what_a_dead_run_left_taking_over_its_lock(fleet: Fleet) -> None:
    host = fleet.hosts[0]
    dead = _left_by_a_dead_run(fleet, host)
    assert fleet.ledger.get_run(dead).summary.status == "interrupted"
    report = fleet.recover(host)
    (outcome,) = report.hosts
    assert outcome.outcome == "applied", outcome
    assert f"took the lock over from run {dead}" in outcome.steps[0].detail
    assert "finished run" in (outcome.note or "")
    assert report.exit_code == 0
    assert not (host.state / "lock.json").exists()  # released at the end


@pytest.mark.process
def test_unlock_frees_a_dead_runs_lock_and_refuses_an_unknown_one(fleet: Fleet) -> None:
    host, other = fleet.hosts[0], fleet.hosts[1]
    _left_by_a_dead_run(fleet, host)
    locked = agent_operation(
        "lock",
        {
            "state_dir": str(other.state),
            "owner": "someone@elsewhere",
            "run_id": "20260101T000000Z-abcdef",
            "ttl_seconds": 1800,
        },
    )
    assert isinstance(locked, dict)
    report = unlock_hosts(
        ledger=fleet.ledger,
        hosts=[host.host(), other.host()],
        factory=fleet.factory,
        playbook=Playbook(),
    )
    outcomes = {h.host: h for h in report.hosts}
    assert outcomes["h1"].outcome == "unlocked"
    assert not (host.state / "lock.json").exists()
    assert outcomes["h2"].outcome == "skipped"
    assert outcomes["h2"].reason == Reason.UNKNOWN_HOLDER, outcomes["h2"]
    assert "which this ledger does not know" in (outcomes["h2"].error or "")  # its wording
    assert (other.state / "lock.json").is_file()
    # h1's lock was removed, so "nothing was changed" (exit 2) would be false; h2 did not reach
    # the goal: exit 1
    assert report.exit_code == 1
    forced = unlock_hosts(
        ledger=fleet.ledger,
        hosts=[other.host()],
        factory=fleet.factory,
        playbook=Playbook(),
        force_unknown=True,
    )
    assert [h.outcome for h in forced.hosts] == ["unlocked"]
    assert not (other.state / "lock.json").exists()


def test_a_staged_apply_is_two_execs_and_leaves_no_lock(fleet: Fleet) -> None:
    """`restart = "never"`: begin, then a swap that gives the lock back itself."""
    from dataclasses import replace

    fleet.hosts = fleet.hosts[:1]
    report = fleet.apply(replace(Playbook(canary=0, batch=BatchSize(count=10)), restart="never"))
    (outcome,) = report.hosts
    assert outcome.outcome == "staged"
    assert "the running server still runs the old code" in (outcome.note or "")
    assert fleet.transports["h1"].execs == [("lock", "inspect"), ("lock", "swap", "unlock")]
    assert not (fleet.hosts[0].state / "lock.json").exists()
    assert sha(fleet.hosts[0].file.read_bytes()) != PRISTINE
    # the scripted engine started before the swap: status reads it staged, as on a real host
    from opspatch.runs.commands.status import fleet_status

    (said,) = fleet_status([fleet.hosts[0].host()], [fleet.patch], fleet.factory, fleet.ledger)
    assert said.state == "staged" and said.server_running, said
    fleet.hosts[0].restarted()
    (said,) = fleet_status([fleet.hosts[0].host()], [fleet.patch], fleet.factory, fleet.ledger)
    assert said.state == "applied", said


@pytest.mark.process
def test_a_change_proven_before_the_kill_whose_engine_died_since_is_restarted_by_recover(
    fleet: Fleet,
) -> None:
    """The run recorded the smoke as passed, then its controller died (before the outcome), and
    the engine died too: recover must not call the host `applied` while its server is down."""
    host = fleet.hosts[0]
    dead = _left_by_a_dead_run(fleet, host)
    fleet.ledger.record_step(dead, host.name, "smoke", "ok", 0.2, "2 prompt(s), 32 tokens")
    down = {"yes": True}

    def engine_gone(op: str, args: dict[str, Any]) -> dict[str, Any] | Refusal | None:
        if op == "wait_ready" and down["yes"]:
            return Refusal("engine-not-running", "the engine is not running: pid 4242 has exited")
        if op == "restart":
            down["yes"] = False
        return None

    host.fault = engine_gone
    report = fleet.recover(host)
    (outcome,) = report.hosts
    assert outcome.outcome == "applied", outcome
    assert "restart" in fleet.transports[host.name].ops  # it was brought back, not trusted


def _count_plans(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The files the pipeline planned the patch on, one entry per call of the planner."""
    from opspatch.core.edit import apply_patch
    from opspatch.runs.fleet import pipeline

    planned: list[bytes] = []

    def counting(source: bytes, patch: Any, **kwargs: Any) -> Any:
        planned.append(source)
        return apply_patch(source, patch, **kwargs)

    monkeypatch.setattr(pipeline, "apply_patch", counting)
    return planned


def test_hosts_with_one_pre_image_share_one_plan(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    planned = _count_plans(monkeypatch)
    report = fleet.apply()
    assert set(fleet.outcomes(report).values()) == {"applied"}
    assert len(planned) == 1 and sha(planned[0]) == PRISTINE
    patched = {sha(host.file.read_bytes()) for host in fleet.hosts}
    assert len(patched) == 1 and PRISTINE not in patched
    for host in fleet.hosts:  # the swap (and the host's own compile check) stays per host
        assert host.requests.count("swap") == 1


def test_hosts_with_different_pre_images_each_get_their_own_plan(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    for index, host in enumerate(fleet.hosts[1:], start=1):
        host.file.write_bytes(host.file.read_bytes() + f"# host {index}\n".encode())
    pre_images = sorted(sha(host.file.read_bytes()) for host in fleet.hosts)
    planned = _count_plans(monkeypatch)
    report = fleet.apply()
    assert set(fleet.outcomes(report).values()) == {"applied"}
    assert sorted(sha(p) for p in planned) == pre_images  # one plan each, on its own file


def test_a_rollback_whose_smoke_fails_is_restored_not_serving_with_a_failed_step(
    fleet: Fleet,
) -> None:
    """The restored pre-image is what was broken: its smoke decode fails. Before, the step read
    `ok`, the host `restored` with no note, exit 0."""
    from opspatch.runs.commands.rollback import rollback_hosts

    fleet.hosts = fleet.hosts[:2]
    assert fleet.apply().exit_code == 0
    for fake in fleet.hosts:
        fake.smoke_ok = False
    report = rollback_hosts(
        ledger=fleet.ledger,
        hosts=[h.host() for h in fleet.hosts],
        factory=fleet.factory,
        playbook=Playbook(max_in_flight=1),
        patch=fleet.patch,
    )
    first, second = report.hosts
    assert first.outcome == "restored-not-serving", first
    assert first.reason == Reason.NOT_SERVING, first
    assert "the server does not serve the restored file" in (first.error or "")
    assert "apply eagle-init-guard --hosts h1" in (first.error or "")
    smoke = next(s for s in first.steps if s.step == "smoke")
    assert smoke.status == "failed" and "the server crashed" in smoke.detail
    assert sha(fleet.hosts[0].file.read_bytes()) == PRISTINE
    # the same restore elsewhere would take that server down too: the run halts
    assert second.outcome == "skipped" and second.reason == "not-started", second
    assert report.halted is not None and "not served on h1" in report.halted, report.halted
    assert sha(fleet.hosts[1].file.read_bytes()) != PRISTINE
    assert report.exit_code == 1
    recorded = fleet.ledger.get_run(report.run_id or "").host("h1")
    assert recorded.outcome == "restored-not-serving"
    assert recorded.reason == Reason.NOT_SERVING
    assert any(s.step == "smoke" and s.status == "failed" for s in recorded.steps)


def test_an_apply_rolled_back_onto_code_that_does_not_serve_says_so(fleet: Fleet) -> None:
    host = fleet.hosts[0]
    fleet.hosts = [host]
    host.smoke_ok = False
    report = fleet.apply()
    (outcome,) = report.hosts
    assert (outcome.outcome, outcome.reason) == ("rolled-back", "smoke-failed")
    assert fleet.ledger.get_run(report.run_id or "").host("h1").reason == "smoke-failed"
    after = next(s for s in outcome.steps if s.step == "smoke-after-restore")
    assert after.status == "failed"
    assert "the server does not serve the restored file" in (outcome.note or ""), outcome


@pytest.mark.process
def test_a_second_recover_leaves_a_host_it_already_reconciled_alone(fleet: Fleet) -> None:
    """Before, every `recover --hosts` said "finished run R's change" and restarted again."""
    import subprocess
    import sys

    host = fleet.hosts[0]
    dead = _left_by_a_dead_run(fleet, host)
    first = fleet.recover(host)
    (outcome,) = first.hosts
    assert outcome.outcome == "applied" and "finished run" in (outcome.note or ""), outcome
    assert "restart" in fleet.transports[host.name].ops
    # the server the first recover started, after the change was written
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (host.root / "pid").write_text(f"{server.pid}\n")
        again = fleet.recover(host)
        (outcome,) = again.hosts
        assert outcome.outcome == "applied", outcome
        assert "restart" not in fleet.transports[host.name].ops  # no restart, no smoke
        assert "smoke" not in fleet.transports[host.name].ops
        note = outcome.note or ""
        assert f"written by run {dead}, proven by run {first.run_id}" in note, note
        assert f"host {host.name} serves: left alone" in note and "finished run" not in note
        assert again.exit_code == 0
    finally:
        server.kill()
        server.wait()


def test_status_and_recover_say_the_same_about_a_change_nothing_interrupted(
    fleet: Fleet,
) -> None:
    """A finished apply, then `recover --hosts`: before, recover said "smoke-tested before the
    interruption" although nothing was interrupted, in other words than `status`."""
    from opspatch.runs.commands.status import fleet_status

    host = fleet.hosts[0]
    fleet.hosts = [host]
    applied = fleet.apply()
    assert applied.exit_code == 0
    (said,) = fleet_status([host.host()], [fleet.patch], fleet.factory, fleet.ledger)
    sentence = f"as written by run {applied.run_id}, proven by its smoke decode"
    assert said.detail.startswith(sentence), said
    (outcome,) = fleet.recover(host).hosts
    assert outcome.outcome == "applied"
    assert (outcome.note or "").startswith(sentence), outcome
    assert "interrupt" not in (outcome.note or "")


@pytest.mark.process
def test_a_smoke_that_passed_before_a_double_ctrl_c_is_proven_for_status_and_recover(
    fleet: Fleet,
) -> None:
    """The run recorded the smoke as passed and no outcome (a second Ctrl-C): status said "never
    proven" while recover said "smoke-tested before the interruption"."""
    from opspatch.runs.commands.status import fleet_status

    host = fleet.hosts[0]
    dead = _left_by_a_dead_run(fleet, host)
    fleet.ledger.record_step(dead, host.name, "smoke", "ok", 0.2, "1 prompt(s), 16 tokens")
    (said,) = fleet_status([host.host()], [fleet.patch], fleet.factory, fleet.ledger)
    sentence = f"written by run {dead} and proven by its smoke decode before it was interrupted"
    assert said.detail.startswith(sentence) and "never proven" not in said.detail, said
    (outcome,) = fleet.recover(host).hosts
    assert (outcome.note or "").startswith(sentence), outcome


def test_hosts_a_finished_run_left_needing_attention_are_what_a_bare_recover_reaches(
    fleet: Fleet,
) -> None:
    """The canary's connection lost mid-swap (the file written, the lock held) and the host gone:
    the run finishes with it `needs-attention` and nothing is interrupted. Before, a bare
    `recover` answered "no interrupted run in the ledger" and left it."""
    from opspatch.runs.commands.recover import hosts_left_needing_attention

    first = fleet.hosts[0]

    def vanish(op: str, args: dict[str, Any]) -> None:
        if op == "swap":
            agent_operation(op, args)
            first.gone = True
            raise TransportError("the connection broke", host=first.name, step="exec")
        return None

    first.fault = vanish
    report = fleet.apply(Playbook(canary=1, batch=BatchSize(count=10), max_failures=1))
    assert fleet.outcomes(report)["h1"] == "needs-attention"
    assert fleet.ledger.get_run(report.run_id or "").summary.status == "finished"
    assert (first.state / "lock.json").is_file()
    # a later run refused on it (its lock held) settles nothing
    first.gone, first.fault = False, None
    fleet.hosts = [first]
    assert fleet.outcomes(fleet.apply()) == {"h1": "failed"}
    left = hosts_left_needing_attention(fleet.ledger)
    assert list(left) == ["h1"], left
    (outcome,) = fleet.recover(first).hosts
    assert outcome.outcome == "applied", outcome
    assert not (first.state / "lock.json").exists()
    assert hosts_left_needing_attention(fleet.ledger) == {}


def test_status_of_a_partial_file_names_the_patch_to_roll_back(fleet: Fleet) -> None:
    """A file with some of a patch's edits (a hand edit stopped half-way): status says
    `partial` and names the rollback of that patch on that host."""
    from opspatch.core.edit import Applied, apply_patch
    from opspatch.runs.commands.status import fleet_status

    host = fleet.hosts[0]
    spec = fleet.patch.spec
    assert len(spec.edits) >= 2
    half = apply_patch(
        host.file.read_bytes(),
        spec.model_copy(update={"edits": spec.edits[:1], "postconditions": []}),
    )
    assert isinstance(half, Applied)
    host.file.write_bytes(half.new_source)
    (said,) = fleet_status([host.host()], [fleet.patch], fleet.factory, fleet.ledger)
    assert said.state == "partial", said
    assert f"`opspatch rollback {spec.id} --hosts {host.name}`" in said.detail, said


def test_a_patch_that_does_not_fit_a_host_names_its_file_line_and_field(
    fleet: Fleet, tmp_path: Path
) -> None:
    """With --hosts as with --file, an anchor that matches nothing names the patch file and the
    line of the field (before: only the field and the reason)."""
    text = (REPO / "patches" / "eagle-init-guard.toml").read_text()
    wrong = text.replace('scope = "EAGLEWorkerV2.__init__"', 'scope = "EAGLEWorkerV2.__inti__"')
    assert wrong != text
    path = tmp_path / "eagle-init-guard.toml"
    path.write_text(wrong)
    fleet.patch = load_patch(path)
    line = 1 + wrong[: wrong.index('scope = "EAGLEWorkerV2.__inti__"')].count("\n")
    report = fleet.apply()
    assert report.refused and report.exit_code == 2
    for host in report.hosts:
        assert host.reason == "not-applicable", host
        assert f"{path}:{line}" in (host.error or ""), host.error
        assert "__inti__" in (host.error or "")


def test_a_host_whose_settings_are_refused_says_what_to_set_and_is_not_called_a_misfit(
    fleet: Fleet,
) -> None:
    """A host whose inventory sets no `engine.python` is skipped with the error's hint (what to
    set), and the refusal does not say the patch does not fit (before: the message alone, then
    "the patch does not fit every selected host")."""
    host = fleet.hosts[0]
    fleet.hosts = [host]
    unset = host.host()
    unset = replace(unset, engine=replace(unset.engine, python=None))
    before = host.file.read_bytes()
    report = apply_to_hosts(
        fleet.patch,
        [unset],
        Playbook(canary=0, batch=BatchSize(count=10), max_failures=1),
        factory=fleet.factory,
        ledger=fleet.ledger,
    )
    assert report.refused and report.exit_code == 2
    (outcome,) = report.hosts
    assert outcome.outcome == "skipped" and outcome.reason == "not-applicable", outcome
    assert "sets no engine.python" in (outcome.error or ""), outcome.error
    assert "(set engine.python to the interpreter" in (outcome.error or ""), outcome.error
    assert f"{host.name} cannot take the patch" in (report.halted or ""), report.halted
    assert "does not fit every" not in (report.halted or "")
    assert host.file.read_bytes() == before


def _ledger_rows(path: Path) -> dict[str, int]:
    """Rows per table of the SQLite file itself (not through the Ledger class)."""
    import sqlite3

    with sqlite3.connect(path) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {t: conn.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in tables}


def test_a_dry_run_records_nothing_even_when_given_the_ledger(fleet: Fleet, tmp_path: Path) -> None:
    """A dry run records through the null recorder: handed the very ledger a real apply writes
    to, it leaves every table of the SQLite file as it was, and takes no lock on any host."""
    path = tmp_path / "ledger.sqlite3"
    before = _ledger_rows(path)
    assert before.get("events") == 0, before
    report = apply_to_hosts(
        fleet.patch,
        [h.host() for h in fleet.hosts],
        Playbook(),
        factory=fleet.factory,
        ledger=fleet.ledger,
        dry_run=True,
    )
    assert {str(h.outcome) for h in report.hosts} == {"would-apply"}
    assert report.run_id is None and report.to_json()["run_id"] is None
    assert [h.requests for h in fleet.hosts] == [["inspect"]] * 3  # no begin, no release
    assert _ledger_rows(path) == before
    assert fleet.ledger.list_runs() == []
    assert not any((h.state / "lock.json").exists() for h in fleet.hosts)
    # the same apply for real writes to that file: the check above can fail
    fleet.apply()
    assert _ledger_rows(path)["events"] > 0


def test_the_null_recorder_has_no_run_id_to_lock_with() -> None:
    """A run that records nothing must never take a host lock: asking for its id is a bug."""
    from opspatch.runs.fleet.recorder import NullRecorder

    with pytest.raises(RuntimeError, match="takes no host lock"):
        _ = NullRecorder().run_id
    assert NullRecorder().reported_run_id is None


def test_a_begin_reply_without_the_hosts_facts_refuses_the_run_naming_the_field(
    fleet: Fleet,
) -> None:
    """A reply read by the codec is checked at the boundary: a host whose agent answers `begin`
    without a field the controller reads is refused in the preflight (exit 2, nothing changed
    anywhere) with the field named, not lost as an internal KeyError."""
    broken = fleet.hosts[1]

    def drop_the_python_version(op: str, args: dict[str, Any]) -> dict[str, Any] | None:
        if op != "inspect":
            return None
        answer = broken.real(op, args)
        assert isinstance(answer, dict)
        answer["facts"] = {k: v for k, v in answer["facts"].items() if k != "python_version"}
        return answer

    broken.fault = drop_the_python_version
    report = fleet.apply()
    assert report.refused and report.exit_code == 2, report
    error = report.hosts[1].error or ""
    assert "HostInspection.facts.python_version: missing" in error, error
    assert all(
        h.file.read_bytes() == (STANDIN / "eagle_worker_v2.py").read_bytes() for h in fleet.hosts
    )
    assert not any((h.state / "lock.json").exists() for h in fleet.hosts)


def test_status_of_a_wiped_fix_on_a_release_the_patch_does_not_cover_is_not_applicable(
    fleet: Fleet,
) -> None:
    """A file back at its pre-image (a reinstall wiped the fix) on a release outside the patch's
    own versions: `not-applicable` (what sync reports as needs-port), never `not-applied` (what
    sync would try to apply, and the apply's preflight then refuses the whole run)."""
    from opspatch.runs.commands.status import fleet_status

    host = fleet.hosts[0]
    fleet.hosts = [host]
    assert fleet.apply().exit_code == 0
    host.file.write_bytes((STANDIN / "eagle_worker_v2.py").read_bytes())  # the reinstall
    (covered,) = fleet_status([host.host()], [fleet.patch], fleet.factory, fleet.ledger)
    assert covered.state == "not-applied", covered
    target = fleet.patch.spec.target.model_copy(update={"versions": "<0.5.23"})
    narrowed = fleet.patch.model_copy(
        update={"spec": fleet.patch.spec.model_copy(update={"target": target})}
    )
    (said,) = fleet_status([host.host()], [narrowed], fleet.factory, fleet.ledger)
    assert said.state == "not-applicable", said
    assert "0.5.23" in said.detail and "back at the pre-image of run" in said.detail, said


# -- sync on scripted hosts ----------------------------------------------------------------------


def test_a_sync_leaves_a_host_whose_engine_is_down_to_recover_and_applies_the_rest(
    fleet: Fleet,
) -> None:
    """h2 carries the fix, proven, but its engine died since: `sync --check` is not at goal
    there (exit 1, naming `opspatch recover --hosts h2`), sync writes nothing there and records
    it skipped with that reason while h1 and h3 get the patch; the recover it names clears it."""
    from opspatch.runs.commands.sync import plan_fleet, sync_fleet

    everyone, down = fleet.hosts, fleet.hosts[1]
    fleet.hosts = [down]
    assert fleet.apply().exit_code == 0
    fleet.hosts = everyone
    down.serving = False
    written = sha(down.file.read_bytes())
    desired = desired_everywhere(fleet, fleet.patch)
    hosts = list(desired.hosts.values())

    check = plan_fleet(desired, hosts, [], fleet.factory, fleet.ledger)
    assert check.exit_code == 1
    rows = {r.host: r for r in check.differing}
    assert {h: str(r.action) for h, r in rows.items()} == {
        "h1": "apply",
        "h2": "recover",
        "h3": "apply",
    }
    assert rows["h2"].command == "opspatch recover --hosts h2"
    assert "its server is not running: `opspatch recover --hosts h2`" in rows["h2"].detail

    down.requests.clear()
    playbook = Playbook(canary=0, batch=BatchSize(count=10), max_failures=1)
    report = sync_fleet(
        desired, hosts, [], playbook, factory=fleet.factory, ledger=fleet.ledger, before=check
    )
    (run,) = report.runs
    assert fleet.outcomes(run) == {"h1": "applied", "h3": "applied"}
    (left,) = report.left_alone
    (skipped,) = left.hosts
    assert (skipped.host, str(skipped.outcome)) == ("h2", "skipped")
    assert skipped.reason == "not-serving"
    assert fleet.ledger.get_run(str(left.run_id)).host("h2").reason == "not-serving"
    assert down.requests == ["inspect"]  # the plan after the sync; nothing begun, swapped
    assert sha(down.file.read_bytes()) == written
    assert not down.serving  # nor restarted
    assert [str(r.action) for r in report.after.differing] == ["recover"]
    assert report.exit_code == 1

    recovered = fleet.recover(down)
    assert fleet.outcomes(recovered) == {"h2": "applied"}, recovered
    assert plan_fleet(desired, hosts, [], fleet.factory, fleet.ledger).exit_code == 0


def test_a_sync_stopped_by_a_failed_run_records_the_next_patchs_hosts_as_not_applied(
    fleet: Fleet, tmp_path: Path
) -> None:
    """The first desired patch's canary fails its smoke (rolled back): the sync stops, and the
    second patch's hosts, which needed `apply`, are recorded `skipped` naming the run that
    stopped it, rather than left out of the ledger; nothing of the second patch is written."""
    from opspatch.core.edit import detect
    from opspatch.runs.commands.sync import sync_fleet

    mark = mark_patch(tmp_path)
    fleet.hosts[0].smoke_ok = False
    desired = desired_everywhere(fleet, fleet.patch, mark)
    hosts = list(desired.hosts.values())
    playbook = Playbook(canary=1, batch=BatchSize(count=10), max_failures=1)

    report = sync_fleet(desired, hosts, [], playbook, factory=fleet.factory, ledger=fleet.ledger)

    (first,) = report.runs
    assert first.patch == "eagle-init-guard" and first.exit_code != 0
    assert fleet.outcomes(first)["h1"] == "rolled-back", first
    (left,) = report.left_alone
    assert left.patch == "module-mark"
    why = f"not applied: sync stopped after run {first.run_id} (eagle-init-guard) did not reach"
    assert {h.host: str(h.outcome) for h in left.hosts} == dict.fromkeys(
        ("h1", "h2", "h3"), "skipped"
    )
    for host in left.hosts:
        assert host.reason == "not-started", host
        assert (host.error or "").startswith(why), host  # the wording, checked here once
        assert f"`opspatch sync --hosts {host.host}`" in (host.error or "")
    recorded = fleet.ledger.get_run(str(left.run_id))
    assert recorded.summary.command == "sync" and recorded.summary.patch_id == "module-mark"
    assert {recorded.host(n).reason for n in ("h1", "h2", "h3")} == {"not-started"}
    for fake in fleet.hosts:
        assert detect(fake.file.read_bytes(), mark.spec).state == "not-applied", fake.name
    assert not any(v.patch_id == "module-mark" for v in fleet.ledger.file_history("h2"))
    assert report.exit_code == first.exit_code


def test_a_run_over_no_host_is_refused_and_records_nothing(fleet: Fleet) -> None:
    """The runs' own guard under the selection's (which names the item): before, an apply over
    zero hosts returned `ok`, exit 0, and the ledger kept a run of no host."""
    from opspatch.errors import InputError

    fleet.hosts = []
    with pytest.raises(InputError, match="apply selects no host: nothing was done") as refused:
        fleet.apply()
    assert refused.value.exit_code == 2
    assert fleet.ledger.list_runs() == []


def _adopted_applied(fleet: Fleet, host: FakeHost) -> str:
    """What `adopt` recorded before it told a host whose server is down apart: a hand edit (the
    patch's post-image, written outside opspatch) as a finished `adopt` run whose host outcome
    is `applied`, with its `read` and `adopt` steps and no smoke decode."""
    from opspatch.core.edit import Applied, apply_patch

    planned = apply_patch(host.file.read_bytes(), fleet.patch.spec)
    assert isinstance(planned, Applied)
    host.file.write_bytes(planned.new_source)  # the hand edit
    run_id = fleet.ledger.begin_run(
        command="adopt",
        patch_id=fleet.patch.spec.id,  # as if the hand edit had been adopted under this id
        patch_sha256=fleet.patch.sha256,
        operator="ops@controller",
        command_line="opspatch adopt --hosts h1 -m x --id eagle-init-guard --yes",
        hosts=[host.name],
    )
    fleet.ledger.record_step(run_id, host.name, "read", "ok", 0.0, "read the file")
    fleet.ledger.record_file_version(
        run_id,
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
    fleet.ledger.record_step(run_id, host.name, "adopt", "ok", 0.0, "recorded as a patch")
    fleet.ledger.record_host_outcome(
        run_id,
        host.name,
        "applied",
        file=FileChange(str(host.file), planned.sha256_before, planned.sha256_after),
    )
    fleet.ledger.finish_run(run_id, "ok")
    return run_id


def test_an_adoption_said_applied_is_no_proof_for_status_or_recover(fleet: Fleet) -> None:
    """The adopt ran no smoke decode, on a host whose server was down. Before, `status` and
    `recover` called it "as written by run R, proven by its smoke decode", and recover only
    started the server again, proving nothing. Now nothing is claimed: recover restarts, runs
    the smoke decode, and only then says proven."""
    from opspatch.runs.commands.status import fleet_status

    host = fleet.hosts[0]
    fleet.hosts = [host]
    host.serving = False
    adopted = _adopted_applied(fleet, host)
    (said,) = fleet_status([host.host()], [fleet.patch], fleet.factory, fleet.ledger)
    assert "proven by" not in said.detail, said
    assert said.detail.startswith(
        f"written by run {adopted} but never proven (run {adopted} recorded it applied, but no "
        "smoke decode ran on it)"
    ), said
    assert f"`opspatch recover --hosts {host.name}`" in said.detail
    (outcome,) = fleet.recover(host).hosts
    assert outcome.outcome == "applied", outcome
    assert "proven by its smoke decode" not in (outcome.note or ""), outcome
    assert (outcome.note or "").startswith(f"finished run {adopted}'s change"), outcome
    assert "smoke" in fleet.transports[host.name].ops  # the proof it now has, it ran
    smoke = next(s for s in outcome.steps if s.step == "smoke")
    assert smoke.status == "ok"


def test_a_recover_that_left_a_proven_change_alone_is_not_named_as_its_proof(
    fleet: Fleet,
) -> None:
    """A recover that found the change proven and its server up says `applied` without a smoke.
    Before, `status` then credited the proof to that recover ("proven by run R's smoke decode",
    a decode it never ran); the proof stays the apply's."""
    from opspatch.runs.commands.status import fleet_status

    host = fleet.hosts[0]
    fleet.hosts = [host]
    applied = fleet.apply()
    assert applied.exit_code == 0
    left_alone = fleet.recover(host)
    assert "smoke" not in fleet.transports[host.name].ops
    (said,) = fleet_status([host.host()], [fleet.patch], fleet.factory, fleet.ledger)
    assert said.detail.startswith(
        f"as written by run {applied.run_id}, proven by its smoke decode"
    ), said
    assert str(left_alone.run_id) not in said.detail


def test_a_rollback_told_not_to_restart_is_staged_back_on_a_host_without_an_engine_restart(
    fleet: Fleet,
) -> None:
    """An inventory that sets no engine restart: apply stages (`--restart never`), and before,
    rollback always restarted, so it restored every file byte for byte and then ended
    `needs-attention`, exit 3 (or, told not to restart, `restored` as if proven). Told not to
    restart, the host is `staged-back`, exit 0, its file the pre-image, no restart sent."""
    from dataclasses import replace

    from opspatch.core.vocabulary import RestartPolicy
    from opspatch.runs.commands.rollback import rollback_hosts

    fake = fleet.hosts[0]
    fleet.hosts = [fake]
    plain = fake.host()
    host = replace(plain, engine=replace(plain.engine, restart=None))
    staging = Playbook(restart=RestartPolicy.NEVER)
    applied = apply_to_hosts(
        fleet.patch, [host], staging, factory=fleet.factory, ledger=fleet.ledger
    )
    assert [h.outcome for h in applied.hosts] == ["staged"], applied
    assert sha(fake.file.read_bytes()) != PRISTINE
    fake.requests.clear()

    report = rollback_hosts(
        ledger=fleet.ledger,
        hosts=[host],
        factory=fleet.factory,
        playbook=staging,
        patch=fleet.patch,
        restart_engine=False,
    )
    (outcome,) = report.hosts
    assert outcome.outcome == "staged-back", outcome
    assert "the server was not restarted" in (outcome.note or ""), outcome
    assert report.exit_code == 0 and report.outcome == "ok", report
    assert sha(fake.file.read_bytes()) == PRISTINE
    assert not {"restart", "wait_ready", "smoke"} & set(fake.requests), fake.requests
    recorded = fleet.ledger.get_run(report.run_id or "")
    assert recorded.host(fake.name).outcome == "staged-back"
    assert recorded.summary.outcome == "ok"


def _rolled_back(fleet: Fleet, playbook: Playbook) -> RunReport:
    """Every host applied, then rolled back under `playbook` with every restored file's smoke
    decode failing (the pre-image is what was broken)."""
    from opspatch.runs.commands.rollback import rollback_hosts

    assert fleet.apply().exit_code == 0
    for fake in fleet.hosts:
        fake.smoke_ok = False
    return rollback_hosts(
        ledger=fleet.ledger,
        hosts=[h.host() for h in fleet.hosts],
        factory=fleet.factory,
        playbook=playbook,
        patch=fleet.patch,
    )


@pytest.mark.parametrize(
    ("playbook", "expected", "reason"),
    [
        # the default: one canary, halt at the first failure
        (
            Playbook(),
            ["restored-not-serving", "skipped", "skipped"],
            "not served on h1 (its smoke decode failed): canary h1 failed",
        ),
        # no canary, one batch, room for every failure: every host is rolled back
        (
            Playbook(canary=0, batch=BatchSize(percent=Decimal(100)), max_failures=99),
            ["restored-not-serving"] * 3,
            "not served on h1, h2, h3 (its smoke decode failed): 3 hosts failed",
        ),
        # a canary is a canary whatever max_failures says
        (
            Playbook(canary=1, batch=BatchSize(percent=Decimal(100)), max_failures=99),
            ["restored-not-serving", "skipped", "skipped"],
            "canary h1 failed",
        ),
        # batches of one, halted at max_failures = 2
        (
            Playbook(canary=0, batch=BatchSize(count=1), max_failures=2),
            ["restored-not-serving", "restored-not-serving", "skipped"],
            "2 hosts failed (h1, h2); the playbook halts at max_failures = 2",
        ),
    ],
)
def test_a_rollback_honours_the_playbooks_canary_batches_and_max_failures(
    fleet: Fleet, playbook: Playbook, expected: list[str], reason: str
) -> None:
    """Before, a rollback went one host, then the rest, and halted at the first
    `restored-not-serving` whatever the playbook said (canary = 0, batch = "all",
    max_failures = 99 still left h2 and h3 "not started")."""
    report = _rolled_back(fleet, playbook)
    assert [str(h.outcome) for h in report.hosts] == expected, report.hosts
    restored = [h for h in fleet.hosts if sha(h.file.read_bytes()) == PRISTINE]
    assert len(restored) == expected.count("restored-not-serving")
    assert report.exit_code == 1
    if "skipped" in expected:
        assert report.halted is not None and reason in report.halted, report.halted
        skipped = next(h for h in report.hosts if h.outcome == "skipped")
        assert skipped.reason == "not-started", skipped
    else:
        assert report.halted is None


def test_a_rollback_reports_a_host_refused_in_its_preflight_whatever_halts_the_run(
    fleet: Fleet,
) -> None:
    """h3's file was changed by hand since the apply: the rollback's preflight reads it and
    refuses it ("not overwriting it"), and says so, although the canary h1 halts the run before
    h3's turn. Before, h3 read "not started: the run halted" and the hand edit went unsaid."""
    assert fleet.apply().exit_code == 0
    edited = fleet.hosts[2]
    edited.file.write_bytes(edited.file.read_bytes() + b"# changed by hand\n")
    hand_edit = sha(edited.file.read_bytes())
    fleet.hosts[0].smoke_ok = False
    edited.requests.clear()
    from opspatch.runs.commands.rollback import rollback_hosts

    report = rollback_hosts(
        ledger=fleet.ledger,
        hosts=[h.host() for h in fleet.hosts],
        factory=fleet.factory,
        playbook=Playbook(),
        patch=fleet.patch,
    )
    h1, h2, h3 = report.hosts
    assert h1.outcome == "restored-not-serving", h1
    assert h2.outcome == "skipped" and h2.reason == "not-started", h2
    assert h3.outcome == "skipped", h3
    assert h3.reason == "changed-since", h3
    assert sha(edited.file.read_bytes()) == hand_edit
    assert edited.requests == ["inspect"]  # decided read-only: never locked, never started
    recorded = fleet.ledger.get_run(report.run_id or "").host("h3")
    assert recorded.outcome == "skipped" and recorded.reason == "changed-since"


def test_a_long_readiness_wait_says_every_part_what_it_awaits_and_until_when(
    fleet: Fleet,
) -> None:
    """A server that does not answer /health (a wrong engine URL) was waited for in one silent
    exec of up to `timeouts.ready` (20 minutes). Now the wait is parts of 30 s, and after each
    one that ran out the operator reads what is awaited, the last answer, the deadline and what
    a Ctrl-C does; a server ready in the third part is applied as before."""
    from opspatch.hosts.engine import READY_SLICE_SECONDS

    host = fleet.hosts[0]
    fleet.hosts = [host]
    parts: list[dict[str, Any]] = []

    def slow_to_answer(op: str, args: dict[str, Any]) -> dict[str, Any] | None:
        if op != "wait_ready":
            return None
        parts.append(args)
        if len(parts) < 3:  # what the agent answers when its part ran out
            return {
                "waiting": {"seconds": 30.0, "polls": 30, "last": "/health: connection refused"}
            }
        return {"seconds": 2.5, "polls": 3}

    host.fault = slow_to_answer
    notices = Notices()
    report = apply_to_hosts(
        fleet.patch,
        [host.host()],
        Playbook(canary=0),
        factory=fleet.factory,
        ledger=fleet.ledger,
        progress=notices,
    )
    (outcome,) = report.hosts
    assert outcome.outcome == "applied", outcome
    ready = next(s for s in outcome.steps if s.step == "ready")
    assert ready.detail == "/health 200 after 62.5s (63 polls)"
    assert [(p["slice"], p["timeout"], p["total"]) for p in parts] == [
        (True, READY_SLICE_SECONDS, 1200.0)
    ] * 3
    waiting = [line for line in notices.lines if "still waiting" in line]
    assert len(waiting) == 2, notices.lines
    url = host.host().engine.url
    for line in waiting:
        assert line.startswith(f"h1: ready: still waiting for {url}/health to answer 200 ")
        assert "(/health: connection refused)" in line
        assert "of 1200s, gives up at " in line and " UTC" in line
        assert "Ctrl-C starts no more hosts and still waits for this one until then" in line
        assert f"opspatch recover --run {report.run_id}" in line


def test_the_last_part_of_a_readiness_wait_ends_at_the_deadline_and_fails_there(
    fleet: Fleet,
) -> None:
    """A deadline within one part is one exec, not a part that would say "waiting": the agent
    fails it (not-ready, naming the whole wait), and the host is rolled back."""
    host = fleet.hosts[0]
    fleet.hosts = [host]
    parts: list[dict[str, Any]] = []

    def never_ready(op: str, args: dict[str, Any]) -> Refusal | None:
        if op != "wait_ready" or parts:  # the restored server comes up
            return None
        parts.append(args)
        return Refusal("not-ready", f"not ready after {args['total']:.0f}s (/health: refused)")

    host.fault = never_ready
    playbook = Playbook(canary=0)
    playbook = Playbook(canary=0, timeouts=replace(playbook.timeouts, ready=20.0))
    (outcome,) = fleet.apply(playbook).hosts
    assert (outcome.outcome, outcome.reason) == ("rolled-back", "step-failed"), outcome
    assert "not ready after 20s" in (outcome.error or "")
    (first,) = parts
    assert first["slice"] is False and first["total"] == 20.0 and 0 < first["timeout"] <= 20.0


def test_a_first_ctrl_c_during_a_readiness_wait_says_what_is_still_waited_for_until_when(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first Ctrl-C lets the hosts in flight finish: a host in its readiness wait may hold
    the run for up to 20 minutes more, so the notice names what it waits for and until when.
    Before, it said only "waiting for h1 to finish"."""
    from opspatch.runs.fleet import fleetrun
    from opspatch.runs.fleet.executor import Cancellation

    cancellation = Cancellation()
    monkeypatch.setattr(fleetrun, "Cancellation", lambda: cancellation)
    host = fleet.hosts[0]
    fleet.hosts = [host]
    notices = Notices()

    def ctrl_c_while_waiting(op: str, args: dict[str, Any]) -> None:
        if op == "wait_ready":
            cancellation.request()  # the operator's first Ctrl-C, as its handler takes it
            deadline = time.monotonic() + 60  # bounds a broken test only
            while not any("Ctrl-C" in line for line in notices.lines):
                assert time.monotonic() < deadline, "no announcement"
                time.sleep(0.05)
        return None

    host.fault = ctrl_c_while_waiting
    report = apply_to_hosts(
        fleet.patch,
        [host.host()],
        Playbook(canary=0),
        factory=fleet.factory,
        ledger=fleet.ledger,
        progress=notices,
    )
    (said,) = [line for line in notices.lines if line.startswith("Ctrl-C")]
    url = host.host().engine.url
    assert f"waiting for h1 (ready: {url}/health, until " in said, said
    assert " UTC) to finish" in said
    assert [str(h.outcome) for h in report.hosts] == ["applied"]  # in flight: finished


def test_a_rehearsals_ctrl_c_lines_say_it_is_torn_down_not_to_recover(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a rehearsal a second Ctrl-C tears the rehearsal down (its servers stopped, its folder
    and ledger removed): its apply's readiness lines and first-Ctrl-C notice say so. Before,
    they advised `opspatch recover --run R`, for a run no ledger of the operator's holds."""
    from opspatch.runs.fleet import fleetrun
    from opspatch.runs.fleet.executor import Cancellation
    from opspatch.sandbox.rehearse import AFTER_STOP, RehearsalApplyProgress

    cancellation = Cancellation()
    monkeypatch.setattr(fleetrun, "Cancellation", lambda: cancellation)
    host = fleet.hosts[0]
    fleet.hosts = [host]
    lines: list[str] = []
    parts: list[str] = []

    def ctrl_c_then_slow_to_answer(op: str, args: dict[str, Any]) -> dict[str, Any] | None:
        if op != "wait_ready":
            return None
        parts.append(op)
        if len(parts) == 1:
            cancellation.request()  # the operator's first Ctrl-C, as its handler takes it
            deadline = time.monotonic() + 60  # bounds a broken test only
            while not any(line.startswith("Ctrl-C") for line in lines):
                assert time.monotonic() < deadline, "no announcement"
                time.sleep(0.05)
        if len(parts) < 3:
            return {"waiting": {"seconds": 30.0, "polls": 30, "last": "/health: refused"}}
        return {"seconds": 2.5, "polls": 3}

    host.fault = ctrl_c_then_slow_to_answer
    report = apply_to_hosts(
        fleet.patch,
        [host.host()],
        Playbook(canary=0),
        factory=fleet.factory,
        ledger=fleet.ledger,
        progress=RehearsalApplyProgress(lines.append),
    )
    assert [str(h.outcome) for h in report.hosts] == ["applied"]
    waiting = [line for line in lines if "still waiting" in line]
    (ctrl_c,) = [line for line in lines if line.startswith("Ctrl-C")]
    assert len(waiting) == 2, lines
    for line in [*waiting, ctrl_c]:
        assert "recover" not in line, line
    for line in waiting:
        assert line.endswith(f"Ctrl-C twice stops waiting, then {AFTER_STOP}"), line
    assert ctrl_c.endswith(f"Ctrl-C again stops waiting, then {AFTER_STOP}"), ctrl_c


def test_a_recorded_run_gives_each_hosts_lease_back_as_a_step_of_the_open_run(
    fleet: Fleet,
) -> None:
    """The postmortem shows each host's lease taken and given back, for an apply and for a
    restoring command alike: a run finished before its fleet gave the leases back removed them
    unrecorded (run_recorded finished inside the fleet; the clean-clone CI found it)."""

    def leases(run_id: str) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for record in fleet.ledger.get_run(run_id).hosts:
            found.setdefault(record.host, []).extend(
                s.detail.split(" on ")[0] for s in record.steps if s.step == "lease"
            )
        return found

    applied = fleet.apply()
    assert applied.exit_code == 0, applied
    assert applied.run_id is not None
    names = [h.name for h in fleet.hosts]
    both = ["took the lease", "gave the lease"]
    assert leases(applied.run_id) == dict.fromkeys(names, both)
    back = rollback_hosts(
        ledger=fleet.ledger,
        hosts=[h.host() for h in fleet.hosts],
        factory=fleet.factory,
        playbook=Playbook(),
        patch=fleet.patch,
    )
    assert back.run_id is not None
    assert leases(back.run_id) == dict.fromkeys(names, both), back
