"""Process-level helpers: SGLang's log format, fatal-error handling, tracebacks."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import traceback

from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)

# SGLang prints `[time TP0] message` for lines written by the scheduler process (tensor-parallel
# rank 0) and `[time] message` for the HTTP server process. The stand-in is one process, so the
# prefix follows the module that logs.
_SCHEDULER_SIDE_LOGGERS = (
    "sglang.srt.managers.scheduler",
    "sglang.srt.managers.tp_worker",
    "sglang.srt.speculative",
    "sglang.srt.model_executor",
    "sglang.srt.models",
)

FATAL_EXIT_CODE = 1


class _RankPrefixFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.prefix = " TP0" if record.name.startswith(_SCHEDULER_SIDE_LOGGERS) else ""
        return True


def configure_logger(server_args: ServerArgs) -> None:
    """Log `[YYYY-mm-dd HH:MM:SS] message` lines to stderr, or to `--log-file` when given."""
    if server_args.log_file:
        handler: logging.Handler = logging.FileHandler(server_args.log_file, mode="a")
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter("[%(asctime)s%(prefix)s] %(message)s", datefmt="%Y-%m-%d %H:%M:%S")
    )
    handler.addFilter(_RankPrefixFilter())
    root = logging.getLogger("sglang")
    root.handlers[:] = [handler]
    root.setLevel(server_args.log_level.upper())
    root.propagate = False


def flush_log_handlers() -> None:
    for handler in logging.getLogger("sglang").handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()


def get_exception_traceback() -> str:
    return "".join(traceback.format_exception(*sys.exc_info()))


def kill_process_tree(parent_pid: int, include_parent: bool = True) -> None:
    """End the server: its child processes (the stand-in starts none) and then itself.

    Like SGLang, a fatal scheduler error takes the whole server down rather than leaving an HTTP
    front end that accepts requests nobody will answer.
    """
    logger.error(f"kill_process_tree called (parent pid {parent_pid})")
    flush_log_handlers()
    if include_parent and parent_pid == os.getpid():
        os._exit(FATAL_EXIT_CODE)
    os.kill(parent_pid, signal.SIGKILL)


def _on_sigquit(signum: int, frame: object) -> None:
    logger.error(
        "SIGQUIT received. It usually means the scheduler failed; shutting down the server."
    )
    kill_process_tree(os.getpid())


def install_sigquit_handler() -> None:
    """Route SIGQUIT (sent by a failing scheduler) to `kill_process_tree` in the main thread."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGQUIT, _on_sigquit)


def report_fatal_error_to_parent(grace_seconds: float = 5.0) -> None:
    """What the scheduler does after a fatal error: SIGQUIT to the server process.

    If the signal is not handled within `grace_seconds` (no handler installed, main thread
    stuck), the scheduler ends the process itself.
    """
    flush_log_handlers()
    with contextlib.suppress(OSError):
        os.kill(os.getpid(), signal.SIGQUIT)
    done = threading.Event()
    done.wait(grace_seconds)
    kill_process_tree(os.getpid())
