"""Live fixes on the host: find the running engine's sockets (opspatch's SGLang plugin listens on
one per process) and ask them, one JSON line each way."""

from __future__ import annotations

import contextlib
import json
import os
import re
from typing import TYPE_CHECKING, Any

from opspatch.hosts.agent.processes import alive, find_server_pid, process_tree
from opspatch.hosts.agent.protocol import operation

if TYPE_CHECKING:
    from opspatch.hosts.agent.protocol import LiveAnswer, LiveReply, LiveRequest

PLUGIN_NAME = "opspatch_live"
PLUGINS_ENV = "SGLANG_PLUGINS"
LIVE_DIR_ENV = "OPSPATCH_LIVE_DIR"
ROOT_BASE = "/run/opspatch-live"
USER_BASE = "/tmp/opspatch-live-{uid}"
ENTRY_SOCKET = "scheduler-tp0.sock"
MAX_REPLY_BYTES = 1 << 20
BROADCAST_OPS = ("take", "revert")
"""Ops a scheduler applies at a boundary on every rank: sent to the entry rank only."""


def base_dir(environ: dict[str, str], uid: int) -> str:
    """The folder of every engine's socket folder, for an engine with this environment and uid."""
    explicit = environ.get(LIVE_DIR_ENV, "")
    if explicit:
        return explicit
    return ROOT_BASE if uid == 0 else USER_BASE.format(uid=uid)


def plugins_filtered_out(environ: dict[str, str]) -> str | None:
    """Why an engine with this environment does not load opspatch's plugin though it may be
    installed: `SGLANG_PLUGINS` is set without it. None when nothing filters it out."""
    raw = environ.get(PLUGINS_ENV, "")
    names = [name.strip() for name in raw.split(",") if name.strip()]
    if not names or PLUGIN_NAME in names:
        return None
    return (
        f"{PLUGINS_ENV}={raw} restricts the engine's plugins to {', '.join(names)}, so "
        f"{PLUGIN_NAME} does not load and live fixes are off; add {PLUGIN_NAME} to "
        f"{PLUGINS_ENV} in the engine's environment (the restart that follows loads it)"
    )


