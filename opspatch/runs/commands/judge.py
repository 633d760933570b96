"""`opspatch judge`: the judge alone, now: the playbook's judge prompts decoded on a baseline host
and on each target, and each target judged against it (`runs/judgments/canary.py`).

A question, like `smoke`: through the fleet run (`FleetRun.visit`, its sessions and Ctrl-C),
nothing locked, leased, changed or recorded. The baseline and every target are measured at the
same time, so that whatever load comes and goes meanwhile meets both sides of each comparison
alike (docs/judge.md: why at once rather than one after the other). Without a baseline host
every verdict is `no-baseline` (the absolute checks only).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from opspatch.core.host import Host
from opspatch.core.jsonrecord import JsonRecord, json_field
from opspatch.core.policy import JudgeSettings, Playbook
from opspatch.core.verdicts import Judgment
from opspatch.core.vocabulary import Command, Step
from opspatch.errors import EXIT_HOST_FAILED, EXIT_OK
from opspatch.hosts.measure import Measurement
from opspatch.runs.fleet.connect import TransportFactory
from opspatch.runs.fleet.executor import CANCELLED
from opspatch.runs.fleet.fleetrun import FleetRun
from opspatch.runs.fleet.judging import measured
from opspatch.runs.fleet.recorder import NullRecorder
from opspatch.runs.fleet.session import HostSession, NoProgress, Progress
from opspatch.runs.judgments.canary import judge


@dataclass(frozen=True)
class HostJudgment(JsonRecord):
    """One target's verdict, or why it could not be measured."""

    host: str
    judgment: Judgment | None
    error: str | None = json_field(default=None, omit_none=True)

    @property
    def failed(self) -> bool:
        return self.judgment is None or self.judgment.failed


@dataclass(frozen=True)
class JudgeReport(JsonRecord):
    """Every target's verdict against `baseline` (a host name; None: no baseline host given)."""

    baseline: str | None
    hosts: tuple[HostJudgment, ...]

    @property
    def exit_code(self) -> int:
        return EXIT_HOST_FAILED if any(h.failed for h in self.hosts) else EXIT_OK


def judge_hosts(
    targets: Sequence[Host],
    playbook: Playbook,
    *,
    baseline: Host | None,
    factory: TransportFactory,
    progress: Progress | None = None,
) -> JudgeReport:
    """Measure `baseline` (if any) and every target at once, and judge each target with the
    playbook's `[judge]` settings (the defaults when it has none).

    Raises:
        GaveUpWaiting: a second Ctrl-C while a host was measured.
    """
    settings = playbook.judge or JudgeSettings()
    chosen = [h for h in targets if baseline is None or h.name != baseline.name]
    hosts = ([baseline] if baseline is not None else []) + chosen
    answers: dict[str, Measurement | str] = {}

    def one(session: HostSession) -> Measurement | str:
        answers[session.name] = measured(session, settings, Step.JUDGE)
        return answers[session.name]

    with FleetRun(
        command=Command.JUDGE,
        patch_id=None,
        hosts=hosts,
        factory=factory,
        playbook=playbook,
        recorder=NullRecorder(),
        progress=progress or NoProgress(),
    ) as fleet:
        fleet.visit(one, limit=len(hosts))  # all at once: one window of time for every side
    reference = answers.get(baseline.name) if baseline is not None else None
    why = None
    if baseline is None:
        why = "no baseline host given (--baseline)"
    elif isinstance(reference, str):
        why = f"{baseline.name} could not be measured: {reference}"
    elif reference is None:
        why = f"{baseline.name} was not measured: {CANCELLED}"
    base = reference if isinstance(reference, Measurement) else None
    results = []
    for host in chosen:
        answer = answers.get(host.name)
        if not isinstance(answer, Measurement):
            error = answer if answer is not None else f"not measured: {CANCELLED}"
            results.append(HostJudgment(host.name, None, error))
            continue
        verdict = judge(
            answer,
            base,
            settings,
            baseline_from=baseline.name if baseline is not None else None,
            why_no_baseline=why,
            together=True,
        )
        results.append(HostJudgment(host.name, verdict))
    return JudgeReport(baseline.name if baseline is not None else None, tuple(results))
