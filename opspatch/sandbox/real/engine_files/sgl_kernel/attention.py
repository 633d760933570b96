"""The two attention ops of SGLang's `intel_amx` backend, in plain torch.

Both read the paged KV cache the way the engine lays it out: `req_to_token[req, i]` is the
cache row of a request's i-th token; `k_buffer[row]` is `[kv_heads, head_dim]`. Slow (one
request at a time) and exact (float32 softmax); the models of the sandbox are tiny.
"""

from __future__ import annotations

import torch

from .errors import OpNotProvided


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sm_scale: float,
    logit_cap: float,
    visible: torch.Tensor | None,
) -> torch.Tensor:
    """`q` `[m, heads, d]` over `k` `[n, kv_heads, d]`, `v` `[n, kv_heads, dv]`; `visible`
    `[m, n]` (None: all) says which key each query sees. Returns `[m, heads, dv]` in q's dtype."""
    heads, kv_heads = q.shape[1], k.shape[1]
    if heads != kv_heads:  # grouped-query attention: each kv head serves heads // kv_heads
        k = k.repeat_interleave(heads // kv_heads, dim=1)
        v = v.repeat_interleave(heads // kv_heads, dim=1)
    scores = torch.einsum("mhd,nhd->hmn", q.float(), k.float()) * sm_scale
    if logit_cap > 0:
        scores = logit_cap * torch.tanh(scores / logit_cap)
    if visible is not None:
        scores = scores.masked_fill(~visible.unsqueeze(0), float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return torch.einsum("hmn,nhd->mhd", weights, v.float()).to(q.dtype)


def _refuse_unsupported(
    is_cross_attention: bool, sliding_window: int, sinks: torch.Tensor | None, op: str
) -> None:
    if is_cross_attention:
        raise OpNotProvided(f"{op} with cross attention")
    if sliding_window > 0:
        raise OpNotProvided(f"{op} with a sliding window")
    if sinks is not None:
        raise OpNotProvided(f"{op} with attention sinks")


def _rows(req_to_token: torch.Tensor, req: torch.Tensor, start: int, end: int) -> torch.Tensor:
    return req_to_token[int(req), start:end].long()


def decode_attention_cpu(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    key_scale: float,
    value_scale: float,
    o: torch.Tensor,
    k: torch.Tensor | None,
    v: torch.Tensor | None,
    loc: torch.Tensor,
    attn_logits: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    logit_cap: float,
    is_cross_attention: bool = False,
    sliding_window: int = 0,
    encoder_lens: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
) -> None:
    """One new token per request: write its k/v (when given) at `loc`, then attend over the
    request's first `seq_lens[b]` tokens (the new one last). Writes `o` `[bs, heads, dv]`."""
    _refuse_unsupported(is_cross_attention, sliding_window, sinks, "decode_attention_cpu")
    kv_heads = k_buffer.shape[1]
    if k is not None and v is not None:
        rows = loc.long()
        k_buffer[rows] = k.reshape(-1, kv_heads, k_buffer.shape[2]).to(k_buffer.dtype)
        v_buffer[rows] = v.reshape(-1, kv_heads, v_buffer.shape[2]).to(v_buffer.dtype)
    for b in range(q.shape[0]):
        rows = _rows(req_to_token, req_pool_indices[b], 0, int(seq_lens[b]))
        keys = k_buffer[rows].float() * key_scale
        values = v_buffer[rows].float() * value_scale
        o[b] = attend(q[b : b + 1], keys, values, sm_scale, logit_cap, None)[0].to(o.dtype)


def extend_attention_cpu(
    q_extend: torch.Tensor,
    k_extend: torch.Tensor | None,
    v_extend: torch.Tensor | None,
    o_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    key_scale: float,
    value_scale: float,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    max_len_extend: int | None,
    sm_scale: float,
    logit_cap: float,
    is_cross_attention: bool = False,
    sliding_window: int = 0,
    encoder_lens: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    tree_mask: torch.Tensor | None = None,
    is_causal: bool = True,
) -> None:
    """Several new tokens per request (a prefill, EAGLE's verify or draft extend): each sees the
    request's cached prefix whole and, among the new tokens, those before it (`is_causal`) or
    those `tree_mask` marks: EAGLE's `[new, new]` block per request, row-major, as its tree
    build writes it on the CPU (QLEN_ONLY). The new tokens' k/v come from `k_extend` /
    `v_extend` (from the cache when None: already written there). Writes `o_extend`."""
    _refuse_unsupported(is_cross_attention, sliding_window, sinks, "extend_attention_cpu")
    mask_offset = 0
    for b in range(seq_lens.shape[0]):
        new = int(extend_seq_lens[b])
        total = int(seq_lens[b])
        prefix = total - new
        start = int(extend_start_loc[b])
        req = req_pool_indices[b]
        prefix_rows = _rows(req_to_token, req, 0, prefix)
        if k_extend is None or v_extend is None:
            new_rows = _rows(req_to_token, req, prefix, total)
            new_k, new_v = k_buffer[new_rows], v_buffer[new_rows]
        else:
            new_k, new_v = k_extend[start : start + new], v_extend[start : start + new]
        keys = torch.cat([k_buffer[prefix_rows].float() * key_scale, new_k.float()])
        values = torch.cat([v_buffer[prefix_rows].float() * value_scale, new_v.float()])
        visible = torch.ones((new, total), dtype=torch.bool)
        if tree_mask is not None:
            block = tree_mask.reshape(-1)[mask_offset : mask_offset + new * new]
            visible[:, prefix:] = block.reshape(new, new).bool()
            mask_offset += new * new
        elif is_causal:
            visible[:, prefix:] = torch.ones((new, new), dtype=torch.bool).tril()
        out = attend(q_extend[start : start + new], keys, values, sm_scale, logit_cap, visible)
        o_extend[start : start + new] = out.to(o_extend.dtype)
