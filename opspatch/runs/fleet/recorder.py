"""Where a run's records go, in one object: the ledger under the run's id, or nowhere."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Protocol, TypeVar

from opspatch.core.hostfacts import HostFacts
from opspatch.core.vocabulary import RunStatus, Step, StepStatus
from opspatch.errors import LedgerError, OpspatchError
from opspatch.ledger.records import LeaseGrant, LeaseHolder, NewFileVersion, StepRecord
from opspatch.ledger.store import Ledger
from opspatch.runs.report import HostOutcome, RunReport

T = TypeVar("T")

DETAIL_LIMIT = 2000
"""Characters of a step's detail kept in the ledger (a log tail can be long)."""


class Recorder(Protocol):
    """What a run records, and the one id its records and host locks carry."""

    @property
    def run_id(self) -> str:
        """The id this run's records and host locks carry."""

    @property
    def reported_run_id(self) -> str | None:
        """The run id its report names: None for a run nothing recorded (a dry run)."""

    def step(
        self, host: str, step: Step, status: StepStatus, seconds: float | None, detail: str
    ) -> None:
        """A step's `started` or its end, with timing and what it did (cut to `DETAIL_LIMIT`)."""

    def facts(self, host: str, facts: HostFacts) -> None:
        """What a host runs (its machine id among it: later lookups by machine find the run)."""

    def file_version(self, host: str, version: NewFileVersion) -> None:
        """Before the host is touched; a restore's pre-image is the ledger's own (`pre_image` None)."""

    def outcome(self, outcome: HostOutcome) -> None:
        """A host's outcome, as soon as it is decided (a later one supersedes it)."""

    def stored_image(self, sha256: str) -> bytes | None:
        """None when this run has no ledger; raises when the ledger has no such bytes or they were
        altered."""

    def run_status(self, run_id: str) -> RunStatus | None:
        """The status of another run of this ledger; None when it knows no such run."""

    def host_steps(self, host: str, steps: Collection[Step]) -> list[tuple[str, StepRecord]]:
        """Newest first; none when this run has no ledger."""

    def take_leases(
        self, identities: Mapping[str, str], expires_after: float, taking_over: Collection[str]
    ) -> LeaseGrant:
        """Nothing taken when a live lease of another run (not of `taking_over`) holds one."""

    def renew_leases(self) -> int:
        """A heartbeat; how many leases this run still holds."""

    def give_back_leases(self) -> None:
        """Give back every lease this run holds (recorded while the run is open)."""

    def leases_of(self, run_ids: Sequence[str]) -> list[LeaseHolder]:
        """The leases the runs hold, live or expired."""


class LedgerRecorder:
    """The first record that fails is kept (`fault`) and raised again by every later one."""

    def __init__(self, ledger: Ledger, run_id: str) -> None:
        self.ledger = ledger
        self._run_id = run_id
        self.finished = False
        self.fault: LedgerError | None = None

    def _record(self, write: Callable[[], T]) -> T:
        if self.fault is not None:
            raise self.fault.with_traceback(None)
        try:
            return write()
        except LedgerError as exc:
            self.fault = exc
            raise

    @property
    def run_id(self) -> str:
        return self._run_id

    @property
    def reported_run_id(self) -> str | None:
        return self._run_id

    def step(
        self, host: str, step: Step, status: StepStatus, seconds: float | None, detail: str
    ) -> None:
        self._record(
            lambda: self.ledger.record_step(
                self._run_id, host, step, status, seconds, detail[:DETAIL_LIMIT]
            )
        )

    def facts(self, host: str, facts: HostFacts) -> None:
        self._record(lambda: self.ledger.record_facts(self._run_id, host, facts))

    def file_version(self, host: str, version: NewFileVersion) -> None:
        self._record(lambda: self.ledger.record_file_version(self._run_id, host, version))

    def outcome(self, outcome: HostOutcome) -> None:
        self._record(
            lambda: self.ledger.record_host_outcome(
                self._run_id,
                outcome.host,
                outcome.outcome,
                outcome.error,
                outcome.file,
                reason=outcome.reason,
            )
        )

    def stored_image(self, sha256: str) -> bytes | None:
        return self.ledger.blob(sha256)

    def run_status(self, run_id: str) -> RunStatus | None:
        try:
            return RunStatus(self.ledger.get_run(run_id).summary.status)
        except OpspatchError:
            return None  # not a run of this ledger: it may be alive on another controller

    def host_steps(self, host: str, steps: Collection[Step]) -> list[tuple[str, StepRecord]]:
        return self.ledger.host_steps(host, steps)

    def take_leases(
        self, identities: Mapping[str, str], expires_after: float, taking_over: Collection[str]
    ) -> LeaseGrant:
        return self._record(
            lambda: self.ledger.take_leases(
                self._run_id, identities, expires_after=expires_after, taking_over=taking_over
            )
        )

    def renew_leases(self) -> int:
        # Not a record: the heartbeat tries again and says when the ledger is gone for long.
        return self.ledger.renew_leases(self._run_id)

    def give_back_leases(self) -> None:
        self._record(lambda: self.ledger.give_back_leases(self._run_id))

    def leases_of(self, run_ids: Sequence[str]) -> list[LeaseHolder]:
        return self.ledger.leases_of(run_ids)

    def finish(self, report: RunReport) -> RunReport:
        """Record the run's outcome (the first time only) and return `report`."""
        if not self.finished:
            self._record(lambda: self.ledger.finish_run(self._run_id, report.outcome))
            self.finished = True
        return report


class NullRecorder:
    """A run that changes nothing records nothing and takes no lock, so it has no run id."""

    @property
    def run_id(self) -> str:
        # A bug, not an input: only a run that changes hosts takes locks, and it is recorded.
        raise RuntimeError("a run that records nothing takes no host lock")

    @property
    def reported_run_id(self) -> str | None:
        return None

    def step(
        self, host: str, step: Step, status: StepStatus, seconds: float | None, detail: str
    ) -> None:
        return None

    def facts(self, host: str, facts: HostFacts) -> None:
        return None

    def file_version(self, host: str, version: NewFileVersion) -> None:
        return None

    def outcome(self, outcome: HostOutcome) -> None:
        return None

    def stored_image(self, sha256: str) -> bytes | None:
        return None

    def run_status(self, run_id: str) -> RunStatus | None:
        return None

    def host_steps(self, host: str, steps: Collection[Step]) -> list[tuple[str, StepRecord]]:
        return []

    def take_leases(
        self, identities: Mapping[str, str], expires_after: float, taking_over: Collection[str]
    ) -> LeaseGrant:
        return LeaseGrant()  # a run that changes nothing keeps no one off the hosts

    def renew_leases(self) -> int:
        return 0

    def give_back_leases(self) -> None:
        return None

    def leases_of(self, run_ids: Sequence[str]) -> list[LeaseHolder]:
        return []
