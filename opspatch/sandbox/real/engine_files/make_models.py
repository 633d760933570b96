"""Make the real-engine sandbox's models: a tiny Llama target and its EAGLE-3 draft.

Run by opspatch with the engine environment's interpreter (it has torch, transformers and
tokenizers): `python make_models.py CORPUS_PY OUT_DIR`. Writes `OUT_DIR/target` (a Llama in
`save_pretrained` form, with a byte-level BPE tokenizer trained here) and `OUT_DIR/draft` (a
`LlamaForCausalLMEagle3` checkpoint in the names SGLang's `llama_eagle3.py` loads), and
`OUT_DIR/report.json` (steps, losses, seconds). Seeded and counted in steps, not seconds, so a
build repeats. Both are trained on the stand-in's corpus (`DOCUMENTS` of CORPUS_PY): the target
until it continues the project's text, then the draft on the target's hidden states, with a
second, self-fed step (EAGLE-3's training-time test) so that its two-token chains are accepted.
"""

from __future__ import annotations

import json
import math
import runpy
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional

SEED = 20261206
VOCAB = 512
HIDDEN = 128
LAYERS = 4
HEADS, KV_HEADS = 4, 2
INTERMEDIATE = 352
CONTEXT = 2048
AUX_LAYER_IDS = [0, 1, 2]  # SGLang captures the residual stream entering layers id + 1
WINDOW, BATCH = 64, 8
TARGET_STEPS, DRAFT_STEPS = 400, 400
EPS = 1e-5
ROPE_THETA = 10000.0


def say(text: str, step: int = 0) -> None:
    """A progress line opspatch shows (every 50th step)."""
    if step % 50 == 49 or step == 0:
        print(f"make_models: {text}", flush=True)


def train_tokenizer(documents: list[str], out: Path) -> object:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(documents, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    fast.save_pretrained(out)
    return fast


def tokenized(tokenizer: object, documents: list[str]) -> list[torch.Tensor]:
    """Each document's tokens, followed by the end-of-text token."""
    eos = tokenizer.eos_token_id  # type: ignore[attr-defined]
    return [torch.tensor(tokenizer.encode(d) + [eos]) for d in documents]  # type: ignore[attr-defined]


def window_starts(total: int, length: int, generator: torch.Generator) -> list[int]:
    return torch.randint(0, total - length, (BATCH,), generator=generator).tolist()


def llama_config(**extra: object) -> object:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HIDDEN // HEADS,
        max_position_embeddings=CONTEXT,
        rms_norm_eps=EPS,
        rope_theta=ROPE_THETA,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        torch_dtype="float32",
        **extra,
    )


def cosine(optimizer: torch.optim.Optimizer, step: int, steps: int, peak: float = 3e-3) -> None:
    for group in optimizer.param_groups:
        group["lr"] = peak * 0.5 * (1 + math.cos(math.pi * step / steps))


def train_target(stream: torch.Tensor, out: Path, generator: torch.Generator) -> dict:
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(llama_config())
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    losses = []
    for step in range(TARGET_STEPS):
        cosine(optimizer, step, TARGET_STEPS)
        starts = window_starts(len(stream), WINDOW, generator)
        batch = torch.stack([stream[s : s + WINDOW] for s in starts])
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        say(f"target step {step + 1}/{TARGET_STEPS}, loss {losses[-1]:.3f}", step)
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    return {"steps": TARGET_STEPS, "first_loss": losses[0], "last_loss": sum(losses[-20:]) / 20}


def target_features(target: nn.Module, documents: list[torch.Tensor]) -> torch.Tensor:
    """The states SGLang captures for the draft (`AUX_LAYER_IDS`), each document read from its
    start as a prompt is, laid end to end like the token stream."""
    with torch.no_grad():
        parts = []
        for ids in documents:
            states = target(input_ids=ids[None], output_hidden_states=True).hidden_states
            parts.append(torch.cat([states[i + 1][0] for i in AUX_LAYER_IDS], dim=-1))
    return torch.cat(parts)


# ---------------------------------------------------------------------------------------------
# the draft: SGLang's LlamaForCausalLMEagle3, written out in torch for training


