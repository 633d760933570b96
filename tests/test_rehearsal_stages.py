"""`opspatch rehearse`: each stage read from the apply's host outcome, as data (pure)."""

from __future__ import annotations

import pytest

from opspatch.core.verdicts import Judgment, MetricVerdict
from opspatch.core.vocabulary import Metric, Outcome, RunOutcome, Step, StepStatus, Verdict
from opspatch.runs.report import HostOutcome, StepResult
from opspatch.sandbox.real.importprobe import NO_ANSWER, ImportFailure, ProbeResult
from opspatch.sandbox.rehearsal import (
    RehearsalReport,
    Stage,
    StageResult,
    StageStatus,
    apply_stages,
    baseline_stage,
    import_stage,
    not_reached,
)

pytestmark = pytest.mark.pure

OK, FAILED = StepStatus.OK, StepStatus.FAILED
MEASURED = "8 prompt(s) decoded: 128 tokens, accept length 1.68"
BEFORE = (
    StepResult(Step.BEGIN, OK, 1.0, "sha256 0da2a0a5d9ab"),
    StepResult(Step.PLAN, OK, 0.1, "applicable"),
    StepResult(Step.JUDGE_BASELINE, OK, 30.0, MEASURED),
    StepResult(Step.BACKUP, OK, 0.1, "pre-image in the ledger"),
    StepResult(Step.SWAP, OK, 0.3, "0da2a0a5d9ab -> 26306cd1b574; purged 0 pyc"),
)
STARTED = (
    StepResult(Step.RESTART, OK, 5.0, "command: pid 23159"),
    StepResult(Step.READY, OK, 60.0, "/health 200 after 59s (18 polls)"),
)
SMOKED = (StepResult(Step.SMOKE, OK, 3.0, "2 prompt(s), 32 tokens, spec_verify_ct 13"),)
RESTORED = (
    StepResult(Step.RESTORE, OK, 0.2, "pre-image back"),
    StepResult(Step.RESTART_AFTER_RESTORE, OK, 5.0, "command: pid 23300"),
    StepResult(Step.READY_AFTER_RESTORE, OK, 50.0, "/health 200"),
    StepResult(Step.SMOKE_AFTER_RESTORE, OK, 3.0, "2 prompt(s)"),
)
IMPORT_ERROR = (
    "the engine (pid 9) exited before it was ready: ImportError: cannot import name 'x' from "
    "'sglang.srt.utils' (File \"eagle_worker_v2.py\", line 30, in <module>)"
)


def _judgment(verdict: Verdict, baseline: str | None = "this host's old server") -> Judgment:
    tokens = MetricVerdict(Metric.TOKENS, verdict, "8 of 8 prompts alike")
    why = None if baseline else "the old server failed the judge's prompts"
    return Judgment(verdict, baseline, (tokens,), why_no_baseline=why)


def _host(outcome: Outcome, steps: tuple[StepResult, ...], **kw: object) -> HostOutcome:
    return HostOutcome("sandbox-01", outcome, steps=steps, **kw)  # type: ignore[arg-type]


