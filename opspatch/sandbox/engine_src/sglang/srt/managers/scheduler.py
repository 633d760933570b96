"""The scheduler: a loop thread that batches running requests and drives the model worker.

Each iteration admits every waiting request (one prefill batch), or else runs one decode step
for all running requests together, so concurrent requests really share a batch and the batch
size that dynamic speculation disable compares against is real.

Like SGLang's, the loop does not handle exceptions per request: any exception in a forward step
is logged as `Scheduler hit an exception: <traceback>` and takes the whole server down.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from typing import Any

from sglang.srt.managers.schedule_batch import (
    ForwardMode,
    GenerationBatchResult,
    Req,
    ScheduleBatch,
)
from sglang.srt.managers.tp_worker import TpModelWorker
from sglang.srt.server_args import ServerArgs
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.utils import get_exception_traceback, report_fatal_error_to_parent

logger = logging.getLogger(__name__)


def spec_worker_class(algorithm: SpeculativeAlgorithm) -> type:
    if algorithm.is_eagle():
        from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

        return EAGLEWorkerV2
    if algorithm.is_standalone():
        from sglang.srt.speculative.standalone_worker_v2 import StandaloneWorkerV2

        return StandaloneWorkerV2
    raise ValueError(f"no speculative worker for {algorithm}")


class Scheduler:
    def __init__(self, server_args: ServerArgs, nccl_port: int = 0):
        self.server_args = server_args
        self.spec_algorithm = SpeculativeAlgorithm.from_string(server_args.speculative_algorithm)
        self.tp_worker = TpModelWorker(server_args, gpu_id=0, tp_rank=0, nccl_port=nccl_port)
        self.tokenizer = self.tp_worker.tokenizer
        if self.spec_algorithm.is_none():
            self.draft_worker = None
            self.model_worker: Any = self.tp_worker
        else:
            self.draft_worker = self.init_spec_worker(nccl_port)
            self.model_worker = self.draft_worker

        self.max_running_requests = server_args.max_running_requests
        self._inbox: queue.SimpleQueue[list[Req] | None] = queue.SimpleQueue()
        self.waiting_queue: deque[Req] = deque()
        self.running_reqs: list[Req] = []
        self._thread: threading.Thread | None = None
        # Submitted and not finished: what /v1/loads reports as running + waiting (a request
        # still in the inbox counts as waiting, so a drain never reads 0 while one is queued).
        self._unfinished = 0
        self._unfinished_lock = threading.Lock()

        self.forward_ct_decode = 0
        self.num_generated_tokens = 0
        self.spec_num_verify = 0
        self.spec_num_verified_tokens = 0
        self.last_gen_throughput = 0.0
        self._last_decode_log_time = time.perf_counter()
        self._last_decode_log_tokens = 0
        logger.info(
            f"max_total_num_tokens={self.tp_worker.max_total_num_tokens}, "
            f"max_running_requests={self.max_running_requests}, "
            f"context_len={server_args.context_length}, device=cpu"
        )

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

    def start(self) -> None:
        self._thread = threading.Thread(target=self.event_loop, name="Scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the loop after the current step (used by the offline Engine)."""
        self._inbox.put(None)
        if self._thread is not None:
            self._thread.join(timeout=10)

    def submit(self, reqs: list[Req]) -> None:
        """Queue requests; requests submitted together are admitted in the same prefill batch."""
        with self._unfinished_lock:
            self._unfinished += len(reqs)
        self._inbox.put(list(reqs))

    def event_loop(self) -> None:
        try:
            while True:
                if not self.recv_requests(block=not self.waiting_queue and not self.running_reqs):
                    return
                batch = self.get_next_batch_to_run()
                if batch is None:
                    continue
                result = self.run_batch(batch)
                self.process_batch_result(batch, result)
        except Exception:
            logger.error(f"Scheduler hit an exception: {get_exception_traceback()}")
            report_fatal_error_to_parent()

    def recv_requests(self, block: bool) -> bool:
        """Move submitted requests to the waiting queue; False when asked to stop."""
        try:
            item = self._inbox.get() if block else self._inbox.get_nowait()
        except queue.Empty:
            return True
        while True:
            if item is None:
                return False
            self.waiting_queue.extend(item)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return True

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
            logger.info(
                f"Prefill batch. #new-seq: {len(new_reqs)}, "
                f"#new-token: {sum(len(r.origin_input_ids) for r in new_reqs)}, "
                f"#running-req: {len(self.running_reqs)}, #queue-req: {len(self.waiting_queue)}"
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
                req.spec_accepted_drafts += result.accepted_drafts[index]
                self.spec_num_verify += 1
            kept = 0
            for token in tokens:
                req.output_ids.append(token)
                kept += 1
                reason = self.finish_reason(req)
                if reason is not None:
                    self.finish(req, reason)
                    break
            self.num_generated_tokens += kept
            if result.speculative:
                # Tokens cut off by a stop string do not count as accepted.
                req.spec_verified_tokens += kept
                self.spec_num_verified_tokens += kept
            if batch.forward_mode.is_extend() and not req.finished():
                self.running_reqs.append(req)
        self.running_reqs = [req for req in self.running_reqs if not req.finished()]
        if batch.forward_mode.is_decode():
            self.forward_ct_decode += 1
            if self.forward_ct_decode % self.server_args.decode_log_interval == 0:
                self.log_decode_stats(batch)

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

    def finish(self, req: Req, reason: dict[str, Any]) -> None:
        req.finished_reason = reason
        req.finished_time = time.perf_counter()
        with self._unfinished_lock:
            self._unfinished -= 1
        req.done.set()

    def log_decode_stats(self, batch: ScheduleBatch) -> None:
        now = time.perf_counter()
        tokens = self.num_generated_tokens - self._last_decode_log_tokens
        self.last_gen_throughput = tokens / max(now - self._last_decode_log_time, 1e-9)
        self._last_decode_log_time, self._last_decode_log_tokens = now, self.num_generated_tokens
        message = (
            f"Decode batch. #running-req: {batch.batch_size()}, "
            f"#token: {sum(len(r.all_ids) for r in batch.reqs)}, "
        )
        if self.spec_num_verify:
            message += f"accept len: {self.spec_num_verified_tokens / self.spec_num_verify:.2f}, "
        message += (
            f"gen throughput (token/s): {self.last_gen_throughput:.2f}, "
            f"#queue-req: {len(self.waiting_queue)}"
        )
        logger.info(message)

    def get_load(self) -> dict[str, Any]:
        """This rank's core load snapshot, the keys of SGLang 0.5.23's `LoadSnapshot`."""
        with self._unfinished_lock:
            unfinished = self._unfinished
        running = min(len(self.running_reqs), unfinished)
        return {
            "timestamp": time.time(),
            "dp_rank": 0,
            "num_running_reqs": running,
            "num_waiting_reqs": unfinished - running,
            "max_total_num_tokens": self.tp_worker.max_total_num_tokens,
            "max_running_requests": self.max_running_requests,
            "gen_throughput": self.last_gen_throughput,
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
