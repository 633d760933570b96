"""EAGLE's bookkeeping ops on the CPU: where draft and verified tokens live in the KV cache, the
token tree, and greedy verification. Each mirrors the Triton kernel of the same name in
SGLang's `sglang/kernels/ops/speculative/` (one loop per request; batches here are small).
"""

from __future__ import annotations

import torch

from .errors import OpNotProvided

FULL_MASK, QLEN_ONLY = 0, 1
"""SGLang's `TreeMaskMode` values this layer writes (bit-packed masks are not provided)."""


def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor,
    accept_lens: torch.Tensor,
    bonus_tokens: torch.Tensor,
    accept_stride: int,
) -> None:
    """Each request's last accepted token (its bonus token): `accept_lens` counts it."""
    flat = accept_tokens.reshape(-1)
    for b in range(accept_lens.shape[0]):
        bonus_tokens[b] = flat[accept_stride * b + int(accept_lens[b]) - 1]


def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor, out_cache_loc: torch.Tensor, accept_out_cache_loc: torch.Tensor
) -> None:
    """The cache rows of the accepted tokens, packed in order (`-1`: not accepted)."""
    index = accept_index.reshape(-1)
    kept = index[index > -1].long()
    accept_out_cache_loc[: kept.numel()] = out_cache_loc[kept].to(accept_out_cache_loc.dtype)


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
    topk: int,
    num_steps: int,
) -> None:
    """Each request's `topk * num_steps` draft slots: its rows right after its sequence."""
    width = topk * num_steps
    for b in range(seq_lens.shape[0]):
        start = int(seq_lens[b])
        row = req_to_token[int(req_pool_indices[b])]
        out_cache_loc[b * width : (b + 1) * width] = row[start : start + width]


def build_draft_decode_metadata_cpu(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    topk: int,
    num_steps: int,
    pool_len: int,
) -> torch.Tensor:
    """A `req_to_token` for the draft's decode steps, one row per (request, branch): the
    request's prefix, then branch j's own slots (`seq_len + j * num_steps` on), as
    `assign_draft_cache_locs_contiguous_cpu` laid them out."""
    rows = torch.zeros((seq_lens.shape[0] * topk, pool_len), dtype=req_to_token.dtype)
    for b in range(seq_lens.shape[0]):
        length = int(seq_lens[b])
        source = req_to_token[int(req_pool_indices[b])]
        for branch in range(topk):
            row = rows[b * topk + branch]
            row[:length] = source[:length]
            first = length + branch * num_steps
            row[length : length + num_steps] = source[first : first + num_steps]
    return rows


def _parent_position(selected: list[int], parents: list[int], index: int, topk: int) -> int:
    """Where token `index`'s parent sits among the draft tokens (0: the root), -1: not found."""
    parent_tb = selected[index] // topk
    if parent_tb == 0:
        return 0
    parent_token = parents[parent_tb]
    for position, candidate in enumerate(selected):
        if candidate == parent_token:
            return position + 1
    return -1


def build_tree_kernel_efficient_cpu(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """The draft token tree of each request: positions, the retrieve links (first child, next
    sibling) and the mask (each token sees its ancestors and itself), as SGLang's Triton
    `sgl_build_tree_kernel_efficient_triton` writes them. `retrieve_next_*` start at -1."""
    # Long because: one port of the Triton kernel, whose two loops share the tree walk
    if tree_mask_mode not in (FULL_MASK, QLEN_ONLY):
        raise OpNotProvided(f"build_tree_kernel_efficient_cpu with tree mask mode {tree_mask_mode}")
    bs = verified_seq_len.shape[0]
    n = draft_token_num
    lens = [int(x) for x in verified_seq_len]
    parents_all = parent_list.reshape(bs, -1).tolist() if parent_list.numel() else [[]] * bs
    mask = tree_mask.reshape(-1)
    for b in range(bs):
        selected = [int(x) for x in selected_index[b, : n - 1]]
        parents = parents_all[b]
        seq_len = lens[b]
        positions[b * n] = seq_len
        for i in range(n - 1, 0, -1):
            retrieve_index[b, i] = b * n + i
            parent = _parent_position(selected, parents, i - 1, topk)
            if parent >= 0:
                previous = int(retrieve_next_token[b, parent])
                retrieve_next_token[b, parent] = i
                if previous != -1:
                    retrieve_next_sibling[b, i] = previous
        retrieve_index[b, 0] = b * n
        for x in range(n):
            if tree_mask_mode == FULL_MASK:
                base = n * n * b + sum(lens[:b]) * n + (seq_len + n) * x + seq_len + 1
            else:
                base = n * n * b + n * x + 1
            mask[base - 1] = True
            mask[base : base + n - 1] = False
            if x == 0:
                continue
            current, position = x - 1, 0
            for _ in range(depth):
                position += 1
                mask[base + current] = True
                parent = _parent_position(selected, parents, current, topk)
                if parent <= 0:
                    break
                current = parent - 1
            positions[b * n + x] = position + seq_len


def verify_tree_greedy_cpu(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Greedy verification of each request's tree: walk down from the root while a child's
    token is the target's prediction after its parent; record the accepted path
    (`accept_index`, `accept_token_num`) and the target's tokens along it (`predicts`)."""
    num_spec = accept_index.shape[1]
    candidates.shape[1]
    target = target_predict.reshape(-1)
    for b in range(candidates.shape[0]):
        last = int(retrive_index[b, 0])
        accept_index[b, 0] = last
        accepted = 0
        current = 0
        for _ in range(1, num_spec):
            current = int(retrive_next_token[b, current])
            wanted = int(target[last])
            while current != -1 and int(candidates[b, current]) != wanted:
                current = int(retrive_next_sibling[b, current])
            if current == -1:
                break
            predicts[last] = wanted
            accepted += 1
            last = int(retrive_index[b, current])
            accept_index[b, accepted] = last
        accept_token_num[b] = accepted
        predicts[last] = target[last]
