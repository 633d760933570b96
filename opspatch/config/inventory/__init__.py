"""Inventories: which hosts exist, how to reach them, and how their engine is run."""

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
