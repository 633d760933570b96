"""`diagnose`: everything opspatch needs to know about a host in trouble, in one exec."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import time
from typing import TYPE_CHECKING, Any, cast

from opspatch.hosts.agent.checks import find_tracebacks, group_tracebacks
from opspatch.hosts.agent.engine import NoAnswer, _http, _port, op_smoke
from opspatch.hosts.agent.facts import collect_facts, resolve_module_file
from opspatch.hosts.agent.files import read_file
from opspatch.hosts.agent.fsutil import LOG_STAMP, log_window, unb64
from opspatch.hosts.agent.processes import (
    alive,
    listening_pids,
    process_start_epoch,
    process_tree,
    read_pid_file,
)
from opspatch.hosts.agent.protocol import OpFailure, operation
from opspatch.hosts.agent.provenance import (
    bytecode_state,
    checkout_state,
    distribution_info,
    installed_copies,
    installed_distributions,
)

if TYPE_CHECKING:
    from opspatch.hosts.agent.protocol import DiagnoseReply, DiagnoseRequest, Result

DEFAULT_MAX_LOG_READ = 32 * 1024 * 1024
"""Bytes of the log read from its end: a log larger than this is read from its tail."""
DEFAULT_MAX_LOG_TEXT = 1024 * 1024
"""Bytes of the log window sent back (its head and its tail when longer)."""
DEFAULT_SOURCE_BUDGET = 8 * 1024 * 1024
DEFAULT_MAX_SOURCES = 400
START_TIME_SLACK = 2.0
"""Seconds a process start time read from /proc may be early (the boot time it is counted from
is a whole second): a file changed within this of the start is not called newer than the
server."""
LOG_MARKERS = (
    ("scheduler-exception", r"Scheduler hit an exception"),
    ("warmup-failed", r"Initialization failed\. warmup error|warm ?up (?:failed|error)"),
    ("cuda-oom", r"CUDA out of memory|OutOfMemoryError"),
    ("cuda-graph-capture-failed", r"(?i)cuda graph capture failed|capture cuda graph failed"),
    ("server-exit", r"SIGQUIT received|kill_process_tree called"),
    ("ready", r"The server is fired up and ready to roll!"),
)
"""Log lines that name a known failure (or the end of a start-up), by kind."""


# ---------------------------------------------------------------------------------------------
# the server process


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            raw = handle.read()
    except OSError:
        return []
    return [part.decode("utf-8", "replace") for part in raw.split(b"\0") if part]


def _environ_value(pid: int, name: str) -> str | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    prefix = name.encode() + b"="
    for entry in raw.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix) :].decode("utf-8", "replace")
    return None


def speculative_settings(argv: list[str]) -> Result:
    """The `--speculative-*` options of a launch command line (`--opt value` or `--opt=value`;
    a flag without a value is `true`)."""
    found: Result = {}
    for index, arg in enumerate(argv):
        if not arg.startswith("--speculative"):
            continue
        name, sep, value = arg[2:].partition("=")
        if not sep:
            following = argv[index + 1] if index + 1 < len(argv) else None
            value = (
                following if following is not None and not following.startswith("--") else "true"
            )
        found[name] = value
    return found


def _tool_pid(argv: list[str]) -> int | None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = done.stdout.strip()
    return int(text) if done.returncode == 0 and text.isdigit() and text != "0" else None


def locate_server(restart: Result, url: str | None) -> tuple[int | None, str]:
    """The engine's process and how it was found: whoever listens on the URL's port (the
    server itself), else the restart strategy's pid (pid file, systemd MainPID, supervisor)."""
    port = _port(url) if url else None
    if port is not None:
        listening = listening_pids(port)
        if listening:
            return listening[0], f"listening on port {port}"
    kind = restart.get("kind")
    if kind == "command" and restart.get("pid_file"):
        pid = read_pid_file(str(restart["pid_file"]))
        if pid is not None and alive(pid):
            tree = [p for p in process_tree(pid) if alive(p)]
            engine = next((p for p in tree if "sglang" in " ".join(_cmdline(p))), pid)
            return engine, f"pid file {restart['pid_file']}"
        return pid, f"pid file {restart['pid_file']}"
    if kind == "systemd" and restart.get("unit"):
        unit = str(restart["unit"])
        found = _tool_pid(["systemctl", "show", "-p", "MainPID", "--value", unit])
        return found, f"systemd unit {unit}"
    if kind == "supervisor" and restart.get("program"):
        ctl = ["supervisorctl"] + (["-c", restart["config"]] if restart.get("config") else [])
        found = _tool_pid(ctl + ["pid", str(restart["program"])])
        return found, f"supervisor program {restart['program']}"
    return None, "no pid file, unit or listening process"


