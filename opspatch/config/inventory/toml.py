"""TOML inventories (`inventories/<name>.toml`), the native format (docs/inventory.md)."""

from __future__ import annotations

from opspatch.config.inventory.model import Inventory
from opspatch.config.inventory.resolve import build_inventory
from opspatch.config.inventory.schema import validate_inventory
from opspatch.core.tomlsource import parse_toml


def parse_toml_inventory(text: str, path: str, name: str) -> Inventory:
    """The inventory `name` from TOML text; `path` names the file in errors.

    Raises:
        SpecError: malformed TOML, an unknown key, a bad value, or a reference the file does
            not resolve (file:line: field: problem).
    """
    document = parse_toml(text, path)
    written = validate_inventory(document.data, document)
    return build_inventory(written, document, name)
