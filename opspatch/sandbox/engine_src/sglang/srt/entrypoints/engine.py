"""The engine's processes, as SGLang's `engine.py` starts them, and the offline Engine.

`multiprocessing.set_start_method("spawn", force=True)`; the main process runs the tokenizer
manager (and, under `launch_server`, the HTTP server); each TP rank of this node is its own
scheduler process; node 0 also runs a detokenizer process. Children are spawned (a fresh
interpreter each, `site` and all), die with the main process (PR_SET_PDEATHSIG), and a child that
ends unexpectedly ends the main process and so the whole tree.

This module imports no torch: the main process never loads the model; only the scheduler
processes import torch (the detokenizer does not).

`Engine(**server_args).generate(prompt, sampling_params)` returns what `/generate` would. Used to
drive the decoding path directly (for example to compare speculative and plain greedy output).
Like the server, a scheduler exception ends the process.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import logging
import multiprocessing
import os
import signal
import socket
import threading
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

from sglang.srt.managers.tokenizer_manager import TokenizerManager
from sglang.srt.plugins import load_plugins
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils import (
    configure_logger,
    flush_log_handlers,
    install_sigquit_handler,
    is_shutting_down,
    kill_process_tree,
    mark_shutting_down,
)

logger = logging.getLogger(__name__)

CHILD_STOP_TIMEOUT_S = 5.0


def _run_scheduler_process(*args: Any) -> None:
    """The scheduler process's entry point, here so that spawning it imports nothing heavy in
    the main process (the child imports the scheduler, and torch, itself)."""
    import warnings

    # torch warns on import when NumPy is not installed; the stand-in never converts to NumPy,
    # and the warning would break the SGLang log format operators (and log scans) rely on.
    warnings.filterwarnings("ignore", message=r"Failed to initialize NumPy")
    from sglang.srt.managers.scheduler import run_scheduler_process

    run_scheduler_process(*args)


def _run_detokenizer_process(*args: Any) -> None:
    from sglang.srt.managers.detokenizer_manager import run_detokenizer_process

    run_detokenizer_process(*args)


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class EngineProcesses:
    """This node's children and, on node 0, what the tokenizer manager talks to."""

    processes: list[BaseProcess] = field(default_factory=list)
    tokenizer_manager: TokenizerManager | None = None
    scheduler_infos: list[dict[str, Any]] = field(default_factory=list)

    def stop(self) -> None:
        """A deliberate stop: SIGTERM every child, SIGKILL what is left after a grace."""
        mark_shutting_down()
        for process in self.processes:
            if process.is_alive() and process.pid:
                with contextlib.suppress(OSError):
                    os.kill(process.pid, signal.SIGTERM)
        for process in self.processes:
            process.join(CHILD_STOP_TIMEOUT_S)
            if process.is_alive():
                process.kill()
                process.join(CHILD_STOP_TIMEOUT_S)


def _watch_children(processes: list[BaseProcess]) -> None:
    """A child that ends while the server is not being stopped takes the server down."""
    sentinels = {process.sentinel: process for process in processes}
    ended = wait(list(sentinels))
    if is_shutting_down():
        return
    process = sentinels[ended[0]]  # type: ignore[index]
    # A child that failed sends SIGQUIT first and waits to be killed; give the handler a moment.
    threading.Event().wait(1.0)
    if is_shutting_down():
        return
    logger.error(
        f"Child process {process.name} (pid {process.pid}) unexpectedly failed with exit code "
        f"{process.exitcode}; shutting down the server."
    )
    kill_process_tree(os.getpid())


