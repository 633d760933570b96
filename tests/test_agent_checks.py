"""The smoke's checks, as the host agent runs them: pure functions on a /generate reply and on
the server log (`opspatch.hosts.agent.checks`)."""

from __future__ import annotations

import json
import textwrap
from typing import Any

import pytest

from opspatch.core.policy import DEFAULT_FAIL_PATTERNS, DEFAULT_IGNORE_PATTERNS
from opspatch.hosts.agent.checks import (
    describe_exception,
    find_tracebacks,
    group_tracebacks,
    judge_reply,
    relevant_tail,
    scan_log,
)

pytestmark = pytest.mark.pure


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


# What real SGLang 0.5.23 started with --skip-server-warmup logged (abridged: the first of its
# three chained tracebacks) when its /freeze_gc lost the race with its HTTP server; it served on.
FREEZE_GC_WARNING = textwrap.dedent(
    """\
    [2026-12-06 03:14:55] INFO:     Uvicorn running on http://127.0.0.1:22880 (Press CTRL+C to quit)
    [2026-12-06 03:14:55] post-warmup freeze_gc failed
    Traceback (most recent call last):
      File "/site/urllib3/connection.py", line 239, in _new_conn
        sock = connection.create_connection(
               ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
    ConnectionRefusedError: [Errno 111] Connection refused

    The above exception was the direct cause of the following exception:

    Traceback (most recent call last):
      File "/site/requests/adapters.py", line 729, in send
        raise ConnectionError(e, request=request)
    requests.exceptions.ConnectionError: Max retries exceeded with url: /freeze_gc
    [2026-12-06 03:14:55] The server is fired up and ready to roll!
    """
)


def test_a_warning_the_engine_lives_on_is_passed_over_with_its_traceback() -> None:
    crash = textwrap.dedent(
        """\
        [2026-12-06 03:18:11] Scheduler hit an exception: Traceback (most recent call last):
          File "eagle_worker_v2.py", line 1463, in should_disable_speculation
        AttributeError: 'EAGLEWorkerV2' object has no attribute 'spec_disable_batch_threshold'
        Traceback (most recent call last):
          File "/site/sglang/launch_server.py", line 9, in <module>
        RuntimeError: a start-up error the interpreter printed
        """
    )
    # every traceback line fails the scan without the ignore patterns ...
    assert [h["line_number"] for h in scan_log(FREEZE_GC_WARNING, DEFAULT_FAIL_PATTERNS)] == [3, 11]
    # ... and none of the warning's with them; a crash after it still fails, and so does a
    # traceback that follows a line the patterns do not name
    hits = scan_log(FREEZE_GC_WARNING + crash, DEFAULT_FAIL_PATTERNS, DEFAULT_IGNORE_PATTERNS)
    assert [(h["line_number"], h["pattern"]) for h in hits] == [
        (16, "Scheduler hit an exception"),
        (19, r"Traceback \(most recent call last\)"),
    ]


# ---------------------------------------------------------------------------------------------
# tracebacks in a server log

SCHEDULER_CRASH = textwrap.dedent(
    """\
    [2026-11-30 02:50:12] Load weight end.
    [2026-11-30 02:50:13] The server is fired up and ready to roll!
    [2026-11-30 02:50:20 TP0] Scheduler hit an exception: Traceback (most recent call last):
      File "/opt/sglang/srt/managers/scheduler.py", line 120, in event_loop
        result = self.run_batch(batch)
      File "/opt/sglang/srt/speculative/eagle_worker_v2.py", line 613, in forward
        if self.spec_disable_batch_threshold:
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
    AttributeError: 'EAGLEWorkerV2' object has no attribute 'spec_disable_batch_threshold'

    [2026-11-30 02:50:20] Received sigquit from a child process. It usually means the child failed.
    """
)

STARTUP_IMPORT_ERROR = textwrap.dedent(
    """\
    Traceback (most recent call last):
      File "<frozen runpy>", line 198, in _run_module_as_main
      File "/opt/sglang/launch_server.py", line 7, in <module>
        from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2
    ImportError: cannot import name 'EAGLEWorkerV2' from 'sglang.srt.speculative.eagle_worker_v2'
    """
)


def test_a_scheduler_crash_is_found_with_its_exception_frame_line_and_time() -> None:
    found = find_tracebacks(SCHEDULER_CRASH)
    assert len(found) == 1
    crash = found[0]
    assert crash["type"] == "AttributeError"
    assert (
        crash["message"] == "'EAGLEWorkerV2' object has no attribute 'spec_disable_batch_threshold'"
    )
    assert crash["frame"] == (
        'File "/opt/sglang/srt/speculative/eagle_worker_v2.py", line 613, in forward'
    )
    assert (crash["file"], crash["lineno"], crash["function"]) == (
        "/opt/sglang/srt/speculative/eagle_worker_v2.py",
        613,
        "forward",
    )
    assert crash["line_number"] == 3
    assert crash["time"] == "2026-11-30 02:50:20"
    assert crash["context"] == "Scheduler hit an exception"
    assert describe_exception(crash) == (
        "AttributeError: 'EAGLEWorkerV2' object has no attribute 'spec_disable_batch_threshold' "
        '(File "/opt/sglang/srt/speculative/eagle_worker_v2.py", line 613, in forward)'
    )


