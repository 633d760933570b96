"""Where each engine process listens for live fixes, and whether the engine loads the plugin."""

from __future__ import annotations

import os
from collections.abc import Mapping

PLUGIN_NAME = "opspatch_live"
"""The entry point's name, which `SGLANG_PLUGINS` must list when it is set."""

ENTRY_POINT_GROUP = "sglang.srt.plugins"
PLUGINS_ENV = "SGLANG_PLUGINS"
LIVE_DIR_ENV = "OPSPATCH_LIVE_DIR"
ROOT_BASE = "/run/opspatch-live"
USER_BASE = "/tmp/opspatch-live-{uid}"

ROLE_MAIN = "main"
ROLE_SCHEDULER = "scheduler"
ROLE_DETOKENIZER = "detokenizer"
ROLES = (ROLE_MAIN, ROLE_SCHEDULER, ROLE_DETOKENIZER)

MAX_SOCKET_PATH = 107
"""The longest path a Unix socket can be bound at on Linux (108 bytes with the final NUL)."""


def base_dir(environ: Mapping[str, str], uid: int) -> str:
    """The folder that holds every engine's socket folder, for an engine with this environment
    running as `uid`."""
    explicit = environ.get(LIVE_DIR_ENV, "")
    if explicit:
        return explicit
    return ROOT_BASE if uid == 0 else USER_BASE.format(uid=uid)


def server_dir(base: str, server_pid: int) -> str:
    """One engine's socket folder: its main process's pid under `base`."""
    return os.path.join(base, str(server_pid))


def socket_name(role: str, rank: int | None = None) -> str:
    """`main.sock`, `detokenizer.sock`, `scheduler-tp<rank>.sock`."""
    if role not in ROLES:
        raise ValueError(f"unknown engine process role {role!r}")
    if role == ROLE_SCHEDULER:
        if rank is None or rank < 0:
            raise ValueError("a scheduler's socket is named by its TP rank")
        return f"{role}-tp{rank}.sock"
    return f"{role}.sock"


def socket_path(
    environ: Mapping[str, str], uid: int, server_pid: int, role: str, rank: int | None = None
) -> str:
    """The socket of one process of the engine whose main process is `server_pid`."""
    return os.path.join(server_dir(base_dir(environ, uid), server_pid), socket_name(role, rank))


def plugins_filtered_out(environ: Mapping[str, str]) -> str | None:
    """Why an engine with this environment does not load the plugin although it is installed:
    `SGLANG_PLUGINS` is set and does not name it. None when nothing filters it out."""
    raw = environ.get(PLUGINS_ENV, "")
    names = [name.strip() for name in raw.split(",") if name.strip()]
    if not names or PLUGIN_NAME in names:
        return None
    return (
        f"{PLUGINS_ENV}={raw} restricts the engine's plugins to {', '.join(names)}, so "
        f"{PLUGIN_NAME} does not load and live fixes are off; add {PLUGIN_NAME} to "
        f"{PLUGINS_ENV} in the engine's environment (the restart that follows loads it)"
    )
