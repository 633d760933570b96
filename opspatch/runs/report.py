"""What a run reports: every host's outcome with its steps, and the run's exit code.

These values are the contract between the runs and everything that shows them: the CLI prints
them as a table or as the JSON documented in docs/cli.md (`RunReport.to_json`), and the ledger
records each host's outcome. A run raises only for bad input before anything changed; a host
that fails is an outcome in the report, never an exception: partial failure is normal.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING, Any

from opspatch.core.jsonrecord import NOT_WRITTEN, JsonRecord, json_field, record_to_json
from opspatch.core.vocabulary import (
    FAILED_OUTCOMES,
    Outcome,
    Rotation,
    RunOutcome,
    SetState,
    StepStatus,
)
from opspatch.errors import EXIT_BAD_INPUT, EXIT_HOST_FAILED, EXIT_NEEDS_ATTENTION, EXIT_OK

if TYPE_CHECKING:
    from opspatch.hosts.engine import SmokeResult


@dataclass(frozen=True)
class StepResult(JsonRecord):
    """One step on one host: its name, status, duration, what it did (or why it failed), and who
    it ran as on the host."""

    step: str
    status: StepStatus
    seconds: float = json_field(encode=lambda seconds: round(seconds, 3))
    detail: str = ""
    ran_as: tuple[str, ...] = ()
    """The users the step's execs ran as (`svc (sudo)` when raised); empty for a step that
    reached no host."""


@dataclass(frozen=True)
class SetFile(JsonRecord):
    """One file of a patch set on a host: the pre- and post-image its change was planned (or
    recorded) with, and the bytes it holds when the host's outcome is decided."""

    path: str
    pre_sha256: str = json_field(key="sha256_pre")
    post_sha256: str = json_field(key="sha256_post")
    live_sha256: str | None = json_field(key="sha256_live")

    @property
    def is_new(self) -> bool:
        return self.live_sha256 == self.post_sha256

    @property
    def is_old(self) -> bool:
        return self.live_sha256 == self.pre_sha256

    @property
    def standing(self) -> str:
        """`new`, `old` or `changed`."""
        return "new" if self.is_new else "old" if self.is_old else "changed"

    def to_json(self) -> dict[str, Any]:
        return {**record_to_json(self), "standing": self.standing}  # derived, so written here


def set_state(files: tuple[SetFile, ...]) -> SetState:
    """Where a set's files stand together: all new, all old, partly applied, or changed."""
    if all(f.is_new for f in files):
        return SetState.ALL_NEW
    if all(f.is_old for f in files):
        return SetState.ALL_OLD
    if all(f.is_new or f.is_old for f in files):
        return SetState.PARTLY_APPLIED
    return SetState.CHANGED


@dataclass(frozen=True)
class FileChange(JsonRecord):
    """The file a host's run was about, with its sha256 before and after (equal: unchanged).

    For a patch set, `set_files` holds every file of the set (this one, the set's first, too):
    the JSON and the ledger's host outcome then say where the set stands (`set.state`)."""

    path: str
    sha256_before: str | None
    sha256_after: str | None
    set_files: tuple[SetFile, ...] = field(default=(), metadata=NOT_WRITTEN)

    @property
    def set_state(self) -> SetState | None:
        return set_state(self.set_files) if self.set_files else None

    def paths(self) -> tuple[str, ...]:
        """Every file this change is about (one, or a set's)."""
        return tuple(f.path for f in self.set_files) or (self.path,)

    def to_json(self) -> dict[str, Any]:
        data = record_to_json(self)
        if self.set_files:  # reshaped: a set's state beside its files, only for a set
            data["set"] = {
                "state": str(self.set_state),
                "files": [f.to_json() for f in self.set_files],
            }
        return data


@dataclass(frozen=True)
class HostOutcome(JsonRecord):
    """One host's result: what happened, why, the file's hashes, and every step with timing.

    `error` says why a host did not reach the goal; `note` says something the operator should
    know although the host did (the smoke after a restore failed, a baseline could not be taken).
    """

    host: str
    outcome: Outcome
    error: str | None = None
    _: KW_ONLY
    note: str | None = None
    file: FileChange | None = None
    steps: tuple[StepResult, ...] = ()
    diff: str | None = json_field(default=None, omit_none=True)
    smoke: SmokeResult | None = json_field(default=None, omit_none=True)
    rotation: Rotation | None = json_field(default=None, omit_none=True)
    """Behind a router: whether the host takes traffic at the end (None: no router)."""


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
class RunReport(JsonRecord):
    """A whole run: every host's outcome, whether the fleet policy halted, and the run's exit."""

    run_id: str | None
    command: str
    patch: str | None
    _: KW_ONLY
    outcome: RunOutcome = field(init=False)
    dry_run: bool = False
    refused: bool = False
    halted: str | None = None
    hosts: tuple[HostOutcome, ...]

    def __post_init__(self) -> None:
        # Derived, so that it is written in its place among the keys (jsonrecord: init=False).
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
