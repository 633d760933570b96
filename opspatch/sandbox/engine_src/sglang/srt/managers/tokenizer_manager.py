"""Between HTTP and the scheduler, in the main process: validate and tokenize requests, send
them to the scheduler (TP0) over a pipe, wait for the detokenizer's text, report. A streamed
request (`"stream": true`) is reported after every step that gave it tokens, each time the whole
output so far (SGLang's default, without `--incremental-streaming-output`).

Every malformed request raises BadRequestError with a message meant for the client (HTTP 400);
nothing malformed reaches the scheduler, whose errors are fatal to the server. This module
imports no torch: the main process never loads the model.
"""

from __future__ import annotations

import enum
import os
import logging
import queue
import random
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from sglang.srt.managers.io_struct import (
    BatchStrOut,
    FinishedReq,
    FreezeGCReq,
    RpcReqInput,
    RpcReqOutput,
    ShutdownReq,
    TokenizedGenerateReqInput,
)
from sglang.srt.sampling.sampling_params import InvalidSamplingParams, SamplingParams
from sglang.srt.server_args import ServerArgs
from sglang.srt.tokenizer.char_tokenizer import get_tokenizer
from sglang.srt.utils import freeze_gc, is_shutting_down, kill_process_tree

logger = logging.getLogger(__name__)

GENERATE_REQUEST_FIELDS = (
    "text",
    "input_ids",
    "sampling_params",
    "rid",
    "stream",
    "return_logprob",
    "top_logprobs_num",
    "logprob_start_len",
    "return_text_in_logprobs",
)
# Fields of SGLang's GenerateReqInput that sglang-router 0.3.2 sends with every /generate it
# forwards; the stand-in accepts them and honours none (a true return_* is refused below).
ROUTER_FORWARDED_FIELDS = (
    "model",
    "log_metrics",
    "no_logs",
    "background",
    "return_bytes",
    "return_entropy",
    "return_hidden_states",
)
HEALTH_CHECK_TIMEOUT_S = 20.0
RPC_TIMEOUT_S = 20.0


class BadRequestError(ValueError):
    """The request is malformed; the message is sent to the client with HTTP 400."""


class ServerStatus(enum.Enum):
    Starting = "Starting"
    Up = "Up"


@dataclass(frozen=True)
class LogprobRequest:
    """SGLang's `return_logprob`, `top_logprobs_num` and `return_text_in_logprobs` (one value
    for every prompt of the request)."""

    return_logprob: bool = False
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False


@dataclass
class GenerateReqInput:
    """One /generate call after validation: one or several prompts."""

    prompts: list[str]
    input_ids: list[list[int]]
    sampling_params: list[SamplingParams]
    rids: list[str]
    is_single: bool
    logprobs: LogprobRequest = field(default_factory=LogprobRequest)
    stream: bool = False


@dataclass
class ReqState:
    """A request sent to the scheduler, until the detokenizer's answer comes."""

    created_time: float = field(default_factory=time.perf_counter)
    event: threading.Event = field(default_factory=threading.Event)
    finished: FinishedReq | None = None
    text: str = ""
    finished_time: float | None = None
    # A streamed request's outputs so far, with their text and arrival time, the last finished.
    steps: queue.SimpleQueue[tuple[FinishedReq, str, float]] = field(
        default_factory=queue.SimpleQueue
    )
    # Logprob entries detokenized so far (SGLang's `ReqState.output_token_logprobs` and
    # `output_top_logprobs`): a streamed request's next output adds only its new positions.
    token_entries: list[list[Any]] = field(default_factory=list)
    top_entries: list[list[list[Any]]] = field(default_factory=list)


