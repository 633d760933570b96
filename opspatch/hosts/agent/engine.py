"""The running engine: readiness, the drain wait and the smoke decode, checked on the host
itself (SGLang servers usually listen on the host's loopback only)."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from opspatch.hosts.agent.checks import (
    describe_exception,
    failure_evidence,
    find_tracebacks,
    group_tracebacks,
    is_health_poll,
    judge_reply,
    scan_log,
)
from opspatch.hosts.agent.fsutil import file_size, log_since, log_window
from opspatch.hosts.agent.processes import (
    alive,
    find_server_pid,
    listening_pids,
    process_tree,
    read_pid_file,
)
from opspatch.hosts.agent.protocol import OpFailure, operation

if TYPE_CHECKING:
    from opspatch.hosts.agent.protocol import (
        DrainedReply,
        GroupCheck,
        ReadyReply,
        Result,
        SmokeReply,
        SmokeRequest,
        WaitDrainedRequest,
        WaitReadyRequest,
    )


READY_POLL_SECONDS = 0.1
"""Seconds between two looks at a starting engine (its pid and its log)."""

QUIET_POLL_SECONDS = 1.0
"""Longest wait between two /health polls while the engine's log is silent."""

EARLIER_LOG_READ = 4 * 1024 * 1024
"""Bytes read from a log's end for the exception of a server found dead by a decode."""


