"""`apply --live`, fast: the scripted hosts of tests/scriptedkit.py (the real agent on real
files, a scripted engine) with a scripted live engine behind the `live` operation: a main
process and a detokenizer that never import the module, and two scheduler ranks that take the
fix at one boundary (the entry rank answering for both, as the plugin does).

Each test names what the live path must do: take and prove without a restart, revert every
process and restore the file when one rank refuses or the smoke fails, and refuse before any
change (exit 2) where live fixes are off, the engine does not listen, or the change's live form
is refused (never restarted instead: the operator asked for no restart).
"""

from __future__ import annotations

import hashlib
import threading
from typing import Any

import pytest

from opspatch.core.live import LiveForm, NotLive
from opspatch.core.policy import BatchSize, Playbook
from opspatch.core.spec import PatchSpec
from opspatch.core.vocabulary import NotLiveReason
from opspatch.errors import LiveRefused
from opspatch.runs.commands.apply import apply_to_hosts
from tests.livekit import LiveEngine, apply_live, former, live_host, steps
from tests.scriptedkit import PRISTINE, Fleet, fleet, sha

pytestmark = pytest.mark.scripted

__all__ = ["fleet"]  # the fixture, used by name

THRESHOLD = "EAGLEWorkerV2.spec_disable_batch_threshold"
INIT = "EAGLEWorkerV2.__init__"


def refusing_former(part: PatchSpec, pre: bytes, post: bytes) -> LiveForm | NotLive:
    return NotLive(
        NotLiveReason.FREE_VARIABLES, "EAGLEWorkerV2.__init__: a new free variable (a closure)"
    )


def test_a_live_apply_takes_the_fix_in_every_rank_and_proves_it_without_a_restart(
    fleet: Fleet,
) -> None:
    fleet.hosts = fleet.hosts[:1]
    engine = LiveEngine()
    report = apply_live(fleet, engine)
    (outcome,) = report.hosts
    assert outcome.outcome == "applied", outcome
    assert report.exit_code == 0
    assert "restart" not in steps(report) and "drain" not in steps(report)
    assert steps(report)[-2:] == ["live", "smoke"]
    assert "no restart: every process of every node holds the fix" in (outcome.note or "")
    assert engine.held == {
        0: {"eagle-init-guard": [THRESHOLD, INIT]},
        1: {"eagle-init-guard": [THRESHOLD, INIT]},
    }
    live_step = [s for s in outcome.steps if s.step == "live"][-1]
    assert "scheduler-tp0 (pid 200), scheduler-tp1 (pid 201)" in live_step.detail
    assert "module not loaded in main (pid 100), detokenizer (pid 101)" in live_step.detail
    assert sha(fleet.hosts[0].file.read_bytes()) != PRISTINE  # the next restart keeps the fix


def test_a_rank_that_refuses_the_take_reverts_every_rank_and_restores_the_file(
    fleet: Fleet,
) -> None:
    fleet.hosts = fleet.hosts[:1]
    engine = LiveEngine(refusing_rank=1)
    engine.held[0] = {}
    report = apply_live(fleet, engine)
    (outcome,) = report.hosts
    assert outcome.outcome == "rolled-back", outcome
    assert outcome.reason == "step-failed", outcome
    assert engine.asked[-1] == "revert"
    assert engine.held == {0: {}, 1: {}}
    assert sha(fleet.hosts[0].file.read_bytes()) == PRISTINE
    assert "restart-after-restore" not in steps(report)  # every process reverted: no restart
    assert "live-revert" in steps(report) and "restore" in steps(report)
    assert report.exit_code == 1


def test_a_smoke_that_fails_after_the_take_reverts_and_restores(fleet: Fleet) -> None:
    fleet.hosts = fleet.hosts[:1]
    fleet.hosts[0].smoke_ok = False
    engine = LiveEngine()
    report = apply_live(fleet, engine)
    (outcome,) = report.hosts
    assert outcome.outcome == "rolled-back", outcome
    assert engine.held == {0: {}, 1: {}}
    assert sha(fleet.hosts[0].file.read_bytes()) == PRISTINE


