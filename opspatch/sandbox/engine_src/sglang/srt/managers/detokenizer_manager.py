"""The detokenizer process: token ids of finished requests (and of a streamed one's steps) in,
text out.

It imports no torch (its start costs an interpreter, not a torch import): the tokenizer is the
stand-in's character tokenizer. Stop strings are trimmed here, as SGLang's detokenizer does.
"""

from __future__ import annotations

import logging
import os
import signal
from multiprocessing.connection import Connection

from sglang.srt.managers.io_struct import BatchStrOut, BatchTokenIDOut, FinishedReq, FreezeGCReq
from sglang.srt.plugins import load_plugins
from sglang.srt.server_args import ServerArgs
from sglang.srt.tokenizer.char_tokenizer import CharTokenizer, get_tokenizer
from sglang.srt.utils import (
    configure_logger,
    freeze_gc,
    get_exception_traceback,
    kill_itself_when_parent_died,
    set_process_name,
)

logger = logging.getLogger(__name__)


class DetokenizerManager:
    def __init__(
        self,
        server_args: ServerArgs,
        recv_from_scheduler: Connection,
        send_to_tokenizer: Connection,
    ):
        self.tokenizer: CharTokenizer = get_tokenizer(server_args.tokenizer_path or "")
        self.recv_from_scheduler = recv_from_scheduler
        self.send_to_tokenizer = send_to_tokenizer

    def text_of(self, req: FinishedReq) -> str:
        text = self.tokenizer.decode(req.output_ids, skip_special_tokens=req.skip_special_tokens)
        reason = req.finished_reason or {}
        if reason.get("type") == "stop" and not req.no_stop_trim:
            text = text[: len(text) - len(reason["matched"])]
        return text

    def event_loop(self) -> None:
        while True:
            try:
                batch = self.recv_from_scheduler.recv()
            except EOFError:  # the scheduler is gone: the server is going down
                return
            if isinstance(batch, FreezeGCReq):
                freeze_gc("Detokenizer Manager")
                continue
            assert isinstance(batch, BatchTokenIDOut), batch
            texts = [self.text_of(req) for req in batch.reqs]
            self.send_to_tokenizer.send(BatchStrOut(batch.reqs, texts))


def run_detokenizer_process(
    server_args: ServerArgs, recv_from_scheduler: Connection, send_to_tokenizer: Connection
) -> None:
    kill_itself_when_parent_died()
    set_process_name("sglang::detokenizer")
    load_plugins()
    configure_logger(server_args)
    signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(0))
    parent = os.getppid()
    try:
        DetokenizerManager(server_args, recv_from_scheduler, send_to_tokenizer).event_loop()
    except Exception:
        logger.error(f"DetokenizerManager hit an exception: {get_exception_traceback()}")
        os.kill(parent, signal.SIGQUIT)
