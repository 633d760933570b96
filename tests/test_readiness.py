"""Readiness: a ready engine is noticed within one short poll interval, without flooding it.

The agent's `wait_ready` runs here in-process against a real HTTP server on loopback that
answers 503 (starting) to its first requests, then 200. The agent's sleeps are recorded (and
really slept), so the test checks the interval it chose, not how fast this machine is.
"""

from __future__ import annotations

import http.server
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import opspatch.hosts.agent.engine as agent_engine
from opspatch.hosts.agent.engine import READY_POLL_SECONDS, op_wait_ready
from opspatch.hosts.agent.protocol import OpFailure

pytestmark = pytest.mark.process


class StartingServer(http.server.ThreadingHTTPServer):
    """Answers /health with 503 to its first `starting` requests, then 200."""

    def __init__(self, starting: int) -> None:
        super().__init__(("127.0.0.1", 0), _Health)
        self.starting = starting
        self.requests = 0


class _Health(http.server.BaseHTTPRequestHandler):
    server: StartingServer

    def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
        self.server.requests += 1
        status = 503 if self.server.requests <= self.server.starting else 200
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def starting_server() -> Iterator[StartingServer]:
    server = StartingServer(starting=12)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_readiness_polls_at_one_short_fixed_interval(
    starting_server: StartingServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        time.sleep(seconds)

    clock = SimpleNamespace(monotonic=time.monotonic, time=time.time, sleep=sleep)
    monkeypatch.setattr(agent_engine, "time", clock)
    url = f"http://127.0.0.1:{starting_server.server_address[1]}"
    ready = op_wait_ready({"url": url, "timeout": 600, "pid": None})
    assert ready["polls"] == 13 == starting_server.requests  # 12 answers 503, then 200
    # never a backoff: a server that turns ready is asked again within one short interval,
    # and never more often than that (a starting server is not flooded)
    assert slept == [READY_POLL_SECONDS] * 12
    assert 0.05 <= READY_POLL_SECONDS <= 0.1


class LoggingStartingServer(StartingServer):
    """Writes an access-log line for every request into `log`, as uvicorn does."""

    def __init__(self, log: Path) -> None:
        super().__init__(starting=10**9)  # 503 until `ready_now()`
        self.log = log

    def ready_now(self) -> None:
        self.starting = self.requests  # every later request answers 200
        with self.log.open("a") as handle:
            handle.write("[2026-12-01 10:00:00] The server is fired up and ready to roll!\n")


class _LoggedHealth(_Health):
    server: LoggingStartingServer

    def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
        super().do_GET()
        status = 503 if self.server.requests <= self.server.starting else 200
        with self.server.log.open("a") as handle:
            handle.write(
                f'[2026-12-01 10:00:00] INFO:     127.0.0.1:5 - "GET /health HTTP/1.1" {status}\n'
            )


def test_readiness_watches_the_log_and_polls_when_the_engine_says_something(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the log is silent (our own polls' access lines do not count) /health is not asked
    again before the quiet interval; the moment the engine logs that it is ready, it is asked."""
    log = tmp_path / "server.log"
    log.write_text("[2026-12-01 09:59:59] Load weight begin.\n")
    server = LoggingStartingServer(log)
    server.RequestHandlerClass = _LoggedHealth
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    looks: list[float] = []

    def sleep(seconds: float) -> None:
        looks.append(seconds)
        if len(looks) == 8:
            server.ready_now()
        time.sleep(seconds)

    monkeypatch.setattr(agent_engine, "QUIET_POLL_SECONDS", 10_000.0)  # only news makes a poll
    monkeypatch.setattr(
        agent_engine, "time", SimpleNamespace(monotonic=time.monotonic, time=time.time, sleep=sleep)
    )
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        ready = op_wait_ready(
            {"url": url, "timeout": 600, "pid": None, "log_file": str(log), "log_offset": 0}
        )
    finally:
        server.shutdown()
        server.server_close()
    # one poll at the start, none while only our own access line was new, one on the ready line
    assert ready["polls"] == 2 == server.requests
    assert len(looks) == 8  # noticed at the first look after the engine said so


# ---------------------------------------------------------------------------------------------
# a decode with no answer: a timeout told from a crash

CRASH_LOG = (
    "[2026-11-30 02:50:20 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
    '  File "/srv/eagle_worker_v2.py", line 613, in forward\n'
    "AttributeError: no attribute 'spec_disable_batch_threshold'\n"
)
WHERE = '(File "/srv/eagle_worker_v2.py", line 613, in forward)'


def exited_pid() -> int:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], check=True, capture_output=True
    )
    return int(done.stdout)


def test_a_decode_without_answer_is_told_apart() -> None:
    import os

    from opspatch.hosts.agent.engine import NoAnswer, explain_no_answer

    timeout = NoAnswer("TimeoutError: timed out", timed_out=True)
    dropped = NoAnswer("RemoteDisconnected: Remote end closed connection without response")
    me = os.getpid()
    assert explain_no_answer(timeout, 2.97, me, "") == (
        f"did not answer within 3s; the server (pid {me}) is still running"
    )
    assert explain_no_answer(timeout, 3, me, CRASH_LOG) == (
        f"did not answer within 3s; the server (pid {me}) is still running; its log records "
        f"AttributeError: no attribute 'spec_disable_batch_threshold' {WHERE}"
    )
    assert explain_no_answer(dropped, 3, me, CRASH_LOG) == (
        f"the server crashed: AttributeError: no attribute 'spec_disable_batch_threshold' {WHERE}"
    )
    gone = exited_pid()
    assert explain_no_answer(timeout, 3, gone, CRASH_LOG).startswith("the server crashed: ")
    assert explain_no_answer(dropped, 3, gone, "") == (
        f"the server (pid {gone}) exited while decoding ({dropped}); its log records no exception"
    )
    assert explain_no_answer(dropped, 3, None, "") == (
        f"the connection was dropped ({dropped}); no server process was found"
    )
    assert explain_no_answer(timeout, 3, None, "") == (
        "did not answer within 3s; no server process was found"
    )


def test_readiness_without_a_restart_fails_at_once_when_the_pid_file_names_a_gone_engine(
    tmp_path: Path,
) -> None:
    """`recover` asks "is the server up?" with no restart of its own to watch: when the engine's
    pid file names a process that has exited and /health does not answer, nothing is starting
    there. Before, the wait ran out the playbook's `ready` deadline (20 minutes by default)."""
    pid_file = tmp_path / "server.pid"
    pid_file.write_text(f"{exited_pid()}\n")
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    with pytest.raises(OpFailure) as refused:
        op_wait_ready({"url": url, "timeout": 600, "pid": None, "pid_file": str(pid_file)})
    assert refused.value.code == "engine-not-running"
    assert f"its pid file {pid_file} names pid" in refused.value.message


def test_readiness_without_a_restart_still_waits_for_a_server_that_answers(
    starting_server: StartingServer, tmp_path: Path
) -> None:
    """A pid file naming a gone process does not fail a server that answers /health (the pid
    file is stale, the server was started another way), nor does a missing pid file."""
    pid_file = tmp_path / "server.pid"
    pid_file.write_text(f"{exited_pid()}\n")
    starting_server.starting = 0
    url = f"http://127.0.0.1:{starting_server.server_address[1]}"
    assert op_wait_ready({"url": url, "timeout": 600, "pid": None, "pid_file": str(pid_file)})
    missing = str(tmp_path / "none.pid")
    assert op_wait_ready({"url": url, "timeout": 600, "pid": None, "pid_file": missing})


def test_one_part_of_a_long_wait_answers_that_it_still_waits_and_the_last_part_fails() -> None:
    """The controller waits in parts of 30 s (`hosts.engine.READY_SLICE_SECONDS`) to say what
    it awaits between them: a part (`slice`) that runs out answers `waiting` with the last
    answer, and the last part fails naming the whole wait (`total`), not its own length."""
    with socket.socket() as probe:  # a port nothing listens on: a wrong engine URL
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    part = op_wait_ready({"url": url, "timeout": 0.3, "pid": None, "slice": True, "total": 1200})
    waiting = part["waiting"]
    assert waiting["polls"] >= 1 and waiting["seconds"] > 0
    assert waiting["last"].startswith("/health: "), waiting
    with pytest.raises(OpFailure) as failed:
        op_wait_ready({"url": url, "timeout": 0.3, "pid": None, "total": 1200})
    assert failed.value.code == "not-ready"
    assert failed.value.message.startswith("not ready after 1200s (/health: "), failed.value


def test_a_wrong_engine_url_is_waited_for_in_parts_that_each_say_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The controller's side, over real agent execs on this machine: an engine URL nothing
    answers at is waited for in parts (here of 0.5 s, 30 s in a run), each that ran out told to
    `on_waiting` with the URL, the last answer and the deadline, and the wait fails at its
    deadline naming the whole of it. Before, it was one silent exec of the whole deadline."""
    import sys

    from opspatch.config.inventory import parse_inventory
    from opspatch.core.policy import Playbook, StepTimeouts
    from opspatch.errors import EngineError
    from opspatch.hosts import engine as engine_control
    from opspatch.hosts.engine import EngineControl, StillWaiting
    from opspatch.hosts.operations import HostOperations
    from opspatch.hosts.transport.local import LocalTransport

    with socket.socket() as probe:  # a port nothing listens on: a wrong engine URL
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    inventory = f"""
[defaults]
transport = "local"
state_dir = "{tmp_path}/state"
[defaults.engine]
python = "{sys.executable}"
url = "{url}"
restart = {{ kind = "command", start = "true", pid_file = "{tmp_path}/server.pid" }}
[hosts.h1]
address = "127.0.0.1"
"""
    host = parse_inventory(inventory, str(tmp_path / "inv.toml"), name="test").hosts[0]
    monkeypatch.setattr(engine_control, "READY_SLICE_SECONDS", 0.5)
    playbook = Playbook(timeouts=StepTimeouts(ready=2.0))
    seen: list[StillWaiting] = []
    with LocalTransport(host.name) as transport:
        control = EngineControl(HostOperations(transport, host), host, playbook)
        before = time.time()
        with pytest.raises(EngineError) as failed:
            control.wait_ready(None, on_waiting=seen.append)
    assert "not ready after 2s (/health: " in failed.value.message, failed.value
    assert seen, "no part said it was still waiting"
    for still in seen:
        assert still.url == url and still.last.startswith("/health: "), still
        assert still.timeout == 2.0 and before + 2.0 <= still.gives_up_at <= time.time() + 2.0


def test_a_smoke_of_a_server_found_dead_names_the_exception_its_log_recorded_before(
    tmp_path: Path,
) -> None:
    """Issue 42, item 17: the server crashed on an earlier decode and is gone; the smoke's own
    stretch of the log is empty, so it said "exited while decoding; its log records no
    exception" while the log held the AttributeError `diagnose` finds. Now it reads the log
    since the server's last start, and does not claim the server died during this decode."""
    from opspatch.hosts.agent.engine import op_smoke

    gone = exited_pid()
    pid_file = tmp_path / "server.pid"
    pid_file.write_text(f"{gone}\n")
    log = tmp_path / "server.log"
    log.write_text(
        "[2026-12-01 01:00:00] server_args=ServerArgs(model_path='old')\n"
        "[2026-12-01 01:00:01] an earlier start\n"
        "[2026-12-01 02:00:00] server_args=ServerArgs(model_path='m')\n"
        "[2026-12-01 02:00:05] The server is fired up and ready to roll!\n" + CRASH_LOG
    )
    with socket.socket() as closed:  # a port nothing listens on: the server is gone
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    reply = op_smoke(
        {
            "url": f"http://127.0.0.1:{port}",
            "prompts": [{"text": "The capital of France is"}],
            "timeout": 10,
            "log_file": str(log),
            "log_offset": None,  # `opspatch smoke`: from the log's end
            "pid_file": str(pid_file),
        }
    )
    assert not reply["ok"]
    (said,) = reply["failures"]
    assert said == (
        f"prompt 1: the server (pid {gone}) is not running: it crashed before this decode: "
        f"AttributeError: no attribute 'spec_disable_batch_threshold' {WHERE} (its log since "
        "its last start)"
    ), said
