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

FATAL_EXIT_CODE = 1
# Seconds a failing child waits, after SIGQUIT to its parent, for the parent to end the tree.
_FATAL_GRACE_S = 5.0
_PR_SET_PDEATHSIG = 1

_shutting_down = threading.Event()


class _PrefixFilter(logging.Filter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        record.prefix = self.prefix
        return True


def configure_logger(server_args: ServerArgs, prefix: str = "") -> None:
    """Log `[YYYY-mm-dd HH:MM:SS] message` lines to stderr, or to `--log-file` when given.

    SGLang's scheduler processes log `[time TP<rank>] message` (prefix " TP<rank>"); the main
    process (HTTP server, tokenizer manager) and the detokenizer log without a prefix. Every
    process appends to the same file.
    """
    if server_args.log_file:
        handler: logging.Handler = logging.FileHandler(server_args.log_file, mode="a")
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter("[%(asctime)s%(prefix)s] %(message)s", datefmt="%Y-%m-%d %H:%M:%S")
    )
    handler.addFilter(_PrefixFilter(prefix))
    root = logging.getLogger("sglang")
    root.handlers[:] = [handler]
    root.setLevel(server_args.log_level.upper())
    root.propagate = False


def freeze_gc(context: str) -> None:
    """`gc.freeze()` in this process, as SGLang's `freeze_gc` (logged at debug level there too)."""
    import gc

    before = gc.get_count()
    gc.freeze()
    logger.debug(f"Freezing GC in {context} process. counts: {before}->{gc.get_count()}")


def set_process_name(name: str) -> None:
    """Name the process in /proc (`comm`, 15 characters), as SGLang's setproctitle does."""
    with contextlib.suppress(OSError):
        with open("/proc/self/comm", "w", encoding="utf-8") as handle:
            handle.write(name[:15])


def kill_itself_when_parent_died() -> None:
    """SIGKILL this process when its parent dies (Linux prctl), so no child outlives a server
    that was killed outright."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # the parent died before the prctl
        os._exit(FATAL_EXIT_CODE)


def mark_shutting_down() -> None:
    """A deliberate stop: children that end from now on are not a failure."""
    _shutting_down.set()


def is_shutting_down() -> bool:
    return _shutting_down.is_set()


def flush_log_handlers() -> None:
    for handler in logging.getLogger("sglang").handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()


def get_exception_traceback() -> str:
    return "".join(traceback.format_exception(*sys.exc_info()))


def kill_process_tree(parent_pid: int, include_parent: bool = True) -> None:
    """End the server: every child process (schedulers, detokenizer), then itself.

    Like SGLang, a fatal scheduler error takes the whole server down rather than leaving an HTTP
    front end that accepts requests nobody will answer.
    """
    logger.error(f"kill_process_tree called (parent pid {parent_pid})")
    flush_log_handlers()
    if parent_pid == os.getpid():
        import multiprocessing

        for child in multiprocessing.active_children():
            with contextlib.suppress(OSError):
                os.kill(child.pid or 0, signal.SIGKILL)
        if include_parent:
            os._exit(FATAL_EXIT_CODE)
        return
    os.kill(parent_pid, signal.SIGKILL)


def _on_sigquit(signum: int, frame: object) -> None:
    if is_shutting_down():
        return
    logger.error(
        "SIGQUIT received. It usually means the scheduler failed; shutting down the server."
    )
    kill_process_tree(os.getpid())


def install_sigquit_handler() -> None:
    """Route SIGQUIT (sent by a failing child process) to `kill_process_tree`."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGQUIT, _on_sigquit)


def report_fatal_error_to_parent(grace_seconds: float = _FATAL_GRACE_S) -> None:
    """What a scheduler process does after a fatal error: SIGQUIT to the server's main process,
    which ends the whole tree (this process included). If that has not happened within
    `grace_seconds`, the scheduler ends itself."""
    flush_log_handlers()
    with contextlib.suppress(OSError):
        os.kill(os.getppid(), signal.SIGQUIT)
    threading.Event().wait(grace_seconds)
    os._exit(FATAL_EXIT_CODE)
