"""The plugin's entry point: `load()`, which SGLang's `load_plugins()` calls (no argument) early in
every process of the server, as entry point `opspatch_live` of group `sglang.srt.plugins`."""

from __future__ import annotations

import atexit
import contextlib
import glob
import importlib.abc
import logging
import os
import sys
import threading
from typing import Any

from . import answers, boundary, hooks, listener, socket_paths

logger = logging.getLogger("sglang.opspatch_live")

SERVER_PID_ENV = "OPSPATCH_LIVE_SERVER_PID"
DETOKENIZER_MODULE = "sglang.srt.managers.detokenizer_manager"
MAIN_MODULES = ("sglang.srt.entrypoints.engine", "sglang.srt.entrypoints.http_server")
"""A process that imports one of these before any other process of its tree loaded the plugin is
a server's main process (the `.pth` start; `load` is called there directly)."""

_listeners: dict[str, listener.Listener] = {}
_lock = threading.Lock()


def load() -> None:
    """Hook what this process has of SGLang's scheduler and detokenizer, and, in the server's
    main process, listen at once. Safe to call again; never raises into the engine."""
    try:
        main = SERVER_PID_ENV not in os.environ
        if main:
            os.environ[SERVER_PID_ENV] = str(os.getpid())
        boundary.install(_listen_as_scheduler)
        detokenizer = getattr(sys.modules.get(DETOKENIZER_MODULE), "DetokenizerManager", None)
        if detokenizer is not None:
            hooks.after_init(
                detokenizer, lambda manager: start_listener(socket_paths.ROLE_DETOKENIZER)
            )
        if main:
            start_listener(socket_paths.ROLE_MAIN)
    except Exception:
        logger.exception("opspatch live: the plugin failed to load; live fixes are off here")


def server_pid() -> int:
    """The pid of this server's main process (this process's, before it spawned any)."""
    return int(os.environ.get(SERVER_PID_ENV) or os.getpid())


def start_listener(role: str, rank: int | None = None) -> None:
    """Listen on this process's socket; a folder or path that is not safe leaves live fixes off
    in this process, logged, and the engine running."""
    name = socket_paths.socket_name(role, rank)
    with _lock:
        if name in _listeners:
            return
        try:
            path = listener.prepare_socket_path(os.environ, server_pid(), role, rank)
            if role == socket_paths.ROLE_SCHEDULER:
                answer = _scheduler_answer(role, rank)
            else:
                answer = _direct_answer(role, rank)
            live = listener.Listener(path, answer)
            live.start()
        except (listener.LiveDirError, OSError) as error:
            logger.warning(f"opspatch live: live fixes are off in this process: {error}")
            return
        _listeners[name] = live
    if role == socket_paths.ROLE_MAIN:
        atexit.register(_remove_server_folder, os.path.dirname(path))
        for folder in listener.remove_dead_servers(
            os.path.dirname(os.path.dirname(path)), server_pid()
        ):
            logger.info(f"opspatch live: removed {folder}, left by a server that is gone")
    else:
        atexit.register(live.close)
    logger.info(f"opspatch live: listening on {path} ({role}, pid {os.getpid()})")


def _listen_as_scheduler(rank: int | None) -> None:
    start_listener(socket_paths.ROLE_SCHEDULER, rank)


def _direct_answer(role: str, rank: int | None) -> listener.Answer:
    def answer(request: dict[str, Any]) -> dict[str, Any]:
        reply = dict(answers.apply_here(request))
        reply["process"] = answers.describe(role, rank)
        return reply

    return answer


def _scheduler_answer(role: str, rank: int | None) -> listener.Answer:
    def answer(request: dict[str, Any]) -> dict[str, Any]:
        refused = answers.bad_op(request)
        if refused is None and request.get("op") in ("take", "revert"):
            reply = boundary.STATE.submit(request)
        else:
            reply = dict(refused or answers.apply_here(request))
        reply.setdefault("process", answers.describe(role, rank))
        return reply

    return answer


def _remove_server_folder(folder: str) -> None:
    """At the main process's exit: its folder and the sockets left in it (children that were
    killed leave theirs). A main process that is killed, as real SGLang stopped by a signal
    kills itself, runs no exit handler: the next server's main removes its folder
    (`listener.remove_dead_servers`)."""
    for path in glob.glob(os.path.join(folder, "*.sock")):
        with contextlib.suppress(OSError):
            os.unlink(path)
    with contextlib.suppress(OSError):
        os.rmdir(folder)


# -- the `.pth` start, for releases without the plugin framework ----------------------------------

WATCHED = (boundary.SCHEDULER_MODULE, DETOKENIZER_MODULE, *MAIN_MODULES)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a watched SGLang module, the spec the other finders give, with
    `load()` run once the module's code has run."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in WATCHED:
            return None
        spec = None
        for finder in sys.meta_path:  # the finders after us (an editable install has its own)
            find = getattr(finder, "find_spec", None)
            if finder is not self and find is not None:
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        loader = getattr(spec, "loader", None)
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return None

        def exec_then_load(module: Any) -> None:
            exec_module(module)
            load()

        loader.exec_module = exec_then_load  # type: ignore[union-attr]
        return spec


def start_at_interpreter_start() -> None:
    """What the `.pth` line runs in every interpreter of the engine's environment: nothing but
    a finder that waits for SGLang's modules (a process that never imports them is untouched)."""
    answers.started_by = answers.START_PTH
    if not any(isinstance(finder, _AfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())