class RMSNorm(nn.Module):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * self.weight


def rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, neox style (halves), as SGLang's Llama and HF's apply it."""
    half = x.shape[-1] // 2
    inv = 1.0 / (ROPE_THETA ** (torch.arange(0, half, dtype=torch.float32) / half))
    angles = positions.float()[:, None] * inv[None, :]
    cos, sin = angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]
    first, second = x[..., :half], x[..., half:]
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


class Draft(nn.Module):
    """fc (the target's three captured states -> hidden), one decoder layer whose attention
    reads [input_layernorm(embedding), hidden_norm(hidden)], the final norm, lm_head."""

    def __init__(self) -> None:
        super().__init__()
        head_dim = HIDDEN // HEADS
        self.fc = nn.Linear(HIDDEN * len(AUX_LAYER_IDS), HIDDEN, bias=False)
        self.input_layernorm, self.hidden_norm = RMSNorm(HIDDEN), RMSNorm(HIDDEN)
        self.post_attention_layernorm, self.norm = RMSNorm(HIDDEN), RMSNorm(HIDDEN)
        self.q_proj = nn.Linear(2 * HIDDEN, HEADS * head_dim, bias=False)
        self.k_proj = nn.Linear(2 * HIDDEN, KV_HEADS * head_dim, bias=False)
        self.v_proj = nn.Linear(2 * HIDDEN, KV_HEADS * head_dim, bias=False)
        self.o_proj = nn.Linear(HEADS * head_dim, HIDDEN, bias=False)
        self.gate_proj = nn.Linear(HIDDEN, INTERMEDIATE, bias=False)
        self.up_proj = nn.Linear(HIDDEN, INTERMEDIATE, bias=False)
        self.down_proj = nn.Linear(INTERMEDIATE, HIDDEN, bias=False)
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def qkv(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor) -> tuple:
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        b, t, _ = x.shape
        q = rope(self.q_proj(x).view(b, t, HEADS, -1), positions)
        k = rope(self.k_proj(x).view(b, t, KV_HEADS, -1), positions)
        return q, k, self.v_proj(x).view(b, t, KV_HEADS, -1)

    def finish(self, attended: torch.Tensor, residual: torch.Tensor) -> tuple:
        """After attention: o_proj, the MLP, the final norm; (logits, the pre-norm state SGLang
        feeds back as the next step's hidden)."""
        residual = self.o_proj(attended.flatten(2)) + residual
        h = self.post_attention_layernorm(residual)
        state = self.down_proj(functional.silu(self.gate_proj(h)) * self.up_proj(h)) + residual
        return self.lm_head(self.norm(state)), state


def attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, visible: torch.Tensor):
    repeat = HEADS // KV_HEADS
    keys, values = keys.repeat_interleave(repeat, 2), values.repeat_interleave(repeat, 2)
    out = functional.scaled_dot_product_attention(
        q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2), attn_mask=visible
    )
    return out.transpose(1, 2)


def draft_losses(draft: Draft, embed: nn.Module, tokens: torch.Tensor, aux: torch.Tensor):
    """Step 1 at position i reads (token i+1, the target's states at i) and predicts token i+2;
    step 2 at position i+1 reads (token i+2, step 1's state at i), sees step 1's keys up to i
    and its own, and predicts token i+3: as SGLang's draft extend and first decode step do."""
    t = tokens.shape[1] - 3
    positions = torch.arange(t)
    with torch.no_grad():
        embeds1, embeds2 = embed(tokens[:, 1 : t + 1]), embed(tokens[:, 2 : t + 2])
    hidden = draft.fc(aux[:, :t])
    q1, k1, v1 = draft.qkv(embeds1, hidden, positions)
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    logits1, state1 = draft.finish(attention(q1, k1, v1, causal), hidden)
    q2, k2, v2 = draft.qkv(embeds2, state1, positions + 1)
    keys, values = torch.cat([k1, k2], dim=1), torch.cat([v1, v2], dim=1)
    visible = torch.cat([causal, torch.eye(t, dtype=torch.bool)], dim=1)
    logits2, _ = draft.finish(attention(q2, keys, values, visible), state1)
    loss1 = functional.cross_entropy(logits1.flatten(0, 1), tokens[:, 2 : t + 2].flatten())
    loss2 = functional.cross_entropy(logits2.flatten(0, 1), tokens[:, 3 : t + 3].flatten())
    return loss1, loss2


