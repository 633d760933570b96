"""Counting a character n-gram model: pure torch, no other part of the engine (so that tests can
load this file by its path and check the model without starting a server)."""

from __future__ import annotations

import torch

# Logits are ln p on this scale, rounded down: integers, so sums are exact in any order.
LOGIT_SCALE = 64.0


def build_ngram_logits(
    token_lists: list[list[int]], vocab_size: int, order: int
) -> tuple[dict[bytes, int], torch.Tensor]:
    """Witten-Bell interpolated log-probabilities, `floor(LOGIT_SCALE * ln p)`, for every
    context of 0 .. order-1 tokens in `token_lists`; returns (context bytes -> row, table).

    p(v | c) = (count(c, v) + types(c) * p(v | c without its first token)) / (count(c) + types(c)),
    where types(c) is the number of distinct tokens seen after c; the empty context is add-one
    smoothed, so no token has probability 0.
    """
    sequences = [bytes(tokens) for tokens in token_lists]
    rows: dict[bytes, int] = {}
    row_ids: list[int] = []
    next_ids: list[int] = []
    for length in range(order):
        for sequence in sequences:
            for index in range(length, len(sequence)):
                context = sequence[index - length : index]
                row = rows.get(context)
                if row is None:
                    row = rows[context] = len(rows)
                row_ids.append(row)
                next_ids.append(sequence[index])
    counts = torch.zeros(len(rows), vocab_size, dtype=torch.float64)
    counts.index_put_(
        (torch.tensor(row_ids), torch.tensor(next_ids)),
        torch.ones(len(row_ids), dtype=torch.float64),
        accumulate=True,
    )
    contexts = list(rows)  # by length: every context's parent has a lower row
    parents = torch.tensor([rows[context[1:]] if context else 0 for context in contexts])
    lengths = torch.tensor([len(context) for context in contexts])
    probs = torch.empty_like(counts)
    probs[0] = (counts[0] + 1.0) / (counts[0].sum() + vocab_size)
    for length in range(1, order):
        selected = (lengths == length).nonzero().squeeze(1)
        seen = counts[selected]
        total = seen.sum(dim=1, keepdim=True)
        types = (seen > 0).sum(dim=1, keepdim=True).to(torch.float64)
        probs[selected] = (seen + types * probs[parents[selected]]) / (total + types)
    return rows, torch.floor(LOGIT_SCALE * torch.log(probs))


def longest_context_row(rows: dict[bytes, int], context: list[int], order: int) -> int:
    """The row of the longest suffix of `context` (at most order - 1 tokens) that was seen; the
    empty context's row when none was."""
    for length in range(min(order - 1, len(context)), 0, -1):
        row = rows.get(bytes(context[len(context) - length :]))
        if row is not None:
            return row
    return rows[b""]
