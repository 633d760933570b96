"""Run statuses, derived from the events and the controller process, never stored: running,
finished, interrupted (the controller died), unknown (another controller)."""

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

from opspatch.ledger import ControllerProcess, Ledger
from tests.ledgerkit import begin


@pytest.fixture
def ledger_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "ledger.sqlite3"


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
    ledger.finish_run(run_id, "succeeded")
    (summary,) = ledger.list_runs()
    assert (summary.status, summary.outcome) == ("finished", "succeeded")
    assert summary.finished_at is not None


def test_a_sigkilled_run_shows_as_interrupted_with_each_hosts_last_step(
    ledger_path: Path,
) -> None:
    script = textwrap.dedent(
        """
        import os, signal, sys
        from pathlib import Path
        from opspatch.ledger.store import Ledger
        ledger = Ledger.open(Path(sys.argv[1]))
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