class NoAnswer(Exception):
    """No answer: the connection was refused or dropped (the server crashed, as SGLang does) or,
    with `timed_out`, the server did not answer in time."""

    def __init__(self, message: str, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


def _http(method: str, url: str, body: dict[str, Any] | None, timeout: float) -> tuple[int, bytes]:
    """One HTTP request; (status, body). No answer raises `NoAnswer`."""
    import http.client
    import socket
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
        timed_out = isinstance(reason, socket.timeout)  # TimeoutError from Python 3.10 on
        raise NoAnswer(f"{type(reason).__name__}: {reason}", timed_out) from None


def _port(url: str) -> int | None:
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        return parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None


def _seconds(value: float) -> str:
    return f"{round(value, 1):g}s"


def explain_no_answer(
    dropped: NoAnswer, waited: float, server: int | None, log_text: str, earlier: str = ""
) -> str:
    """Why a /generate got no answer, told apart: the server crashed (its log records an
    exception since the restart: shown with where it was raised), it was found dead, having
    crashed before this decode (`earlier`, its log since its last start, records the exception
    `log_text` does not), it did not answer in time while still running (with the exception its
    log records, if any: a scheduler that died under a living HTTP server), or it exited or
    dropped the connection without logging why."""
    found = find_tracebacks(log_text)
    running = server is not None and alive(server)
    where = f"the server (pid {server})" if server is not None else "the server"
    if found and not (dropped.timed_out and running):
        return f"the server crashed: {describe_exception(found[-1])}"
    before = [] if running else find_tracebacks(earlier)
    if before:
        gone = f"{where} is not running" if server is not None else "no server process was found"
        return (
            f"{gone}: it crashed before this decode: {describe_exception(before[-1])} (its log "
            "since its last start)"
        )
    if dropped.timed_out:
        head = f"did not answer within {_seconds(waited)}"
        if running:
            logged = f"; its log records {describe_exception(found[-1])}" if found else ""
            return f"{head}; {where} is still running{logged}"
        if server is None:
            return f"{head}; no server process was found"
        return f"{head}; {where} has exited and its log records no exception"
    if running:
        return f"the connection was dropped ({dropped}); {where} is still running"
    if server is None:
        return f"the connection was dropped ({dropped}); no server process was found"
    return f"{where} exited while decoding ({dropped}); its log records no exception"


@operation("wait_ready")
def op_wait_ready(args: WaitReadyRequest) -> ReadyReply:
    """Wait until `<url>/health` answers 200, until the deadline, noticing it within ~0.1 s.

    /health is polled when the engine's log has news (a ready server logs it; our own polls'
    access lines are no news), at every look without a log, and every `QUIET_POLL_SECONDS`
    otherwise: no backoff (it noticed readiness up to 2 s late) and no flood of polls. The
    restart's pid, else the pid file's, is watched: gone, the wait fails at once
    (`engine-not-running`). With `group`, the head's `/server_info` must also say node rank 0 of
    that group (`group-mismatch`). With `slice`, the deadline answers `waiting` instead of
    failing: one part of a longer wait (`hosts.engine.EngineControl.wait_ready`); `total` is that
    whole wait's deadline, said in the failure.
    """
    # Long because: one polling loop whose exits (ready, gone, exited, deadline, a slice's end) share its state; the agent runs as one file on Python 3.8
    url = str(args["url"]).rstrip("/")
    timeout = float(args.get("timeout") or 600.0)
    total = float(args.get("total") or timeout)
    pid = restarted = args.get("pid")  # the restart's: ready only as that process
    pid_file = args.get("pid_file")
    gone = None  # what the pid file names, when that process is not running
    if pid is None and pid_file:
        named = read_pid_file(str(pid_file))
        if named is not None and alive(named):
            pid = named
        else:
            gone = named
    log_file = args.get("log_file")
    offset = args.get("log_offset")
    group = args.get("group")
    started = time.monotonic()
    deadline = started + timeout
    polls = 0
    last = "no answer yet"
    watched = file_size(log_file) if log_file else None
    next_poll = started  # poll at once
    while True:
        news = watched is None
        if log_file:
            size = file_size(log_file) or 0
            if watched is not None and size != watched:
                fresh = log_since(log_file, watched, limit=65536)
                news = any(line.strip() and not is_health_poll(line) for line in fresh.splitlines())
                watched = size
        now = time.monotonic()
        if news or now >= next_poll:
            polls += 1
            wait = min(20.0, max(1.0, deadline - now))
            try:
                status, _ = _http("GET", url + "/health", None, timeout=wait)
                if status == 200:
                    last = _group_unproven(url, group, wait) if group else ""
                    if restarted is not None:
                        _refuse_an_older_server(url, int(restarted))
                    if not last:
                        return {"seconds": round(time.monotonic() - started, 3), "polls": polls}
                else:
                    last = f"/health answered {status}"
            except NoAnswer as exc:
                last = f"/health: {exc}"
            next_poll = time.monotonic() + QUIET_POLL_SECONDS
            if log_file:  # our own request's access line is not news
                watched = file_size(log_file) or 0
        if gone is not None:
            said, evidence = failure_evidence(log_since(log_file, offset))
            raise OpFailure(
                "engine-not-running",
                f"the engine is not running: its pid file {pid_file} names pid {gone}, which "
                f"has exited, and /health does not answer ({last})"
                + (f"; its log records{said}" if said else ""),
                evidence,
            )
        if pid is None and gone is None and pid_file:
            # a pid file not written yet (a container's start script writes it as it starts
            # the engine, on a fresh tmpfs): read it again at each look
            pid = read_pid_file(str(pid_file))
        if pid is not None and not alive(int(pid)):
            said, evidence = failure_evidence(log_since(log_file, offset))
            raise OpFailure(
                "engine-exited",
                f"the engine (pid {pid}) exited before it was ready{said}",
                evidence,
            )
        if time.monotonic() + READY_POLL_SECONDS > deadline:
            if args.get("slice"):
                waited = round(time.monotonic() - started, 3)
                return {"waiting": {"seconds": waited, "polls": polls, "last": last}}
            said, evidence = failure_evidence(log_since(log_file, offset))
            running = f"; the engine (pid {pid}) is still running" if pid is not None else ""
            raise OpFailure(
                "not-ready",
                f"not ready after {total:.0f}s ({last}){running}"
                + (f"; its log records{said}" if said else ""),
                evidence,
            )
        time.sleep(READY_POLL_SECONDS)


def _refuse_an_older_server(url: str, started: int) -> None:
    """`/health` answered, but is it the engine just `started`? A server that was already
    running (a stop that missed it) would answer while the new one loads, and a restart that
    changed nothing would pass as one. Refused when every process listening on the url's port
    is outside the started process's tree; unknown (another user's sockets) is not refused."""
    port = _port(url)
    listeners = listening_pids(port) if port is not None else []
    if not listeners or set(listeners) & set(process_tree(started)):
        return
    raise OpFailure(
        "stale-server",
        f"{url} was answered by pid {listeners[0]}, not by the engine just started (pid "
        f"{started}): a server that was already running holds port {port}, and the stop did "
        f"not end it; stop pid {listeners[0]}, then restart",
        {"listening": listeners, "started": started},
    )


def _group_unproven(url: str, group: GroupCheck, wait: float) -> str:
    """Why the server at `url` is not yet known to be the head of `group` (its `/server_info`:
    SGLang's server arguments, `nnodes`, `tp_size`, `node_rank`), or "" when it is. A server of
    another shape, or one without `/server_info` (a non-head node's dummy health server), is
    refused (`group-mismatch`); no answer yet is only said."""
    try:
        status, raw = _http("GET", url + "/server_info", None, timeout=wait)
    except NoAnswer as exc:
        return f"/server_info: {exc}"
    tp_size = group.get("tp_size")
    expected = {"nnodes": int(group["nnodes"]), "tp_size": tp_size, "node_rank": 0}
    head = f"the head of {expected['nnodes']} node(s)"
    if tp_size is None:  # not asked: any number of ranks
        del expected["tp_size"]
    else:
        head += f" with tp_size {tp_size}"
    if status == 404:
        raise OpFailure(
            "group-mismatch",
            f"{url} answers /health but has no /server_info (404): not {head} (a non-head "
            "node serves only a dummy /health)",
        )
    if status != 200:
        return f"/server_info answered {status}"
    try:
        info = json.loads(raw)
        found = {key: info.get(key) for key in expected}
    except (ValueError, AttributeError):
        return f"/server_info answered no JSON object: {raw[:100]!r}"
    if found != expected:
        said = ", ".join(f"{key}={value}" for key, value in found.items())
        raise OpFailure(
            "group-mismatch",
            f"{url} serves {said} (its /server_info), not {head}",
            {"expected": expected, "found": found},
        )
    return ""


def summed_loads(raw: bytes) -> tuple[int, int] | None:
    """(running, waiting) summed over the data-parallel ranks of SGLang's `GET /v1/loads`
    (0.5.23: `{"loads": [{"num_running_reqs", "num_waiting_reqs", ...}, ...]}`), or None when
    `raw` is not that report."""
    try:
        loads = json.loads(raw)["loads"]
        return (
            sum(int(rank["num_running_reqs"]) for rank in loads),
            sum(int(rank["num_waiting_reqs"]) for rank in loads),
        )
    except (ValueError, KeyError, TypeError):
        return None


@operation("wait_drained")
def op_wait_drained(args: WaitDrainedRequest) -> DrainedReply:
    """Wait until the engine at `url` reports nothing running or waiting (`GET /v1/loads`) for
    `settle` seconds in a row, reading it every `poll` seconds, within `timeout`: a request the
    router sent just before the worker's removal may still be on its way into the queue. Read on
    the host, at the engine URL the readiness poll and the smoke decode use. A server that does
    not answer at all runs nothing: drained (`answered` false).
    """
    url = str(args["url"]).rstrip("/")
    timeout = float(args["timeout"])
    settle = float(args["settle"])
    poll = float(args["poll"])
    started = time.monotonic()
    idle_since: float | None = None
    polls = 0
    running = waiting = 0
    while True:
        polls += 1
        try:
            status, raw = _http("GET", url + "/v1/loads", None, timeout=min(10.0, timeout))
        except NoAnswer:
            return {
                "seconds": round(time.monotonic() - started, 3),
                "polls": polls,
                "answered": False,
            }
        counts = summed_loads(raw) if status == 200 else None
        if counts is None:
            raise OpFailure(
                "bad-load-report",
                f"GET {url}/v1/loads answered {status}, not SGLang's load report: {raw[:200]!r}",
            )
        running, waiting = counts
        now = time.monotonic()
        if running == 0 and waiting == 0:
            idle_since = now if idle_since is None else idle_since
            if now - idle_since >= settle:
                return {"seconds": round(now - started, 3), "polls": polls, "answered": True}
        else:
            idle_since = None
        if now - started > timeout:
            raise OpFailure(
                "not-drained",
                f"the engine at {url} still had {running} running and {waiting} waiting after "
                f"{timeout:.0f}s (timeouts.drain)",
            )
        time.sleep(poll)


@operation("smoke")
def op_smoke(args: SmokeRequest) -> SmokeReply:
    """Greedy decodes of the playbook's prompts, checked; then a scan of the log since restart.

    Every failed check is reported in the result (not raised): the controller decides.
    """
    # Long because: the checks run in order against one result, each adding what it found; the agent runs as one file on Python 3.8
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
        waited = max(1.0, deadline - time.monotonic())
        try:
            status, raw = _http("POST", url + "/generate", body, timeout=waited)
        except NoAnswer as exc:
            server = find_server_pid(args.get("pid"), args.get("pid_file"), _port(url))
            log_text = log_since(log_file, offset)
            earlier = ""
            if not find_tracebacks(log_text) and not (server is not None and alive(server)):
                time.sleep(0.3)  # a dying server may still be writing its traceback
                log_text = log_since(log_file, offset)
                if log_file and not find_tracebacks(log_text):  # found dead: since when, why
                    earlier = log_window(str(log_file), None, None, EARLIER_LOG_READ)["text"]
            result["problem"] = explain_no_answer(exc, waited, server, log_text, earlier)
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
    exceptions: list[Result] = []
    evidence: Result = {"log_tail": None, "exception": None}
    if checks and log_file:
        log_text = log_since(log_file, offset)
        hits = scan_log(
            log_text, args.get("fail_patterns") or [], args.get("ignore_patterns") or []
        )
        log_hits = [hit["line"] for hit in hits]
        found = find_tracebacks(log_text)
        exceptions = group_tracebacks(found)
        if log_hits:
            failures.append(f"server log: {_explain_hit(hits[0], found)}")
        if failures:
            _, evidence = failure_evidence(log_text)
    return {
        "ok": not failures,
        "results": results,
        "failures": failures,
        "log_hits": log_hits[:20],
        "log_offset": offset,
        "exceptions": exceptions[:20],
        "log_tail": evidence["log_tail"],
        "exception": evidence["exception"],
    }


def _explain_hit(hit: Result, tracebacks: list[Result]) -> str:
    """The exception behind a matching log line (the first traceback that holds it or starts
    after it), shown with where it was raised; the line itself when no traceback follows it."""
    for found in tracebacks:
        if (found["exception_line_number"] or found["line_number"]) >= hit["line_number"]:
            return describe_exception(found)
    return str(hit["line"])