PASSED = StageStatus.PASSED
CASES = {
    "every stage passed": (
        _host(
            Outcome.APPLIED,
            (*BEFORE, *STARTED, *SMOKED, StepResult(Step.JUDGE, OK, 40.0, "judge: pass")),
            judgment=_judgment(Verdict.PASS),
        ),
        {
            Stage.INSTALL: PASSED,
            Stage.START: PASSED,
            Stage.FIRST_DECODE: PASSED,
            Stage.JUDGE: PASSED,
        },
    ),
    "the server did not start on the patch": (
        _host(
            Outcome.ROLLED_BACK,
            (
                *BEFORE,
                STARTED[0],
                StepResult(Step.READY, FAILED, 20.0, IMPORT_ERROR),
                *RESTORED,
            ),
            error=f"ready: {IMPORT_ERROR}",
        ),
        {
            Stage.INSTALL: PASSED,
            Stage.START: StageStatus.FAILED,
            Stage.FIRST_DECODE: StageStatus.NOT_REACHED,
            Stage.JUDGE: StageStatus.NOT_REACHED,
        },
    ),
    "the first decode crashed": (
        _host(
            Outcome.ROLLED_BACK,
            (
                *BEFORE,
                *STARTED,
                StepResult(Step.SMOKE, FAILED, 9.0, "the server crashed"),
                *RESTORED,
            ),
        ),
        {
            Stage.INSTALL: PASSED,
            Stage.START: PASSED,
            Stage.FIRST_DECODE: StageStatus.FAILED,
            Stage.JUDGE: StageStatus.NOT_REACHED,
        },
    ),
    "the judge failed it": (
        _host(
            Outcome.ROLLED_BACK,
            (*BEFORE, *STARTED, *SMOKED, StepResult(Step.JUDGE, FAILED, 40.0, "judge: fail")),
            judgment=_judgment(Verdict.FAIL),
        ),
        {
            Stage.INSTALL: PASSED,
            Stage.START: PASSED,
            Stage.FIRST_DECODE: PASSED,
            Stage.JUDGE: StageStatus.FAILED,
        },  # fmt: skip
    ),
    "the host refused the swap": (
        _host(
            Outcome.FAILED,
            (*BEFORE[:-1], StepResult(Step.SWAP, FAILED, 0.3, "compile: SyntaxError")),
        ),
        {
            Stage.INSTALL: StageStatus.FAILED,
            Stage.START: StageStatus.NOT_REACHED,
            Stage.FIRST_DECODE: StageStatus.NOT_REACHED,
            Stage.JUDGE: StageStatus.NOT_REACHED,
        },
    ),
    "no baseline to judge against": (
        _host(
            Outcome.APPLIED,
            (*BEFORE, *STARTED, *SMOKED, StepResult(Step.JUDGE, OK, 40.0, "judge: no baseline")),
            judgment=_judgment(Verdict.NO_BASELINE, baseline=None),
        ),
        {
            Stage.INSTALL: PASSED,
            Stage.START: PASSED,
            Stage.FIRST_DECODE: PASSED,
            Stage.JUDGE: StageStatus.INCONCLUSIVE,
        },  # fmt: skip
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_stage_is_read_from_the_apply_steps_behind_it(case: str) -> None:
    outcome, expected = CASES[case]
    stages = apply_stages(outcome)
    assert [s.stage for s in stages] == list(expected)
    assert {s.stage: s.status for s in stages} == expected


def test_a_failed_stage_names_its_step_and_error_and_the_restore_is_not_counted() -> None:
    outcome, _ = CASES["the server did not start on the patch"]
    start = next(s for s in apply_stages(outcome) if s.stage == Stage.START)
    assert start.detail == f"ready: {IMPORT_ERROR}"
    assert start.seconds == 25.0  # restart + the failed ready; not the restore's restart


def test_the_judge_stage_says_the_verdict_and_where_the_baseline_came_from() -> None:
    outcome, _ = CASES["every stage passed"]
    judge = apply_stages(outcome)[-1]
    assert judge.detail == "judge: pass against this host's old server"


def test_the_baseline_is_the_unpatched_server_started_then_measured() -> None:
    outcome, _ = CASES["every stage passed"]
    stage = baseline_stage("ready in 40 s (pid 7)", 45.0, outcome)
    assert (stage.status, stage.detail, stage.seconds) == (
        PASSED,
        f"ready in 40 s (pid 7); {MEASURED}",
        75.0,
    )
    none, _ = CASES["no baseline to judge against"]
    stage = baseline_stage("ready in 40 s (pid 7)", 45.0, none)
    assert stage.status == StageStatus.INCONCLUSIVE
    assert "the old server failed the judge's prompts" in stage.detail


def test_the_report_names_the_first_failed_stage_and_its_outcome_word() -> None:
    failed = StageResult(Stage.IMPORT, StageStatus.FAILED, "ImportError: ...")
    report = RehearsalReport(
        "p",
        "sglang==0.5.23",
        1,
        stages=(StageResult(Stage.RELEASE, PASSED), failed, *not_reached(Stage.IMPORT)),
    )
    assert report.failed_stage == Stage.IMPORT and report.outcome == RunOutcome.FAILED
    data = report.to_json()
    assert list(data)[:5] == ["patch", "release", "exit_code", "outcome", "failed_stage"]
    assert (data["outcome"], data["failed_stage"]) == ("failed", "import")
    assert [s["stage"] for s in data["stages"]] == [str(s) for s in Stage]
    assert data["stages"][-1] == {"stage": "judge", "status": "not-reached", "detail": "",
                                  "seconds": None}  # fmt: skip
    passed = RehearsalReport("p", "sglang==0.5.23", 0)
    assert passed.failed_stage is None and passed.outcome == RunOutcome.OK


EAGLE = "sglang.srt.speculative.eagle_worker_v2"
MISSING = ImportFailure(
    EAGLE,
    "ImportError",
    "cannot import name 'x' from 'sglang.srt.utils'",
    "/s/e.py",
    30,
    "<module>",
)
IMPORT_CASES = {
    "every module imported": (ProbeResult(None), StageStatus.PASSED, EAGLE),
    "the patch fails the import": (
        ProbeResult(MISSING),
        StageStatus.FAILED,
        f"{EAGLE}: ImportError: cannot import name 'x' from 'sglang.srt.utils' "
        '(File "/s/e.py", line 30, in <module>)',
    ),
    "the release's own module fails it too": (
        ProbeResult(MISSING, release_imports=False),
        StageStatus.INCONCLUSIVE,
        f"the release's own {EAGLE} does not import alone here (ImportError: cannot import",
    ),
    "the probe gave no answer": (
        ProbeResult(ImportFailure("", NO_ANSWER, "the imports did not finish in 900 s"), False),
        StageStatus.INCONCLUSIVE,
        "ProbeFailed: the imports did not finish in 900 s",
    ),
}


@pytest.mark.parametrize("case", list(IMPORT_CASES))
def test_the_import_stage_fails_only_on_what_the_patch_broke(case: str) -> None:
    probe, status, detail = IMPORT_CASES[case]
    stage = import_stage((EAGLE,), probe, 12.0)
    assert (stage.stage, stage.status, stage.seconds) == (Stage.IMPORT, status, 12.0)
    assert stage.detail.startswith(detail), stage.detail