def server_state(restart: Result, url: str | None, health_timeout: float) -> Result:
    """The engine's process (pid, start time, command line, speculative settings) and what
    /health answers."""
    pid, found_by = locate_server(restart, url)
    running = pid is not None and alive(pid)
    state: Result = {
        "pid": pid,
        "found_by": found_by,
        "running": running,
        "started_at": None,
        "cmdline": [],
        "speculative": {},
        "spec_v2_env": None,
        "health": None,
    }
    if running and pid is not None:
        argv = _cmdline(pid)
        state.update(
            started_at=process_start_epoch(
                pid, str(restart["pid_file"]) if restart.get("pid_file") else None
            ),
            cmdline=argv,
            speculative=speculative_settings(argv),
            spec_v2_env=_environ_value(pid, "SGLANG_ENABLE_SPEC_V2"),
        )
    if url:
        started = time.monotonic()
        try:
            status, body = _http("GET", url.rstrip("/") + "/health", None, timeout=health_timeout)
            state["health"] = {
                "status": status,
                "seconds": round(time.monotonic() - started, 3),
                "error": None if status == 200 else body[:200].decode("utf-8", "replace"),
            }
        except NoAnswer as exc:
            state["health"] = {"status": None, "seconds": None, "error": str(exc)}
    return state


# ---------------------------------------------------------------------------------------------
# the log


def log_markers(text: str) -> list[Result]:
    """Each `LOG_MARKERS` kind found: count, first and last time, the first line."""
    found: list[Result] = []
    lines = text.splitlines()
    for kind, pattern in LOG_MARKERS:
        regex = re.compile(pattern)
        hits = [(n, line) for n, line in enumerate(lines, start=1) if regex.search(line)]
        if not hits:
            continue
        stamps = []
        for _, line in hits:
            stamp = LOG_STAMP.match(line)
            if stamp is not None:
                stamps.append(stamp.group(1))
        found.append(
            {
                "kind": kind,
                "count": len(hits),
                "first_time": stamps[0] if stamps else None,
                "last_time": stamps[-1] if stamps else None,
                "line_number": hits[0][0],
                "line": hits[0][1].strip()[:300],
            }
        )
    return found


def grouped_tracebacks(text: str) -> list[Result]:
    """The log's tracebacks grouped by exception (`checks.group_tracebacks`), each with the file
    and line of the frame that raised it."""
    found = find_tracebacks(text)
    groups = group_tracebacks(found)
    for group in groups:
        first = next(
            t for t in found if (t["type"], t["message"]) == (group["type"], group["message"])
        )
        group["file"] = first["file"]
        group["lineno"] = first["lineno"]
        group["context"] = first["context"]
    return groups


def _bounded(text: str, limit: int) -> tuple[str, bool]:
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text, False
    half = limit // 2
    head = data[:half].decode("utf-8", "ignore")
    tail = data[-half:].decode("utf-8", "ignore")
    skipped = len(data) - 2 * half
    return f"{head}\n[... {skipped} bytes of the log not sent ...]\n{tail}", True


# ---------------------------------------------------------------------------------------------
# source for the controller's analyses


