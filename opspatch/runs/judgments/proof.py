"""Whether bytes a run wrote on a host were proven, from the ledger alone, and the sentence saying
so."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from opspatch.core.filechange import FileChange
from opspatch.core.host import Host
from opspatch.core.remedy import remedy_text
from opspatch.core.vocabulary import Command, Outcome, RunStatus, Step, StepStatus
from opspatch.errors import InputError
from opspatch.ledger.records import StepRecord
from opspatch.ledger.store import FileVersion, Ledger
from opspatch.runs.judgments.units import recover_remedy, target_of

_CONCLUDES_NOTHING = frozenset(
    {
        Outcome.SKIPPED,
        Outcome.UNLOCKED,
        Outcome.ALREADY_APPLIED,
        Outcome.WOULD_APPLY,
        Outcome.STAGED_BACK,
    }
)
"""Outcomes that say nothing of a proof (a rollback that put these bytes back without a restart
leaves it to the server's age)."""

_SMOKE_TESTED = frozenset({Outcome.APPLIED, Outcome.RESTORED})
"""An apply's, and a later patch's rollback that restored and smoke-tested these bytes."""


@dataclass(frozen=True)
class ChangeProof:
    """Only a smoke proves: an `applied` said without one (an `adopt`'s) borrows the proof of the
    `applied` before it, or has none."""

    host: str
    version: FileVersion
    writer: RunStatus | None
    proven_by: str | None
    staged_by: str | None
    last_word: tuple[str, Outcome] | None

    @property
    def proven(self) -> bool:
        return self.proven_by is not None


def change_proof(ledger: Ledger, host: str, version: FileVersion) -> ChangeProof:
    said = [
        (run_id, outcome)
        for run_id, outcome, change in ledger.outcomes_since((host, version.host), version.event_id)
        if outcome not in _CONCLUDES_NOTHING and (change is None or _about(change, version))
    ]
    try:
        writer = ledger.get_run(version.run_id)
    except InputError:
        writer = None
    status = RunStatus(writer.summary.status) if writer is not None else None
    proven_by = staged_by = None
    names = (host, version.host)
    if said and said[-1][1] in _SMOKE_TESTED:
        proven_by = _smoke_tested(ledger, said, names, version.event_id)
    elif said and said[-1][1] == Outcome.STAGED:
        staged_by = said[-1][0]
    elif not said and writer is not None:
        try:
            steps = writer.host(host).steps
        except KeyError:
            steps = ()
        if _smoke_passed(steps, version.event_id):
            proven_by = version.run_id  # its smoke passed; it recorded no outcome after it
    return ChangeProof(host, version, status, proven_by, staged_by, said[-1] if said else None)


def _smoke_tested(
    ledger: Ledger, said: list[tuple[str, Outcome]], names: tuple[str, ...], event_id: int
) -> str | None:
    for run_id, outcome in reversed(said):
        if outcome not in _SMOKE_TESTED:
            return None
        try:
            run = ledger.get_run(run_id)
        except InputError:
            continue
        if _smoke_passed([s for r in run.hosts if r.host in names for s in r.steps], event_id):
            return run_id
    return None


def _smoke_passed(steps: Sequence[StepRecord], event_id: int) -> bool:
    """Whether a smoke decode passed among `steps` after the event `event_id` (the write)."""
    return any(
        s.step == Step.SMOKE and s.status == StepStatus.OK and s.event_id > event_id for s in steps
    )


def _about(change: FileChange, version: FileVersion) -> bool:
    if change.path == version.path and change.sha256_after == version.sha256_after:
        return True
    return any(
        m.path == version.path and m.live_sha256 == version.sha256_after for m in change.set_files
    )


def describe(proof: ChangeProof, host: Host) -> str:
    """Its remedies name `host`'s group, its unit for a node of one."""
    run = proof.version.run_id
    if proof.proven_by is not None:
        if proof.proven_by != run:
            return f"written by run {run}, proven by run {proof.proven_by}'s smoke decode"
        if proof.last_word is None:
            cut = (
                " before it was interrupted"
                if proof.writer in (RunStatus.INTERRUPTED, RunStatus.RECOVERED)
                else ""
            )
            return (
                f"written by run {run} and proven by its smoke decode{cut} (the run recorded no "
                "outcome here)"
            )
        return f"as written by run {run}, proven by its smoke decode"
    if proof.staged_by is not None:
        restart = remedy_text(Command.RESTART, hosts=target_of(host))
        return (
            f"staged by run {proof.staged_by}: `{restart}` restarts, proves and (on failure) "
            "rolls it back"
        )
    if proof.last_word is None:
        why = f"run {run} recorded no outcome here (interrupted, or still running)"
    elif proof.last_word[1] == Outcome.APPLIED:  # said without a smoke decode (an adopt's)
        why = f"run {proof.last_word[0]} recorded it applied, but no smoke decode ran on it"
    else:
        why = f"run {proof.last_word[0]} ended {proof.last_word[1]} here"
    return (
        f"written by run {run} but never proven ({why}); the server may still run the "
        f"old code: `{recover_remedy(host)}` finishes or undoes it"
    )
