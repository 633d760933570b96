"""`opspatch judge`: the judge alone, now: the playbook's judge prompts decoded on a baseline host
and on each target, and each target judged against it (`runs/judgments/canary.py`).

A question, like `smoke`: through the fleet run (`FleetRun.visit`, its sessions and Ctrl-C),
nothing locked, leased, changed or recorded. Each target is measured in turns with the baseline
(`judging.measured_in_turns`: a few prompts on one, then on the other, one server at a time), the
targets one after another, so that whatever load comes and goes meets both sides of each
comparison alike (docs/judge.md says why in turns rather than at once); a latency fail is
measured again and stands only if confirmed (`canary.confirm`). Without a baseline host
each target is measured alone and every verdict is `no-baseline` (the absolute checks only).
"""

from __future__ import annotations

import time
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
from opspatch.runs.fleet.judging import CONFIRM_AFTER_SECONDS, measured, measured_in_turns
from opspatch.runs.fleet.recorder import NullRecorder
from opspatch.runs.fleet.session import HostSession, NoProgress, Progress
from opspatch.runs.judgments.canary import confirm, judge, unconfirmed


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
    """Measure each target in turns with `baseline` (if any; else alone), one target after
    another, and judge each with the playbook's `[judge]` settings (the defaults when it has
    none).

    Raises:
        GaveUpWaiting: a second Ctrl-C while a host was measured.
    """
    settings = playbook.judge or JudgeSettings()
    chosen = [h for h in targets if baseline is None or h.name != baseline.name]
    hosts = ([baseline] if baseline is not None else []) + chosen

    with FleetRun(
        command=Command.JUDGE,
        patch_id=None,
        hosts=hosts,
        factory=factory,
        playbook=playbook,
        recorder=NullRecorder(),
        progress=progress or NoProgress(),
    ) as fleet:
        reference = fleet.sessions[baseline.name] if baseline is not None else None

        def one(session: HostSession) -> HostJudgment | None:
            if reference is None:
                return _judged(
                    session.name, settings, None, measured(session, settings, Step.JUDGE)
                )
            if session is reference:
                return None  # measured in turns with each target
            base, answer = measured_in_turns(reference, session, settings)
            first = _judged(session.name, settings, (reference.name, base), answer)
            if first.judgment is None or not unconfirmed(first.judgment):
                return first
            time.sleep(CONFIRM_AFTER_SECONDS)
            base, answer = measured_in_turns(reference, session, settings)  # to confirm
            second = _judged(session.name, settings, (reference.name, base), answer)
            if second.judgment is None:
                return first  # not measured again: the fail stands
            return HostJudgment(session.name, confirm(first.judgment, second.judgment))

        done = fleet.visit(one, limit=1)  # a target at a time: no two servers measured at once
    results = [
        done.get(host.name) or HostJudgment(host.name, None, f"not measured: {CANCELLED}")
        for host in chosen
    ]
    return JudgeReport(baseline.name if baseline is not None else None, tuple(results))


def _judged(
    name: str,
    settings: JudgeSettings,
    baseline: tuple[str, Measurement | str] | None,
    answer: Measurement | str,
) -> HostJudgment:
    """One target's verdict from its answers and the baseline's, measured in turns with them
    (`baseline`: the baseline host's name and answers; None: no baseline host given)."""
    if isinstance(answer, str):
        return HostJudgment(name, None, answer)
    if baseline is None:
        why: str | None = "no baseline host given (--baseline)"
    elif isinstance(baseline[1], str):
        why = f"{baseline[0]} could not be measured: {baseline[1]}"
    else:
        why = None
    reference = baseline[1] if baseline is not None and not isinstance(baseline[1], str) else None
    verdict = judge(
        answer,
        reference,
        settings,
        baseline_from=baseline[0] if baseline is not None else None,
        why_no_baseline=why,
        in_turns=True,
    )
    return HostJudgment(name, verdict)
