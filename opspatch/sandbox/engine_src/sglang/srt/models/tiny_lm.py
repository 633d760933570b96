"""The stand-in's models: character n-gram language models counted at start from `corpus.py`.

Why they look the way they do:
- The target is an interpolated (Witten-Bell) character n-gram model of order 12: greedy decoding
  continues a prompt with the words and sentences of the corpus ("The capital of France is" ->
  " Paris. ..."), so a newcomer reads the output as language, and a changed token shows.
- Its logits are integers (`floor(LOGIT_SCALE * ln p)`) held in float64, looked up per position
  from a table built once, deterministically, from the corpus: the logits of a position are
  bit-identical whether the model runs on the prefix alone (plain decode) or on the prefix plus
  draft tokens (speculative verify), so greedy speculative decoding is exactly lossless.
- Tensor parallelism splits the table by vocabulary, as Megatron's vocab-parallel output layer
  does: each TP rank holds the columns of its slice of the vocabulary, writes them into an
  otherwise zero logits tensor, and a `torch.distributed` all-reduce adds the ranks' tensors.
  Each element has one non-zero term, so TP=T logits equal TP=1 logits bit for bit.
- The draft is EAGLE-shaped: a weaker model (order 4) that does not read the text itself but the
  target's hidden state (the last tokens the target saw, with their positions) plus the token
  just chosen, and returns its own hidden state for the next draft step. Its attention is
  causal by position: a hidden-state entry counts only if its position lies in the window just
  before the input's position. Wrong positions or a hidden state from the wrong row therefore
  make the drafts worse (acceptance drops) while verification keeps every answer exact, which is
  how ported EAGLE fixes fail quietly on real servers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang.srt.distributed.parallel_state import tensor_model_parallel_all_reduce
from sglang.srt.models.corpus import DOCUMENTS
from sglang.srt.models.ngram import LOGIT_SCALE, build_ngram_logits, longest_context_row
from sglang.srt.tokenizer.char_tokenizer import CharTokenizer

TARGET_ORDER = 12
DRAFT_ORDER = 4
_MASKED_LOGIT = -1.0e15
# A hidden-state entry for a position before the text (no token there).
_NO_POSITION = -1.0


@dataclass(frozen=True)
class TinyLMConfig:
    vocab_size: int
    # The model reads the last `order - 1` tokens.
    order: int = TARGET_ORDER
    # Tokens (with their positions) in a hidden state: what the EAGLE draft reads of the target.
    hidden_window: int = DRAFT_ORDER - 2
    bos_token_id: int = 0

    @property
    def hidden_size(self) -> int:
        return 2 * self.hidden_window


@dataclass
class LogitsProcessorOutput:
    """One row per computed position (SGLang's name for a forward's output)."""

    next_token_logits: torch.Tensor  # (positions, vocab): integer-valued float64
    hidden_states: torch.Tensor  # (positions, hidden_size): token ids, then their positions


class NgramTable:
    """Interpolated n-gram log-probabilities of every context seen in the documents, this TP
    rank's vocabulary columns only."""

    def __init__(
        self,
        token_lists: list[list[int]],
        vocab_size: int,
        order: int,
        masked_token_id: int,
        tp_rank: int = 0,
        tp_size: int = 1,
    ) -> None:
        self.order, self.vocab_size = order, vocab_size
        self.rows, full = build_ngram_logits(token_lists, vocab_size, order)
        full[:, masked_token_id] = _MASKED_LOGIT
        bounds = [len(part) for part in torch.arange(vocab_size).tensor_split(tp_size)]
        self.column_start = sum(bounds[:tp_rank])
        self.column_end = self.column_start + bounds[tp_rank]
        self.shard = full[:, self.column_start : self.column_end].contiguous()

    def row_of(self, context: list[int]) -> int:
        return longest_context_row(self.rows, context, self.order)

    def logits(self, rows: list[int]) -> torch.Tensor:
        """The full logits of `rows`: this rank's columns, added up over the TP group."""
        logits = torch.zeros(len(rows), self.vocab_size, dtype=torch.float64)
        logits[:, self.column_start : self.column_end] = self.shard[torch.tensor(rows)]
        return tensor_model_parallel_all_reduce(logits)

    def num_weights(self) -> int:
        return self.shard.numel()


def corpus_token_lists(tokenizer: CharTokenizer, documents: tuple[str, ...]) -> list[list[int]]:
    """Each document as the model sees a prompt: BOS, then its characters."""
    return [tokenizer.encode(document) for document in documents]


