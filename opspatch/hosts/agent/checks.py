"""Pure checks on what an engine says: text in, findings out.

No I/O here, so the tests call the very functions the agent runs on hosts: `judge_reply` decides
whether one /generate reply passes the smoke, `scan_log` finds the log lines that fail a host.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence

    from opspatch.hosts.agent.protocol import Result


def log_tail(text: str, lines: int = 15) -> str:
    """The last `lines` lines of `text`."""
    return "\n".join(text.rstrip().splitlines()[-lines:])


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


def scan_log(text: str, patterns: Sequence[str]) -> list[Result]:
    """Every line of `text` that matches one of the fail `patterns` (regular expressions), in
    order: `{"line_number": 1-based, "line": stripped (300 chars at most), "pattern": ...}`."""
    compiled = [(pattern, re.compile(pattern)) for pattern in patterns]
    hits: list[Result] = []
    for number, line in enumerate(text.splitlines(), start=1):
        for pattern, regex in compiled:
            if regex.search(line):
                hits.append({"line_number": number, "line": line.strip()[:300], "pattern": pattern})
                break
    return hits
