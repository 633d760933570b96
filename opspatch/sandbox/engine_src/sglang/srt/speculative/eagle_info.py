"""What passes from the target to the EAGLE draft between steps (after SGLang's `eagle_info.py`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class EagleDraftInput:
    """Where a request's next draft starts: the last token the target chose, and the target's
    hidden state at the position before it (the draft head reads that instead of the text)."""

    verified_id: int
    hidden_states: torch.Tensor  # (hidden_size,)


@dataclass
class DraftForwardBatch:
    """The draft head's input for one step; `draft_forward` advances it step by step."""

    input_ids: torch.Tensor  # (1,): the token whose successor the step drafts
    positions: torch.Tensor  # (1,): where input_ids stands in the text
    hidden_states: torch.Tensor  # (1, hidden_size): the hidden state of the position before it
