"""`status` on live hosts, fast: the scripted hosts and live engine of
tests/livekit.py. A host with `live = true` is asked `list` once: each patch's row
names the processes holding its live fix, and a fix taken from bytes the file no longer has is
drift; a host without it is asked nothing more than before. Sync reads a fix held live as its
own column (`views.SYNC` `held`) over the files' word as read.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from opspatch.config.fleet import DesiredPatch
from opspatch.errors import Location, TransportError
from opspatch.runs.commands.status import exit_code, fleet_status, read_fleet
from opspatch.runs.commands.sync import decide
from opspatch.runs.judgments.views import status_word
from tests.livekit import LiveEngine, apply_live
from tests.scriptedkit import Fleet, fleet, sha

pytestmark = pytest.mark.scripted

__all__ = ["fleet"]  # the fixture, used by name

MODULE = "sglang.srt.speculative.eagle_worker_v2"


def with_hashes(fleet: Fleet, engine: LiveEngine, taken_sha: str) -> None:
    """The engine's `list` entries name the module and the file hash each fix was taken from,
    as the fix runtime's do."""

    def answer(op: str, args: dict[str, Any]) -> dict[str, Any] | None:
        if op != "live":
            return None
        reply = engine.answer(args)
        for socket in reply["answers"]:
            for entry in (socket["reply"] or {}).get("took", []):
                entry.update(module=MODULE, sha256=taken_sha)
        return reply

    for fake in fleet.hosts:
        fake.fault = answer


def status(fleet: Fleet, *, live: bool = True) -> Any:
    hosts = [replace(h.host(), live=live) for h in fleet.hosts]
    (row,) = fleet_status(hosts, [fleet.patch], fleet.factory, fleet.ledger)
    return row


def test_status_names_the_processes_holding_a_live_fix_and_the_file_agrees(fleet: Fleet) -> None:
    fleet.hosts = fleet.hosts[:1]
    engine = LiveEngine()
    apply_live(fleet, engine)
    with_hashes(fleet, engine, sha(fleet.hosts[0].file.read_bytes()))
    row = status(fleet)
    assert row.state == "applied", row
    assert row.live is not None
    assert {m.process for m in row.live} == {"scheduler-tp0", "scheduler-tp1"}
    assert all(m.fix_id == "eagle-init-guard" and m.drift is None for m in row.live)
    assert "live fix in memory in scheduler-tp0, scheduler-tp1" in row.detail
    assert "still runs the old code" not in row.detail  # the server started before the
    # file, but holds its fix live: applied, not staged
    assert row.to_json()["live"][0]["definitions"] == [  # the live form of eagle-init-guard
        "EAGLEWorkerV2.spec_disable_batch_threshold",
        "EAGLEWorkerV2.__init__",
    ]


def test_a_fix_in_memory_whose_file_changed_since_is_drift(fleet: Fleet) -> None:
    fleet.hosts = fleet.hosts[:1]
    engine = LiveEngine()
    apply_live(fleet, engine)
    with_hashes(fleet, engine, "ab" * 32)  # taken from other bytes than the file's now
    row = status(fleet)
    assert row.live is not None and all(m.drift for m in row.live)
    assert row.state == "staged"  # what the server holds is not the file's fix
    assert "the next restart loses the fix" in row.detail


def test_a_host_without_live_true_is_asked_nothing_more(fleet: Fleet) -> None:
    fleet.hosts = fleet.hosts[:1]
    engine = LiveEngine()
    apply_live(fleet, engine)
    asked = len(engine.asked)
    row = status(fleet, live=False)
    assert row.live is None and "live" not in row.to_json()
    assert len(engine.asked) == asked


def test_diagnose_names_a_live_fix_in_memory(fleet: Fleet) -> None:
    from opspatch.runs.commands.diagnose import DiagnoseOptions, diagnose_fleet

    fleet.hosts = fleet.hosts[:1]
    engine = LiveEngine()
    apply_live(fleet, engine)
    hosts = [replace(h.host(), live=True) for h in fleet.hosts]
    diagnosis = diagnose_fleet(hosts, [fleet.patch], fleet.factory, fleet.ledger, DiagnoseOptions())
    (report,) = diagnosis.hosts
    (finding,) = [f for f in report.findings if f.kind == "live-fix"]
    assert finding.text == (  # issue 42, 6: the text names the fix and the processes
        "live fix eagle-init-guard is held in memory by scheduler-tp0, scheduler-tp1"
    )
    assert "held by scheduler-tp0 (pid 200), scheduler-tp1 (pid 201)" in finding.detail
    asked = len(engine.asked)
    off = [replace(h.host(), live=False) for h in fleet.hosts]
    (report,) = diagnose_fleet(
        off, [fleet.patch], fleet.factory, fleet.ledger, DiagnoseOptions()
    ).hosts
    assert not [f for f in report.findings if f.kind.startswith("live-fix")]
    assert len(engine.asked) == asked  # live off: not asked


def exec_lost(fleet: Fleet) -> None:
    """The host's `live` exec gets no reply: what the engine holds is not known."""

    def answer(op: str, args: dict[str, Any]) -> None:
        if op == "live":
            raise TransportError("the connection broke", host="h1", step="exec")

    for fake in fleet.hosts:
        fake.fault = answer


