"""What one process answers: a request applied here by `fixes`, and who answered."""

from __future__ import annotations

import gc
import importlib
import os
from typing import Any

from . import wire

OPS = ("take", "revert", "list", "check", "ping")
"""`ping` is the delivery path's own: who answers here, how the plugin started, and whether the
collector is frozen (SGLang freezes it after its warm-up: objects built before are then found
from the threads' frames, `checks`); `check` the preflight's; the others are the fix runtime's."""

START_ENTRY_POINT, START_PTH = "entry-point", "pth"
started_by = START_ENTRY_POINT
"""How the plugin started in this process: SGLang's `load_plugins()` called the entry point of
group `sglang.srt.plugins`, or the `.pth` line's finder called it (`plugin`, which sets it)."""


def describe(role: str, rank: int | None) -> dict[str, Any]:
    """The `process` of a reply: its role, its TP rank (schedulers) and its pid."""
    return {"role": role, "rank": rank, "pid": os.getpid()}


def bad_op(request: dict[str, Any]) -> dict[str, Any] | None:
    """A refusal when `request` names no operation this path knows, else None."""
    op = request.get("op")
    if op in OPS:
        return None
    return wire.refusal(wire.BAD_REQUEST, f"unknown op {op!r}: one of {', '.join(OPS)}")


def apply_here(request: dict[str, Any]) -> dict[str, Any]:
    """`request` applied in this process by the fix runtime; its reply as a JSON object. An
    exception of the runtime is a refusal (`plugin-error`), never an exception of the engine."""
    refused = bad_op(request)
    if refused is not None:
        return refused
    op = request["op"]
    if op == "ping":
        return {"ok": True, "took": [], "start": started_by, "gc_frozen": gc.get_freeze_count()}
    try:
        if op == "check":
            return _as_document(importlib.import_module(".checks", __package__).check(request))
        fixes = importlib.import_module(".fixes", __package__)
        if op == "take":
            reply = fixes.take(request)
        elif op == "revert":
            reply = fixes.revert(request.get("fix_id"))
        else:
            reply = fixes.list()
    except Exception as error:
        return wire.refusal(wire.PLUGIN_ERROR, f"{type(error).__name__}: {error}")
    return _as_document(reply)


def _as_document(reply: Any) -> dict[str, Any]:
    if isinstance(reply, dict):
        return reply
    to_json = getattr(reply, "to_json", None)
    if callable(to_json):
        document = to_json()
        if isinstance(document, dict):
            return document
    return wire.refusal(wire.PLUGIN_ERROR, f"the fix runtime answered {reply!r}")
