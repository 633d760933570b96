"""TinyCausalLM: a one-layer causal transformer small enough to decode on any CPU.

Why it looks the way it does:
- Every weight is a small integer and every activation that feeds a sum is an integer held in
  float64, so each matrix product is exact whatever order the CPU kernel adds in. The logits of a
  position are therefore bit-identical whether the model runs on the prefix alone (plain decode)
  or on the prefix plus draft tokens (speculative verify): greedy speculative decoding is exactly
  lossless, not merely almost always.
- Attention is "hard": each position reads the value of the single best-scoring earlier position
  (ties go to the latest), which keeps the integer property that softmax would break.
- A fixed unigram prior over the output favours spaces and common lowercase letters, so the
  untrained weights still produce legible, if meaningless, text.
- Tensor parallelism splits the MLP as Megatron does: each TP rank holds a slice of the MLP's
  units (columns of `w_mlp_in`, rows of `w_out`) and computes a partial output sum; a
  `torch.distributed` all-reduce adds the partial sums. The sums are integers, exact in any
  order, so TP=T logits equal TP=1 logits bit for bit.
- Weights come from a seeded generator derived from the model path: the same path always gives
  the same model on every host. A draft model is the target with a fraction of its output
  weights nudged, so it agrees with the target often but not always.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch

from sglang.srt.distributed.parallel_state import tensor_model_parallel_all_reduce
from sglang.srt.tokenizer.char_tokenizer import CharTokenizer

# Spaces and lowercase letters by their frequency in English text.
_LETTERS_BY_FREQUENCY = "etaoinshrdlcumwfgypbvkjxqz"
_MASKED_LOGIT = -1.0e15


@dataclass(frozen=True)
class TinyLMConfig:
    vocab_size: int
    hidden_size: int = 24
    attention_size: int = 8
    mlp_size: int = 96
    # A position "phase" embedding (position // stride % period) keeps greedy text from
    # settling into a one-character loop.
    phase_period: int = 8
    phase_stride: int = 3
    # Scales the network's contribution against the unigram prior (integer floor division).
    logit_divisor: float = 32.0
    # Sampling divides logits by this before the temperature, so temperature 1.0 is not greedy.
    sampling_logit_scale: float = 4.0
    bos_token_id: int = 0


def seed_for_model_path(model_path: str) -> int:
    return zlib.crc32(model_path.encode("utf-8"))


def init_weights(config: TinyLMConfig, seed: int) -> dict[str, torch.Tensor]:
    """Small integer weights from a seeded generator (stored as float64 for exact matmuls)."""
    generator = torch.Generator().manual_seed(seed)

    def integers(low: int, high: int, *shape: int) -> torch.Tensor:
        return torch.randint(low, high + 1, shape, generator=generator).to(torch.float64)

    d, a, m, v = config.hidden_size, config.attention_size, config.mlp_size, config.vocab_size
    return {
        "embed": integers(-3, 3, v, d),
        "phase_embed": integers(-2, 2, config.phase_period, d),
        "w_query": integers(-1, 1, d, a),
        "w_key": integers(-1, 1, d, a),
        "w_value": integers(-1, 1, d, d),
        "w_mlp_in": integers(-1, 1, 5 * d, m),
        "b_mlp_in": integers(-4, 4, m),
        "w_out": integers(-2, 2, m, v),
    }


def perturb_weights(
    weights: dict[str, torch.Tensor], seed: int, fraction: float
) -> dict[str, torch.Tensor]:
    """A copy of `weights` with about `fraction` of the output weights nudged by -2..2."""
    generator = torch.Generator().manual_seed(seed)
    perturbed = {name: tensor.clone() for name, tensor in weights.items()}
    out = perturbed["w_out"]
    chosen = (torch.rand(out.shape, generator=generator) < fraction).to(torch.float64)
    noise = torch.randint(-2, 3, out.shape, generator=generator).to(torch.float64)
    perturbed["w_out"] = out + chosen * noise
    return perturbed


def unigram_prior(tokenizer: CharTokenizer) -> torch.Tensor:
    prior = torch.full((tokenizer.vocab_size,), -30.0, dtype=torch.float64)
    prior[tokenizer.id_of(" ")] = 14.0
    for rank, letter in enumerate(_LETTERS_BY_FREQUENCY):
        prior[tokenizer.id_of(letter)] = 10.0 - 1.2 * rank
    for punctuation in ".,":
        prior[tokenizer.id_of(punctuation)] = -8.0
    return prior


class TinyCausalLM(torch.nn.Module):
    """Token ids in, next-token logits for every position out (integer-valued float64)."""

    def __init__(
        self,
        config: TinyLMConfig,
        weights: dict[str, torch.Tensor],
        output_prior: torch.Tensor,
        tp_rank: int = 0,
        tp_size: int = 1,
    ) -> None:
        super().__init__()
        self.config = config
        self.tp_rank, self.tp_size = tp_rank, tp_size
        # The whole model's weights (a draft is derived from them); the buffers hold this
        # rank's shard only.
        self._full_weights = weights
        for name, tensor in shard_weights(weights, config, tp_rank, tp_size).items():
            self.register_buffer(name, tensor)
        self.register_buffer("output_prior", output_prior)

    def weights(self) -> dict[str, torch.Tensor]:
        """The whole model's weights (every rank's shard together)."""
        return self._full_weights

    def num_weights(self) -> int:
        return sum(buffer.numel() for buffer in self.buffers())

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        config = self.config
        length = int(input_ids.shape[0])
        positions = torch.arange(length)
        phase = (positions // config.phase_stride) % config.phase_period
        x = self.embed[input_ids] + self.phase_embed[phase]

        zero = torch.zeros(2, x.shape[1], dtype=x.dtype)
        previous_1 = torch.cat([zero[:1], x[:-1]])[:length]
        previous_2 = torch.cat([zero, x[:-2]])[:length]

        # Hard causal attention: each position reads the best-scoring position j <= i.
        scores = (x @ self.w_query) @ (x @ self.w_key).T
        causal = torch.ones(length, length, dtype=torch.bool).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        # argmax returns the first maximum; flipping makes ties go to the latest position.
        chosen = (length - 1) - torch.argmax(torch.flip(scores, dims=[1]), dim=1)
        attended = (x @ self.w_value)[chosen]

        counts = (positions + 1).to(x.dtype).unsqueeze(1)
        running_mean = torch.floor(torch.cumsum(x, dim=0) * 2 / counts)

        features = torch.cat([x, previous_1, previous_2, attended, running_mean], dim=1)
        # This rank's MLP units only; the all-reduce adds every rank's share of the output.
        hidden = torch.relu(features @ self.w_mlp_in + self.b_mlp_in)
        partial = tensor_model_parallel_all_reduce(hidden @ self.w_out)
        logits = torch.floor(partial / config.logit_divisor) + self.output_prior
        logits[:, config.bos_token_id] = _MASKED_LOGIT
        return logits

    def sampling_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits on the scale temperature sampling uses (greedy uses `forward`'s directly)."""
        return logits / self.config.sampling_logit_scale


