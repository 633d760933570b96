"""`opspatch judge`: the judge alone, now: the playbook's judge prompts decoded on a baseline host
and on each target, and each target judged against it (`runs/judgments/canary.py`).

A question, like `smoke`: through the fleet run (`FleetRun.visit`, its sessions and Ctrl-C),
nothing locked, leased, changed or recorded. The servers are measured one at a time, the
baseline first, so that no measurement shares the machine's time with another one. Without a
baseline host every verdict is `no-baseline` (the absolute checks only).

A unit (one server over several hosts) is judged by its head, the one node that serves the
prompts (its decodes run on every rank): a selection that takes the head judges the unit once
(`servers`). A node that is not the head, selected without it, is refused rather than resolved
to the head: it is no server by itself, and a verdict printed under a host the operator did not
name would hide that the operator asked about something else.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from opspatch.core.host import Host
from opspatch.core.jsonrecord import JsonRecord, json_field
from opspatch.core.policy import JudgeSettings, Playbook
from opspatch.core.remedy import CliCommand, remedy_text
from opspatch.core.verdicts import Judgment
from opspatch.core.vocabulary import Command, Step
from opspatch.errors import EXIT_HOST_FAILED, EXIT_OK, InputError, UnitRefused
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
    unit: str | None = json_field(default=None, omit_none=True)
    """The unit `host` is the head of: the verdict is the unit's."""

    @property
    def failed(self) -> bool:
        return self.judgment is None or self.judgment.failed


@dataclass(frozen=True)
class JudgeReport(JsonRecord):
    """Every target's verdict against `baseline` (a host name; None: no baseline host given),
    and why the baseline asked for could not be measured (`baseline_error`)."""

    baseline: str | None
    hosts: tuple[HostJudgment, ...]
    baseline_error: str | None = json_field(default=None, omit_none=True)

    @property
    def exit_code(self) -> int:
        """1 when a target failed or was not measured, or the baseline asked for was not (its
        targets were then judged by the absolute checks alone, not the comparison asked for);
        else 0."""
        failed = self.baseline_error is not None or any(h.failed for h in self.hosts)
        return EXIT_HOST_FAILED if failed else EXIT_OK


def servers(hosts: Sequence[Host]) -> list[Host]:
    """The servers a selection names, each once, by the host that serves its prompts: a host by
    itself, a unit by its head (its other nodes serve only a dummy `/health`).

    Raises:
        UnitRefused: a node of a unit that is not its head is selected without the head.
    """
    names = {host.name for host in hosts}
    stray = [h for h in hosts if h.unit is not None and h.unit.head not in names]
    if stray:
        said = "; ".join(
            f"{h.name} is {h.unit.describe(h.name)}, whose head is {h.unit.head}"
            for h in stray
            if h.unit is not None
        )
        units = sorted({h.unit.name for h in stray if h.unit is not None})
        raise UnitRefused(
            f"judge: {said}: a node that is not its unit's head serves no prompts (only a dummy "
            "/health); the unit is judged by its head",
            hint="judge the unit: "
            + "; ".join(f"`{remedy_text(CliCommand.JUDGE, hosts=name)}`" for name in units),
        )
    return [h for h in hosts if h.unit is None or h.unit.head == h.name]


def judge_hosts(
    targets: Sequence[Host],
    playbook: Playbook,
    *,
    baseline: Host | None,
    factory: TransportFactory,
    progress: Progress | None = None,
) -> JudgeReport:
    """Measure `baseline` (if any), then each target, one at a time, and judge each target
    with the playbook's `[judge]` settings (the defaults when it has none); a unit's nodes by
    its head (`servers`).

    Raises:
        UnitRefused: a target is a unit's node without its head.
        InputError: no target is left once the baseline is taken out of them (nothing asked).
        GaveUpWaiting: a second Ctrl-C while a host was measured.
    """
    settings = playbook.judge or JudgeSettings()
    chosen = [h for h in servers(targets) if baseline is None or h.name != baseline.name]
    if not chosen:  # a report of no verdict would exit 0 having judged nothing
        assert baseline is not None  # a selection is never empty
        raise InputError(
            f"--hosts selects only the baseline {baseline.name}: there is no host to judge "
            "against it",
            hint=f"`{remedy_text(CliCommand.JUDGE, hosts='TARGET', baseline=baseline.name)}` "
            "with the hosts to judge",
        )
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
        fleet.visit(one, limit=1)  # in order, baseline first, each server alone
    reference = answers.get(baseline.name) if baseline is not None else None
    why = baseline_error = None
    if baseline is None:
        why = "no baseline host given (--baseline)"
    elif isinstance(reference, str):
        why = baseline_error = f"{baseline.name} could not be measured: {reference}"
    elif reference is None:
        why = baseline_error = f"{baseline.name} was not measured: {CANCELLED}"
    base = reference if isinstance(reference, Measurement) else None
    results = []
    for host in chosen:
        answer = answers.get(host.name)
        if not isinstance(answer, Measurement):
            error = answer if answer is not None else f"not measured: {CANCELLED}"
            results.append(HostJudgment(host.name, None, error, unit=_unit_name(host)))
            continue
        verdict = judge(
            answer,
            base,
            settings,
            baseline_from=baseline.name if baseline is not None else None,
            why_no_baseline=why,
        )
        results.append(HostJudgment(host.name, verdict, unit=_unit_name(host)))
    return JudgeReport(
        baseline.name if baseline is not None else None, tuple(results), baseline_error
    )


def _unit_name(host: Host) -> str | None:
    return host.unit.name if host.unit is not None else None
