"""The smoke's checks, as the host agent runs them: pure functions on a /generate reply and on
the server log (`opspatch.hosts.agent.checks`)."""

from __future__ import annotations

import json
import textwrap
from typing import Any

import pytest

from opspatch.core.policy import DEFAULT_FAIL_PATTERNS
from opspatch.hosts.agent.checks import judge_reply, scan_log


def reply(text: str | None = " Paris", tokens: int | None = 16, verified: int | None = 3) -> bytes:
    meta: dict[str, Any] = {"completion_tokens": tokens, "spec_verify_ct": verified}
    return json.dumps({"text": text, "meta_info": meta}).encode()


@pytest.mark.parametrize(
    ("expect", "completion", "matches"),
    [
        (None, "anything at all", True),
        ("Paris", " Paris, of course", True),
        ("Paris", " Lyon", False),
        (r"\breturn x \* x\b", "    return x * x\n", True),
        ("^ Paris", "Paris", False),
    ],
)
def test_expect_is_a_regular_expression_searched_in_the_output(
    expect: str | None, completion: str, matches: bool
) -> None:
    judged = judge_reply(200, reply(completion), expect=expect)
    assert (judged["problem"] is None) is matches
    if not matches:
        assert judged["problem"] == f"text {completion!r} does not match {expect!r}"


def test_a_passing_reply_reports_its_text_and_counts() -> None:
    judged = judge_reply(200, reply(), require_spec_verify=True, baseline=" Paris")
    assert judged == {
        "text": " Paris",
        "completion_tokens": 16,
        "spec_verify_ct": 3,
        "problem": None,
    }


@pytest.mark.parametrize(
    ("status", "body", "options", "problem"),
    [
        (500, b"internal error", {}, "HTTP 500: internal error"),
        (200, reply(tokens=0), {}, "no completion tokens"),
        (200, b"not json", {}, "no completion tokens"),
        (200, b"[1, 2]", {}, "no completion tokens"),
        (
            200,
            reply(verified=None),
            {"require_spec_verify": True},
            "no spec_verify_ct: speculative decoding did not verify any draft",
        ),
        (
            200,
            reply(" Lyon"),
            {"baseline": " Paris"},
            "text ' Lyon' differs from the pre-patch baseline ' Paris'",
        ),
    ],
)
def test_each_failed_check_names_its_problem(
    status: int, body: bytes, options: dict[str, Any], problem: str
) -> None:
    assert judge_reply(status, body, **options)["problem"] == problem


def test_without_checks_only_the_status_counts() -> None:
    """A pre-patch baseline is taken with checks off: its text is kept whatever it is."""
    assert judge_reply(200, reply(tokens=0, verified=None), checks=False)["problem"] is None
    assert judge_reply(503, b"busy", checks=False)["problem"] == "HTTP 503: busy"


def test_log_scan_finds_every_failing_line_in_order() -> None:
    log = textwrap.dedent(
        """\
        [2026-11-30 02:50:12] Load weight end.
        [2026-11-30 02:50:13] The server is fired up and ready to roll!
        [2026-11-30 02:50:20 TP0] Scheduler hit an exception: Traceback (most recent call last):
          File "eagle_worker_v2.py", line 613, in forward
        AttributeError: 'EAGLEWorkerV2' object has no attribute 'spec_disable_batch_threshold'
        """
    )
    hits = scan_log(log, DEFAULT_FAIL_PATTERNS)
    assert [(h["line_number"], h["pattern"]) for h in hits] == [
        (3, "Scheduler hit an exception")  # one hit per line, the first pattern that matches
    ]
    assert hits[0]["line"].startswith("[2026-11-30 02:50:20 TP0] Scheduler hit an exception")
    assert scan_log("[2026-11-30] all quiet\n", DEFAULT_FAIL_PATTERNS) == []
    assert scan_log(log, ()) == []
