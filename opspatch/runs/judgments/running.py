"""What code a running server runs: its file's bytes when it started, changed by live fixes since."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from opspatch.core.vocabulary import Step, StepStatus
from opspatch.hosts.results import RemoteFile, ServerProcess
from opspatch.ledger.store import FileVersion, StepRecord

STARTS = frozenset({Step.RESTART, Step.RESTART_AFTER_RESTORE, Step.START, Step.START_AFTER_RESTORE})
"""The steps that start a host's engine: the running server started at or after the last one."""

SERVER_STEPS = STARTS | {Step.SWAP, Step.LIVE, Step.LIVE_REVERT, Step.LIVE_READBACK}
"""The steps `stale` reads of a host (a run's swap tells its live takes from its checks; a
`live-readback` after its run's revert confirms it or not)."""


@dataclass(frozen=True)
class LiveChange:
    run_id: str
    step: Step
    event_id: int
    at: float
    """Epoch seconds (the controller's clock)."""
    ok: bool


def epoch(recorded_at: str) -> float:
    """A ledger time (`2026-12-06T13:55:00.123456Z`, UTC) in epoch seconds."""
    return datetime.fromisoformat(recorded_at.replace("Z", "+00:00")).timestamp()


def live_changes(steps: Sequence[tuple[str, StepRecord]]) -> list[LiveChange]:
    """Oldest first: every `live-revert` and each `live-readback` after its own run's revert (a
    node that still lists the fix: the revert did not happen), and every `live` after its own
    run's swap (one before its swap only checked or listed). Pure."""
    swapped: set[str] = set()
    reverting: set[str] = set()
    found: list[LiveChange] = []
    for run, step in _ended(steps):
        if step.step == Step.SWAP:
            swapped.add(run)
            continue
        if step.step == Step.LIVE_REVERT:
            reverting.add(run)
        if (
            step.step == Step.LIVE_REVERT
            or (step.step == Step.LIVE_READBACK and run in reverting)
            or (step.step == Step.LIVE and run in swapped)
        ):
            ok = step.status == StepStatus.OK
            found.append(LiveChange(run, step.step, step.event_id, epoch(step.recorded_at), ok))
    return found


def last_start(steps: Sequence[tuple[str, StepRecord]]) -> int | None:
    """The event id of the last engine start recorded `ok` among a host's steps (None: none)."""
    starts = [
        s.event_id for _, s in _ended(steps) if s.step in STARTS and s.status == StepStatus.OK
    ]
    return starts[-1] if starts else None


def _ended(steps: Sequence[tuple[str, StepRecord]]) -> list[tuple[str, StepRecord]]:
    ended = [(run, s) for run, s in steps if s.status != StepStatus.STARTED]
    return sorted(ended, key=lambda item: item[1].event_id)


def running_sha256(
    started_at: float, history: Sequence[FileVersion], steps: Sequence[tuple[str, StepRecord]]
) -> str | None:
    """The bytes of the newest version written before the server started, then of each run that took
    or reverted a live fix since (a failed revert changes nothing); None: it cannot tell. Pure."""
    started = last_start(steps) or 0

    def before(event_id: int, recorded_at: float) -> bool:
        return event_id < started or recorded_at < started_at

    versions = sorted(history, key=lambda v: v.event_id)
    at_start = [v for v in versions if before(v.event_id, epoch(v.recorded_at))]
    runs = at_start[-1].sha256_after if at_start else None
    if not at_start and versions:
        runs = versions[0].sha256_before
    wrote = {v.run_id: v.sha256_after for v in versions}
    since: dict[str, list[LiveChange]] = {}
    for change in live_changes(steps):
        if not before(change.event_id, change.at):
            since.setdefault(change.run_id, []).append(change)
    for run, changes in sorted(since.items(), key=lambda item: item[1][-1].event_id):
        reverted = all(c.ok for c in changes if c.step != Step.LIVE)  # and read back
        if changes[-1].ok and reverted:  # a failed take is reverted after: ok when that is
            runs = wrote.get(run)
    return runs


def stale(
    server: ServerProcess | None,
    file: RemoteFile,
    history: Sequence[FileVersion],
    steps: Sequence[tuple[str, StepRecord]],
) -> bool:
    """Started before the file last changed, and not since made to run these bytes live. Pure."""
    if server is None or server.started_at is None or not server.predates(file):
        return False
    return running_sha256(server.started_at, history, steps) != file.sha256
