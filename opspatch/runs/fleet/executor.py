"""The fleet executor: one function per host, over batches, a bounded number at a time."""

from __future__ import annotations

import queue
import signal
import threading
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

from opspatch.core.policy import Batch, Playbook
from opspatch.core.reasons import Reason
from opspatch.core.vocabulary import FAILED_OUTCOMES, Outcome
from opspatch.core.vocabulary import Rotation as RotationWord
from opspatch.runs.report import HostOutcome

CANCELLED = "cancelled by the operator (Ctrl-C); hosts already started were finished"

T = TypeVar("T")

HostWork = Callable[[str], "HostOutcome | Sequence[HostOutcome]"]
"""What is done to an item by name (a host, or a unit by its head): every node's outcome; never
raises for a host failure."""

HaltPolicy = Callable[[Mapping[str, HostOutcome]], "str | None"]
"""Given every outcome so far that `may_halt`, why the run must stop starting hosts (None: go
on). A policy's answer depends on those outcomes alone (and on what it reads elsewhere, such as a
lease lost): `run_fleet` passes it no other, so that a run of N hosts asks it N times over the
few that went wrong, not over all the N decided (quadratic: 1.2 s of a 1,000-host rollout's
CPU)."""

_POLL_SECONDS = 0.25
"""A signal handler that only sets a flag does not wake a thread blocked on a lock."""


class Cancellation:
    """The first SIGINT sets the flag (read between hosts); the second raises `KeyboardInterrupt`."""

    def __init__(self) -> None:
        self._requested = threading.Event()
        self._announced = False

    @property
    def requested(self) -> bool:
        return self._requested.is_set()

    def request(self) -> None:
        self._requested.set()

    def announce_once(self) -> bool:
        """True the first time it is called after a request (to say so once), else False."""
        if self.requested and not self._announced:
            self._announced = True
            return True
        return False

    @contextmanager
    def armed(self) -> Iterator[Cancellation]:
        if threading.current_thread() is not threading.main_thread():
            yield self
            return

        def on_sigint(signum: int, frame: object) -> None:
            if self.requested:
                raise KeyboardInterrupt
            self.request()

        previous = signal.signal(signal.SIGINT, on_sigint)
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, previous)


@dataclass(frozen=True)
class FleetResult:
    outcomes: dict[str, HostOutcome]
    halted: str | None
    not_started: tuple[str, ...]


class GaveUpWaiting(KeyboardInterrupt):
    """The second Ctrl-C: the `in_flight` pipelines may still be part-way when the process exits."""

    def __init__(self, in_flight: Sequence[str]) -> None:
        super().__init__(", ".join(in_flight))
        self.in_flight = tuple(in_flight)


def may_halt(outcome: HostOutcome) -> bool:
    """Whether a halt policy may count `outcome`: a failed host (needs attention included) or one
    left out of rotation. Every policy of opspatch halts on those and counts no other."""
    return outcome.outcome in FAILED_OUTCOMES or outcome.rotation == RotationWord.OUT_OF_ROTATION


def halt_as_apply(playbook: Playbook, canaries: Collection[str]) -> HaltPolicy:
    """The playbook's `max_failures` and canaries, as an apply halts."""

    def halt(outcomes: Mapping[str, HostOutcome]) -> str | None:
        return playbook.halt_reason({n: o.outcome for n, o in outcomes.items()}, canaries=canaries)

    return halt


def halt_on_attention(outcomes: Mapping[str, HostOutcome]) -> str | None:
    """A host in an unknown state stops the run: the same step elsewhere could spread the problem."""
    attention = sorted(n for n, o in outcomes.items() if o.outcome == Outcome.NEEDS_ATTENTION)
    if attention:
        return f"{', '.join(attention)} need{'s' if len(attention) == 1 else ''} attention"
    return None


