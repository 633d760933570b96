"""Pure checks on what an engine says: text in, findings out."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence

    from opspatch.hosts.agent.protocol import Result


def judge_reply(
    status: int,
    body: bytes,
    *,
    checks: bool = True,
    require_spec_verify: bool = False,
    expect: str | None = None,
    baseline: str | None = None,
) -> Result:
    """One greedy /generate reply, judged: its `text`, `completion_tokens`, `spec_verify_ct`
    and the first `problem` found (None when it passes).

    In order: HTTP 200; then, with `checks`, at least one completion token; `spec_verify_ct > 0`
    where speculative decoding must verify drafts; `expect` (a regular expression) found in the
    text (`re.search`); the text equal to the pre-patch `baseline`. Without `checks` only the
    status counts (a baseline is being taken).
    """
    try:
        data: Any = json.loads(body.decode("utf-8"))
    except ValueError:
        data = {}
    if not isinstance(data, dict):
        data = {}
    meta = data.get("meta_info") or {}
    if not isinstance(meta, dict):
        meta = {}
    text = data.get("text")
    judged: Result = {
        "text": text,
        "completion_tokens": meta.get("completion_tokens"),
        "spec_verify_ct": meta.get("spec_verify_ct"),
        "problem": None,
    }
    if status != 200:
        judged["problem"] = f"HTTP {status}: {body[:200].decode('utf-8', 'replace')}"
    elif not checks:
        pass
    elif not judged["completion_tokens"]:
        judged["problem"] = "no completion tokens"
    elif require_spec_verify and not judged["spec_verify_ct"]:
        judged["problem"] = "no spec_verify_ct: speculative decoding did not verify any draft"
    elif expect and not re.search(expect, str(text)):
        judged["problem"] = f"text {text!r} does not match {expect!r}"
    elif baseline is not None and text != baseline:
        judged["problem"] = f"text {text!r} differs from the pre-patch baseline {baseline!r}"
    return judged


def scan_log(text: str, patterns: Sequence[str], ignore: Sequence[str] = ()) -> list[Result]:
    """Every line of `text` that matches one of the fail `patterns` (regular expressions), in
    order: `{"line_number": 1-based, "line": stripped (300 chars at most), "pattern": ...}`.
    A line that matches one of `ignore` is passed over, and so is the traceback logged right
    after it (a warning logged with `exc_info`: its traceback starts on the next line)."""
    compiled = [(pattern, re.compile(pattern)) for pattern in patterns]
    lines = text.splitlines()
    skipped: set[int] = set()
    if ignore:
        passed = [re.compile(pattern) for pattern in ignore]
        skipped = {n for n, line in enumerate(lines, 1) if any(r.search(line) for r in passed)}
        for found in find_tracebacks(text):
            if found["line_number"] - 1 in skipped:
                end = found["exception_line_number"] or found["frame_line_number"] or 0
                skipped.update(range(found["line_number"], max(end, found["line_number"]) + 1))
    hits: list[Result] = []
    for number, line in enumerate(lines, start=1):
        if number in skipped:
            continue
        for pattern, regex in compiled:
            if regex.search(line):
                hits.append({"line_number": number, "line": line.strip()[:300], "pattern": pattern})
                break
    return hits


# ---------------------------------------------------------------------------------------------
# tracebacks in a server log

TRACEBACK_HEADER = "Traceback (most recent call last):"
_CHAIN_LINES = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)
# Pattern strings, compiled on first use by `re`'s own cache: most execs that carry this module
# (every `begin`) never read a log, so they need not pay for compiling them.
# SGLang: `[2026-11-30 02:50:20] msg`, `[2026-11-30 02:50:20 TP0] msg` (ranks after the time).
_STAMP = r"^\[(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})(?:[ ,.][^\]]*)?\] ?"
_FRAME = r'^\s+File "(?P<file>[^"]*)", line (?P<lineno>\d+)(?:, in (?P<function>.+))?$'
_EXCEPTION = r"^(?P<type>[A-Za-z_][\w.]*)(?::[ ]?(?P<message>.*))?$"
_MAX_LINE = 500


def find_tracebacks(text: str) -> list[Result]:
    """Every Python traceback in a log, in order, each as the exception that was raised:

    `type` and `message` (from the exception line; None when the log cuts it off), `exception`
    (that line, as printed), `frame` (its final frame, `File "...", line N, in f`) with `file`,
    `lineno`, `function`; `line_number` (1-based) and `time` of the line the traceback starts
    on (the time of SGLang's `[YYYY-mm-dd HH:MM:SS ...]` prefix; None for a traceback the
    interpreter printed itself), `context` (what that line said before the traceback, e.g.
    `Scheduler hit an exception`), and `cause` (for a chained exception, the one it replaced).
    The 1-based `frame_line_number` and `exception_line_number` locate the two lines in `text`.
    """
    lines = text.splitlines()
    found: list[Result] = []
    chain: Result | None = None  # the previous traceback, when a chain line followed it
    index = 0
    while index < len(lines):
        line = lines[index]
        at = line.find(TRACEBACK_HEADER)
        if at < 0:
            index += 1
            continue
        stamp = re.match(_STAMP, line)
        context = line[stamp.end() if stamp else 0 : at].strip().rstrip(":").strip()
        record: Result = {
            "type": None,
            "message": None,
            "exception": None,
            "frame": None,
            "file": None,
            "lineno": None,
            "function": None,
            "line_number": index + 1,
            "time": stamp.group(1) if stamp else None,
            "context": context or None,
            "cause": None,
            "frame_line_number": None,
            "exception_line_number": None,
        }
        if chain is not None:
            record.update(
                line_number=chain["line_number"],
                time=chain["time"],
                context=chain["context"],
                cause=chain["exception"],
            )
            found.remove(chain)
            chain = None
        index += 1
        while index < len(lines) and lines[index][:1] in (" ", "\t"):
            frame = re.match(_FRAME, lines[index])
            if frame:
                record.update(
                    frame=lines[index].strip()[:_MAX_LINE],
                    file=frame.group("file"),
                    lineno=int(frame.group("lineno")),
                    function=frame.group("function"),
                    frame_line_number=index + 1,
                )
            index += 1
        raised = re.match(_EXCEPTION, lines[index]) if index < len(lines) else None
        if raised:
            record.update(
                type=raised.group("type"),
                message=raised.group("message"),
                exception=lines[index].strip()[:_MAX_LINE],
                exception_line_number=index + 1,
            )
            index += 1
        found.append(record)
        following = index
        while following < len(lines) and not lines[following].strip():
            following += 1
        if following < len(lines) and lines[following].strip() in _CHAIN_LINES:
            chain = record
            index = following + 1
    return found


def describe_exception(traceback: Result) -> str:
    """One line for an operator: `Type: message (File "...", line N, in f)`."""
    said = traceback.get("exception") or "a traceback cut off before its exception line"
    return f"{said} ({traceback['frame']})" if traceback.get("frame") else str(said)


def group_tracebacks(tracebacks: Sequence[Result]) -> list[Result]:
    """The tracebacks grouped by exception (type and message), in order of first appearance:
    `type`, `message`, `count`, `first_time`, `last_time`, `first_line_number`, `frame`."""
    groups: dict[tuple[Any, Any], Result] = {}
    for found in tracebacks:
        key = (found["type"], found["message"])
        group = groups.get(key)
        if group is None:
            groups[key] = {
                "type": found["type"],
                "message": found["message"],
                "count": 1,
                "first_time": found["time"],
                "last_time": found["time"],
                "first_line_number": found["line_number"],
                "frame": found["frame"],
            }
        else:
            group["count"] += 1
            group["last_time"] = found["time"] or group["last_time"]
    return list(groups.values())


_HEALTH_ACCESS_LINE = r'"(?:GET|HEAD) /(?:health|health_generate|ready)(?:\?\S*)? HTTP/'


def is_health_poll(line: str) -> bool:
    """Whether a log line is the server's access-log entry for a /health (or /ready) request:
    opspatch's own readiness polls, which say nothing about why a server failed."""
    return re.search(_HEALTH_ACCESS_LINE, line) is not None