def process_environ(pid: int) -> dict[str, str] | None:
    """The environment `pid` started with (/proc), or None where this user may not read it."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    found: dict[str, str] = {}
    for entry in raw.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep:
            found[name.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return found


def _process_uid(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def server_folder(pid: int, env: dict[str, str]) -> tuple[str | None, dict[str, str]]:
    """The socket folder of the server whose process (or wrapper) is `pid`, and the environment
    its engine runs with (`env`, the inventory's, where /proc cannot be read)."""
    seen_environ: dict[str, str] | None = None
    for candidate in process_tree(pid):
        environ = process_environ(candidate)
        if seen_environ is None and environ is not None:
            seen_environ = environ
        uid = _process_uid(candidate)
        if uid is None:
            continue
        folder = os.path.join(base_dir(environ or env, uid), str(candidate))
        if os.path.isdir(folder):
            return folder, environ or env
    return None, seen_environ if seen_environ is not None else env


def _not_allowed_in(folder: str, pid: int) -> str:
    """Why this agent cannot reach the engine's sockets: its user may not enter their folder
    (only root and the engine's user may, as only they may use a socket)."""
    return (
        f"this user (uid {os.geteuid()}) may not enter {folder}: only root and the engine's "
        f"user (uid {_process_uid(pid)}) may ask its processes; run the agent as one of them "
        "(the inventory's become and become_user)"
    )


def socket_order(names: list[str]) -> list[str]:
    """Socket names in a stable order: main, the detokenizer, then schedulers by rank."""

    def key(name: str) -> tuple[int, int]:
        match = re.match(r"^scheduler-tp(\d+)\.sock$", name)
        if match:
            return 2, int(match.group(1))
        return (0 if name == "main.sock" else 1), 0

    return sorted(names, key=key)


def sockets_to_ask(names: list[str], op: str) -> list[str]:
    """Which sockets a request goes to: a take or revert to every process but the schedulers
    after the entry rank (the entry rank applies it on every rank); anything else to all."""
    ordered = socket_order(names)
    if op not in BROADCAST_OPS:
        return ordered
    return [n for n in ordered if not n.startswith("scheduler-") or n == ENTRY_SOCKET]


def ask_socket(path: str, request: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One request line to the socket at `path`, its reply line back.

    Raises:
        OSError: nobody listens there (or this user may not connect).
        ValueError: the reply is not one JSON object.
    """
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(timeout)
        connection.connect(path)
        # a process refusing this peer's uid answers and closes before it reads: read its answer
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            connection.sendall((json.dumps(request, separators=(",", ":")) + "\n").encode())
        with connection.makefile("rb") as stream:
            line = stream.readline(MAX_REPLY_BYTES + 1)
    if not line.endswith(b"\n"):
        raise ValueError("the process closed the connection before a whole reply line")
    document = json.loads(line.decode("utf-8"))
    if not isinstance(document, dict):
        raise ValueError("the reply is not one JSON object")
    return document


@operation("live")
def op_live(args: LiveRequest) -> LiveReply:
    """Send a live fix's request to the running engine's processes and return what each said.

    Nothing is refused here: an engine that is not running or has no socket answers `missing`
    (why no process was asked, `SGLANG_PLUGINS` without the plugin named), with `unread` when
    it is this agent's user that may not ask (another user's engine, or a folder it may not
    enter: what the engine holds is then unknown), a socket that cannot be asked its `error`; the controller judges."""
    url = str(args.get("url") or "")
    match = re.match(r"^[a-z]+://[^/:]+:(\d+)", url)
    port = int(match.group(1)) if match else None
    pid = find_server_pid(args.get("pid"), args.get("pid_file"), port)
    reply: LiveReply = {
        "server_pid": pid,
        "folder": None,
        "missing": None,
        "answers": [],
        "unread": False,
    }
    if pid is None or not alive(pid):
        reply["missing"] = "the engine is not running"
        return reply
    me = os.geteuid()
    uids = {uid for p in process_tree(pid) if (uid := _process_uid(p)) is not None}
    if me != 0 and uids and me not in uids:  # its folder and sockets are closed to this user
        reply["missing"] = (
            f"the engine (pid {pid}) runs as uid {', '.join(map(str, sorted(uids)))} and this "
            f"agent as uid {me}: its live sockets admit only root and the engine's user, so "
            "what it holds could not be asked (`become` in the inventory raises the agent)"
        )
        reply["unread"] = True
        return reply
    env = dict(args.get("env") or {})
    folder, environ = server_folder(pid, env)
    if folder is None:
        base = base_dir(environ, _process_uid(pid) or 0)
        filtered = plugins_filtered_out(environ)
        closed = not filtered and os.path.isdir(base) and not os.access(base, os.X_OK)
        reply["unread"] = closed
        reply["missing"] = filtered or (
            _not_allowed_in(base, pid)
            if closed
            else f"no process of the engine (pid {pid}) listens for live fixes: opspatch's "
            "plugin is not installed in its environment, or installed since the engine started "
            "(`opspatch live enable`, then a restart)"
        )
        return reply
    reply["folder"] = folder
    fix = dict(args["fix"])
    try:
        names = [n for n in os.listdir(folder) if n.endswith(".sock")]
    except PermissionError:
        reply["missing"] = _not_allowed_in(folder, pid)
        reply["unread"] = True
        return reply
    if not names:
        reply["missing"] = f"{folder} holds no socket: the engine's processes are not listening"
    for name in sockets_to_ask(names, str(fix.get("op"))):
        answer: LiveAnswer = {"socket": name, "reply": None, "error": None}
        try:
            answer["reply"] = ask_socket(os.path.join(folder, name), fix, float(args["timeout"]))
        except (OSError, ValueError) as error:
            answer["error"] = f"{type(error).__name__}: {error}"
        reply["answers"].append(answer)
    return reply
