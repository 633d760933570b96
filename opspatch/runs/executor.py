"""The fleet executor: one function per host, over batches, a bounded number at a time.

Apply, rollback and recover all run through `run_fleet`: batches in order (canaries first for an
apply; one batch for a restore), at most `in_flight` hosts of a batch at once on a bounded thread
pool (never a thread per host), each host's outcome handed to `on_outcome` as soon as it is known
(the ledger records it then, so a killed controller loses nothing already decided), and after
each outcome the halt policy decides whether to start more hosts. Hosts that were not started are
returned by name, for the caller to report with the halt's reason.

Cancellation: the first Ctrl-C stops starting hosts and waits for the running ones to finish
their pipeline (each ends applied or restored; abandoning a host between its swap and its smoke
would leave it unproven); a second Ctrl-C gives up waiting (the run is then interrupted, and
`opspatch recover` finishes it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TypeVar

from opspatch.core.policy import Batch
from opspatch.core.vocabulary import Outcome
from opspatch.runs.report import HostOutcome

CANCELLED = "cancelled by the operator (Ctrl-C); hosts already started were finished"

T = TypeVar("T")

HostWork = Callable[[str], HostOutcome]
"""What is done to one host (by name); returns its outcome and never raises for a host failure."""

HaltPolicy = Callable[[Mapping[str, HostOutcome]], "str | None"]
"""Given every outcome so far, why the run must stop starting hosts (None: go on)."""


@dataclass(frozen=True)
class FleetResult:
    """What the executor did: the outcome of every host it ran, why it halted, and the hosts it
    never started (in batch order)."""

    outcomes: dict[str, HostOutcome]
    halted: str | None
    not_started: tuple[str, ...]


def halt_on_attention(outcomes: Mapping[str, HostOutcome]) -> str | None:
    """The restore runs' policy: a host that needs attention stops the run (its state is
    unknown, so touching more hosts the same way could spread the problem)."""
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
) -> FleetResult:
    """Run `work` for every host of `batches` under the halt policy.

    `already` holds outcomes decided before the run (e.g. hosts refused in preflight): they
    count for the halt policy but are not run, recorded or returned again.
    """
    decided: dict[str, HostOutcome] = dict(already or {})
    outcomes: dict[str, HostOutcome] = {}
    halted = halt(decided) if decided else None
    not_started: list[str] = []
    cancelled = False
    for batch in batches:
        pending = [name for name in batch.hosts if name not in decided]
        if halted:
            not_started.extend(pending)
            continue
        in_flight = max(1, batch.in_flight)
        with ThreadPoolExecutor(max_workers=in_flight, thread_name_prefix="host") as pool:
            running: dict[Future[HostOutcome], str] = {}
            while pending or running:
                while pending and len(running) < in_flight and not halted:
                    name = pending.pop(0)
                    running[pool.submit(work, name)] = name
                if not running:
                    break
                try:
                    done, _ = wait(list(running), return_when=FIRST_COMPLETED)
                except KeyboardInterrupt:
                    if cancelled:
                        raise
                    cancelled = True
                    halted = CANCELLED
                    continue
                for future in done:
                    name = running.pop(future)
                    try:
                        outcome = future.result()
                    except Exception as exc:  # a bug must not lose the other hosts' outcomes
                        outcome = HostOutcome(
                            name,
                            Outcome.NEEDS_ATTENTION,
                            f"internal error: {type(exc).__name__}: {exc}",
                        )
                    outcomes[name] = decided[name] = outcome
                    on_outcome(outcome)
                    halted = halted or halt(decided)
                if halted:
                    not_started.extend(pending)
                    pending.clear()
    return FleetResult(outcomes, halted, tuple(not_started))


def one_batch(hosts: Sequence[str], in_flight: int | None) -> tuple[Batch, ...]:
    """Every host in one batch, `in_flight` at a time (None: all at once)."""
    if not hosts:
        return ()
    limit = len(hosts) if in_flight is None else max(1, min(in_flight, len(hosts)))
    return (Batch(tuple(hosts), False, limit),)


def map_hosts(work: Callable[[str], T], hosts: Sequence[str], *, limit: int) -> dict[str, T]:
    """`work` on every host, at most `limit` at once, results by host name in selection order.

    For what has no fleet policy (preflight inspections, status): every host is visited.
    `work` must not raise for a host-level problem (return it as a value).
    """
    if not hosts:
        return {}
    with ThreadPoolExecutor(
        max_workers=max(1, min(limit, len(hosts))), thread_name_prefix="host"
    ) as pool:
        return dict(zip(hosts, pool.map(work, hosts), strict=True))