def shard_weights(
    weights: dict[str, torch.Tensor], config: TinyLMConfig, tp_rank: int, tp_size: int
) -> dict[str, torch.Tensor]:
    """TP rank `tp_rank`'s slice of the MLP (column-parallel in, row-parallel out)."""
    if tp_size == 1:
        return dict(weights)
    if config.mlp_size % tp_size:
        raise ValueError(
            f"the tiny model's {config.mlp_size} MLP units do not split over tp_size={tp_size}"
        )
    per_rank = config.mlp_size // tp_size
    units = slice(tp_rank * per_rank, (tp_rank + 1) * per_rank)
    shard = dict(weights)
    shard["w_mlp_in"] = weights["w_mlp_in"][:, units].contiguous()
    shard["b_mlp_in"] = weights["b_mlp_in"][units].contiguous()
    shard["w_out"] = weights["w_out"][units, :].contiguous()
    return shard


def load_target_model(
    model_path: str, tokenizer: CharTokenizer, tp_rank: int = 0, tp_size: int = 1
) -> TinyCausalLM:
    config = TinyLMConfig(vocab_size=tokenizer.vocab_size, bos_token_id=tokenizer.bos_token_id)
    weights = init_weights(config, seed_for_model_path(model_path))
    return TinyCausalLM(config, weights, unigram_prior(tokenizer), tp_rank, tp_size)


def load_draft_model(
    target: TinyCausalLM, draft_model_path: str, perturb_fraction: float
) -> TinyCausalLM:
    weights = perturb_weights(
        target.weights(), seed_for_model_path(draft_model_path), perturb_fraction
    )
    return TinyCausalLM(
        target.config, weights, target.output_prior.clone(), target.tp_rank, target.tp_size
    )


EntryClass = TinyCausalLM