def test_a_start_up_error_printed_by_the_interpreter_has_no_time() -> None:
    (error,) = find_tracebacks("[2026-11-30 02:50:11] server_args=...\n" + STARTUP_IMPORT_ERROR)
    assert error["type"] == "ImportError"
    assert error["frame"] == 'File "/opt/sglang/launch_server.py", line 7, in <module>'
    assert (error["line_number"], error["time"], error["context"]) == (2, None, None)


def test_a_chained_exception_is_reported_as_the_one_raised_last() -> None:
    log = textwrap.dedent(
        """\
        [2026-11-30 03:00:00] Traceback (most recent call last):
          File "/a.py", line 1, in f
        KeyError: 'x'

        During handling of the above exception, another exception occurred:

        Traceback (most recent call last):
          File "/b.py", line 2, in g
        ValueError: bad x
        """
    )
    (chained,) = find_tracebacks(log)
    assert (chained["type"], chained["message"], chained["frame"]) == (
        "ValueError",
        "bad x",
        'File "/b.py", line 2, in g',
    )
    assert chained["line_number"] == 1 and chained["time"] == "2026-11-30 03:00:00"
    assert chained["cause"] == "KeyError: 'x'"


def test_a_traceback_cut_off_before_its_exception_still_names_its_frame() -> None:
    log = 'Traceback (most recent call last):\n  File "/a.py", line 9, in f\n'
    (cut,) = find_tracebacks(log)
    assert cut["type"] is None and cut["frame"] == 'File "/a.py", line 9, in f'
    assert "cut off" in describe_exception(cut)
    assert find_tracebacks("[2026-11-30 03:00:00] all quiet\n") == []


def test_tracebacks_are_grouped_by_exception_with_count_and_times() -> None:
    again = SCHEDULER_CRASH.replace("02:50:20", "02:51:40").replace("02:50:12", "02:51:30")
    other = "[2026-11-30 02:52:00] " + STARTUP_IMPORT_ERROR
    groups = group_tracebacks(find_tracebacks(SCHEDULER_CRASH + again + other))
    assert [(g["type"], g["count"], g["first_time"], g["last_time"]) for g in groups] == [
        ("AttributeError", 2, "2026-11-30 02:50:20", "2026-11-30 02:51:40"),
        ("ImportError", 1, "2026-11-30 02:52:00", "2026-11-30 02:52:00"),
    ]
    assert groups[0]["first_line_number"] == 3
    assert groups[0]["frame"].endswith("line 613, in forward")


def test_the_relevant_tail_keeps_the_exception_and_its_frame_within_bounds() -> None:
    noise = "".join(f"[2026-11-30 02:50:2{i % 10}] shutting down part {i}\n" for i in range(40))
    tail = relevant_tail(SCHEDULER_CRASH + noise, max_lines=20, max_bytes=4096)
    lines = tail.splitlines()
    assert len(lines) <= 20 and len(tail.encode()) <= 4096
    assert (
        lines[0] == '  File "/opt/sglang/srt/speculative/eagle_worker_v2.py", line 613, in forward'
    )
    assert lines[1].startswith("AttributeError: 'EAGLEWorkerV2' object has no attribute")
    assert lines[2] == "[...]"
    assert lines[-1].endswith("shutting down part 39")
    # a short log is its own tail; a log without a traceback is its last lines
    assert relevant_tail(SCHEDULER_CRASH) == SCHEDULER_CRASH.rstrip()
    assert relevant_tail(noise, max_lines=3).splitlines()[0].endswith("part 37")
    huge = "x" * 10_000 + "\n" + "y" * 10
    assert len(relevant_tail(huge, max_bytes=600).encode()) <= 600


def test_the_relevant_tail_leaves_out_our_own_health_polls() -> None:
    """Readiness polls write an access-log line each; in a failure's tail they would push out
    what the engine said (its warm-up delay, its traceback)."""
    from opspatch.hosts.agent.checks import relevant_tail

    said = "[2026-12-01 10:00:00] Delaying warm-up by 30 s"
    polls = [
        f'[2026-12-01 10:00:{i:02}] INFO:     127.0.0.1:5{i} - "GET /health HTTP/1.1" 503 Service Unavailable'
        for i in range(40)
    ]
    tail = relevant_tail("\n".join([said, *polls, "[2026-12-01 10:00:41] still waiting"]))
    assert said in tail and "still waiting" in tail
    assert "/health" not in tail