def launch_subprocesses(server_args: ServerArgs) -> EngineProcesses:
    """Start this node's scheduler processes (and on node 0 the detokenizer), wait until every
    one is ready (which needs every rank of every node to have joined the TP group), then
    return. On node 0 the result holds the tokenizer manager."""
    # Long because: it mirrors SGLang's own function of this name, kept in its shape
    multiprocessing.set_start_method("spawn", force=True)
    # Defensive, as in SGLang: a caller may have loaded them already (loading is idempotent).
    load_plugins()
    install_sigquit_handler()
    # Registered after multiprocessing's own exit handler, so it runs first: an interpreter
    # that exits normally ends its (daemonic) children, which is no failure.
    atexit.register(mark_shutting_down)
    dist_init_addr = server_args.dist_init_addr
    if dist_init_addr is None and server_args.tp_size > 1:
        dist_init_addr = f"127.0.0.1:{_free_loopback_port()}"
    is_head = server_args.node_rank == 0
    started = EngineProcesses()

    # Pipes: tokenizer -> TP0, TP0 -> detokenizer, detokenizer -> tokenizer, TP0 -> tokenizer.
    to_scheduler_r = to_scheduler_w = to_detok_r = to_detok_w = None
    to_tok_r = to_tok_w = rpc_r = rpc_w = None
    if is_head:
        to_scheduler_r, to_scheduler_w = multiprocessing.Pipe(duplex=False)
        to_detok_r, to_detok_w = multiprocessing.Pipe(duplex=False)
        to_tok_r, to_tok_w = multiprocessing.Pipe(duplex=False)
        rpc_r, rpc_w = multiprocessing.Pipe(duplex=False)

    ready_readers: list[Connection] = []
    for tp_rank in server_args.node_tp_ranks():
        ready_r, ready_w = multiprocessing.Pipe(duplex=False)
        first = tp_rank == 0
        process = multiprocessing.Process(
            target=_run_scheduler_process,
            args=(
                server_args,
                tp_rank,
                dist_init_addr,
                ready_w,
                to_scheduler_r if first else None,
                to_detok_w if first else None,
                rpc_w if first else None,
            ),
            name=f"scheduler_TP{tp_rank}",
            # Daemonic: an interpreter that exits (the offline Engine's) ends its children.
            daemon=True,
        )
        process.start()
        ready_w.close()
        started.processes.append(process)
        ready_readers.append(ready_r)
    if is_head:
        process = multiprocessing.Process(
            target=_run_detokenizer_process,
            args=(server_args, to_detok_r, to_tok_w),
            name="detokenizer",
            daemon=True,
        )
        process.start()
        started.processes.append(process)
        # The children hold their own copies; ours would keep a dead child's pipe open.
        for end in (to_scheduler_r, to_detok_r, to_detok_w, to_tok_w, rpc_w):
            assert end is not None
            end.close()

    for tp_rank, reader in zip(server_args.node_tp_ranks(), ready_readers, strict=True):
        try:
            info = reader.recv()
        except EOFError:
            if not is_shutting_down():
                logger.error(
                    f"Rank {tp_rank} scheduler is dead. Please check if there are relevant logs."
                )
                kill_process_tree(os.getpid())
            raise
        started.scheduler_infos.append(info)
        reader.close()
    if server_args.tp_size > 1:
        # Each scheduler reports ready only after every rank of every node has loaded weights.
        logger.info(
            f"TP group ready: {server_args.tp_size} ranks on {server_args.nnodes} node(s) "
            f"joined (dist_init_addr={dist_init_addr}); this node runs ranks "
            f"{list(server_args.node_tp_ranks())}"
        )
    threading.Thread(
        target=_watch_children, args=(started.processes,), name="ChildWatch", daemon=True
    ).start()
    if is_head:
        assert to_scheduler_w is not None and to_tok_r is not None and rpc_r is not None
        started.tokenizer_manager = TokenizerManager(
            server_args, to_scheduler_w, to_tok_r, rpc_r, started.scheduler_infos[0]
        )
    return started


class Engine:
    def __init__(self, log: bool = False, **kwargs: Any):
        self.server_args = ServerArgs(**kwargs)
        if self.server_args.node_rank != 0:
            raise ValueError("the offline Engine runs on node 0 (--node-rank 0)")
        if log:
            configure_logger(self.server_args)
            child_args = self.server_args
        else:
            # Unconfigured logging in one process shows warnings and errors only; so do the
            # children of an Engine that was not asked to log.
            child_args = dataclasses.replace(self.server_args, log_level="warning")
        self.processes = launch_subprocesses(child_args)
        assert self.processes.tokenizer_manager is not None
        self.tokenizer_manager = self.processes.tokenizer_manager
        self.tokenizer_manager.mark_up()

    def generate(
        self,
        prompt: None | str | list[str] = None,
        sampling_params: None | dict[str, Any] | list[dict[str, Any]] = None,
        input_ids: list[Any] | None = None,
    ) -> dict[str, Any] | list[dict[str, Any]]:
        body: dict[str, Any] = {"sampling_params": sampling_params}
        if prompt is not None:
            body["text"] = prompt
        if input_ids is not None:
            body["input_ids"] = input_ids
        request = self.tokenizer_manager.parse_generate_request(body)
        return self.tokenizer_manager.generate(request)

    def shutdown(self) -> None:
        mark_shutting_down()
        with contextlib.suppress(OSError):
            self.tokenizer_manager.shutdown()
        self.processes.stop()
        flush_log_handlers()
