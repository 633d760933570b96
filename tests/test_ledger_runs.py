"""Run statuses, derived from the events and the controller process, never stored: running,
finished, interrupted (the controller died), recovered (a later `recover` naming the run finished),
unknown (another controller); and the chain of runs a recover follows through `parent_run`."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from opspatch.core.ledgerlocation import PostgresLedger
from opspatch.core.reasons import Reason
from opspatch.core.vocabulary import RunStatus
from opspatch.errors import InputError
from opspatch.ledger import ControllerProcess, Ledger
from tests.clirunner import opspatch
from tests.ledgerkit import begin, begin_and_die
from tests.pgkit import BACKENDS, backend_location

pytestmark = pytest.mark.process


@pytest.fixture(params=BACKENDS)
def ledger_path(request: pytest.FixtureRequest, tmp_path: Path) -> Path | PostgresLedger:
    return backend_location(request, tmp_path)


@pytest.fixture
def ledger(ledger_path: Path) -> Iterator[Ledger]:
    opened = Ledger.open(ledger_path)
    yield opened
    opened.close()


def statuses(ledger: Ledger) -> dict[str, tuple[str, str | None]]:
    """run id -> (status, recovered_by), for every run."""
    return {r.run_id: (r.status, r.recovered_by) for r in ledger.list_runs()}


# ---------------------------------------------------------------------------------------------
# running, finished, interrupted, unknown


def test_a_run_of_a_living_process_is_running_until_finished(ledger: Ledger) -> None:
    run_id = begin(ledger)
    (summary,) = ledger.list_runs()
    assert summary.status == "running" and summary.outcome is None
    assert summary.controller.pid == os.getpid()
    ledger.finish_run(run_id, "ok")
    (summary,) = ledger.list_runs()
    assert (summary.status, summary.outcome) == ("finished", "ok")
    assert summary.finished_at is not None


def test_a_sigkilled_run_shows_as_interrupted_with_each_hosts_last_step(
    ledger_path: Path,
) -> None:
    script = textwrap.dedent(
        """
        import os, signal, sys
        from opspatch.core.ledgerlocation import ledger_location
        from opspatch.ledger.store import Ledger
        ledger = Ledger.open(ledger_location(sys.argv[1]))
        run_id = ledger.begin_run(command="apply", patch_id="eagle-init-guard",
                                  patch_sha256=None, operator="ops@controller",
                                  command_line="opspatch apply", hosts=["gpu-01", "gpu-02"])
        ledger.record_step(run_id, "gpu-01", "lock", "ok", 0.01)
        ledger.record_step(run_id, "gpu-01", "swap", "started")
        ledger.record_step(run_id, "gpu-02", "lock", "ok", 0.01)
        print(run_id, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(ledger_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    run_id = done.stdout.strip()

    with Ledger.open(ledger_path) as ledger:
        (summary,) = ledger.list_runs()
        detail = ledger.get_run(run_id)
        assert ledger.verify().ok
    assert summary.run_id == run_id
    assert summary.status == "interrupted"
    assert summary.outcome is None and summary.finished_at is None
    last_01 = detail.host("gpu-01").last_step
    last_02 = detail.host("gpu-02").last_step
    assert last_01 is not None and (last_01.step, last_01.status) == ("swap", "started")
    assert last_02 is not None and (last_02.step, last_02.status) == ("lock", "ok")
    assert detail.host("gpu-01").outcome is None


def test_a_reused_pid_does_not_count_as_the_run_still_going() -> None:
    me = ControllerProcess.current()
    assert me.is_alive() is True
    if me.start_token is None:
        pytest.skip("no /proc on this system: start times cannot be compared")
    impostor = ControllerProcess(me.hostname, me.pid, me.start_token + "0")
    assert impostor.is_alive() is False


def test_a_run_begun_on_another_controller_has_unknown_status() -> None:
    elsewhere = ControllerProcess(socket.gethostname() + "-other", os.getpid(), None)
    assert elsewhere.is_alive() is None


# ---------------------------------------------------------------------------------------------
# recovered


def test_an_interrupted_run_is_recovered_once_a_recover_naming_it_finishes(
    ledger: Ledger, ledger_path: Path
) -> None:
    applied = begin_and_die(ledger_path)
    assert statuses(ledger)[applied] == ("interrupted", None)

    recover = begin(ledger, command="recover", parent_run=applied)
    assert statuses(ledger)[applied] == ("interrupted", None)  # the recover is still running

    ledger.finish_run(recover, "ok")
    assert statuses(ledger) == {recover: ("finished", None), applied: ("recovered", recover)}
    summary = ledger.get_run(applied[:-1]).summary
    assert summary.status is RunStatus.RECOVERED and summary.recovered_by == recover
    assert summary.outcome is None and summary.finished_at is None  # it never finished itself
    document = summary.to_json()
    assert (document["status"], document["recovered_by"]) == ("recovered", recover)
    assert list(document)[-4:] == ["status", "outcome", "recovered_by", "inventories"]


def test_a_killed_recover_recovers_nothing_and_a_recover_of_it_recovers_the_chain(
    ledger: Ledger, ledger_path: Path
) -> None:
    applied = begin_and_die(ledger_path)
    killed_recover = begin_and_die(ledger_path, command="recover", parent_run=applied)
    assert statuses(ledger) == {
        killed_recover: ("interrupted", None),
        applied: ("interrupted", None),
    }
    # A recover of the killed recover recovers that one and, through it, the apply: recover
    # follows the chain of runs (issue 9 item 6).
    second = begin(ledger, command="recover", parent_run=killed_recover)
    assert statuses(ledger)[applied] == ("interrupted", None)  # not finished yet
    ledger.finish_run(second, "needs-attention")  # finished, whatever its outcome
    assert statuses(ledger)[killed_recover] == ("recovered", second)
    assert statuses(ledger)[applied] == ("recovered", second)


def test_a_recover_that_left_a_host_never_started_recovers_nothing(
    ledger: Ledger, ledger_path: Path
) -> None:
    """A recover halted before it started gpu-02: the apply stays `interrupted` (issue 42's
    false green); a later recover that started every host recovers it."""
    applied = begin_and_die(ledger_path)
    halted = begin(ledger, command="recover", parent_run=applied)
    ledger.record_host_outcome(halted, "gpu-01", "needs-attention", "its server did not start")
    ledger.record_host_outcome(
        halted, "gpu-02", "skipped", "not started: the run halted", reason=Reason.NOT_STARTED
    )
    ledger.finish_run(halted, "needs-attention")
    assert statuses(ledger)[applied] == ("interrupted", None)

    whole = begin(ledger, command="recover", parent_run=applied)
    for host in ("gpu-01", "gpu-02"):
        ledger.record_host_outcome(whole, host, "restored")
    ledger.finish_run(whole, "ok")
    assert statuses(ledger)[applied] == ("recovered", whole)


def test_only_a_recover_recovers_and_only_an_interrupted_run(
    ledger: Ledger, ledger_path: Path
) -> None:
    applied = begin_and_die(ledger_path)
    rollback = begin(ledger, command="rollback", parent_run=applied)
    ledger.finish_run(rollback, "ok")
    assert statuses(ledger)[applied] == ("interrupted", None)

    finished = begin(ledger)
    ledger.finish_run(finished, "failed")
    recover = begin(ledger, command="recover", parent_run=finished)
    ledger.finish_run(recover, "ok")
    assert statuses(ledger)[finished] == ("finished", None)


def test_the_first_recover_to_finish_is_the_one_named(ledger: Ledger, ledger_path: Path) -> None:
    applied = begin_and_die(ledger_path)
    earlier = begin(ledger, command="recover", parent_run=applied)
    later = begin(ledger, command="recover", parent_run=applied)
    ledger.finish_run(later, "ok")
    ledger.finish_run(earlier, "ok")
    assert statuses(ledger)[applied] == ("recovered", later)


def test_ledger_list_and_show_say_which_run_recovered_it(ledger_path: Path) -> None:
    with Ledger.open(ledger_path) as ledger:
        applied = begin_and_die(ledger_path)
        recover = begin(ledger, command="recover", parent_run=applied)
        ledger.finish_run(recover, "ok")
    env = {"OPSPATCH_LEDGER": str(ledger_path)}

    table = opspatch("ledger", "list", env=env)
    assert table.code == 0, table.stderr
    assert "recovered by" in table.stdout
    (row,) = [line for line in table.stdout.splitlines() if applied in line]
    assert "recovered" in row and recover in row

    runs = {r["run_id"]: r for r in opspatch("ledger", "list", "--json", env=env).json()["runs"]}
    assert (runs[applied]["status"], runs[applied]["recovered_by"]) == ("recovered", recover)
    assert runs[recover]["recovered_by"] is None

    shown = opspatch("ledger", "show", applied, env=env)
    assert shown.code == 0, shown.stderr
    assert f"recovered by run {recover}" in shown.stdout
    document = opspatch("ledger", "show", applied, "--json", env=env).json()
    assert document["recovered_by"] == recover


# ---------------------------------------------------------------------------------------------
# the chain of runs


def test_run_chain_follows_parent_runs_from_the_run_to_its_oldest_ancestor(
    ledger: Ledger, ledger_path: Path
) -> None:
    applied = begin_and_die(ledger_path)
    killed_recover = begin_and_die(ledger_path, command="recover", parent_run=applied)
    recover = begin(ledger, command="recover", parent_run=killed_recover)
    unrelated = begin(ledger)

    chain = ledger.run_chain(recover)
    assert [r.run_id for r in chain] == [recover, killed_recover, applied]
    assert [r.status for r in chain] == ["running", "interrupted", "interrupted"]
    assert [r.parent_run for r in chain] == [killed_recover, applied, None]

    ledger.finish_run(recover, "ok")
    chain = ledger.run_chain(recover[:-1])  # a unique prefix is enough
    assert [(r.status, r.recovered_by) for r in chain] == [
        ("finished", None),
        ("recovered", recover),
        ("recovered", recover),  # the chain: a recover of a recover recovers the original too
    ]
    assert [r.run_id for r in ledger.run_chain(applied)] == [applied]
    assert [r.run_id for r in ledger.run_chain(unrelated)] == [unrelated]


def test_run_chain_of_an_unknown_run_is_refused(ledger: Ledger) -> None:
    with pytest.raises(InputError, match="no run"):
        ledger.run_chain("19990101T000000Z-000000")
