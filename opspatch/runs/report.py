"""What a run reports: every host's outcome with its steps, and the run's exit code.

These values are the contract between the runs and everything that shows them: the CLI prints
them as a table or as the JSON documented in the README (`RunReport.to_json`), and the ledger
records each host's outcome. A run raises only for bad input before anything changed; a host
that fails is an outcome in the report, never an exception (style.md, "partial failure is
normal").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opspatch.core.vocabulary import FAILED_OUTCOMES, Outcome, Rotation, RunOutcome, StepStatus
from opspatch.errors import EXIT_BAD_INPUT, EXIT_HOST_FAILED, EXIT_NEEDS_ATTENTION, EXIT_OK

if TYPE_CHECKING:
    from opspatch.hosts.engine import SmokeResult


@dataclass(frozen=True)
class StepResult:
    """One step on one host: its name, status, duration, what it did (or why it failed), and who
    it ran as on the host."""

    step: str
    status: StepStatus
    seconds: float
    detail: str = ""
    ran_as: tuple[str, ...] = ()
    """The users the step's execs ran as (`svc (sudo)` when raised); empty for a step that
    reached no host."""

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "status": str(self.status),
            "seconds": round(self.seconds, 3),
            "detail": self.detail,
            "ran_as": list(self.ran_as),
        }


@dataclass(frozen=True)
class FileChange:
    """The file a host's run was about, with its sha256 before and after (equal: unchanged)."""

    path: str
    sha256_before: str | None
    sha256_after: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "sha256_before": self.sha256_before,
            "sha256_after": self.sha256_after,
        }


@dataclass(frozen=True)
class HostOutcome:
    """One host's result: what happened, why, the file's hashes, and every step with timing.

    `error` says why a host did not reach the goal; `note` says something the operator should
    know although the host did (the smoke after a restore failed, a baseline could not be taken).
    """

    host: str
    outcome: Outcome
    error: str | None = None
    file: FileChange | None = None
    steps: tuple[StepResult, ...] = ()
    diff: str | None = None
    smoke: SmokeResult | None = None
    note: str | None = None
    rotation: Rotation | None = None
    """Behind a router: whether the host takes traffic at the end (None: no router)."""

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "host": self.host,
            "outcome": str(self.outcome),
            "error": self.error,
            "note": self.note,
            "file": self.file.to_json() if self.file else None,
            "steps": [s.to_json() for s in self.steps],
        }
        if self.diff is not None:
            data["diff"] = self.diff
        if self.smoke is not None:
            data["smoke"] = self.smoke.to_json()
        if self.rotation is not None:
            data["rotation"] = str(self.rotation)
        return data


CHANGED_OUTCOMES = frozenset(
    {Outcome.APPLIED, Outcome.STAGED, Outcome.RESTORED, Outcome.UNLOCKED, Outcome.ROLLED_BACK}
)
"""Host outcomes of a run that changed something on the host (a file, a server, a lock)."""

_RUN_OUTCOME_BY_EXIT = {
    EXIT_OK: RunOutcome.OK,
    EXIT_HOST_FAILED: RunOutcome.FAILED,
    EXIT_BAD_INPUT: RunOutcome.REFUSED,
    EXIT_NEEDS_ATTENTION: RunOutcome.NEEDS_ATTENTION,
}


@dataclass(frozen=True)
class RunReport:
    """A whole run: every host's outcome, whether the fleet policy halted, and the run's exit."""

    run_id: str | None
    command: str
    patch: str | None
    hosts: tuple[HostOutcome, ...]
    halted: str | None = None
    dry_run: bool = False
    refused: bool = False

    @property
    def outcome(self) -> RunOutcome:
        return _RUN_OUTCOME_BY_EXIT[self.exit_code]

    @property
    def exit_code(self) -> int:
        """3 if a host needs attention; else 2 if the run was refused before any change; else 1
        if a host failed (`FAILED_OUTCOMES`: failed, rolled back, restored but not serving); else
        2 if a host was refused and no host was changed (nothing changed anywhere); else 1 if the
        run halted or a host did not reach the goal (a host changed beside it: "nothing was
        changed" would be false); else 0."""
        outcomes = {h.outcome for h in self.hosts}
        if Outcome.NEEDS_ATTENTION in outcomes:
            return EXIT_NEEDS_ATTENTION
        if self.refused:
            return EXIT_BAD_INPUT
        if outcomes & FAILED_OUTCOMES:
            return EXIT_HOST_FAILED
        refused_hosts = any(h.outcome == Outcome.SKIPPED and h.error for h in self.hosts)
        if refused_hosts and not outcomes & CHANGED_OUTCOMES:
            return EXIT_BAD_INPUT
        if self.halted or refused_hosts:
            return EXIT_HOST_FAILED
        return EXIT_OK

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "command": self.command,
            "patch": self.patch,
            "outcome": str(self.outcome),
            "dry_run": self.dry_run,
            "refused": self.refused,
            "halted": self.halted,
            "hosts": [h.to_json() for h in self.hosts],
        }
