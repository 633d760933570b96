"""The messages between the stand-in's processes (after SGLang's `managers/io_struct.py`).

tokenizer manager (main process) -> scheduler TP0: lists of `TokenizedGenerateReqInput` (a list
is admitted in one prefill batch), `RpcReqInput`, or `ShutdownReq`. Scheduler TP0 -> detokenizer:
`BatchTokenIDOut`; detokenizer -> tokenizer manager: `BatchStrOut`; scheduler TP0 -> tokenizer
manager: `RpcReqOutput`. Plain dataclasses of plain values (no torch), pickled over pipes. A
streamed request's output goes the same way after every step that gave it tokens, unfinished
(`finished_reason` None), as SGLang's scheduler streams at its default `stream_interval` of 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sglang.srt.sampling.sampling_params import SamplingParams


@dataclass
class TokenizedGenerateReqInput:
    rid: str
    input_text: str
    input_ids: list[int]
    sampling_params: SamplingParams
    # Drawn by the tokenizer manager for a sampled request without a seed: every rank samples
    # with the same generator.
    seed: int | None = None
    return_logprob: bool = False
    top_logprobs_num: int = 0
    stream: bool = False


@dataclass
class RpcReqInput:
    """A call of a Scheduler method by name on every rank (`Scheduler.handle_rpc_request`), made
    with keywords as SGLang's (`RpcReqInput(method=..., parameters=...)`); TP0 answers one with an
    `rpc_id` (the stand-in's tokenizer manager waits on it)."""

    method: str
    parameters: dict[str, Any] | None = None
    rpc_id: str | None = None


@dataclass
class RpcReqOutput:
    rpc_id: str | None
    result: Any
    success: bool = True
    message: str = ""


@dataclass
class FreezeGCReq:
    """Freeze the collector (`gc.freeze()`) in every scheduler rank and the detokenizer, sent
    once the server is warm, as SGLang's `/freeze_gc` after its warm-up does: every object built
    until then is hidden from `gc.get_objects()` for the rest of the server's life."""

    gc_threshold: list[int] | None = None


@dataclass
class ShutdownReq:
    """Every rank leaves its loop at the same step (the offline engine's shutdown)."""


@dataclass
class FinishedReq:
    """A request's output so far: finished, or (`finished_reason` None) a streamed one's step."""

    rid: str
    output_ids: list[int]
    finished_reason: dict[str, Any] | None
    prompt_tokens: int
    skip_special_tokens: bool
    no_stop_trim: bool
    spec_verify_ct: int = 0
    spec_proposed_drafts: int = 0
    spec_num_correct_drafts: int = 0
    spec_verified_tokens: int = 0
    spec_correct_drafts_histogram: list[int] = field(default_factory=list)
    return_logprob: bool = False
    top_logprobs_num: int = 0
    # One per output token: its logprob; with top_logprobs_num, the best (logprob, id) pairs.
    output_token_logprobs_val: list[float] = field(default_factory=list)
    output_top_logprobs_val: list[list[float]] = field(default_factory=list)
    output_top_logprobs_idx: list[list[int]] = field(default_factory=list)


@dataclass
class BatchTokenIDOut:
    reqs: list[FinishedReq]


@dataclass
class BatchStrOut:
    reqs: list[FinishedReq]
    texts: list[str]