def _imported_files(path: str, text: str, top: str) -> list[str]:
    """The files of the same-package modules a source file imports (absolute and relative)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    names: list[str] = []
    folder = os.path.dirname(path)
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = folder
                for _ in range(node.level - 1):
                    base = os.path.dirname(base)
                parts = (node.module or "").split(".") if node.module else []
                candidates = [os.path.join(base, *parts)] if parts else []
                candidates += [os.path.join(base, *parts, a.name) for a in node.names]
                for candidate in candidates:
                    for option in (candidate + ".py", os.path.join(candidate, "__init__.py")):
                        if os.path.isfile(option):
                            found.append(option)
                            break
            elif node.module:
                names.append(node.module)
    for name in dict.fromkeys(names):
        if name.split(".")[0] != top:
            continue
        try:
            found.append(resolve_module_file(name)["origin"])
        except OpFailure:
            continue
    return found


def top_package(path: str) -> str | None:
    """The top-level package a source file belongs to (the outermost folder above it that has
    an `__init__.py`), or None for a file outside any package."""
    folder = os.path.dirname(os.path.abspath(path))
    top = None
    while os.path.isfile(os.path.join(folder, "__init__.py")):
        top = os.path.basename(folder)
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    return top


def gather_sources(seeds: list[str], budget: int, max_files: int) -> Result:
    """The seed files, their package siblings, and the same-package modules any of those
    imports, as text; bounded by `budget` bytes and `max_files` (what did not fit is named)."""
    ordered: list[str] = []
    for seed in seeds:
        ordered.append(seed)
        folder = os.path.dirname(seed)
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        ordered += [os.path.join(folder, n) for n in names if n.endswith(".py")]
    texts: dict[str, str] = {}
    left_out: list[str] = []
    used = 0

    def take(path: str) -> None:
        nonlocal used
        real = os.path.realpath(path)
        if real in texts or real in left_out:
            return
        try:
            size = os.path.getsize(real)
            if len(texts) >= max_files or used + size > budget:
                left_out.append(real)
                return
            with open(real, "rb") as handle:
                texts[real] = handle.read().decode("utf-8", "replace")
        except OSError:
            return
        used += size

    first_ring = list(dict.fromkeys(os.path.realpath(p) for p in ordered))
    for path in first_ring:
        take(path)
    for path in first_ring:
        top = top_package(path)
        if top is not None and path in texts:
            for imported in _imported_files(path, texts[path], top):
                take(imported)
    return {
        "files": [{"path": p, "text": t} for p, t in texts.items()],
        "left_out": left_out,
        "bytes": used,
    }


# ---------------------------------------------------------------------------------------------
# the operation


def _newer(mtime: float, start: float | None) -> bool | None:
    return None if start is None else start + START_TIME_SLACK < mtime


def module_facts(module: str, started_at: float | None, log_started_at: float | None) -> Result:
    """One module's file and where its code comes from; a module that does not resolve is a
    value (`error`), not a failure of the whole diagnosis. `server_older_than_file`: the running
    server started before the file last changed; `changed_after_log_start`: the file changed
    after the start the log window begins with (its logged exceptions ran the earlier code)."""
    try:
        resolved = resolve_module_file(module)
    except OpFailure as failure:
        return {"module": module, "error": {"code": failure.code, "message": failure.message}}
    file = read_file(resolved["origin"])
    content = unb64(file["content_b64"])
    top = module.split(".")[0]
    mtime = file["mtime_ns"] / 1e9
    return dict(
        resolved,
        error=None,
        file=file,
        installed=distribution_info(top),
        distributions=installed_distributions(top),
        copies=installed_copies(top, resolved["realpath"]),
        checkout=checkout_state(resolved["realpath"], content),
        bytecode=bytecode_state([resolved["origin"], resolved["realpath"]], content),
        server_older_than_file=_newer(mtime, started_at),
        changed_after_log_start=_newer(mtime, log_started_at),
    )


@operation("diagnose")
def op_diagnose(args: DiagnoseRequest) -> DiagnoseReply:
    """The facts `opspatch diagnose` reports for one host (see the module docstring).

    Args: `modules` (dotted names), `server` (`{"url", "restart", "health_timeout"}` or None),
    `smoke` (the `smoke` operation's args, or None), `log` (`{"file", "since_seconds",
    "max_read", "max_text"}` or None), `sources` (`{"modules": [...], "tracebacks": bool,
    "budget", "max_files"}` or None), `facts` (bool).
    """
    result: Result = {"facts": collect_facts() if args.get("facts", True) else None}
    server_args = args.get("server")
    server: Result | None = None
    if server_args:
        server = server_state(
            dict(server_args.get("restart") or {}),
            server_args.get("url"),
            float(server_args.get("health_timeout") or 20.0),
        )
    result["server"] = server
    started_at = server["started_at"] if server else None
    smoke_args = args.get("smoke")
    if smoke_args:
        result["smoke"] = op_smoke(smoke_args)
        if server is not None and server["pid"] is not None:
            server["running_after_decode"] = alive(int(server["pid"]))
    else:
        result["smoke"] = None
    log_args = args.get("log")
    tracebacks: list[Result] = []
    result["log"] = None
    if log_args and log_args.get("file"):
        window = log_window(
            str(log_args["file"]),
            log_args.get("since_seconds"),
            started_at,
            int(log_args.get("max_read") or DEFAULT_MAX_LOG_READ),
        )
        text = window.pop("text")
        tracebacks = grouped_tracebacks(text)
        window["tracebacks"] = tracebacks
        window["markers"] = log_markers(text)
        window["text"], window["text_cut"] = _bounded(
            text, int(log_args.get("max_text") or DEFAULT_MAX_LOG_TEXT)
        )
        result["log"] = window
    log_started_at = result["log"]["started_at"] if result["log"] else None
    modules = [str(m) for m in args.get("modules") or []]
    result["modules"] = [module_facts(m, started_at, log_started_at) for m in modules]
    result["sources"] = _sources(args.get("sources"), result["modules"], tracebacks)
    return cast("DiagnoseReply", result)


def _sources(wanted: Any, modules: list[Result], tracebacks: list[Result]) -> Result | None:
    """The source files the controller's analyses need (see `gather_sources`): the files of the
    modules asked for, and of the frames where logged AttributeErrors were raised."""
    if not wanted:
        return None
    by_name = {m["module"]: m for m in modules}
    seeds: list[str] = []
    for name in wanted.get("modules") or []:
        found = by_name.get(name)
        if found is not None and not found.get("error"):
            seeds.append(found["realpath"])
    if wanted.get("tracebacks"):
        for group in tracebacks:
            path = group.get("file")
            raised = str(group.get("type") or "")
            if raised.endswith("AttributeError") and path and os.path.isfile(path):
                seeds.append(os.path.realpath(path))
    return gather_sources(
        list(dict.fromkeys(seeds)),
        int(wanted.get("budget") or DEFAULT_SOURCE_BUDGET),
        int(wanted.get("max_files") or DEFAULT_MAX_SOURCES),
    )