def test_status_never_says_a_live_fix_absent_when_the_engine_could_not_be_asked(
    fleet: Fleet,
) -> None:
    fleet.hosts = fleet.hosts[:1]
    engine = LiveEngine()
    apply_live(fleet, engine)  # the fix is live in memory; the server started before the file
    exec_lost(fleet)
    row = status(fleet)
    assert row.live is None and row.live_unread is not None
    assert "live fixes could not be listed" in row.live_unread
    assert row.to_json()["live_unread"] == row.live_unread  # was absent: "holds none"
    assert row.state == "staged", row  # a restart makes it certain (sync: restart)
    assert "unless it holds the fix live" in row.detail  # was "it still runs the old code"
    assert "still runs the old code" not in row.detail
    assert exit_code([row]) == 1  # was 0: the look was not made


def test_a_process_that_could_not_be_asked_keeps_staged_from_becoming_applied(
    fleet: Fleet,
) -> None:
    fleet.hosts = fleet.hosts[:1]
    engine = LiveEngine()
    apply_live(fleet, engine)
    taken = sha(fleet.hosts[0].file.read_bytes())

    def answer(op: str, args: dict[str, Any]) -> dict[str, Any] | None:
        if op != "live":
            return None
        reply = engine.answer(args)
        for socket in reply["answers"]:
            for entry in (socket["reply"] or {}).get("took", []):
                entry.update(module=MODULE, sha256=taken)
            if socket["socket"] == "scheduler-tp1.sock":  # the login user may not connect
                socket.update(reply=None, error="PermissionError: [Errno 13] Permission denied")
        return reply

    fleet.hosts[0].fault = answer
    row = status(fleet)
    assert row.live is not None and {m.process for m in row.live} == {"scheduler-tp0"}
    assert "scheduler-tp1" in (row.live_unread or "")
    assert row.state == "staged", row  # was applied: tp1 may run the old code
    assert exit_code([row]) == 1


def test_diagnose_says_the_live_fixes_could_not_be_listed_and_is_not_clean(fleet: Fleet) -> None:
    from opspatch.runs.commands.diagnose import DiagnoseOptions, diagnose_fleet

    fleet.hosts = fleet.hosts[:1]
    engine = LiveEngine()
    apply_live(fleet, engine)
    exec_lost(fleet)
    hosts = [replace(h.host(), live=True) for h in fleet.hosts]
    diagnosis = diagnose_fleet(hosts, [fleet.patch], fleet.factory, fleet.ledger, DiagnoseOptions())
    (report,) = diagnosis.hosts
    (finding,) = [f for f in report.findings if f.kind == "live-fixes-unread"]
    assert "the connection broke" in finding.detail
    assert report.status != "clean"  # was clean, exit 0, with no look at the engine's memory
    assert diagnosis.exit_code == 1


def test_an_engine_of_another_user_is_unread_in_status_and_diagnose(fleet: Fleet) -> None:
    from opspatch.runs.commands.diagnose import DiagnoseOptions, diagnose_fleet

    fleet.hosts = fleet.hosts[:1]
    engine = LiveEngine()
    apply_live(fleet, engine)
    why = (
        "the engine (pid 4242) runs as uid 1001 and this agent as uid 1000: ... could not be asked"
    )

    def answer(op: str, args: dict[str, Any]) -> dict[str, Any] | None:
        if op != "live":
            return None
        return {"server_pid": 4242, "folder": None, "missing": why, "answers": [], "unread": True}

    fleet.hosts[0].fault = answer
    row = status(fleet)
    assert row.live_unread is not None and "uid 1001" in row.live_unread, row
    assert row.state == "staged" and exit_code([row]) == 1
    hosts = [replace(h.host(), live=True) for h in fleet.hosts]
    diagnosis = diagnose_fleet(hosts, [fleet.patch], fleet.factory, fleet.ledger, DiagnoseOptions())
    (report,) = diagnosis.hosts
    assert [f for f in report.findings if f.kind == "live-fixes-unread"], report.findings
    assert diagnosis.exit_code == 1


def test_an_unreachable_live_host_is_not_asked_again_for_its_live_fixes(fleet: Fleet) -> None:
    fleet.hosts = fleet.hosts[:1]
    fleet.hosts[0].gone = True
    row = status(fleet)
    assert row.state == "unreachable" and exit_code([row]) == 1
    assert "live" not in fleet.hosts[0].requests  # one connection timeout, not two
    assert row.live_unread is None  # unreachable says it: not a second, redundant reason


@pytest.mark.parametrize(("taken", "action"), [("file", "nothing"), ("other", "restart")])
def test_sync_reads_a_staged_file_whose_fix_is_held_live_as_served(
    fleet: Fleet, taken: str, action: str
) -> None:
    """The files as read say `staged` (the server started before them); the engine holding the
    file's own fix live is its own column of sync's table (`held`), not status's word."""
    fleet.hosts = fleet.hosts[:1]
    engine = LiveEngine()
    apply_live(fleet, engine)
    file_sha = sha(fleet.hosts[0].file.read_bytes())
    with_hashes(fleet, engine, file_sha if taken == "file" else "ab" * 32)
    hosts = [replace(h.host(), live=True) for h in fleet.hosts]
    (said,), read = read_fleet(hosts, [fleet.patch], fleet.factory, fleet.ledger)
    (standing,) = files = read[said.host, said.patch]
    assert standing is not None and status_word(standing.files[0]) == "staged"
    entry = DesiredPatch(fleet.patch, (said.host,), "", Location("fleet.toml", 1, "x"))
    row = decide(entry, said, hosts[0], files)
    assert row is not None and row.action == action, row
