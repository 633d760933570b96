"""One router's `/workers` shared by every host of a run waiting on it (hosts/router.py
`SharedListing`): one request serves every host that asked before it began, none sooner than an
interval after the last, and no host reads a listing older than the mark it names."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from opspatch.errors import RouterError
from opspatch.hosts.router import Listing, RouterWorker, SharedListing

pytestmark = pytest.mark.pure

LONG = 30.0  # seconds a test waits for a thread before it fails; never reached when it passes

LISTED = (RouterWorker("id-1", "http://w1", True),)
UNLISTED: tuple[RouterWorker, ...] = ()


class Router:
    """A `/workers` whose each answer waits until the test lets it go, and is counted."""

    def __init__(self, *answers: tuple[RouterWorker, ...] | RouterError) -> None:
        self.answers = list(answers)
        self.calls = 0
        self.asked = threading.Event()
        self.go = threading.Event()

    def workers(self) -> tuple[RouterWorker, ...]:
        answer = self.answers[self.calls]
        self.calls += 1
        self.asked.set()
        assert self.go.wait(LONG)
        if isinstance(answer, RouterError):
            raise answer
        return answer


class Clock:
    """Time as the test moves it: the interval between requests passes only when it says."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def in_threads(
    count: int, read: Callable[[], Listing]
) -> tuple[list[Listing], list[threading.Thread]]:
    got: list[Listing] = []
    threads = [threading.Thread(target=lambda: got.append(read())) for _ in range(count)]
    for thread in threads:
        thread.start()
    return got, threads


def joined(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.join(LONG)
        assert not thread.is_alive()


def test_every_host_that_asked_before_a_request_began_is_served_by_that_one_request() -> None:
    router, clock = Router(LISTED), Clock()
    shared = SharedListing(router.workers, interval=1.0, clock=clock)
    mark = shared.mark()
    got, threads = in_threads(8, lambda: shared.after(mark))
    assert router.asked.wait(LONG)
    router.go.set()
    joined(threads)
    assert router.calls == 1
    assert [listing.of("http://w1") for listing in got] == [LISTED] * 8


def test_a_host_that_changed_the_router_after_a_request_began_never_reads_that_request() -> None:
    # the request in flight began before the host removed its worker: it still lists it
    router, clock = Router(LISTED, UNLISTED), Clock()
    shared = SharedListing(router.workers, interval=1.0, clock=clock)
    early, first = in_threads(1, lambda: shared.after(shared.mark()))
    assert router.asked.wait(LONG)
    clock.now += 5
    removed = shared.mark()  # the worker removed now, while that request is out
    late, second = in_threads(3, lambda: shared.after(removed))
    router.go.set()
    joined(first + second)
    assert early[0].of("http://w1") == LISTED
    assert router.calls == 2
    assert all(listing.number > removed and listing.of("http://w1") == () for listing in late)


def test_hosts_polling_one_router_cost_it_one_request_per_interval() -> None:
    router, clock = Router(LISTED, UNLISTED), Clock()
    router.go.set()
    shared = SharedListing(router.workers, interval=0.05, clock=clock)
    seen = shared.after(shared.mark())
    got, threads = in_threads(6, lambda: shared.after(seen.number))
    # the interval has not passed on the clock: however long they wait, nobody asks the router
    threads[0].join(0.3)
    assert router.calls == 1 and not got
    clock.now += 0.05
    joined(threads)
    assert router.calls == 2
    assert all(listing.number > seen.number and listing.of("http://w1") == () for listing in got)


def test_a_failed_request_is_the_error_of_every_host_it_served_and_the_next_asks_again() -> None:
    router, clock = Router(RouterError("router http://r: GET /workers: no answer"), LISTED), Clock()
    router.go.set()
    shared = SharedListing(router.workers, interval=0.0, clock=clock)
    failed = shared.after(shared.mark())
    with pytest.raises(RouterError, match="no answer"):
        failed.of("http://w1")
    clock.now += 1
    assert shared.after(failed.number).of("http://w1") == LISTED
    assert router.calls == 2


def test_a_url_listed_twice_is_both_of_its_workers() -> None:
    twice = (RouterWorker("a", "http://w1", False), RouterWorker("b", "http://w1", True))
    assert Listing(1, (*twice, RouterWorker("c", "http://w2", True))).of("http://w1") == twice