class TinyNgramLM(torch.nn.Module):
    """The target: token ids in, next-token logits and hidden states at the asked positions out."""

    def __init__(
        self, config: TinyLMConfig, table: NgramTable, tp_rank: int = 0, tp_size: int = 1
    ) -> None:
        super().__init__()
        self.config = config
        self.table = table
        self.tp_rank, self.tp_size = tp_rank, tp_size

    def num_weights(self) -> int:
        return self.table.num_weights()

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> LogitsProcessorOutput:
        """Row i: the prediction after `input_ids[: positions[i] + 1]`, and the hidden state
        there (earlier tokens are read as from a KV cache: the result does not depend on them
        being recomputed)."""
        tokens = input_ids.tolist()
        wanted = positions.tolist()
        rows = [self.table.row_of(tokens[: position + 1]) for position in wanted]
        return LogitsProcessorOutput(
            next_token_logits=self.table.logits(rows),
            hidden_states=torch.stack([self.hidden_state(tokens, position) for position in wanted]),
        )

    def hidden_state(self, tokens: list[int], position: int) -> torch.Tensor:
        """The last `hidden_window` tokens through `position`, then their positions."""
        window = self.config.hidden_window
        ids, places = [], []
        for place in range(position - window + 1, position + 1):
            ids.append(float(tokens[place]) if place >= 0 else float(self.config.bos_token_id))
            places.append(float(place) if place >= 0 else _NO_POSITION)
        return torch.tensor(ids + places, dtype=torch.float64)

    def sampling_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits on the scale temperature sampling and logprobs use: ln p."""
        return logits / LOGIT_SCALE


class TinyEagleDraft(torch.nn.Module):
    """The draft head: (token, position, the hidden state before it) in, the next token's logits
    and its own hidden state out. Its `config.order` may be below the target's hidden window + 2
    (a weaker draft reads fewer of the tokens the hidden state holds)."""

    def __init__(self, config: TinyLMConfig, table: NgramTable) -> None:
        super().__init__()
        self.config = config
        self.table = table

    def num_weights(self) -> int:
        return self.table.num_weights()

    @torch.inference_mode()
    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, hidden_states: torch.Tensor
    ) -> LogitsProcessorOutput:
        window = self.config.hidden_window
        rows, new_hidden = [], []
        for token, position, hidden in zip(
            input_ids.tolist(), positions.tolist(), hidden_states.tolist(), strict=True
        ):
            ids, places = hidden[:window], hidden[window:]
            # Causal attention by position: only entries in the window just before the input.
            context = [
                (int(place), int(ident))
                for ident, place in zip(ids, places, strict=True)
                if place != _NO_POSITION and position - window <= place < position
            ]
            context = sorted([*context, (position, token)])
            rows.append(
                self.table.row_of([ident for _, ident in context[-(self.config.order - 1) :]])
            )
            kept = context[-window:]
            padding = window - len(kept)
            new_hidden.append(
                [float(self.config.bos_token_id)] * padding
                + [float(ident) for _, ident in kept]
                + [_NO_POSITION] * padding
                + [float(place) for place, _ in kept]
            )
        return LogitsProcessorOutput(
            next_token_logits=self.table.logits(rows),
            hidden_states=torch.tensor(new_hidden, dtype=torch.float64),
        )

    def sampling_logits(self, logits: torch.Tensor) -> torch.Tensor:
        return logits / LOGIT_SCALE


def load_target_model(
    model_path: str, tokenizer: CharTokenizer, tp_rank: int = 0, tp_size: int = 1
) -> TinyNgramLM:
    """Every model path gives the same model: the stand-in has one corpus."""
    config = TinyLMConfig(vocab_size=tokenizer.vocab_size, bos_token_id=tokenizer.bos_token_id)
    table = NgramTable(
        corpus_token_lists(tokenizer, DOCUMENTS),
        config.vocab_size,
        config.order,
        config.bos_token_id,
        tp_rank,
        tp_size,
    )
    return TinyNgramLM(config, table, tp_rank, tp_size)


def load_draft_model(target: TinyNgramLM, tokenizer: CharTokenizer, order: int) -> TinyEagleDraft:
    """A draft of `order` over the same corpus, reading the target's hidden states."""
    window = target.config.hidden_window
    if not 2 <= order <= window + 2:
        raise ValueError(f"a draft reads 1 to {window + 1} tokens: order 2..{window + 2}")
    config = TinyLMConfig(
        vocab_size=target.config.vocab_size,
        order=order,
        hidden_window=window,
        bos_token_id=target.config.bos_token_id,
    )
    table = NgramTable(
        corpus_token_lists(tokenizer, DOCUMENTS),
        config.vocab_size,
        order,
        config.bos_token_id,
        target.tp_rank,
        target.tp_size,
    )
    return TinyEagleDraft(config, table)


EntryClass = TinyNgramLM
