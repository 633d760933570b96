"""opspatch's CPU kernel layer, installed under the name `sgl_kernel` into sandbox engines only.

SGLang on the CPU imports its kernels from `sgl_kernel` (sgl-kernel's CPU build, not on PyPI).
This package provides, in plain torch, the ops the sandbox's tiny Llama and its EAGLE-3 draft
reach: the KV cache's bookkeeping, EAGLE's tree and verification, and the two attention ops of
the `intel_amx` backend (on `torch.ops.sgl_kernel`, where SGLang looks them up). Anything else
raises `OpNotProvided` naming the op. `convert_weight_packed` is absent on purpose: without it
SGLang takes its layers' `forward_native` paths.

Opspatch never imports this package itself: it ships as package data and is copied into a
sandbox host's environment (`opspatch.sandbox.realengine`).
"""

from __future__ import annotations

from typing import Any

import torch

from .attention import decode_attention_cpu, extend_attention_cpu
from .errors import OpNotProvided
from .memory import (
    assign_extend_cache_locs_cpu,
    assign_req_to_token_pool_cpu,
    copy_all_layer_kv_cache_cpu,
)
from .speculative import (
    assign_draft_cache_locs_contiguous_cpu,
    build_draft_decode_metadata_cpu,
    build_tree_kernel_efficient_cpu,
    fill_accept_out_cache_loc_cpu,
    fill_bonus_tokens_cpu,
    verify_tree_greedy_cpu,
)

__all__ = [
    "OpNotProvided",
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_req_to_token_pool_cpu",
    "build_draft_decode_metadata_cpu",
    "build_tree_kernel_efficient_cpu",
    "copy_all_layer_kv_cache_cpu",
    "decode_attention_cpu",
    "extend_attention_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "verify_tree_greedy_cpu",
]

TORCH_OPS = {
    "decode_attention_cpu": decode_attention_cpu,
    "extend_attention_cpu": extend_attention_cpu,
}
"""The ops SGLang calls as `torch.ops.sgl_kernel.<name>`."""


def _register_torch_ops() -> None:
    # Plain attributes of the op namespace: SGLang only calls them from Python, and an op not
    # set here stays absent there too (torch's AttributeError, so `hasattr` says False).
    namespace = torch.ops.sgl_kernel
    for name, op in TORCH_OPS.items():
        setattr(namespace, name, op)


_register_torch_ops()


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    raise OpNotProvided(name)