class TokenizerManager:
    def __init__(
        self,
        server_args: ServerArgs,
        send_to_scheduler: Connection,
        recv_from_detokenizer: Connection,
        recv_from_scheduler: Connection,
        scheduler_info: dict[str, Any],
    ):
        self.server_args = server_args
        self.tokenizer = get_tokenizer(server_args.tokenizer_path or "")
        self.scheduler_info = scheduler_info
        self.server_status = ServerStatus.Starting
        self._status_lock = threading.Lock()
        # SGLang's `sglang:num_requests_total` (tokenizer metrics): requests finished
        self.num_requests_total = 0
        self._send_to_scheduler = send_to_scheduler
        self._send_lock = threading.Lock()
        self._states: dict[str, ReqState] = {}
        self._rpcs: dict[str, tuple[threading.Event, list[Any]]] = {}
        # Sent and not finished: what /v1/loads reports as running + waiting (a request on its
        # way to the scheduler counts as waiting, so a drain never reads 0 while one is queued).
        self._unfinished = 0
        for name, connection, handle in (
            ("detokenizer", recv_from_detokenizer, self._handle_str_out),
            ("scheduler", recv_from_scheduler, self._handle_rpc_out),
        ):
            threading.Thread(
                target=self._receive_loop,
                args=(name, connection, handle),
                name=f"Recv-{name}",
                daemon=True,
            ).start()

    def _receive_loop(self, name: str, connection: Connection, handle: Any) -> None:
        while True:
            try:
                message = connection.recv()
            except (EOFError, OSError):
                if not is_shutting_down():
                    logger.error(f"The {name} process is gone; shutting down the server.")
                    kill_process_tree(os.getpid())
                return
            handle(message)

    def _handle_str_out(self, batch: BatchStrOut) -> None:
        now = time.perf_counter()
        with self._status_lock:
            for output, text in zip(batch.reqs, batch.texts, strict=True):
                if output.finished_reason is None:  # a streamed request's step
                    streamed = self._states.get(output.rid)
                    if streamed is not None:
                        streamed.steps.put((output, text, now))
                    continue
                state = self._states.pop(output.rid, None)
                if state is None:
                    continue
                self._unfinished -= 1
                state.finished, state.text, state.finished_time = output, text, now
                state.steps.put((output, text, now))
                state.event.set()

    def _handle_rpc_out(self, output: RpcReqOutput) -> None:
        with self._status_lock:
            waiter = self._rpcs.pop(output.rpc_id, None)
        if waiter is not None:
            waiter[1].append(output.result)
            waiter[0].set()

    def _send(self, message: Any) -> None:
        with self._send_lock:
            self._send_to_scheduler.send(message)

    def rpc(self, method: str, timeout: float = RPC_TIMEOUT_S, **parameters: Any) -> Any:
        """Call a Scheduler method on TP0 (between two of its steps); None after `timeout`."""
        rpc_id = uuid.uuid4().hex
        event, result = threading.Event(), []
        with self._status_lock:
            self._rpcs[rpc_id] = (event, result)
        self._send(RpcReqInput(method=method, parameters=parameters, rpc_id=rpc_id))
        if not event.wait(timeout):
            with self._status_lock:
                self._rpcs.pop(rpc_id, None)
            return None
        return result[0]

    def get_load(self) -> dict[str, Any]:
        snapshot = dict(self.rpc("get_load") or {})
        with self._status_lock:
            unfinished = self._unfinished
        running = min(int(snapshot.get("num_running_reqs", 0)), unfinished)
        snapshot["num_running_reqs"] = running
        snapshot["num_waiting_reqs"] = unfinished - running
        return snapshot

    def get_spec_metrics(self) -> dict[str, float]:
        return dict(self.rpc("get_spec_metrics") or {})

    def get_internal_state(self) -> dict[str, Any]:
        return dict(self.rpc("get_internal_state") or {})

    def freeze_gc(self) -> None:
        """Freeze the collector in the schedulers (which pass it to the detokenizer), then here."""
        self._send(FreezeGCReq())
        freeze_gc("Tokenizer Manager")

    def shutdown(self) -> None:
        """Ask every rank to leave its loop (the offline engine's shutdown)."""
        self._send(ShutdownReq())

    def mark_up(self) -> None:
        with self._status_lock:
            self.server_status = ServerStatus.Up

    @property
    def is_up(self) -> bool:
        return self.server_status is ServerStatus.Up

    # -- parsing ----------------------------------------------------------------------------

    def parse_generate_request(
        self, body: Any, *, default_max_new_tokens: int | None = None
    ) -> GenerateReqInput:
        # Long because: it mirrors SGLang's own function of this name, kept in its shape
        if not isinstance(body, dict):
            raise BadRequestError("the request body must be a JSON object")
        unknown = sorted(set(body) - set(GENERATE_REQUEST_FIELDS) - set(ROUTER_FORWARDED_FIELDS))
        if unknown:
            raise BadRequestError(
                f"unknown field(s) {', '.join(map(repr, unknown))}; "
                f"known: {', '.join(GENERATE_REQUEST_FIELDS)}"
            )
        stream = body.get("stream")
        if stream is not None and not isinstance(stream, bool):
            raise BadRequestError("stream must be true or false")
        unsupported = [
            name
            for name in ROUTER_FORWARDED_FIELDS
            if name.startswith("return_") and body.get(name)
        ]
        if unsupported:
            raise BadRequestError(
                f"{', '.join(unsupported)}=true is not supported by the stand-in engine"
            )
        logprobs = self.parse_logprob_request(body)

        text, input_ids = body.get("text"), body.get("input_ids")
        if (text is None) == (input_ids is None):
            raise BadRequestError("give exactly one of text and input_ids")
        if text is not None:
            is_single = isinstance(text, str)
            prompts = [text] if is_single else text
            if not isinstance(prompts, list) or not prompts:
                raise BadRequestError("text must be a string or a non-empty list of strings")
            if not all(isinstance(p, str) for p in prompts):
                raise BadRequestError("text must be a string or a non-empty list of strings")
            token_lists = [self.tokenizer.encode(p) for p in prompts]
        else:
            is_single = isinstance(input_ids, list) and all(
                isinstance(i, int) and not isinstance(i, bool) for i in input_ids
            )
            token_lists = [input_ids] if is_single else input_ids
            if not isinstance(token_lists, list) or not token_lists:
                raise BadRequestError("input_ids must be a list of token ids or a list of lists")
            for ids in token_lists:
                if (
                    not isinstance(ids, list)
                    or not ids
                    or not all(
                        isinstance(i, int)
                        and not isinstance(i, bool)
                        and 0 <= i < self.tokenizer.vocab_size
                        for i in ids
                    )
                ):
                    raise BadRequestError(
                        f"input_ids must be non-empty lists of ids in 0..{self.tokenizer.vocab_size - 1}"
                    )
            prompts = [self.tokenizer.decode(ids) for ids in token_lists]

        count = len(token_lists)
        raw_params = body.get("sampling_params")
        if isinstance(raw_params, list):
            if len(raw_params) != count:
                raise BadRequestError("sampling_params list must have one entry per prompt")
            raw_list = raw_params
        else:
            raw_list = [raw_params] * count
        defaults = (
            {}
            if default_max_new_tokens is None
            else {"default_max_new_tokens": default_max_new_tokens}
        )
        try:
            params = [SamplingParams.from_request(raw, **defaults) for raw in raw_list]
        except InvalidSamplingParams as error:
            raise BadRequestError(str(error)) from None

        rid = body.get("rid")
        if rid is None:
            rids = [uuid.uuid4().hex for _ in range(count)]
        elif isinstance(rid, str) and is_single:
            rids = [rid]
        elif isinstance(rid, list) and len(rid) == count and all(isinstance(r, str) for r in rid):
            rids = list(rid)
        else:
            raise BadRequestError("rid must be a string (one prompt) or one string per prompt")

        limit = self.server_args.context_length
        for ids, sampling in zip(token_lists, params, strict=False):
            total = len(ids) + sampling.max_new_tokens
            if total > limit:
                raise BadRequestError(
                    f"Requested token count exceeds the model's maximum context length of "
                    f"{limit} tokens. You requested a total of {total} tokens: {len(ids)} tokens "
                    f"from the input messages and {sampling.max_new_tokens} tokens for the "
                    f"completion. Please reduce the number of tokens in the input messages or "
                    f"the completion to fit within the limit."
                )
        if stream and not is_single:
            raise BadRequestError("stream=true takes one prompt in the stand-in engine")
        return GenerateReqInput(
            prompts,
            [list(ids) for ids in token_lists],
            params,
            rids,
            is_single,
            logprobs,
            stream=bool(stream),
        )

    def parse_logprob_request(self, body: dict[str, Any]) -> LogprobRequest:
        """The logprob fields of a /generate body; the stand-in gives output logprobs only."""
        flags = {}
        for name in ("return_logprob", "return_text_in_logprobs"):
            value = body.get(name)
            if value is not None and not isinstance(value, bool):
                raise BadRequestError(f"{name} must be true or false (one value for all prompts)")
            flags[name] = bool(value)
        top = body.get("top_logprobs_num")
        if top is None:
            top = 0
        if isinstance(top, bool) or not isinstance(top, int) or top < 0:
            raise BadRequestError("top_logprobs_num must be a non-negative integer")
        if top > self.tokenizer.vocab_size:
            raise BadRequestError(
                f"top_logprobs_num must be at most the vocabulary size, "
                f"{self.tokenizer.vocab_size}, got {top}"
            )
        start = body.get("logprob_start_len")
        if start is not None and start != -1:
            raise BadRequestError(
                "logprob_start_len must be -1: the stand-in engine returns the logprobs of "
                "output tokens only"
            )
        return LogprobRequest(
            return_logprob=flags["return_logprob"],
            top_logprobs_num=top if flags["return_logprob"] else 0,
            return_text_in_logprobs=flags["return_text_in_logprobs"],
        )

    # -- generation -------------------------------------------------------------------------

    def submit(self, items: list[TokenizedGenerateReqInput]) -> list[ReqState]:
        """Send requests to the scheduler; requests sent together share one prefill batch."""
        states = [ReqState() for _ in items]
        with self._status_lock:
            for item, state in zip(items, states, strict=True):
                self._states[item.rid] = state
            self._unfinished += len(items)
        self._send(items)
        return states

    @staticmethod
    def tokenized(request: GenerateReqInput) -> list[TokenizedGenerateReqInput]:
        return [
            TokenizedGenerateReqInput(
                rid=rid,
                input_text=prompt,
                input_ids=ids,
                sampling_params=params,
                seed=None if params.is_greedy else random.getrandbits(63),
                return_logprob=request.logprobs.return_logprob,
                top_logprobs_num=request.logprobs.top_logprobs_num,
                stream=request.stream,
            )
            for prompt, ids, params, rid in zip(
                request.prompts,
                request.input_ids,
                request.sampling_params,
                request.rids,
                strict=False,
            )
        ]

    def generate(self, request: GenerateReqInput) -> dict[str, Any] | list[dict[str, Any]]:
        """Run the request's prompts as one group of concurrent requests and wait for all."""
        items = self.tokenized(request)
        states = self.submit(items)
        for state in states:
            state.event.wait()
        with self._status_lock:
            self.num_requests_total += len(items)
        outputs = []
        for state in states:
            assert state.finished is not None
            outputs.append(
                self.output_of(
                    state,
                    state.finished,
                    state.text,
                    state.finished_time or time.perf_counter(),
                    request.logprobs,
                )
            )
        return outputs[0] if request.is_single else outputs

    def generate_stream(self, request: GenerateReqInput) -> Iterator[dict[str, Any]]:
        """A streamed request's output so far after every step that gave it tokens, the last
        finished (one prompt)."""
        (state,) = self.submit(self.tokenized(request))
        while True:
            output, text, at = state.steps.get()
            yield self.output_of(state, output, text, at, request.logprobs)
            if output.finished_reason is not None:
                break
        with self._status_lock:
            self.num_requests_total += 1

    def output_of(
        self,
        state: ReqState,
        req: FinishedReq,
        text: str,
        at: float,
        logprobs: LogprobRequest,
    ) -> dict[str, Any]:
        """SGLang's reply: text, ids and meta_info so far; speculation's figures and the
        latency only once finished, as SGLang reports them."""
        finished = req.finished_reason is not None
        meta_info: dict[str, Any] = {
            "id": req.rid,
            "finish_reason": req.finished_reason,
            "prompt_tokens": req.prompt_tokens,
            "completion_tokens": len(req.output_ids),
            "cached_tokens": 0,
        }
        if finished:
            meta_info["e2e_latency"] = at - state.created_time
        if finished and req.spec_verify_ct > 0:
            # SGLang's definitions: drafts accepted of every draft slot verified, and output
            # tokens (the prefill's first one included) per verify step.
            draft_slots = req.spec_verify_ct * (self.server_args.speculative_num_draft_tokens - 1)
            meta_info["spec_verify_ct"] = req.spec_verify_ct
            meta_info["spec_accept_rate"] = (
                req.spec_num_correct_drafts / draft_slots if draft_slots else 0.0
            )
            meta_info["spec_accept_length"] = len(req.output_ids) / req.spec_verify_ct
            meta_info["spec_num_correct_drafts"] = req.spec_num_correct_drafts
            meta_info["spec_num_proposed_drafts"] = draft_slots
            meta_info["spec_correct_drafts_histogram"] = list(req.spec_correct_drafts_histogram)
        if req.return_logprob:
            meta_info.update(self.logprob_meta_info(state, req, logprobs.return_text_in_logprobs))
        return {"text": text, "output_ids": list(req.output_ids), "meta_info": meta_info}

    def logprob_meta_info(
        self, state: ReqState, req: FinishedReq, with_text: bool
    ) -> dict[str, Any]:
        """SGLang's shapes: `[logprob, token_id, token_text]` per output token (the text only
        with `return_text_in_logprobs`, else null), and per output position a list of them for
        the top logprobs; each position detokenized once (`state`'s entries so far)."""

        def entry(logprob: float, token_id: int) -> list[Any]:
            text = self.tokenizer.decode([token_id]) if with_text else None
            return [logprob, token_id, text]

        done = len(state.token_entries)
        state.token_entries.extend(
            entry(logprob, token_id)
            for logprob, token_id in zip(
                req.output_token_logprobs_val[done:], req.output_ids[done:], strict=True
            )
        )
        meta_info: dict[str, Any] = {"output_token_logprobs": state.token_entries}
        if req.top_logprobs_num > 0:
            done = len(state.top_entries)
            state.top_entries.extend(
                [entry(logprob, token_id) for logprob, token_id in zip(values, ids, strict=True)]
                for values, ids in zip(
                    req.output_top_logprobs_val[done:],
                    req.output_top_logprobs_idx[done:],
                    strict=True,
                )
            )
            meta_info["output_top_logprobs"] = state.top_entries
        return meta_info

    def health_generate(self, timeout: float = HEALTH_CHECK_TIMEOUT_S) -> bool:
        """A real one-token generation (prefill only) through every rank; True when the
        scheduler answers in time."""
        item = TokenizedGenerateReqInput(
            rid=f"HEALTH_CHECK_{uuid.uuid4().hex}",
            input_text="",
            input_ids=self.tokenizer.encode("health"),
            sampling_params=SamplingParams(max_new_tokens=1, temperature=0.0),
        )
        (state,) = self.submit([item])
        if state.event.wait(timeout):
            return True
        with self._status_lock:
            if self._states.pop(item.rid, None) is not None:
                self._unfinished -= 1
        return False
