"""The scheduler: one process per TP rank, a loop that batches requests and drives the model.

Rank 0 (TP0, on node 0) receives requests from the tokenizer manager; at every step it broadcasts
what it received over the TP group (`scheduler_components/request_receiver.py`), so every rank
admits the same requests at the same step, runs the same batch (the model's all-reduce couples the
ranks inside each forward) and reaches the same tokens. An `RpcReqInput` among them calls a
Scheduler method by name on every rank at that step, then waits at a barrier on the TP group's CPU
group (`handle_rpc_request`). Rank 0 alone sends finished requests to the detokenizer and answers
RPCs. `run_scheduler_process` loads SGLang plugins before it builds the Scheduler.

Each iteration admits every waiting request (one prefill batch), or else runs one decode step
for all running requests together, so concurrent requests really share a batch and the batch
size that dynamic speculation disable compares against is real.

Like SGLang's, the loop does not handle exceptions per request: any exception in a forward step
(or a collective that fails because a rank is gone) is logged as
`Scheduler hit an exception: <traceback>`, and the scheduler sends SIGQUIT to its server's main
process, which ends the whole process tree. A step that takes longer than `--watchdog-timeout`
(a collective waiting on a rank that vanished silently) is ended by the watchdog the same way.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from sglang.srt.distributed.parallel_state import barrier, init_distributed_environment
from sglang.srt.layers.sampler import token_logprobs
from sglang.srt.managers.io_struct import (
    BatchTokenIDOut,
    FinishedReq,
    FreezeGCReq,
    RpcReqInput,
    RpcReqOutput,
    ShutdownReq,
    TokenizedGenerateReqInput,
)
from sglang.srt.managers.schedule_batch import (
    ForwardMode,
    GenerationBatchResult,
    Req,
    ScheduleBatch,
)
from sglang.srt.managers.scheduler_components.request_receiver import SchedulerRequestReceiver
from sglang.srt.managers.tp_worker import TpModelWorker
from sglang.srt.plugins import load_plugins
from sglang.srt.server_args import ServerArgs
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.utils import (
    configure_logger,
    flush_log_handlers,
    freeze_gc,
    get_exception_traceback,
    kill_itself_when_parent_died,
    report_fatal_error_to_parent,
    set_process_name,
)

logger = logging.getLogger(__name__)


@dataclass
class SpecDecodeCounts:
    """Speculative decoding since the last decode log."""

    verify_ct: int = 0
    verified_tokens: int = 0
    proposed_drafts: int = 0
    accepted_drafts: int = 0


def spec_worker_class(algorithm: SpeculativeAlgorithm) -> type:
    if algorithm.is_eagle():
        from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

        return EAGLEWorkerV2
    if algorithm.is_standalone():
        from sglang.srt.speculative.standalone_worker_v2 import StandaloneWorkerV2

        return StandaloneWorkerV2
    raise ValueError(f"no speculative worker for {algorithm}")


class Scheduler:
    def __init__(
        self,
        server_args: ServerArgs,
        tp_rank: int = 0,
        dist_init_addr: str | None = None,
        recv_from_tokenizer: Connection | None = None,
        send_to_detokenizer: Connection | None = None,
        send_to_tokenizer: Connection | None = None,
        nccl_port: int = 0,
    ):
        self.server_args = server_args
        self.tp_rank = tp_rank
        self.tp_size = server_args.tp_size
        self.recv_from_tokenizer = recv_from_tokenizer
        self.send_to_detokenizer = send_to_detokenizer
        self.send_to_tokenizer = send_to_tokenizer
        self.tp_group = init_distributed_environment(
            server_args.tp_size, tp_rank, dist_init_addr, server_args.dist_timeout
        )
        self.spec_algorithm = SpeculativeAlgorithm.from_string(server_args.speculative_algorithm)
        gpu_id = tp_rank % server_args.tp_size_per_node
        self.gpu_id = gpu_id
        self.tp_worker = TpModelWorker(
            server_args, gpu_id=gpu_id, tp_rank=tp_rank, nccl_port=nccl_port
        )
        self.tokenizer = self.tp_worker.tokenizer
        if self.spec_algorithm.is_none():
            self.draft_worker = None
            self.model_worker: Any = self.tp_worker
        else:
            self.draft_worker = self.init_spec_worker(nccl_port)
            self.model_worker = self.draft_worker

        self.max_running_requests = server_args.max_running_requests
        self.waiting_queue: deque[Req] = deque()
        self.running_reqs: list[Req] = []
        self._finished_out: list[FinishedReq] = []
        # When the step in progress began (None between steps): what the watchdog watches.
        self._step_started: float | None = None
        self.request_receiver = SchedulerRequestReceiver(
            recv_from_tokenizer=recv_from_tokenizer,
            tp_rank=tp_rank,
            tp_size=self.tp_size,
            is_idle=lambda: not self.waiting_queue and not self.running_reqs,
        )

        self.forward_ct_decode = 0
        self.num_generated_tokens = 0
        self.spec_num_verify = 0
        self.spec_num_verified_tokens = 0
        # Since the last decode log; SGLang's gauges hold the last interval's figures.
        self.spec_interval = SpecDecodeCounts()
        self.spec_accept_length = 0.0
        self.spec_accept_rate = 0.0
        self.last_gen_throughput = 0.0
        self._last_decode_log_time = time.perf_counter()
        self._last_decode_log_tokens = 0
        # Every rank has loaded its weights before any is reported ready.
        barrier()
        logger.info(
            f"max_total_num_tokens={self.tp_worker.max_total_num_tokens}, "
            f"max_running_requests={self.max_running_requests}, "
            f"context_len={server_args.context_length}, device=cpu"
        )

    def scheduler_info(self) -> dict[str, Any]:
        """What the tokenizer manager learns at start (SGLang's `scheduler_info`)."""
        model = self.tp_worker.model
        return {
            "status": "ready",
            "tp_rank": self.tp_rank,
            "pid": os.getpid(),
            "max_total_num_tokens": self.tp_worker.max_total_num_tokens,
            "max_running_requests": self.max_running_requests,
            "architectures": [type(model).__name__],
            "vocab_size": model.config.vocab_size,
        }

    def init_spec_worker(self, nccl_port: int) -> Any:
        worker_class = spec_worker_class(self.spec_algorithm)
        # Local change of the incident's build: CUDA graph capture fails on some hardware, and
        # rather than refusing to start, the server keeps the worker and decodes eagerly. The
        # object is created before __init__ runs so that it survives an exception raised
        # part-way through __init__ (whatever was not assigned yet stays missing).
        worker = worker_class.__new__(worker_class)
        try:
            worker.__init__(
                server_args=self.server_args,
                gpu_id=0,
                nccl_port=nccl_port,
                target_worker=self.tp_worker,
            )
        except Exception as error:
            logger.warning(f"CUDA graph capture failed: {error}; falling back to eager decode")
        return worker

    # -- the loop ---------------------------------------------------------------------------

    def event_loop(self) -> None:
        while True:
            messages = self.recv_requests()
            if not self.process_input_requests(messages):
                self._step_started = None
                return
            batch = self.get_next_batch_to_run()
            if batch is not None:
                result = self.run_batch(batch)
                self.process_batch_result(batch, result)
            self.send_finished()
            self._step_started = None

    def recv_requests(self) -> list[Any]:
        """What the entry rank received since the last step, the same list on every rank."""
        self._step_started = time.monotonic()
        return self.request_receiver.recv_requests()

    def process_input_requests(self, messages: list[Any]) -> bool:
        """Admit requests, answer RPCs; False when asked to shut down."""
        for message in messages:
            if isinstance(message, ShutdownReq):
                return False
            if isinstance(message, FreezeGCReq):
                self.handle_freeze_gc(message)
                continue
            if isinstance(message, RpcReqInput):
                output = self.handle_rpc_request(message)
                if output is not None and output.rpc_id is not None and self.send_to_tokenizer:
                    self.send_to_tokenizer.send(output)
                continue
            self.waiting_queue.extend(self.req_of(item) for item in message)
        return True

    @staticmethod
    def req_of(item: TokenizedGenerateReqInput) -> Req:
        return Req(
            rid=item.rid,
            origin_input_text=item.input_text,
            origin_input_ids=list(item.input_ids),
            sampling_params=item.sampling_params,
            seed=item.seed,
            return_logprob=item.return_logprob,
            top_logprobs_num=item.top_logprobs_num,
            stream=item.stream,
        )

    def handle_rpc_request(self, recv_req: RpcReqInput) -> RpcReqOutput:
        """Call the named method on this rank, then wait for every rank (each runs the same
        request at the same step); a failing method is logged and answered, as in SGLang."""
        result, success, message = None, True, ""
        try:
            result = getattr(self, recv_req.method)(**(recv_req.parameters or {}))
        except Exception as error:
            success, message = False, str(error)
            logger.error(f"Failed to call rpc {recv_req.method}: {error}")
        barrier(group=self.tp_group.cpu_group)
        return RpcReqOutput(recv_req.rpc_id, result, success, message)

    def handle_freeze_gc(self, recv_req: FreezeGCReq) -> None:
        """Freeze this rank's collector and pass the request on to the detokenizer (TP0)."""
        freeze_gc("Scheduler")
        if self.send_to_detokenizer is not None:
            self.send_to_detokenizer.send(recv_req)

    def send_finished(self) -> None:
        if self._finished_out and self.send_to_detokenizer is not None:
            self.send_to_detokenizer.send(BatchTokenIDOut(self._finished_out))
        self._finished_out = []

    def get_next_batch_to_run(self) -> ScheduleBatch | None:
        new_reqs: list[Req] = []
        while self.waiting_queue and (
            len(self.running_reqs) + len(new_reqs) < self.max_running_requests
        ):
            req = self.waiting_queue.popleft()
            if req.sampling_params.max_new_tokens == 0:
                self.finish(req, {"type": "length", "length": 0})
                continue
            new_reqs.append(req)
        if new_reqs:
            if self.tp_rank == 0:  # SGLang logs batch statistics on the first rank only
                logger.info(
                    f"Prefill batch. #new-seq: {len(new_reqs)}, "
                    f"#new-token: {sum(len(r.origin_input_ids) for r in new_reqs)}, "
                    f"#running-req: {len(self.running_reqs)}, "
                    f"#queue-req: {len(self.waiting_queue)}"
                )
            return ScheduleBatch(new_reqs, ForwardMode.EXTEND)
        if self.running_reqs:
            return ScheduleBatch(list(self.running_reqs), ForwardMode.DECODE)
        return None

    def run_batch(self, batch: ScheduleBatch) -> GenerationBatchResult:
        return self.model_worker.forward_batch_generation(batch)

    def process_batch_result(self, batch: ScheduleBatch, result: GenerationBatchResult) -> None:
        for index, req in enumerate(batch.reqs):
            tokens = result.next_token_ids[index]
            if result.speculative:
                assert result.proposed_drafts is not None and result.accepted_drafts is not None
                req.spec_verify_ct += 1
                req.spec_proposed_drafts += result.proposed_drafts[index]
                req.spec_num_correct_drafts += result.accepted_drafts[index]
                correct, histogram = result.accepted_drafts[index], req.spec_correct_drafts_histogram
                histogram.extend([0] * (correct + 1 - len(histogram)))
                histogram[correct] += 1
                self.spec_num_verify += 1
                self.spec_interval.verify_ct += 1
                self.spec_interval.proposed_drafts += result.proposed_drafts[index]
                self.spec_interval.accepted_drafts += result.accepted_drafts[index]
            kept, reason = 0, None
            for position, token in enumerate(tokens):
                req.output_ids.append(token)
                kept += 1
                if req.return_logprob:
                    assert result.next_token_logits is not None
                    self.record_logprobs(req, result.next_token_logits[index][position], token)
                reason = self.finish_reason(req)
                if reason is not None:
                    break
            self.num_generated_tokens += kept
            if result.speculative:
                # Tokens cut off by a stop string do not count as accepted.
                req.spec_verified_tokens += kept
                self.spec_num_verified_tokens += kept
                self.spec_interval.verified_tokens += kept
            if reason is not None:
                # After the counts: the finished request carries this step's tokens too.
                self.finish(req, reason)
            elif self.streams_now(req):
                req.send_token_offset = len(req.output_ids)
                self._finished_out.append(self.output_so_far(req))
            if batch.forward_mode.is_extend() and not req.finished():
                self.running_reqs.append(req)
        self.running_reqs = [req for req in self.running_reqs if not req.finished()]
        if batch.forward_mode.is_decode():
            self.forward_ct_decode += 1
            interval = self.server_args.decode_log_interval
            if self.tp_rank == 0 and self.forward_ct_decode % interval == 0:
                self.log_decode_stats(batch)

    def record_logprobs(self, req: Req, logits_row: Any, token: int) -> None:
        logprob, top_values, top_ids = token_logprobs(
            self.tp_worker.model.sampling_logits(logits_row), token, req.top_logprobs_num
        )
        req.output_token_logprobs_val.append(logprob)
        if req.top_logprobs_num > 0:
            req.output_top_logprobs_val.append(top_values)
            req.output_top_logprobs_idx.append(top_ids)

    def finish_reason(self, req: Req) -> dict[str, Any] | None:
        params = req.sampling_params
        if len(req.output_ids) >= params.max_new_tokens:
            return {"type": "length", "length": params.max_new_tokens}
        if params.stop:
            # One character per token: a stop string can only complete at the end.
            tail = self.tokenizer.decode(req.output_ids[-max(len(s) for s in params.stop) :])
            for stop in params.stop:
                if tail.endswith(stop):
                    return {"type": "stop", "matched": stop}
        return None

    @staticmethod
    def streams_now(req: Req) -> bool:
        """Whether an unfinished request's output goes out now: a streamed request's first
        token at once, then once at least its `stream_interval` tokens are unsent (SGLang's
        `OutputStreamer.accept`; a finished request's always goes out)."""
        unsent = len(req.output_ids) - req.send_token_offset
        interval = req.sampling_params.stream_interval or 1
        return req.stream and unsent > 0 and (req.send_token_offset == 0 or unsent >= interval)

    def finish(self, req: Req, reason: dict[str, Any]) -> None:
        req.finished_reason = reason
        req.finished_time = time.perf_counter()
        self._finished_out.append(self.output_so_far(req))

    @staticmethod
    def output_so_far(req: Req) -> FinishedReq:
        """What the detokenizer gets of `req`: finished, or a streamed request's step (copies:
        the request goes on growing its lists)."""
        params = req.sampling_params
        return FinishedReq(
            rid=req.rid,
            output_ids=list(req.output_ids),
            finished_reason=req.finished_reason,
            prompt_tokens=len(req.origin_input_ids),
            skip_special_tokens=params.skip_special_tokens,
            no_stop_trim=params.no_stop_trim,
            spec_verify_ct=req.spec_verify_ct,
            spec_proposed_drafts=req.spec_proposed_drafts,
            spec_num_correct_drafts=req.spec_num_correct_drafts,
            spec_verified_tokens=req.spec_verified_tokens,
            spec_correct_drafts_histogram=list(req.spec_correct_drafts_histogram),
            return_logprob=req.return_logprob,
            top_logprobs_num=req.top_logprobs_num,
            output_token_logprobs_val=list(req.output_token_logprobs_val),
            output_top_logprobs_val=list(req.output_top_logprobs_val),
            output_top_logprobs_idx=list(req.output_top_logprobs_idx),
        )

    def log_decode_stats(self, batch: ScheduleBatch) -> None:
        now = time.perf_counter()
        tokens = self.num_generated_tokens - self._last_decode_log_tokens
        self.last_gen_throughput = tokens / max(now - self._last_decode_log_time, 1e-9)
        self._last_decode_log_time, self._last_decode_log_tokens = now, self.num_generated_tokens
        message = (
            f"Decode batch. #running-req: {batch.batch_size()}, "
            f"#token: {sum(len(r.all_ids) for r in batch.reqs)}, "
        )
        counts = self.spec_interval
        if counts.verify_ct:
            self.spec_accept_length = counts.verified_tokens / counts.verify_ct
            self.spec_accept_rate = (
                counts.accepted_drafts / counts.proposed_drafts if counts.proposed_drafts else 0.0
            )
            self.spec_interval = SpecDecodeCounts()
            message += f"accept len: {self.spec_accept_length:.2f}, "
        message += (
            f"gen throughput (token/s): {self.last_gen_throughput:.2f}, "
            f"#queue-req: {len(self.waiting_queue)}"
        )
        logger.info(message)

    def get_load(self) -> dict[str, Any]:
        """This rank's core load snapshot, the keys of SGLang 0.5.23's `LoadSnapshot` (the
        tokenizer manager counts requests on their way here as waiting)."""
        return {
            "timestamp": time.time(),
            "dp_rank": 0,
            "num_running_reqs": len(self.running_reqs),
            "num_waiting_reqs": len(self.waiting_queue),
            "max_total_num_tokens": self.tp_worker.max_total_num_tokens,
            "max_running_requests": self.max_running_requests,
            "gen_throughput": self.last_gen_throughput,
        }

    def get_spec_metrics(self) -> dict[str, float]:
        """The gauges `sglang:spec_accept_length` and `sglang:spec_accept_rate`: the figures of
        the last decode log interval (`--decode-log-interval` decode steps), 0 before one."""
        return {
            "spec_accept_length": self.spec_accept_length,
            "spec_accept_rate": self.spec_accept_rate,
        }

    def get_internal_state(self) -> dict[str, Any]:
        return {
            "avg_spec_accept_length": (
                self.spec_num_verified_tokens / self.spec_num_verify
                if self.spec_num_verify
                else None
            ),
            "last_gen_throughput": self.last_gen_throughput,
            "num_generated_tokens": self.num_generated_tokens,
            "#running-req": len(self.running_reqs),
            "#queue-req": len(self.waiting_queue),
        }

    # -- the watchdog -------------------------------------------------------------------------

    def start_watchdog(self) -> None:
        threading.Thread(target=self.watchdog_thread, name="SchedulerWatchdog", daemon=True).start()

    def watchdog_thread(self) -> None:
        timeout = self.server_args.watchdog_timeout
        period = min(1.0, timeout / 4)
        while True:
            time.sleep(period)
            started = self._step_started
            if started is not None and time.monotonic() - started > timeout:
                logger.error(
                    f"Scheduler watchdog timeout (self.watchdog_timeout={timeout:g}, "
                    f"self.soft=False): a step has run for more than {timeout:g} s"
                )
                report_fatal_error_to_parent()


def run_scheduler_process(
    server_args: ServerArgs,
    tp_rank: int,
    dist_init_addr: str | None,
    ready_writer: Connection,
    recv_from_tokenizer: Connection | None,
    send_to_detokenizer: Connection | None,
    send_to_tokenizer: Connection | None,
) -> None:
    """The body of one scheduler process (spawned by the engine, one per TP rank of a node)."""
    # As SGLang: plugins load first, so their hooks are in place before the Scheduler is built.
    load_plugins()
    kill_itself_when_parent_died()
    set_process_name(f"sglang::sch_TP{tp_rank}")
    # as SGLang: the rank is named only where there are several
    configure_logger(server_args, prefix=f" TP{tp_rank}" if server_args.tp_size > 1 else "")
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        scheduler = Scheduler(
            server_args,
            tp_rank,
            dist_init_addr,
            recv_from_tokenizer,
            send_to_detokenizer,
            send_to_tokenizer,
        )
        ready_writer.send(scheduler.scheduler_info())
        scheduler.start_watchdog()
        scheduler.event_loop()
    except Exception:
        logger.error(f"Scheduler hit an exception: {get_exception_traceback()}")
        report_fatal_error_to_parent()
    flush_log_handlers()


def _exit_on_sigterm(signum: int, frame: object) -> None:
    # The server is being stopped (its main process, or the whole tree at once).
    flush_log_handlers()
    os._exit(0)
