"""Choosing tokens from logits: greedy argmax, or sampling with temperature, top-k, top-p, min-p.

`token_distribution` is shared by plain decoding, the draft model and speculative verification,
so all three see the same filtered distribution for a given request.
"""

from __future__ import annotations

import torch

from sglang.srt.sampling.sampling_params import SamplingParams


def greedy_token(logits_row: torch.Tensor) -> int:
    """The highest logit; ties go to the lowest token id (torch.argmax returns the first)."""
    return int(torch.argmax(logits_row))


def token_distribution(scaled_logits_row: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Probabilities after temperature, top-k, top-p and min-p (for non-greedy requests)."""
    probs = torch.softmax(scaled_logits_row / params.temperature, dim=-1)
    if params.top_k > 0 and params.top_k < probs.shape[0]:
        kth_largest = torch.topk(probs, params.top_k).values[-1]
        probs = torch.where(probs >= kth_largest, probs, torch.zeros_like(probs))
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        mass_before = torch.cumsum(sorted_probs, dim=0) - sorted_probs
        keep_sorted = mass_before < params.top_p * sorted_probs.sum()
        keep = torch.zeros_like(keep_sorted)
        keep[order] = keep_sorted
        probs = torch.where(keep, probs, torch.zeros_like(probs))
    if params.min_p > 0.0:
        probs = torch.where(probs >= params.min_p * probs.max(), probs, torch.zeros_like(probs))
    return probs / probs.sum()


def sample_token(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))


def uniform(generator: torch.Generator | None) -> float:
    return float(torch.rand((), generator=generator, dtype=torch.float64))


def token_logprobs(
    scaled_logits_row: torch.Tensor, token: int, top_logprobs_num: int
) -> tuple[float, list[float], list[int]]:
    """The logprob of `token` and the `top_logprobs_num` best (logprob, id) under the model's own
    distribution (temperature 1, no top-k/top-p/min-p filtering), as SGLang reports them."""
    logprobs = torch.log_softmax(scaled_logits_row, dim=-1)
    if top_logprobs_num <= 0:
        return float(logprobs[token]), [], []
    top = torch.topk(logprobs, min(top_logprobs_num, logprobs.shape[0]))
    return float(logprobs[token]), top.values.tolist(), top.indices.tolist()
