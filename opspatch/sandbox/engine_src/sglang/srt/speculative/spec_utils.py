"""Verifying a chain of draft tokens against the target model (EAGLE with topk=1).

Greedy: accept drafts while each equals the target's argmax at its position, then append the
target's own token at the first disagreement (or after the last draft). The output is exactly
the target's greedy output, only computed in fewer target passes.

Sampled: standard speculative sampling. Draft token x with draft probability q(x) is accepted with
probability min(1, p(x) / q(x)); on rejection the replacement is drawn from the normalised
positive part of p - q. The result is distributed as sampling from the target alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sglang.srt.layers.sampler import greedy_token, sample_token, uniform


def verify_chain_greedy(
    drafts: Sequence[int], target_logits: torch.Tensor
) -> tuple[list[int], int]:
    """`target_logits` row i is the target's prediction after the prefix and drafts[:i].

    Returns the tokens to append (accepted drafts plus one target token) and the number of
    drafts accepted.
    """
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == greedy_token(target_logits[accepted]):
        accepted += 1
    return list(drafts[:accepted]) + [greedy_token(target_logits[accepted])], accepted


def verify_chain_sampled(
    drafts: Sequence[int],
    draft_probs: Sequence[torch.Tensor],
    target_probs: Sequence[torch.Tensor],
    generator: torch.Generator | None,
) -> tuple[list[int], int]:
    """Speculative sampling over a chain; `target_probs` has one more row than `drafts`."""
    for index, token in enumerate(drafts):
        p, q = target_probs[index], draft_probs[index]
        if uniform(generator) * float(q[token]) <= float(p[token]):
            continue
        residual = torch.clamp(p - q, min=0.0)
        if float(residual.sum()) <= 0.0:
            residual = p
        replacement = sample_token(residual / residual.sum(), generator)
        return list(drafts[:index]) + [replacement], index
    return list(drafts) + [sample_token(target_probs[len(drafts)], generator)], len(drafts)
