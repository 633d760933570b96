"""The running engine: readiness and the smoke decode, checked on the host itself (SGLang servers
usually listen on the host's loopback only).

The checks that decide (a /generate reply, a log scan) are pure functions in
`opspatch.hosts.agent.checks`, shared with the tests.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from opspatch.hosts.agent.checks import judge_reply, log_tail, scan_log
from opspatch.hosts.agent.fsutil import file_size, log_since
from opspatch.hosts.agent.processes import alive
from opspatch.hosts.agent.protocol import OpFailure, operation

if TYPE_CHECKING:
    from opspatch.hosts.agent.protocol import Args, Result


class _Dropped(Exception):
    """The server closed the connection without an answer (it crashed, as SGLang does)."""


def _http(method: str, url: str, body: dict[str, Any] | None, timeout: float) -> tuple[int, bytes]:
    """One HTTP request; (status, body). A refused or dropped connection raises `_Dropped`."""
    import http.client
    import urllib.error
    import urllib.request

    data = json.dumps(body).encode("utf-8") if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - loopback URL from the inventory
            return int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()
    except (urllib.error.URLError, http.client.HTTPException, ConnectionError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise _Dropped(f"{type(reason).__name__}: {reason}") from None


@operation("wait_ready")
def op_wait_ready(args: Args) -> Result:
    """Poll `<url>/health` until it answers 200, with backoff, until the deadline.

    Fails fast when the process started by the restart (its pid) has exited.
    """
    url = str(args["url"]).rstrip("/")
    timeout = float(args.get("timeout") or 600.0)
    pid = args.get("pid")
    log_file = args.get("log_file")
    offset = args.get("log_offset")
    started = time.monotonic()
    deadline = started + timeout
    polls = 0
    delay = 0.1
    last = "no answer yet"
    while True:
        polls += 1
        try:
            status, _ = _http("GET", url + "/health", None, timeout=min(20.0, max(1.0, timeout)))
            if status == 200:
                return {"seconds": round(time.monotonic() - started, 3), "polls": polls}
            last = f"/health answered {status}"
        except _Dropped as exc:
            last = f"/health: {exc}"
        if pid is not None and not alive(int(pid)):
            raise OpFailure(
                "engine-exited",
                f"the engine (pid {pid}) exited before it was ready",
                {"log_tail": log_tail(log_since(log_file, offset))},
            )
        if time.monotonic() + delay > deadline:
            raise OpFailure(
                "not-ready",
                f"not ready after {timeout:.0f}s ({last})",
                {"log_tail": log_tail(log_since(log_file, offset))},
            )
        time.sleep(delay)
        delay = min(delay * 1.5, 2.0)


@operation("smoke")
def op_smoke(args: Args) -> Result:
    """Greedy decodes of the playbook's prompts, checked; then a scan of the log since restart.

    Every failed check is reported in the result (not raised): the controller decides.
    """
    url = str(args["url"]).rstrip("/")
    prompts = args.get("prompts") or []
    max_new_tokens = int(args.get("max_new_tokens") or 16)
    require_spec_verify = bool(args.get("require_spec_verify"))
    baseline = args.get("baseline")
    checks = args.get("checks", True)
    timeout = float(args.get("timeout") or 180.0)
    log_file = args.get("log_file")
    offset = args.get("log_offset")
    if offset is None:
        offset = file_size(log_file)
    deadline = time.monotonic() + timeout
    results: list[Result] = []
    failures: list[str] = []
    for index, prompt in enumerate(prompts):
        text = str(prompt.get("text", ""))
        result: Result = {
            "prompt": text,
            "ok": False,
            "text": None,
            "completion_tokens": None,
            "spec_verify_ct": None,
            "problem": None,
        }
        results.append(result)
        body = {
            "text": text,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0},
        }
        try:
            status, raw = _http(
                "POST", url + "/generate", body, timeout=max(1.0, deadline - time.monotonic())
            )
        except _Dropped as exc:
            result["problem"] = f"connection dropped ({exc}): the server may have crashed"
        else:
            expected = baseline[index] if baseline is not None and index < len(baseline) else None
            result.update(
                judge_reply(
                    status,
                    raw,
                    checks=bool(checks),
                    require_spec_verify=require_spec_verify,
                    expect=prompt.get("expect"),
                    baseline=expected,
                )
            )
        if result["problem"]:
            failures.append(f"prompt {index + 1}: {result['problem']}")
        else:
            result["ok"] = True
    log_hits: list[str] = []
    if checks and log_file:
        hits = scan_log(log_since(log_file, offset), args.get("fail_patterns") or [])
        log_hits = [hit["line"] for hit in hits]
        if log_hits:
            failures.append(f"server log: {log_hits[0]}")
    return {
        "ok": not failures,
        "results": results,
        "failures": failures,
        "log_hits": log_hits[:20],
        "log_offset": offset,
    }
