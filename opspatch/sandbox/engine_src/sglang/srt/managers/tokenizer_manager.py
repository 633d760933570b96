"""Between HTTP and the scheduler: validate and tokenize requests, wait, detokenize, report.

Every malformed request raises BadRequestError with a message meant for the client (HTTP 400);
nothing malformed reaches the scheduler, whose errors are fatal to the server.
"""

from __future__ import annotations

import enum
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.sampling.sampling_params import InvalidSamplingParams, SamplingParams
from sglang.srt.server_args import ServerArgs

GENERATE_REQUEST_FIELDS = (
    "text",
    "input_ids",
    "sampling_params",
    "rid",
    "stream",
    "return_logprob",
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
    "return_text_in_logprobs",
)
HEALTH_CHECK_TIMEOUT_S = 20.0


class BadRequestError(ValueError):
    """The request is malformed; the message is sent to the client with HTTP 400."""


class ServerStatus(enum.Enum):
    Starting = "Starting"
    Up = "Up"


@dataclass
class GenerateReqInput:
    """One /generate call after validation: one or several prompts."""

    prompts: list[str]
    input_ids: list[list[int]]
    sampling_params: list[SamplingParams]
    rids: list[str]
    is_single: bool


class TokenizerManager:
    def __init__(self, server_args: ServerArgs, scheduler: Scheduler):
        self.server_args = server_args
        self.scheduler = scheduler
        self.tokenizer = scheduler.tokenizer
        self.server_status = ServerStatus.Starting
        self._status_lock = threading.Lock()
        # SGLang's `sglang:num_requests_total` (tokenizer metrics): requests finished
        self.num_requests_total = 0

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
        if not isinstance(body, dict):
            raise BadRequestError("the request body must be a JSON object")
        unknown = sorted(set(body) - set(GENERATE_REQUEST_FIELDS) - set(ROUTER_FORWARDED_FIELDS))
        if unknown:
            raise BadRequestError(
                f"unknown field(s) {', '.join(map(repr, unknown))}; "
                f"known: {', '.join(GENERATE_REQUEST_FIELDS)}"
            )
        if body.get("stream"):
            raise BadRequestError("stream=true is not supported by the stand-in engine")
        unsupported = [
            name for name in ROUTER_FORWARDED_FIELDS if name.startswith("return_") and body.get(name)
        ]
        if unsupported:
            raise BadRequestError(
                f"{', '.join(unsupported)}=true is not supported by the stand-in engine"
            )
        if body.get("return_logprob"):
            raise BadRequestError("return_logprob=true is not supported by the stand-in engine")

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
        return GenerateReqInput(
            prompts, [list(ids) for ids in token_lists], params, rids, is_single
        )

    # -- generation -------------------------------------------------------------------------

    def generate(self, request: GenerateReqInput) -> dict[str, Any] | list[dict[str, Any]]:
        """Run the request's prompts as one group of concurrent requests and wait for all."""
        reqs = [
            Req(rid=rid, origin_input_text=prompt, origin_input_ids=ids, sampling_params=params)
            for prompt, ids, params, rid in zip(
                request.prompts,
                request.input_ids,
                request.sampling_params,
                request.rids,
                strict=False,
            )
        ]
        self.scheduler.submit(reqs)
        for req in reqs:
            req.done.wait()
        with self._status_lock:
            self.num_requests_total += len(reqs)
        outputs = [self.output_of(req) for req in reqs]
        return outputs[0] if request.is_single else outputs

    def output_of(self, req: Req) -> dict[str, Any]:
        params = req.sampling_params
        text = self.tokenizer.decode(req.output_ids, skip_special_tokens=params.skip_special_tokens)
        reason = req.finished_reason or {"type": "abort"}
        if reason.get("type") == "stop" and not params.no_stop_trim:
            text = text[: len(text) - len(reason["matched"])]
        meta_info: dict[str, Any] = {
            "id": req.rid,
            "finish_reason": reason,
            "prompt_tokens": len(req.origin_input_ids),
            "completion_tokens": len(req.output_ids),
            "cached_tokens": 0,
            "e2e_latency": (req.finished_time or time.perf_counter()) - req.created_time,
        }
        if req.spec_verify_ct > 0:
            meta_info["spec_verify_ct"] = req.spec_verify_ct
            meta_info["spec_accept_rate"] = (
                req.spec_accepted_drafts / req.spec_proposed_drafts
                if req.spec_proposed_drafts
                else 0.0
            )
            meta_info["spec_accept_length"] = req.spec_verified_tokens / req.spec_verify_ct
        return {"text": text, "output_ids": list(req.output_ids), "meta_info": meta_info}

    def health_generate(self, timeout: float = HEALTH_CHECK_TIMEOUT_S) -> bool:
        """A real one-token generation (prefill only); True when the scheduler answers in time."""
        params = SamplingParams(max_new_tokens=1, temperature=0.0)
        req = Req(
            rid=f"HEALTH_CHECK_{uuid.uuid4().hex}",
            origin_input_text="",
            origin_input_ids=self.tokenizer.encode("health"),
            sampling_params=params,
        )
        self.scheduler.submit([req])
        return req.done.wait(timeout)
