"""Inventories: which hosts exist, how to reach them, and how their engine is run.

An inventory is a file in a workspace's `inventories/` folder (`<name>.toml`, or an Ansible YAML
inventory `<name>.yml` / `<name>.yaml`). It names hosts, groups of hosts (groups may contain
groups), variables at fleet, group and host level, and per-host engine settings. The format is
documented in `docs/inventory.md`. One concern per module:

- `model`: `Inventory`, `Group`, the settings layers and `merge_layers` (the one merge order);
- `schema`: the file's strict pydantic schema (`InventoryFile`);
- `resolve`: the one conversion from the schema to resolved `Host`s (`opspatch.core.host`);
- `toml`, `ansible`: the two formats, both read into the one schema; `load`: by file name;
- `select`: the `--hosts` grammar (`select_hosts` in one inventory, `resolve_hosts` over a
  workspace);
- `show`: what `opspatch inventory show` prints, as values.

Errors: malformed files, unknown keys and bad values raise `SpecError` naming the file, the line
and the field; selection problems raise `SelectionError` with the nearest names.
"""

from __future__ import annotations

from opspatch.config.inventory.load import load_inventory, parse_inventory
from opspatch.config.inventory.model import (
    ALL_HOSTS,
    EngineLayer,
    Group,
    Inventory,
    SettingsLayer,
    merge_layers,
)
from opspatch.config.inventory.schema import InventoryFile
from opspatch.config.inventory.select import SANDBOX_INVENTORIES, resolve_hosts, select_hosts
from opspatch.config.inventory.show import (
    INVENTORY_COLUMNS,
    InventoryTable,
    host_to_json,
    inventory_show_json,
    inventory_show_table,
    restart_to_json,
)

__all__ = [
    "ALL_HOSTS",
    "INVENTORY_COLUMNS",
    "SANDBOX_INVENTORIES",
    "EngineLayer",
    "Group",
    "Inventory",
    "InventoryFile",
    "InventoryTable",
    "SettingsLayer",
    "host_to_json",
    "inventory_show_json",
    "inventory_show_table",
    "load_inventory",
    "merge_layers",
    "parse_inventory",
    "resolve_hosts",
    "restart_to_json",
    "select_hosts",
]
