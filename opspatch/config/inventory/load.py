"""Reading an inventory file: the format follows the file name (`.toml`, `.yml`, `.yaml`)."""

from __future__ import annotations

import posixpath
from pathlib import Path

from opspatch.config.files import read_text
from opspatch.config.inventory.ansible import parse_ansible_inventory
from opspatch.config.inventory.model import Inventory
from opspatch.config.inventory.toml import parse_toml_inventory
from opspatch.errors import Location, SpecError


def parse_inventory(text: str, path: str, *, name: str | None = None) -> Inventory:
    """Parse inventory text; the format follows the file name (`.toml`, `.yml`, `.yaml`).

    `name` defaults to the file's stem (`inventories/gpu-fleet.toml` -> `gpu-fleet`).

    Raises:
        SpecError: malformed file, unknown key, bad value, unknown host or group reference,
            a group cycle, or a host without an address; the message names file, line and field.
    """
    suffix = posixpath.splitext(path)[1].lower()
    inventory_name = name or posixpath.splitext(posixpath.basename(path))[0]
    if suffix == ".toml":
        return parse_toml_inventory(text, path, inventory_name)
    if suffix in (".yml", ".yaml"):
        return parse_ansible_inventory(text, path, inventory_name)
    raise SpecError(
        Location(path),
        f"unknown inventory format {suffix or '(no suffix)'!r}",
        hint="use .toml, or .yml/.yaml for Ansible inventories",
    )


def load_inventory(path: Path, *, name: str | None = None) -> Inventory:
    """Read and parse an inventory file (by name: `Workspace.load_inventory`).

    Raises:
        SpecError: the file cannot be read, is not UTF-8, or is not a valid inventory.
    """
    return parse_inventory(read_text(path), str(path), name=name)