def relevant_tail(text: str, max_lines: int = 20, max_bytes: int = 4096) -> str:
    """The log's last lines, bounded (`max_lines`, `max_bytes`), that always show the last
    traceback's exception line and final frame: when they are older than the last lines, they
    come first, followed by `[...]`. The access-log lines of health polls (ours, while waiting
    for readiness) are left out: they would push out what the engine itself said."""
    text = "\n".join(line for line in text.splitlines() if not is_health_poll(line))
    lines = [line[:_MAX_LINE] for line in text.rstrip().splitlines()]
    found = find_tracebacks(text)
    needed: list[int] = []
    if found:
        last = found[-1]
        needed = [
            number - 1
            for number in (last["frame_line_number"], last["exception_line_number"])
            if number is not None
        ]
    window = max_lines
    missing: list[int] = []
    for _ in range(3):  # each pass can only move the window's start later
        start = max(0, len(lines) - window)
        missing = [i for i in needed if i < start]
        window = max_lines - (len(missing) + 1 if missing else 0)
    head = [lines[i] for i in missing] + (["[...]"] if missing else [])
    tail = lines[max(0, len(lines) - window) :] if window > 0 else []
    while tail and len("\n".join(head + tail).encode()) > max_bytes:
        tail.pop(0)
    kept = "\n".join(head + tail)
    return (
        kept
        if len(kept.encode()) <= max_bytes
        else kept.encode()[:max_bytes].decode(errors="ignore")
    )


def failure_evidence(log_text: str) -> tuple[str, Result]:
    """What an engine's log (since its restart) says about a failure: a suffix for the one-line
    message (`: Type: message (File "...", line N, in f)`, empty when it logged no traceback) and
    the data sent with the failure: `log_tail` (`relevant_tail`) and `exception` (the last
    traceback, `find_tracebacks`' record, or None)."""
    found = find_tracebacks(log_text)
    last = found[-1] if found else None
    suffix = f": {describe_exception(last)}" if last else ""
    return suffix, {"log_tail": relevant_tail(log_text), "exception": last}
