"""What `opspatch inventory show` prints: a table and a JSON document, both as values.

The CLI only draws them; nothing here reads a file or talks to a host.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from opspatch.core.host import (
    CommandRestart,
    Host,
    RestartStrategy,
    SupervisorRestart,
    SystemdRestart,
)

INVENTORY_COLUMNS = (
    "host",
    "address",
    "port",
    "user",
    "transport",
    "jump",
    "groups",
    "python",
    "restart",
    "url",
    "become",
    "container",
)


@dataclass(frozen=True)
class InventoryTable:
    """What `opspatch inventory show` prints: a title, column names and one row per host."""

    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


def restart_to_json(restart: RestartStrategy | None) -> dict[str, Any] | None:
    if restart is None:
        return None
    if isinstance(restart, SystemdRestart):
        return {"kind": restart.kind, "unit": restart.unit}
    if isinstance(restart, SupervisorRestart):
        return {"kind": restart.kind, "program": restart.program}
    if not isinstance(restart, CommandRestart):
        return {
            "kind": restart.kind,
            "stop_timeout": restart.stop_timeout,
            "pid_file": restart.pid_file,
        }
    return {
        "kind": restart.kind,
        "start": restart.start,
        "pid_file": restart.pid_file,
        "workdir": restart.workdir,
        "stop_timeout": restart.stop_timeout,
    }


def _json_safe(value: Any) -> Any:
    """`vars` as JSON: TOML dates and times as ISO text, anything else YAML can hold (bytes,
    sets) as its text; containers recursively (the loaders bound how deep they nest)."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_json_safe(v) for v in value]
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def host_to_json(host: Host) -> dict[str, Any]:
    """Every resolved setting of a host as JSON-ready data."""
    jump = host.jump
    return {
        "name": host.name,
        "inventory": host.inventory,
        "address": host.address,
        "port": host.port,
        "user": host.user,
        "identity_file": host.identity_file,
        "known_hosts": host.known_hosts,
        "jump": None
        if jump is None
        else {
            "address": jump.address,
            "port": jump.port,
            "user": jump.user,
            "identity_file": jump.identity_file,
            "name": jump.name,
        },
        "transport": host.transport,
        "state_dir": host.state_dir,
        # the settings only: a password is never in the model, so it cannot be shown
        "become": {
            "enabled": host.become.enabled,
            "user": host.become.user,
            "method": host.become.method,
            "password_env": host.become.password_env,
        },
        "container": None
        if host.container is None
        else {"runtime": host.container.runtime, "name": host.container.name},
        "groups": list(host.groups),
        "vars": _json_safe(dict(host.vars)),
        "engine": {
            "python": host.engine.python,
            "url": host.engine.url,
            "log_file": host.engine.log_file,
            "speculative": host.engine.speculative,
            "env": dict(host.engine.env),
            "restart": restart_to_json(host.engine.restart),
        },
        # the key's source only: the key is never in the model, so it cannot be shown
        "router": None
        if host.router is None
        else {
            "url": host.router.url,
            "worker_url": host.router.worker_url,
            "admin_key_env": host.router.admin_key_env,
        },
    }


def inventory_show_json(hosts: Sequence[Host], *, selection: str = "") -> dict[str, Any]:
    """The `inventory show --json` document: the selection and every resolved host."""
    return {
        "selection": selection,
        "inventories": sorted({h.inventory for h in hosts}),
        "hosts": [host_to_json(h) for h in hosts],
    }


def inventory_show_table(hosts: Sequence[Host], *, selection: str = "") -> InventoryTable:
    """The `inventory show` table: one row per host, `-` where a setting is left to defaults."""

    def text(value: object) -> str:
        return "-" if value is None or value == "" else str(value)

    # the router column only where a host has one: inventories without routers read as before
    routed = any(h.router is not None for h in hosts)
    rows = tuple(
        (
            h.name,
            h.address if h.transport == "ssh" else "(this machine)",
            text(h.port),
            text(h.user),
            h.transport,
            text(h.jump.describe() if h.jump else None),
            ",".join(h.groups) or "-",
            text(h.engine.python),
            text(h.engine.restart.describe() if h.engine.restart else None),
            h.engine.url,
            h.become.describe(),
            text(h.container.describe() if h.container else None),
            *((text(h.router.describe() if h.router else None),) if routed else ()),
        )
        for h in hosts
    )
    title = f"{len(hosts)} host{'s' if len(hosts) != 1 else ''}" + (
        f" selected by {selection!r}" if selection else ""
    )
    columns = (*INVENTORY_COLUMNS, "router") if routed else INVENTORY_COLUMNS
    return InventoryTable(title=title, columns=columns, rows=rows)
