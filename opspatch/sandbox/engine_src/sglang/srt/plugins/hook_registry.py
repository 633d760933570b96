"""Hooks that plugins register on SGLang's functions, methods and classes (SGLang's
`sglang/srt/plugins/hook_registry.py`, in the stand-in's words).

A hook names its target by dotted path (`sglang.srt.managers.scheduler.Scheduler.recv_requests`)
and says how it wraps it: `before` (may return new `(args, kwargs)`), `after` (may return a new
result), `around` (`hook(original, *args, **kwargs)`) or `replace` (a function, or a class for a
class target). `load_plugins()` applies every registered hook once, after all plugins ran.
"""

from __future__ import annotations

import enum
import functools
import logging
import pkgutil
from collections import defaultdict
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)


class HookType(enum.Enum):
    BEFORE = "before"
    AFTER = "after"
    AROUND = "around"
    REPLACE = "replace"


def _wrap(original: Callable[..., Any], hook: Any, hook_type: HookType) -> Any:
    if hook_type is HookType.REPLACE:
        return hook
    if hook_type is HookType.BEFORE:

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            changed = hook(*args, **kwargs)
            if changed is not None:
                args, kwargs = changed
            return original(*args, **kwargs)

    elif hook_type is HookType.AFTER:

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            changed = hook(result, *args, **kwargs)
            return result if changed is None else changed

    else:

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return hook(original, *args, **kwargs)

    return functools.wraps(original)(wrapper)


class HookRegistry:
    """Every hook registered in this process, by target; applied once per target."""

    _hooks: dict[str, list[tuple[HookType, Any]]] = defaultdict(list)
    _applied: set[str] = set()

    @classmethod
    def register(cls, target: str, hook: Any, hook_type: HookType = HookType.AFTER) -> None:
        if isinstance(hook, type) and hook_type is not HookType.REPLACE:
            raise TypeError(f"a class can only replace its target ({target})")
        cls._hooks[target].append((hook_type, hook))

    @classmethod
    def apply_hooks(cls) -> None:
        for target, hooks in cls._hooks.items():
            if target in cls._applied:
                continue
            try:
                owner_path, name = target.rsplit(".", 1)
                owner = pkgutil.resolve_name(owner_path)
                raw = owner.__dict__.get(name) if isinstance(owner, type) else None
                kind = type(raw) if isinstance(raw, (classmethod, staticmethod)) else None
                wrapped = raw.__func__ if kind is not None else getattr(owner, name)
                # replacements first, so that the other hooks wrap what replaced the original
                for hook_type, hook in sorted(hooks, key=lambda h: h[0] is not HookType.REPLACE):
                    wrapped = _wrap(wrapped, hook, hook_type)
                setattr(owner, name, kind(wrapped) if kind is not None else wrapped)
                cls._applied.add(target)
                logger.info(f"Applied {len(hooks)} hook(s) to {target}")
            except Exception:
                logger.exception(f"Failed to apply hooks to {target}")