def test_a_change_whose_live_form_is_refused_refuses_the_run_before_any_change(
    fleet: Fleet,
) -> None:
    engine = LiveEngine()
    report = apply_live(fleet, engine, refusing_former)
    assert report.refused and report.exit_code == 2
    names = [h.name for h in fleet.hosts]
    assert {o.host: o.reason for o in report.hosts} == dict.fromkeys(names, "not-taken-live")
    for outcome in report.hosts:
        error = outcome.error or ""
        assert outcome.outcome == "skipped", outcome
        said = (
            f"{outcome.host}: sglang.srt.speculative.eagle_worker_v2 cannot be taken live: "
            "free-variables: EAGLEWorkerV2.__init__: a new free variable (a closure)"
        )
        assert said in error, error
        assert f"apply eagle-init-guard --hosts {outcome.host}" in error, error
        assert [(str(s.step), str(s.status)) for s in outcome.steps][-1] == ("live", "failed")
    assert engine.asked == []  # decided from the images alone: the engine is not even asked
    assert all(sha(h.file.read_bytes()) == PRISTINE for h in fleet.hosts)
    recorded = fleet.ledger.get_run(report.run_id or "")
    assert recorded.summary.outcome == "refused", recorded.summary
    assert {h.host: h.outcome for h in recorded.hosts} == dict.fromkeys(names, "skipped")
    assert {h.host: h.reason for h in recorded.hosts} == dict.fromkeys(names, "not-taken-live")


def test_one_host_whose_change_has_no_live_form_refuses_the_whole_fleet(fleet: Fleet) -> None:
    """The live form is found per host (from its own pre-image): one host that cannot take the
    change live refuses every host, none is swapped, and the others' engines are only asked
    whether they listen."""
    calls: list[None] = []
    lock = threading.Lock()

    def one_refused(part: PatchSpec, pre: bytes, post: bytes) -> LiveForm | NotLive:
        with lock:
            calls.append(None)
            first = len(calls) == 1
        return refusing_former(part, pre, post) if first else former(part, pre, post)

    engine = LiveEngine()
    report = apply_live(fleet, engine, one_refused)
    assert report.exit_code == 2
    (refused,) = [o for o in report.hosts if o.reason == "not-taken-live"]
    assert {o.reason for o in report.hosts if o is not refused} == {"not-started"}
    assert set(engine.asked) == {"check"}
    assert all(sha(h.file.read_bytes()) == PRISTINE for h in fleet.hosts)


FRAME = {"name": INIT, "module": "m", "thread": "MainThread", "across": "two scheduling boundaries"}


@pytest.mark.parametrize(
    ("engine", "reason", "said"),
    [
        (LiveEngine(loaded=False), "not-imported", "no process of the engine has imported"),
        (
            LiveEngine(held={0: {"other-fix": [INIT]}, 1: {"other-fix": [INIT]}}),
            "already-held",
            f"{INIT} is held by live fix other-fix",
        ),
        (
            LiveEngine(found={"captured": [{"name": THRESHOLD, "module": "m", "line": 7,
                                            "where": "the defaults of f"}]}),
            "captured-at-import",
            f"{THRESHOLD} is read while m is imported (line 7, the defaults of f)",
        ),
        (
            LiveEngine(found={"objects": [{"name": INIT, "class": "EAGLEWorkerV2", "count": 1}]}),
            "built-objects",
            "1 EAGLEWorkerV2 object(s) already are",
        ),
        (
            LiveEngine(found={"frames": [FRAME]}),
            "never-returns",
            "across two scheduling boundaries: that frame keeps the old code",
        ),
    ],
    ids=["never-imported", "held-by-another-fix", "read-at-import", "built", "never-returns"],
)  # fmt: skip
def test_a_take_the_engine_says_would_not_be_in_effect_is_refused_before_any_swap(
    fleet: Fleet, engine: LiveEngine, reason: str, said: str
) -> None:
    """The preflight's `check`: each process's answer judged; a take that would not be in
    effect refuses the run (exit 2), nothing swapped, nothing taken, the reason word, the
    sentence and the processes named. Before, each was swapped and then taken and reported
    applied, or refused at the take and rolled back (exit 1)."""
    fleet.hosts = fleet.hosts[:1]
    report = apply_live(fleet, engine)
    (outcome,) = report.hosts
    assert report.exit_code == 2, outcome
    assert outcome.outcome == "skipped"
    error = outcome.error or ""
    assert f"cannot be taken live: {reason}: " in error and said in error, error
    assert "apply without --live to apply it with a restart" in error
    if reason != "not-imported":
        assert "(in scheduler-tp0 (pid 200), scheduler-tp1 (pid 201))" in error, error
    assert engine.asked == ["check"]
    assert sha(fleet.hosts[0].file.read_bytes()) == PRISTINE
    assert not {"backup", "swap"} & set(steps(report))


