"""What `opspatch inventory show` prints: a table and a JSON document, both as values."""

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
    Unit,
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
    """What `opspatch inventory show` prints: a title, column names, one row per host, and one
    line per unit the selected hosts belong to (`units`)."""

    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    units: tuple[str, ...] = ()


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


def _units_of(hosts: Sequence[Host]) -> list[Unit]:
    """The units the hosts belong to, in the order their first host comes."""
    found: dict[str, Unit] = {}
    for host in hosts:
        if host.unit is not None:
            found.setdefault(host.unit.name, host.unit)
    return list(found.values())


def unit_to_json(unit: Unit, hosts: Sequence[Host] = ()) -> dict[str, Any]:
    """A unit as JSON-ready data; `selected`: those of its hosts among `hosts`."""
    chosen = {h.name for h in hosts}
    return {
        "name": unit.name,
        "head": unit.head,
        "nodes": unit.nodes,
        "hosts": list(unit.hosts),
        "selected": [h for h in unit.hosts if h in chosen],
    }


def unit_line(unit: Unit, hosts: Sequence[Host]) -> str:
    """`unit kimi-a: 2 nodes, head node-a0 (ranks: node-a0, node-a1)`, and which of them the
    selection leaves out (a command takes a unit whole, never one node of it)."""
    chosen = {h.name for h in hosts}
    left_out = [h for h in unit.hosts if h not in chosen]
    line = (
        f"unit {unit.name}: {unit.nodes} node{'s' if unit.nodes != 1 else ''}, head {unit.head} "
        f"(ranks: {', '.join(unit.hosts)})"
    )
    return line + (f"; not selected: {', '.join(left_out)}" if left_out else "")


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
        "live": host.live,
        "agent": host.agent,
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
        "unit": None
        if host.unit is None
        else {"name": host.unit.name, "rank": host.unit.rank_of(host.name), "head": host.unit.head},
    }


def inventory_show_json(hosts: Sequence[Host], *, selection: str = "") -> dict[str, Any]:
    """The `inventory show --json` document: the selection, every resolved host, and the
    units the selected hosts belong to."""
    return {
        "selection": selection,
        "inventories": sorted({h.inventory for h in hosts}),
        "hosts": [host_to_json(h) for h in hosts],
        "units": [unit_to_json(u, hosts) for u in _units_of(hosts)],
    }


def inventory_show_table(hosts: Sequence[Host], *, selection: str = "") -> InventoryTable:
    """The `inventory show` table: one row per host, `-` where a setting is left to defaults."""

    def text(value: object) -> str:
        return "-" if value is None or value == "" else str(value)

    # the router and unit columns only where a host has one: other inventories read as before
    routed = any(h.router is not None for h in hosts)
    united = any(h.unit is not None for h in hosts)
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
            *((text(h.unit.describe(h.name) if h.unit else None),) if united else ()),
        )
        for h in hosts
    )
    title = f"{len(hosts)} host{'s' if len(hosts) != 1 else ''}" + (
        f" selected by {selection!r}" if selection else ""
    )
    columns = (
        *INVENTORY_COLUMNS,
        *(("router",) if routed else ()),
        *(("unit",) if united else ()),
    )
    units = tuple(unit_line(u, hosts) for u in _units_of(hosts))
    return InventoryTable(title=title, columns=columns, rows=rows, units=units)
