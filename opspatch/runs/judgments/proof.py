"""Whether bytes a run wrote on a host were proven, from the ledger's facts alone, and the one
sentence that says so."""

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
"""Host outcomes that say nothing about whether a change is proven (nothing was done, the patch
was found already there and not restarted, or a later patch's rollback put these bytes back
without a restart: whether the server runs them is its age's to say, as for any staged file)."""

_SMOKE_TESTED = frozenset({Outcome.APPLIED, Outcome.RESTORED})
"""Host outcomes of runs that may have smoke-tested the bytes: an apply's, and a later patch's
rollback that restored them, restarted and decoded (`restored` is said only after its smoke)."""


@dataclass(frozen=True)
class ChangeProof:
    """What the ledger says about `version`'s bytes on `host` (the live file is those bytes).
    `proven_by`: the run whose smoke decode passed on them. Only a smoke proves: an `applied`
    said without one (an `adopt`'s) borrows the proof of the `applied` before it, or has none."""

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
    """The proof of `version`'s bytes on `host`, from the outcomes and steps recorded since.

    Raises:
        LedgerError: the ledger cannot be read.
    """
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
    """The newest run of the trailing `applied` (or `restored`) words whose smoke decode passed
    on the host after the change was written (None: none of them ran one)."""
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
    """Whether a host outcome's file is `version`'s bytes: its file, or (a patch set) any file
    of its set as the outcome left it."""
    if change.path == version.path and change.sha256_after == version.sha256_after:
        return True
    return any(
        m.path == version.path and m.live_sha256 == version.sha256_after for m in change.set_files
    )


def describe(proof: ChangeProof, host: Host) -> str:
    """The sentence `status` and `recover` say about a change on `host` (why it is, or is not,
    live); its remedies name `host`'s group, its unit for a node of one."""
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
