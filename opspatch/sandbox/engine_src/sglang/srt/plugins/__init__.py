"""SGLang's plugin framework (0.5.15 and later): general plugins are the entry points of group
`sglang.srt.plugins` of every installed distribution, each a function called with no argument.

`load_plugins()` is called early in every process of the server, as SGLang calls it: the main
process (`launch_subprocesses`), each scheduler process (`run_scheduler_process`, before it builds
the Scheduler) and the detokenizer. `SGLANG_PLUGINS`, a comma-separated list of entry point names,
restricts which load. A plugin's side effects (hooks registered with `hook_registry.HookRegistry`,
classes patched) are the point; after every plugin ran, the registered hooks are applied once.
A plugin that fails to load or to run is logged and skipped: it never stops the server.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from sglang.srt.plugins.hook_registry import HookRegistry

logger = logging.getLogger(__name__)

GENERAL_PLUGINS_GROUP = "sglang.srt.plugins"
PLUGINS_ENV = "SGLANG_PLUGINS"

_plugins_loaded = False


def allowed_plugin_names() -> set[str] | None:
    """The names `SGLANG_PLUGINS` allows, or None when it is unset or empty (all load)."""
    raw = os.environ.get(PLUGINS_ENV, "")
    names = {name.strip() for name in raw.split(",") if name.strip()}
    return names or None


def load_plugins_by_group(group: str) -> dict[str, Callable[[], Any]]:
    """The loaded entry points of `group` that `SGLANG_PLUGINS` allows, by name."""
    allowed = allowed_plugin_names()
    discovered = entry_points(group=group)
    if not discovered:
        logger.debug(f"No plugins found for group {group}.")
        return {}
    logger.info(f"Available plugins for group {group}:")
    for entry in discovered:
        logger.info(f"  - {entry.name} -> {entry.value}")
    plugins: dict[str, Callable[[], Any]] = {}
    for entry in discovered:
        if allowed is not None and entry.name not in allowed:
            logger.info(f"Skipping plugin {entry.name} (not in {PLUGINS_ENV})")
            continue
        try:
            plugins[entry.name] = entry.load()
            logger.info(f"Loaded plugin {entry.name} from group {group}")
        except Exception:
            logger.exception(f"Failed to load plugin {entry.name} from group {group}")
    return plugins


def load_plugins() -> None:
    """Load and run every allowed general plugin, then apply the registered hooks. Idempotent:
    a process loads its plugins once, however often this is called."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for name, plugin in load_plugins_by_group(GENERAL_PLUGINS_GROUP).items():
        try:
            plugin()
            logger.info(f"Executed general plugin: {name}")
        except Exception:
            logger.exception(f"Failed to execute general plugin: {name}")
    HookRegistry.apply_hooks()