def run_fleet(
    batches: Sequence[Batch],
    work: HostWork,
    *,
    halt: HaltPolicy,
    on_outcome: Callable[[HostOutcome], None] = lambda _: None,
    already: Mapping[str, HostOutcome] | None = None,
    cancellation: Cancellation | None = None,
    on_cancel: Callable[[Sequence[str]], None] = lambda _: None,
) -> FleetResult:
    """`already`: outcomes decided before, counted by `halt` but not run or returned again.
    `halt` is asked after each item over the decided outcomes that `may_halt`, in the order they
    were decided."""
    cancellation = cancellation or Cancellation()
    decided: dict[str, HostOutcome] = dict(already or {})
    halting = {name: o for name, o in decided.items() if may_halt(o)}
    outcomes: dict[str, HostOutcome] = {}
    halted = halt(halting) if decided else None
    not_started: list[str] = []
    for batch in batches:
        pending = [name for name in batch.hosts if name not in decided]
        started = [] if halted or cancellation.requested else list(pending)
        for name, future in _bounded(
            started, max(1, batch.in_flight), work, cancellation, on_cancel
        ):
            try:
                result = future.result()
                done = (result,) if isinstance(result, HostOutcome) else tuple(result)
            except Exception as exc:  # a bug must not lose the other hosts' outcomes
                done = (
                    HostOutcome(
                        name,
                        Outcome.NEEDS_ATTENTION,
                        f"internal error: {type(exc).__name__}: {exc}",
                        reason=Reason.INTERNAL_ERROR,
                    ),
                )
            for outcome in done:
                earlier = outcome.host in decided
                outcomes[outcome.host] = decided[outcome.host] = outcome
                if not may_halt(outcome):
                    halting.pop(outcome.host, None)
                elif earlier and outcome.host not in halting:  # kept where it was decided
                    halting = {name: o for name, o in decided.items() if may_halt(o)}
                else:
                    halting[outcome.host] = outcome
                on_outcome(outcome)
            halted = halted or halt(halting)
            if halted:
                started.clear()
        left = [name for name in pending if name not in decided]
        if left and (halted or cancellation.requested):  # hosts it kept from starting
            halted = halted or CANCELLED
            not_started.extend(left)
    return FleetResult(outcomes, halted, tuple(not_started))


def _bounded(
    pending: list[str],
    limit: int,
    work: Callable[[str], T],
    cancellation: Cancellation,
    on_cancel: Callable[[Sequence[str]], None],
) -> Iterator[tuple[str, Future[T]]]:
    """The caller may clear `pending` to stop starting hosts; the threads are joined unless the
    operator gave up waiting.

    Each future puts itself on `finished` when it completes, so a wait costs the same with 2
    or 200 hosts running (`concurrent.futures.wait` over the running futures hooks a waiter
    into every one of them each poll: at 4 polls a second, 200 running hosts made it the
    executor thread's largest cost over a long rollout)."""
    pool = ThreadPoolExecutor(max_workers=limit, thread_name_prefix="host")
    running: dict[Future[T], str] = {}
    finished: queue.SimpleQueue[Future[T]] = queue.SimpleQueue()
    gave_up = False
    try:
        while pending or running:
            while pending and len(running) < limit and not cancellation.requested:
                name = pending.pop(0)
                future = pool.submit(work, name)
                running[future] = name
                future.add_done_callback(finished.put)
            if not running:
                break
            try:
                done = _finished(finished, _POLL_SECONDS)
            except KeyboardInterrupt:
                gave_up = True
                raise GaveUpWaiting(sorted(running.values())) from None
            if cancellation.announce_once():
                on_cancel(sorted(running.values()))
            for future in done:
                yield running.pop(future), future
            if cancellation.requested and not running:
                break
    except GeneratorExit:  # the consumer was interrupted (a second Ctrl-C while it recorded)
        gave_up = True
        raise
    finally:
        pool.shutdown(wait=not gave_up, cancel_futures=gave_up)


def _finished(finished: queue.SimpleQueue[Future[T]], timeout: float) -> list[Future[T]]:
    """The futures that completed: waits up to `timeout` for the first, takes every other one
    already there (none: the timeout passed first)."""
    try:
        done = [finished.get(timeout=timeout)]
    except queue.Empty:
        return []
    while True:
        try:
            done.append(finished.get_nowait())
        except queue.Empty:
            return done


def map_cancellable(
    work: Callable[[str], T],
    hosts: Sequence[str],
    *,
    limit: int,
    cancellation: Cancellation,
    on_cancel: Callable[[Sequence[str]], None] = lambda _: None,
) -> dict[str, T]:
    """The result holds the hosts started before the cancel, in selection order."""
    results: dict[str, T] = {}
    for name, future in _bounded(list(hosts), max(1, limit), work, cancellation, on_cancel):
        results[name] = future.result()
    return {name: results[name] for name in hosts if name in results}


def one_batch(hosts: Sequence[str], in_flight: int | None) -> tuple[Batch, ...]:
    """Every host in one batch, `in_flight` at a time (None: all at once)."""
    if not hosts:
        return ()
    limit = len(hosts) if in_flight is None else max(1, min(in_flight, len(hosts)))
    return (Batch(tuple(hosts), False, limit),)


def map_hosts(work: Callable[[str], T], hosts: Sequence[str], *, limit: int) -> dict[str, T]:
    """For what has no fleet policy: `work` returns a host's problem as a value."""
    return map_cancellable(work, hosts, limit=min(limit, len(hosts)), cancellation=Cancellation())
