"""The target model worker: loads the model and runs prefill and plain (one-token) decode.

Sandbox hook (not in SGLang): `SGLANG_STANDIN_LOAD_S=<seconds>` makes each scheduler's weight
load take that much longer, standing for a real model's weight loading and CUDA graph capture
(`opspatch sandbox up --restart-seconds S`), so a restart costs what it costs on a real fleet.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import TypeVar

import torch

from sglang.srt.layers.sampler import greedy_token, sample_token, token_distribution
from sglang.srt.managers.schedule_batch import GenerationBatchResult, Req, ScheduleBatch
from sglang.srt.models.tiny_lm import (
    LogitsProcessorOutput,
    TinyEagleDraft,
    TinyNgramLM,
    load_target_model,
)
from sglang.srt.server_args import ServerArgs
from sglang.srt.tokenizer.char_tokenizer import CharTokenizer, get_tokenizer

logger = logging.getLogger(__name__)

LOAD_SECONDS_ENV = "SGLANG_STANDIN_LOAD_S"


def simulated_load_seconds() -> float:
    """The extra seconds `SGLANG_STANDIN_LOAD_S` asks the weight load to take (0 when unset)."""
    raw = os.environ.get(LOAD_SECONDS_ENV, "")
    try:
        return max(0.0, float(raw)) if raw else 0.0
    except ValueError:
        logger.warning(f"ignoring {LOAD_SECONDS_ENV}={raw!r}: not a number")
        return 0.0


ModelT = TypeVar("ModelT", TinyNgramLM, TinyEagleDraft)


def log_weight_load(name: str, load: Callable[[], ModelT]) -> ModelT:
    """Build a model between SGLang's `Load weight begin/end` log lines."""
    logger.info(f"Load weight begin. model={name}, device=cpu")
    started = time.perf_counter()
    model = load()
    logger.info(
        f"Load weight end. type={type(model).__name__}, dtype=torch.float64, "
        f"weights={model.num_weights()}, elapsed={time.perf_counter() - started:.2f} s"
    )
    return model


class TpModelWorker:
    """Holds the target model and the tokenizer; decodes one token per request per step."""

    def __init__(self, server_args: ServerArgs, gpu_id: int, tp_rank: int, nccl_port: int):
        self.server_args = server_args
        self.gpu_id = gpu_id
        self.tp_rank = tp_rank
        self.device = server_args.device
        # Tiny matrices: one thread is faster than the coordination of several, and several
        # sandbox hosts share a machine.
        torch.set_num_threads(1)
        self.tokenizer: CharTokenizer = get_tokenizer(server_args.tokenizer_path or "")

        def load() -> TinyNgramLM:
            model = load_target_model(
                server_args.model_path, self.tokenizer, tp_rank, server_args.tp_size
            )
            time.sleep(simulated_load_seconds())
            return model

        self.model: TinyNgramLM = log_weight_load(server_args.model_path, load)
        self.max_total_num_tokens = server_args.context_length * server_args.max_running_requests

    def forward(self, token_ids: list[int], first_position: int) -> LogitsProcessorOutput:
        """Logits and hidden states at positions `first_position` .. the last of `token_ids`."""
        positions = torch.arange(first_position, len(token_ids))
        return self.model(torch.tensor(token_ids, dtype=torch.long), positions)

    def next_token(self, req: Req, logits_row: torch.Tensor) -> int:
        if req.sampling_params.is_greedy:
            return greedy_token(logits_row)
        probs = token_distribution(self.model.sampling_logits(logits_row), req.sampling_params)
        return sample_token(probs, req.generator)

    def forward_batch_generation(self, batch: ScheduleBatch) -> GenerationBatchResult:
        """Prefill or plain decode: exactly one new token for each request of the batch, with
        the target's logits and its hidden state at the last position."""
        next_token_ids, logits_rows, hidden_states = [], [], []
        for req in batch.reqs:
            output = self.forward(req.all_ids, len(req.all_ids) - 1)
            next_token_ids.append([self.next_token(req, output.next_token_logits[-1])])
            logits_rows.append(output.next_token_logits)
            hidden_states.append(output.hidden_states[-1])
        return GenerationBatchResult(
            next_token_ids=next_token_ids,
            next_token_logits=logits_rows,
            hidden_states=hidden_states,
        )
