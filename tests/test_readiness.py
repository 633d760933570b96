"""Readiness: a ready engine is noticed within one short poll interval, without flooding it.

The agent's `wait_ready` runs here in-process against a real HTTP server on loopback that
answers 503 (starting) to its first requests, then 200. The agent's sleeps are recorded (and
really slept), so the test checks the interval it chose, not how fast this machine is.
"""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

import opspatch.hosts.agent.engine as agent_engine
from opspatch.hosts.agent.engine import READY_POLL_SECONDS, op_wait_ready


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
