"""Where a run's records go, in one object: the ledger under the run's id, or nowhere."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TypeVar

from opspatch.core.hostfacts import HostFacts
from opspatch.core.vocabulary import RunStatus, Step, StepStatus
from opspatch.errors import LedgerError, OpspatchError
from opspatch.ledger.records import LeaseGrant, LeaseHolder, NewFileVersion, StepRecord
from opspatch.ledger.store import Ledger
from opspatch.runs.report import HostOutcome, RunReport

T = TypeVar("T")

DETAIL_LIMIT = 2000
"""Characters of a step's detail kept in the ledger (a log tail can be long)."""


class Recorder:
    """A run's records, under `run_id` in `ledger` (`NullRecorder`: none). The first record that
    fails is kept (`fault`) and raised again by every later one."""

    def __init__(self, ledger: Ledger | None, run_id: str | None) -> None:
        self.ledger = ledger
        self._run_id = run_id
        self.finished = False
        self.fault: LedgerError | None = None

    def _record(self, write: Callable[[Ledger, str], T], nothing: T) -> T:
        if self.ledger is None or self._run_id is None:
            return nothing
        if self.fault is not None:
            raise self.fault.with_traceback(None)
        try:
            return write(self.ledger, self._run_id)
        except LedgerError as exc:
            self.fault = exc
            raise

    def _read(self, read: Callable[[Ledger], T], nothing: T) -> T:
        return nothing if self.ledger is None else read(self.ledger)

    @property
    def run_id(self) -> str:
        """The id this run's records and host locks carry."""
        if self._run_id is None:  # a bug, not an input: only a recorded run takes host locks
            raise RuntimeError("a run that records nothing takes no host lock")
        return self._run_id

    @property
    def reported_run_id(self) -> str | None:
        """None for a run nothing recorded (a dry run)."""
        return self._run_id

    def step(
        self, host: str, step: Step, status: StepStatus, seconds: float | None, detail: str
    ) -> None:
        cut = detail[:DETAIL_LIMIT]
        self._record(
            lambda ledger, run: ledger.record_step(run, host, step, status, seconds, cut), None
        )

    def facts(self, host: str, facts: HostFacts) -> None:
        """Its machine id among them: later lookups by machine find the run."""
        self._record(lambda ledger, run: ledger.record_facts(run, host, facts), None)

    def file_version(self, host: str, version: NewFileVersion) -> None:
        """Before the host is touched; a restore's pre-image is the ledger's own (`pre_image` None)."""
        self._record(lambda ledger, run: ledger.record_file_version(run, host, version), None)

    def outcome(self, outcome: HostOutcome) -> None:
        """As soon as it is decided (a later one supersedes it)."""
        self._record(
            lambda ledger, run: ledger.record_host_outcome(
                run,
                outcome.host,
                outcome.outcome,
                outcome.error,
                outcome.file,
                reason=outcome.reason,
            ),
            None,
        )

    def stored_image(self, sha256: str) -> bytes | None:
        """Raises when the ledger has no such bytes or they were altered."""
        return self._read(lambda ledger: ledger.blob(sha256), None)

    def run_status(self, run_id: str) -> RunStatus | None:
        try:
            return self._read(lambda ledger: RunStatus(ledger.get_run(run_id).summary.status), None)
        except OpspatchError:
            return None  # not a run of this ledger: it may be alive on another controller

    def host_steps(self, host: str, steps: Collection[Step]) -> list[tuple[str, StepRecord]]:
        """Newest first."""
        return self._read(lambda ledger: ledger.host_steps(host, steps), [])

    def take_leases(
        self, identities: Mapping[str, str], expires_after: float, taking_over: Collection[str]
    ) -> LeaseGrant:
        """Nothing taken when a live lease of another run (not of `taking_over`) holds one; a run
        that records nothing keeps no one off the hosts."""
        return self._record(
            lambda ledger, run: ledger.take_leases(
                run, identities, expires_after=expires_after, taking_over=taking_over
            ),
            LeaseGrant(),
        )

    def renew_leases(self) -> int:
        """How many leases this run still holds. Not a record: the heartbeat tries again and says
        when the ledger is gone for long."""
        return self._read(lambda ledger: ledger.renew_leases(self.run_id), 0)

    def give_back_leases(self) -> None:
        self._record(lambda ledger, run: ledger.give_back_leases(run), None)

    def leases_of(self, run_ids: Sequence[str]) -> list[LeaseHolder]:
        return self._read(lambda ledger: ledger.leases_of(run_ids), [])

    def finish(self, report: RunReport) -> RunReport:
        """Record the run's outcome (the first time only) and return `report`."""
        if not self.finished:
            self._record(lambda ledger, run: ledger.finish_run(run, report.outcome), None)
            self.finished = True
        return report


class NullRecorder(Recorder):
    """A run that changes nothing (a dry run, a smoke) records nothing and takes no lock."""

    def __init__(self) -> None:
        super().__init__(None, None)
