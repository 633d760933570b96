"""What a run reports: every host's outcome with its steps, and the run's exit code."""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING

from opspatch.core.codec import AnyRecord, Record, json_field

# the file of a host's outcome lives in core, since the ledger records it too: re-exported here
from opspatch.core.filechange import FileChange as FileChange
from opspatch.core.filechange import SetFile as SetFile
from opspatch.core.reasons import Reason
from opspatch.core.verdicts import Judgment
from opspatch.core.vocabulary import (
    FAILED_OUTCOMES,
    Command,
    Outcome,
    Rotation,
    RunOutcome,
    Step,
    StepStatus,
)
from opspatch.errors import EXIT_BAD_INPUT, EXIT_HOST_FAILED, EXIT_NEEDS_ATTENTION, EXIT_OK

if TYPE_CHECKING:
    from opspatch.hosts.engine import SmokeResult
else:
    SmokeResult = AnyRecord  # hosts.engine is off `apply --file`'s import path


def join_notes(*notes: str | None) -> str | None:
    """The notes given, in order, as one ("; "); None when none is."""
    return "; ".join(n for n in notes if n) or None


@dataclass(frozen=True)
class StepResult(Record):
    """One step on one host: its name, status, duration, what it did (or why it failed), and who
    it ran as on the host."""

    step: Step
    status: StepStatus
    seconds: float = json_field(encode=lambda seconds: round(seconds, 3))
    detail: str = ""
    ran_as: tuple[str, ...] = ()
    """The users the step's execs ran as (`svc (sudo)` when raised); empty for a step that
    reached no host."""


@dataclass(frozen=True)
class HostOutcome(Record):
    """One host's result: what happened, why, the file's hashes, and every step with timing.

    `error` says why a host did not reach the goal, `reason` the same as a code; `note` says
    something the operator should know although the host did (the smoke after a restore failed,
    a baseline could not be taken).
    """

    host: str
    outcome: Outcome
    error: str | None = None
    _: KW_ONLY
    reason: Reason | None = json_field(default=None, omit_none=True)
    note: str | None = None
    file: FileChange | None = None
    steps: tuple[StepResult, ...] = ()
    diff: str | None = json_field(default=None, omit_none=True)
    smoke: SmokeResult | None = json_field(default=None, omit_none=True)
    rotation: Rotation | None = json_field(default=None, omit_none=True)
    """Behind a router: whether the host takes traffic at the end (None: no router)."""
    judgment: Judgment | None = json_field(default=None, omit_none=True)
    """The judge's verdict and figures, on a host the playbook's judge proved."""


CHANGED_OUTCOMES = frozenset(
    {
        Outcome.APPLIED,
        Outcome.STAGED,
        Outcome.RESTORED,
        Outcome.STAGED_BACK,
        Outcome.UNLOCKED,
        Outcome.ROLLED_BACK,
    }
)
"""Host outcomes of a run that changed something on the host (a file, a server, a lock)."""

_RUN_OUTCOME_BY_EXIT = {
    EXIT_OK: RunOutcome.OK,
    EXIT_HOST_FAILED: RunOutcome.FAILED,
    EXIT_BAD_INPUT: RunOutcome.REFUSED,
    EXIT_NEEDS_ATTENTION: RunOutcome.NEEDS_ATTENTION,
}


@dataclass(frozen=True)
class RunReport(Record):
    """A whole run: every host's outcome, whether the fleet policy halted, and the run's exit."""

    run_id: str | None
    command: Command
    patch: str | None
    _: KW_ONLY
    outcome: RunOutcome = field(init=False)
    dry_run: bool = False
    refused: bool = False
    halted: str | None = None
    hosts: tuple[HostOutcome, ...]

    def __post_init__(self) -> None:
        # Derived, so that it is written in its place among the keys (codec: init=False).
        object.__setattr__(self, "outcome", _RUN_OUTCOME_BY_EXIT[self.exit_code])

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