def train_draft(
    target: nn.Module, documents: list[torch.Tensor], out: Path, generator: torch.Generator
) -> dict:
    stream = torch.cat(documents)
    aux = target_features(target, documents)
    embed = target.get_input_embeddings()
    draft = Draft()
    optimizer = torch.optim.AdamW(draft.parameters(), lr=3e-3, weight_decay=0.0)
    first = last = (0.0, 0.0)
    for step in range(DRAFT_STEPS):
        cosine(optimizer, step, DRAFT_STEPS)
        starts = window_starts(len(stream), WINDOW + 3, generator)
        tokens = torch.stack([stream[s : s + WINDOW + 3] for s in starts])
        features = torch.stack([aux[s : s + WINDOW + 3] for s in starts])
        loss1, loss2 = draft_losses(draft, embed, tokens, features)
        optimizer.zero_grad()
        (loss1 + 0.8 * loss2).backward()
        optimizer.step()
        last = (loss1.item(), loss2.item())
        first = first if step else last
        say(f"draft step {step + 1}/{DRAFT_STEPS}, losses {last[0]:.3f} {last[1]:.3f}", step)
    save_draft(draft, target, out)
    return {"steps": DRAFT_STEPS, "first_losses": first, "last_losses": last}


def save_draft(draft: Draft, target: nn.Module, out: Path) -> None:
    from safetensors.torch import save_file

    layer = {
        name: getattr(draft, name).weight
        for name in (
            "input_layernorm",
            "hidden_norm",
            "post_attention_layernorm",
        )
    }
    tensors = {f"midlayer.{name}.weight": w for name, w in layer.items()}
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        tensors[f"midlayer.self_attn.{name}.weight"] = getattr(draft, name).weight
    for name in ("gate_proj", "up_proj", "down_proj"):
        tensors[f"midlayer.mlp.{name}.weight"] = getattr(draft, name).weight
    tensors["fc.weight"] = draft.fc.weight
    tensors["norm.weight"] = draft.norm.weight
    tensors["lm_head.weight"] = draft.lm_head.weight
    tensors["embed_tokens.weight"] = target.get_input_embeddings().weight
    tensors["d2t"] = torch.zeros(VOCAB, dtype=torch.long)  # draft id = target id
    tensors["t2d"] = torch.ones(VOCAB, dtype=torch.bool)
    out.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.detach().contiguous().clone() for k, v in tensors.items()},
        str(out / "model.safetensors"),
    )
    config = llama_config(
        architectures=["LlamaForCausalLMEagle3"],
        draft_vocab_size=VOCAB,
        target_hidden_size=HIDDEN,
        eagle_config={"eagle_aux_hidden_state_layer_ids": AUX_LAYER_IDS},
    )
    config.num_hidden_layers = 1
    config.save_pretrained(out)


def main(corpus_py: str, out_dir: str) -> None:
    torch.set_num_threads(1)  # tiny matrices: more threads only fight other work for the cores
    torch.manual_seed(SEED)
    generator = torch.Generator().manual_seed(SEED)
    documents = list(runpy.run_path(corpus_py)["DOCUMENTS"])
    out = Path(out_dir)
    started = time.monotonic()
    tokenizer = train_tokenizer(documents, out / "target")
    tokens = tokenized(tokenizer, documents)
    target_report = train_target(torch.cat(tokens), out / "target", generator)
    target_seconds = time.monotonic() - started
    from transformers import LlamaForCausalLM

    target = LlamaForCausalLM.from_pretrained(out / "target").eval()
    for parameter in target.parameters():
        parameter.requires_grad_(False)
    draft_report = train_draft(target, tokens, out / "draft", generator)
    report = {
        "seed": SEED,
        "corpus_tokens": sum(len(t) for t in tokens),
        "target": {**target_report, "seconds": round(target_seconds, 1)},
        "draft": {**draft_report, "seconds": round(time.monotonic() - started - target_seconds, 1)},
    }
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
