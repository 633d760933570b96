"""`opspatch judge`, fast: the scripted hosts of tests/scriptedkit.py, each server answering the
judge's `measure` with the same decodes, so that what is under test is what the report claims
when a host could not be measured: never exit 0 (the baseline asked for included), and a
selection with nothing to judge is refused before any host is asked.
"""

from __future__ import annotations

from typing import Any

import pytest

from opspatch.core.policy import Playbook
from opspatch.errors import InputError
from opspatch.runs.commands.judge import JudgeReport, judge_hosts
from tests.scriptedkit import Fleet, fleet

pytestmark = pytest.mark.scripted

__all__ = ["fleet"]  # the fixture, used by name


def answer_measure(
    fleet: Fleet, *, silent: str | None = None, warmups: list[tuple[str, int]] | None = None
) -> list[str]:
    """Every host's server decodes each prompt alike (a pass against each other); the engine of
    host `silent` answers no request (its host does). `warmups`: each measure's host and the
    warm-up requests it was asked for."""
    asked: list[str] = []
    for fake in fleet.hosts:

        def measure(op: str, args: dict[str, Any], name: str = fake.name) -> Any:
            if op != "measure":
                return None
            asked.append(name)
            if warmups is not None:
                warmups.append((name, args["warmup"]))
            if name == silent:
                unanswered = [
                    {**SILENT, "prompt": prompt, "problem": "no answer: ConnectionRefusedError"}
                    for prompt in args["prompts"]
                ]
                return {"samples": unanswered, "spec_accept_length": None}
            samples = [
                {
                    "prompt": prompt,
                    "problem": None,
                    "refused": False,
                    "text": "the same words",
                    "output_ids": [1, 2, 3, 4],
                    "top_ids": None,
                    "top_logprobs": None,
                    "token_logprobs": None,
                    "token_texts": None,
                    "completion_tokens": 4,
                    "spec_verify_ct": 2,
                    "seconds": 0.5,
                    "first_token_seconds": 0.05,
                    "server_seconds": 0.45,
                }
                for prompt in args["prompts"]
            ]
            return {"samples": samples, "spec_accept_length": 2.0}

        fake.fault = measure
    return asked


SILENT = {
    "refused": True,
    "text": None,
    "output_ids": None,
    "top_ids": None,
    "top_logprobs": None,
    "token_logprobs": None,
    "token_texts": None,
    "completion_tokens": None,
    "spec_verify_ct": None,
    "seconds": None,
    "first_token_seconds": None,
    "server_seconds": None,
}


def judged(fleet: Fleet, targets: list[str], baseline: str | None) -> JudgeReport:
    hosts = {fake.name: fake.host() for fake in fleet.hosts}
    return judge_hosts(
        [hosts[name] for name in targets],
        Playbook(),
        baseline=hosts[baseline] if baseline is not None else None,
        factory=fleet.factory,
    )


def test_alike_servers_pass_against_the_baseline_and_exit_0(fleet: Fleet) -> None:
    answer_measure(fleet)
    report = judged(fleet, ["h2"], "h1")
    (host,) = report.hosts
    assert host.judgment is not None and host.judgment.verdict == "pass", host
    assert report.exit_code == 0
    assert "baseline_error" not in report.to_json()


def test_each_server_is_warmed_in_its_first_turn_only(fleet: Fleet) -> None:
    warmups: list[tuple[str, int]] = []
    answer_measure(fleet, warmups=warmups)
    judged(fleet, ["h2"], "h1")
    # 24 prompts in turns of 6, ABBA: each server warmed once, before its first prompts
    first_turn = [("h1", 3), ("h2", 3)]
    assert warmups == first_turn + [
        ("h2", 0),
        ("h1", 0),
        ("h1", 0),
        ("h2", 0),
        ("h2", 0),
        ("h1", 0),
    ]


def test_a_baseline_that_cannot_be_measured_never_exits_0(fleet: Fleet) -> None:
    answer_measure(fleet)
    fleet.hosts[0].gone = True  # the baseline's host does not answer
    report = judged(fleet, ["h2"], "h1")
    (host,) = report.hosts
    assert host.judgment is not None and host.judgment.verdict == "no-baseline"
    assert report.exit_code == 1  # was 0: the comparison asked for was never made
    assert "h1 could not be measured" in (report.baseline_error or "")
    assert "opspatch diagnose --hosts h1 --decode" in (report.baseline_error or "")  # the remedy
    assert report.to_json()["baseline_error"] == report.baseline_error


def test_a_baseline_whose_engine_does_not_answer_exits_1_as_a_lost_host_does(
    fleet: Fleet,
) -> None:
    answer_measure(fleet, silent="h1")  # h1's agent answers, its engine does not
    report = judged(fleet, ["h2"], "h1")
    (host,) = report.hosts
    assert host.judgment is not None and host.judgment.verdict == "no-baseline"
    assert report.exit_code == 1  # was 0: the comparison asked for was never made
    assert "h1 could not be measured" in (report.baseline_error or "")
    assert "ConnectionRefusedError" in (report.baseline_error or "")


def test_a_target_that_cannot_be_measured_exits_1(fleet: Fleet) -> None:
    answer_measure(fleet)
    fleet.hosts[1].gone = True
    report = judged(fleet, ["h2", "h3"], "h1")
    by_host = {h.host: h for h in report.hosts}
    assert by_host["h2"].judgment is None and by_host["h2"].error
    assert by_host["h3"].judgment is not None
    assert report.exit_code == 1


def test_hosts_that_are_only_the_baseline_are_refused_before_any_host_is_asked(
    fleet: Fleet,
) -> None:
    asked = answer_measure(fleet)
    with pytest.raises(InputError) as refused:
        judged(fleet, ["h1"], "h1")  # was exit 0 with no verdict at all
    assert "only the baseline h1" in refused.value.message
    assert refused.value.exit_code == 2
    assert asked == []
