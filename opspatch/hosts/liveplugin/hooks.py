"""Wrapping a class's method in place, once: what SGLang's hook registry calls an `around` hook."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

MARK = "__opspatch_live__"


def around(owner: type, name: str, hook: Callable[..., Any]) -> bool:
    """Make `owner.name(*args)` call `hook(original, *args)`; False when `owner` has no such
    attribute. Wrapping twice leaves the first wrapper."""
    original = getattr(owner, name, None)
    if original is None:
        return False
    if getattr(original, MARK, False):
        return True

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return hook(original, *args, **kwargs)

    setattr(wrapper, MARK, True)
    setattr(owner, name, wrapper)
    return True


def after_init(owner: type, hook: Callable[[Any], None]) -> bool:
    """Call `hook(instance)` once `owner.__init__` has returned."""

    def run_then_hook(
        original: Callable[..., Any], instance: Any, *args: Any, **kwargs: Any
    ) -> None:
        original(instance, *args, **kwargs)
        hook(instance)

    return around(owner, "__init__", run_then_hook)
