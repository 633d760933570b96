"""The fleet executor's Ctrl-C, driven by real SIGINTs to this process (the main thread takes
them, as the console script's does): the first stops starting hosts and lets the ones in flight
finish, the second stops waiting and names the hosts left in flight."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable

import pytest

from opspatch.core.policy import Batch
from opspatch.core.vocabulary import Outcome
from opspatch.runs.fleet.executor import (
    CANCELLED,
    Cancellation,
    GaveUpWaiting,
    map_cancellable,
    run_fleet,
)
from opspatch.runs.report import HostOutcome

pytestmark = pytest.mark.pure

HOSTS = ("h1", "h2", "h3")


def interrupt_when(started: str, times: int = 1) -> tuple[Callable[[str], HostOutcome], list[str]]:
    """Work that sends SIGINT (`times` times) while host `started` runs, and holds that host
    until the signals were taken (so the order of events is fixed, whatever the machine's speed)."""
    ran: list[str] = []
    taken = threading.Event()

    def work(name: str) -> HostOutcome:
        ran.append(name)
        if name == started:
            for _ in range(times):
                os.kill(os.getpid(), signal.SIGINT)
                threading.Event().wait(0.3)
            taken.wait(timeout=5)
        return HostOutcome(name, Outcome.APPLIED)

    # The handler runs in the main thread between its waits: two seconds is ample, and the host
    # only finishes later than it would (no outcome depends on how long it takes).
    threading.Timer(2.0, taken.set).start()
    return work, ran


def test_the_first_ctrl_c_stops_starting_hosts_and_finishes_those_in_flight() -> None:
    work, ran = interrupt_when("h1")
    notices: list[tuple[str, ...]] = []
    cancellation = Cancellation()
    with cancellation.armed():
        result = run_fleet(
            [Batch(("h1",), True, 1), Batch(HOSTS[1:], False, 2)],
            work,
            halt=lambda _: None,
            cancellation=cancellation,
            on_cancel=lambda in_flight: notices.append(tuple(in_flight)),
        )
    assert ran == ["h1"]
    assert result.outcomes["h1"].outcome == Outcome.APPLIED  # finished, not abandoned
    assert result.not_started == ("h2", "h3")
    assert result.halted == CANCELLED
    assert notices == [("h1",)]


def test_a_second_ctrl_c_stops_waiting_and_names_the_hosts_in_flight() -> None:
    work, _ = interrupt_when("h2", times=2)
    cancellation = Cancellation()
    with cancellation.armed(), pytest.raises(GaveUpWaiting) as stopped:
        run_fleet([Batch(HOSTS, False, 3)], work, halt=lambda _: None, cancellation=cancellation)
    assert "h2" in stopped.value.in_flight


def test_the_handler_is_restored_after_the_run() -> None:
    before = signal.getsignal(signal.SIGINT)
    with Cancellation().armed():
        assert signal.getsignal(signal.SIGINT) is not before
    assert signal.getsignal(signal.SIGINT) is before


def test_a_cancelled_preflight_returns_only_the_hosts_it_started() -> None:
    work, ran = interrupt_when("h1")
    cancellation = Cancellation()
    with cancellation.armed():
        done = map_cancellable(
            lambda name: work(name).outcome, HOSTS, limit=1, cancellation=cancellation
        )
    assert cancellation.requested
    assert list(done) == ["h1"] == ran


def test_hosts_that_finish_while_the_executor_waits_are_each_yielded_once() -> None:
    # 20 hosts at once, released together: every one is noticed (on its own completion, not by
    # polling the running ones), none twice, and the run waits for all of them
    release = threading.Event()

    def work(name: str) -> str:
        release.wait(timeout=5)
        return name

    hosts = [f"h{i}" for i in range(40)]
    threading.Timer(0.3, release.set).start()
    done = map_cancellable(work, hosts, limit=20, cancellation=Cancellation())
    assert list(done) == hosts and all(done[h] == h for h in hosts)