def test_a_dry_run_says_the_refusal_too(fleet: Fleet) -> None:
    engine = LiveEngine()
    for fake in fleet.hosts:
        fake.fault = lambda op, args: engine.answer(args) if op == "live" else None
    report = apply_to_hosts(
        fleet.patch,
        [live_host(h) for h in fleet.hosts],
        Playbook(canary=0, batch=BatchSize(count=10), max_failures=1),
        factory=fleet.factory,
        ledger=None,
        dry_run=True,
        live=refusing_former,
    )
    assert report.refused and report.exit_code == 2
    assert {o.reason for o in report.hosts} == {"not-taken-live"}


def test_hosts_without_live_true_are_refused_before_anything(fleet: Fleet) -> None:
    engine = LiveEngine()
    with pytest.raises(LiveRefused) as caught:
        apply_live(fleet, engine, live=False)
    assert caught.value.exit_code == 2
    assert "live = true" in caught.value.message
    assert engine.asked == []
    assert all(sha(h.file.read_bytes()) == PRISTINE for h in fleet.hosts)
    assert fleet.ledger.list_runs() == []


def test_an_engine_that_does_not_listen_refuses_the_run_before_any_change(fleet: Fleet) -> None:
    engine = LiveEngine(listening=False)
    report = apply_live(fleet, engine)
    assert report.exit_code == 2
    assert {o.reason for o in report.hosts} == {"not-listening"}
    assert all(sha(h.file.read_bytes()) == PRISTINE for h in fleet.hosts)
    assert "take" not in engine.asked
    assert all("nobody listens" in (o.error or "") for o in report.hosts)


def test_the_plugin_is_asked_for_the_post_image_the_run_swapped_in(fleet: Fleet) -> None:
    fleet.hosts = fleet.hosts[:1]
    seen: list[dict[str, Any]] = []
    engine = LiveEngine()
    original = engine.answer

    def recording(args: dict[str, Any]) -> dict[str, Any]:
        seen.append(args["fix"])
        return original(args)

    engine.answer = recording  # type: ignore[method-assign]
    apply_live(fleet, engine)
    take = next(fix for fix in seen if fix["op"] == "take")
    on_disk = fleet.hosts[0].file.read_bytes()
    assert take["sha256"] == hashlib.sha256(on_disk).hexdigest()
    assert take["path"] == str(fleet.hosts[0].file)
    assert take["module"] == "sglang.srt.speculative.eagle_worker_v2"
    assert take["definitions"] == [
        {"name": THRESHOLD, "kind": "class-attribute"},
        {"name": INIT, "kind": "method"},
    ]


REFUSED_BY_SOCKETS = {
    "server_pid": 4242,
    "folder": "/tmp/x/4242",
    "missing": None,
    "answers": [
        {
            "socket": name,
            "reply": {
                "ok": False,
                "refused": {
                    "code": "peer-not-allowed",
                    "message": "uid 65534 may not use this socket",
                },
            },
            "error": None,
        }
        for name in ("main.sock", "detokenizer.sock", "scheduler-tp0.sock")
    ],
}
KEPT_OUT_BY_ITS_FOLDER = {
    "server_pid": 4242,
    "folder": None,
    "missing": "the engine (pid 4242) runs as uid 0 and this agent as uid 65534: its live "
    "sockets admit only root and the engine's user, so what it holds could not be asked",
    "answers": [],
    "unread": True,
}


@pytest.mark.parametrize(
    "reply", [REFUSED_BY_SOCKETS, KEPT_OUT_BY_ITS_FOLDER], ids=["sockets", "folder"]
)
def test_an_agent_whose_uid_the_engine_refuses_refuses_the_run_before_any_change(
    fleet: Fleet, reply: dict[str, Any]
) -> None:
    """The replies the agent gives when run as a user that is neither root nor the engine's
    (tests/test_live_cli_engine.py proves them on a real engine): its sockets' folder keeps the
    agent out, or (opened by mistake) each socket refuses the peer."""
    fleet.hosts = fleet.hosts[:1]
    fleet.hosts[0].fault = lambda op, args: reply if op == "live" else None
    report = apply_to_hosts(
        fleet.patch,
        [live_host(fleet.hosts[0])],
        Playbook(canary=0, batch=BatchSize(count=10), max_failures=1),
        factory=fleet.factory,
        ledger=fleet.ledger,
        live=former,
    )
    assert report.exit_code == 2
    (outcome,) = report.hosts
    assert outcome.reason == "peer-not-allowed", outcome  # it listens: for root and its user
    assert "uid 65534" in (outcome.error or "")  # the engine's or the agent's words
    assert sha(fleet.hosts[0].file.read_bytes()) == PRISTINE
