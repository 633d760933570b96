"""What a rehearsal reports (pure): each stage a patch went through on the real release, and the
exit code, read from the values the parts already return (the apply's host outcome, the probe)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from opspatch.core.codec import Record, json_field
from opspatch.core.vocabulary import RunOutcome, Step, StepStatus, Verdict, Word
from opspatch.errors import EXIT_BAD_INPUT, EXIT_HOST_FAILED, EXIT_NEEDS_ATTENTION, EXIT_OK
from opspatch.runs.report import HostOutcome, StepResult
from opspatch.sandbox.real.importprobe import NO_ANSWER, ProbeResult


class Stage(Word):
    """One stage of a rehearsal (the report's `stages[].stage`)."""

    RELEASE = "release"
    IMPORT = "import"
    BASELINE = "baseline"
    INSTALL = "install"
    START = "start"
    FIRST_DECODE = "first-decode"
    JUDGE = "judge"


class StageStatus(Word):
    """How a stage ended: `inconclusive` proved nothing either way (the release's own module
    does not import alone; the unpatched server failed the judge's prompts)."""

    PASSED = "passed"
    FAILED = "failed"
    INCONCLUSIVE = "inconclusive"
    NOT_REACHED = "not-reached"


@dataclass(frozen=True)
class StageResult(Record):
    stage: Stage
    status: StageStatus
    detail: str = ""
    seconds: float | None = json_field(
        default=None, encode=lambda s: None if s is None else round(s, 1)
    )


APPLY_STAGES: dict[Stage, tuple[Step, ...]] = {
    Stage.INSTALL: (Step.BACKUP, Step.SWAP),
    Stage.START: (Step.RESTART, Step.READY),
    Stage.FIRST_DECODE: (Step.SMOKE,),
    Stage.JUDGE: (Step.JUDGE,),
}
"""The apply's own steps behind each stage it proves (the restore's steps are not among them)."""


def _stage_of_steps(stage: Stage, steps: Sequence[StepResult]) -> StageResult:
    mine = [s for s in steps if s.step in APPLY_STAGES[stage]]
    if not mine:
        return StageResult(stage, StageStatus.NOT_REACHED)
    seconds = sum(s.seconds for s in mine)
    failed = next((s for s in mine if s.status == StepStatus.FAILED), None)
    if failed is not None:
        return StageResult(stage, StageStatus.FAILED, f"{failed.step}: {failed.detail}", seconds)
    return StageResult(stage, StageStatus.PASSED, mine[-1].detail, seconds)


def _judge_stage(outcome: HostOutcome) -> StageResult:
    stage = _stage_of_steps(Stage.JUDGE, outcome.steps)
    judgment = outcome.judgment
    if judgment is None or stage.status == StageStatus.NOT_REACHED:
        return stage
    if judgment.verdict == Verdict.NO_BASELINE and stage.status == StageStatus.PASSED:
        return StageResult(Stage.JUDGE, StageStatus.INCONCLUSIVE, judgment.summary(), stage.seconds)
    return StageResult(Stage.JUDGE, stage.status, judgment.summary(), stage.seconds)


def baseline_stage(started: str, seconds: float, outcome: HostOutcome | None) -> StageResult:
    """The unpatched server, started (`started` says how) and measured by the judge before the
    swap (the apply's `judge-baseline` step; its judgment says when it could not compare)."""
    measured = (
        next((s for s in outcome.steps if s.step == Step.JUDGE_BASELINE), None) if outcome else None
    )
    if outcome is None or measured is None:
        return StageResult(Stage.BASELINE, StageStatus.PASSED, started, seconds)
    seconds += measured.seconds
    judgment = outcome.judgment
    if measured.status == StepStatus.FAILED or measured.detail.startswith("no baseline"):
        detail = f"{started}; not measured: {measured.detail}"
        return StageResult(Stage.BASELINE, StageStatus.INCONCLUSIVE, detail, seconds)
    if judgment is not None and judgment.verdict == Verdict.NO_BASELINE:
        detail = f"{started}; not compared: {judgment.why_no_baseline}"
        return StageResult(Stage.BASELINE, StageStatus.INCONCLUSIVE, detail, seconds)
    return StageResult(Stage.BASELINE, StageStatus.PASSED, f"{started}; {measured.detail}", seconds)


def apply_stages(outcome: HostOutcome) -> tuple[StageResult, ...]:
    """The stages the apply proved on the rehearsal's host, from its steps and judgment."""
    stages = [_stage_of_steps(s, outcome.steps) for s in APPLY_STAGES if s is not Stage.JUDGE]
    return (*stages, _judge_stage(outcome))


def import_stage(modules: Sequence[str], probe: ProbeResult, seconds: float) -> StageResult:
    """What the import probe proved: a failure under the patch is the patch's only when the
    release's own modules import alone; a probe with no answer proves nothing."""
    failure = probe.failure
    if failure is None:
        return StageResult(Stage.IMPORT, StageStatus.PASSED, ", ".join(modules), seconds)
    said = failure.describe()
    if failure.type == NO_ANSWER:
        return StageResult(Stage.IMPORT, StageStatus.INCONCLUSIVE, said, seconds)
    if not probe.release_imports:
        detail = f"the release's own {failure.module} does not import alone here ({said})"
        return StageResult(Stage.IMPORT, StageStatus.INCONCLUSIVE, detail, seconds)
    return StageResult(Stage.IMPORT, StageStatus.FAILED, f"{failure.module}: {said}", seconds)


def not_reached(after: Stage) -> tuple[StageResult, ...]:
    """Every stage after `after`, not reached."""
    order = list(Stage)
    return tuple(StageResult(s, StageStatus.NOT_REACHED) for s in order[order.index(after) + 1 :])


_OUTCOME_BY_EXIT = {
    EXIT_OK: RunOutcome.OK,
    EXIT_HOST_FAILED: RunOutcome.FAILED,
    EXIT_BAD_INPUT: RunOutcome.REFUSED,
    EXIT_NEEDS_ATTENTION: RunOutcome.NEEDS_ATTENTION,
}


@dataclass(frozen=True)
class Teardown(Record):
    """What was stopped and removed at the end, whatever the rehearsal's outcome."""

    stopped: tuple[int, ...] = ()
    """The engine processes stopped (the sandbox's `down`, then any process left in its folder)."""
    folder: str = ""
    removed: bool = False
    problem: str | None = json_field(default=None, omit_none=True)


@dataclass(frozen=True)
class RehearsalReport(Record):
    """A rehearsal of `patch` on real `release`: every stage, the exit code (as `apply`'s: 0 the
    patch passed every stage; 1 a stage failed and the release's file is back; 2 nothing could
    be rehearsed; 3 the host needs attention), the apply's host outcome where it ran, and the
    teardown."""

    patch: str
    release: str
    exit_code: int
    outcome: RunOutcome = field(init=False)
    failed_stage: Stage | None = field(init=False)
    """The first stage that failed (None: none did)."""
    stages: tuple[StageResult, ...] = ()
    host: HostOutcome | None = None
    teardown: Teardown = Teardown()

    def __post_init__(self) -> None:
        # derived, so written in their place among the keys (codec: init=False)
        object.__setattr__(self, "outcome", _OUTCOME_BY_EXIT[self.exit_code])
        failed = next((s for s in self.stages if s.status == StageStatus.FAILED), None)
        object.__setattr__(self, "failed_stage", None if failed is None else failed.stage)
