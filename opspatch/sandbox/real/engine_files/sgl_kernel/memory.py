"""The KV cache's bookkeeping ops on the CPU: which cache rows a request's tokens occupy
(`req_to_token`), and copying rows of every layer's buffer at once. Each mirrors the Triton
kernel SGLang runs on a GPU (`assign_req_to_token_pool`, `assign_extend_cache_locs`,
`copy_all_layer_kv_cache_tiled`).
"""

from __future__ import annotations

import ctypes

import torch


def _spans(start_offset: torch.Tensor, end_offset: torch.Tensor) -> list[tuple[int, int, int]]:
    """Per request (start, end, where its part of the packed locations begins)."""
    spans, packed = [], 0
    for start, end in zip(start_offset.tolist(), end_offset.tolist(), strict=True):
        spans.append((int(start), int(end), packed))
        packed += int(end) - int(start)
    return spans


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Record newly allocated rows: request b's tokens `start..end` get the next
    `end - start` entries of the packed `out_cache_loc`."""
    for b, (start, end, packed) in enumerate(_spans(start_offset, end_offset)):
        row = req_to_token[int(req_pool_indices[b])]
        row[start:end] = out_cache_loc[packed : packed + end - start].to(row.dtype)


def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """The reverse: pack the rows of request b's tokens `start..end` into `out_cache_loc`."""
    for b, (start, end, packed) in enumerate(_spans(start_offset, end_offset)):
        row = req_to_token[int(req_pool_indices[b])]
        out_cache_loc[packed : packed + end - start] = row[start:end].to(out_cache_loc.dtype)


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor, src_loc: torch.Tensor
) -> None:
    """In every buffer (`data_ptrs[i]`, rows of `strides[i]` bytes), copy row `src_loc[j]` to
    row `tgt_loc[j]`; every source row is read before any is written, so overlapping moves
    are safe, as in the Triton kernel."""
    sources = [int(x) for x in src_loc]
    targets = [int(x) for x in tgt_loc]
    for base, stride in zip(data_ptrs.tolist(), strides.tolist(), strict=True):
        saved = [ctypes.string_at(base + row * stride, stride) for row in sources]
        for row, data in zip(targets, saved, strict=True):
            ctypes.memmove(base + row * stride, data, stride)
