"""Requests and batches as the scheduler and the model workers share them."""

from __future__ import annotations

import enum
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from sglang.srt.sampling.sampling_params import SamplingParams


class ForwardMode(enum.Enum):
    EXTEND = "extend"  # prefill: the prompt goes in, the first output token comes out
    DECODE = "decode"  # one decode step for every running request

    def is_extend(self) -> bool:
        return self is ForwardMode.EXTEND

    def is_decode(self) -> bool:
        return self is ForwardMode.DECODE


@dataclass
class Req:
    """One generation request, from admission to its finish reason."""

    rid: str
    origin_input_text: str
    origin_input_ids: list[int]
    sampling_params: SamplingParams
    output_ids: list[int] = field(default_factory=list)
    finished_reason: dict[str, Any] | None = None
    created_time: float = field(default_factory=time.perf_counter)
    finished_time: float | None = None
    # Speculative decoding counters reported in meta_info.
    spec_verify_ct: int = 0
    spec_proposed_drafts: int = 0
    spec_num_correct_drafts: int = 0
    spec_verified_tokens: int = 0
    # Per verify step, how many drafts were correct: index n counts the steps with n (grown as
    # needed, as SGLang's `update_spec_correct_drafts_histogram` does).
    spec_correct_drafts_histogram: list[int] = field(default_factory=list)
    # The seed of an unseeded sampled request, drawn once by the tokenizer manager, so that
    # every TP rank samples the same tokens.
    seed: int | None = None
    generator: torch.Generator | None = None
    done: threading.Event = field(default_factory=threading.Event)
    # Where the EAGLE draft starts next step (speculative/spec_info.py `EagleDraftInput`).
    spec_info: Any = None
    # Logprobs asked for (SGLang's `return_logprob`, `top_logprobs_num`) and gathered so far.
    return_logprob: bool = False
    top_logprobs_num: int = 0
    output_token_logprobs_val: list[float] = field(default_factory=list)
    output_top_logprobs_val: list[list[float]] = field(default_factory=list)
    output_top_logprobs_idx: list[list[int]] = field(default_factory=list)
    # SGLang's `stream`: the output so far is sent as its tokens come (`stream_interval`), and
    # how many of them were sent.
    stream: bool = False
    send_token_offset: int = 0

    def __post_init__(self) -> None:
        if not self.sampling_params.is_greedy:
            seed = self.sampling_params.sampling_seed
            if seed is None:
                seed = self.seed
            self.generator = torch.Generator()
            if seed is None:
                self.generator.seed()
            else:
                self.generator.manual_seed(seed)

    @property
    def all_ids(self) -> list[int]:
        return self.origin_input_ids + self.output_ids

    @property
    def remaining_tokens(self) -> int:
        return self.sampling_params.max_new_tokens - len(self.output_ids)

    def finished(self) -> bool:
        return self.finished_reason is not None


@dataclass
class ScheduleBatch:
    reqs: list[Req]
    forward_mode: ForwardMode

    def batch_size(self) -> int:
        return len(self.reqs)


@dataclass
class GenerationBatchResult:
    """New tokens for each request of a batch (same order), and what verification did."""

    next_token_ids: list[list[int]]
    # Per request, the target's logits row of each new token (what logprobs are computed from).
    next_token_logits: list[torch.Tensor] | None = None
    # A step of the target alone: per request, its hidden state at the last input position
    # (where an EAGLE draft starts).
    hidden_states: list[torch.Tensor] | None = None
    # Set for a speculative decode step: drafts proposed and accepted per request.
    proposed_drafts: list[int] | None = None
    accepted_drafts: list[int] | None = None

    @property
    def speculative(self) -> bool:
        return self.accepted_drafts is not None
