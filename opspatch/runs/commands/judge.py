"""`opspatch judge`: the judge alone, now: the playbook's judge prompts decoded on a baseline host
and on each target, and each target judged against it (`runs/judgments/canary.py`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from opspatch.core.codec import Record, json_field
from opspatch.core.host import Host
from opspatch.core.policy import JudgeSettings, Playbook
from opspatch.core.remedy import remedy_text
from opspatch.core.verdicts import Judgment
from opspatch.core.vocabulary import Command, Step
from opspatch.errors import EXIT_HOST_FAILED, EXIT_OK, InputError
from opspatch.hosts.measure import Measurement
from opspatch.runs.fleet.connect import TransportFactory
from opspatch.runs.fleet.executor import CANCELLED
from opspatch.runs.fleet.judging import CONFIRM_AFTER_SECONDS, measured, measured_in_turns
from opspatch.runs.fleet.recorded import unrecorded_run
from opspatch.runs.fleet.session import HostSession, Progress
from opspatch.runs.judgments.canary import confirm, judge, unconfirmed
from opspatch.runs.judgments.units import serving_heads


@dataclass(frozen=True)
class HostJudgment(Record):
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
class JudgeReport(Record):
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
    """The servers a selection names, each once: a unit by its head (`serving_heads`).

    Raises:
        UnitRefused: a node of a unit that is not its head is selected without the head.
    """
    return serving_heads(
        hosts, command="judge", whole=lambda unit: remedy_text(Command.JUDGE, hosts=unit.name)
    )


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
    none); a unit's nodes by its head (`servers`).

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
            hint=f"`{remedy_text(Command.JUDGE, hosts='TARGET', baseline=baseline.name)}` "
            "with the hosts to judge",
        )
    hosts = ([baseline] if baseline is not None else []) + chosen

    with unrecorded_run(
        Command.JUDGE, hosts=hosts, factory=factory, playbook=playbook, progress=progress
    ) as fleet:
        reference = fleet.sessions[baseline.name] if baseline is not None else None
        unmeasured: list[str] = []  # why the baseline could not be measured, per attempt

        def judged(
            session: HostSession, base: Measurement | str, answer: Measurement | str
        ) -> HostJudgment:
            assert reference is not None
            if isinstance(base, str):
                unmeasured.append(f"{reference.name} could not be measured: {base}")
            elif not any(sample.ok for sample in base.samples):  # its host answered, its engine not
                unmeasured.append(f"{reference.name} could not be measured: {base.problem}")
            return _judged(session, settings, (reference.name, base), answer)

        def one(session: HostSession) -> HostJudgment | None:
            if reference is None:
                return _judged(session, settings, None, measured(session, settings, Step.JUDGE))
            if session is reference:
                return None  # measured in turns with each target
            first = judged(session, *measured_in_turns(reference, session, settings))
            if first.judgment is None or not unconfirmed(first.judgment):
                return first
            time.sleep(CONFIRM_AFTER_SECONDS)
            second = judged(session, *measured_in_turns(reference, session, settings))
            if second.judgment is None:
                return first  # not measured again: the fail stands
            return replace(first, judgment=confirm(first.judgment, second.judgment))

        done = fleet.visit(one, limit=1)  # a target at a time: no two servers measured at once
    results = [
        done.get(host.name)
        or HostJudgment(host.name, None, f"not measured: {CANCELLED}", unit=_unit_name(host))
        for host in chosen
    ]
    if baseline is None:
        return JudgeReport(None, tuple(results), None)
    return JudgeReport(baseline.name, tuple(results), _baseline_error(baseline, unmeasured, done))


def _baseline_error(baseline: Host, unmeasured: list[str], done: object) -> str | None:
    """Why the baseline asked for was not measured, with the remedy (None: it was)."""
    if not done:
        return f"{baseline.name} was not measured: {CANCELLED}"
    if not unmeasured:
        return None
    return (
        f"{unmeasured[0]}; `{remedy_text(Command.DIAGNOSE, hosts=baseline.name, decode=True)}` "
        "says why it does not serve, or name another --baseline"
    )


def _unit_name(host: Host) -> str | None:
    return host.unit.name if host.unit is not None else None


def _judged(
    session: HostSession,
    settings: JudgeSettings,
    baseline: tuple[str, Measurement | str] | None,
    answer: Measurement | str,
) -> HostJudgment:
    """One target's verdict from its answers and the baseline's, measured in turns with them
    (`baseline`: the baseline host's name and answers; None: no baseline host given)."""
    unit = _unit_name(session.host)
    if isinstance(answer, str):
        return HostJudgment(session.name, None, answer, unit=unit)
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
    return HostJudgment(session.name, verdict, unit=unit)
