"""`opspatch inventory show`: the resolved hosts of a selection and their merged settings."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from opspatch.cli.context import options
from opspatch.cli.params import JsonOption
from opspatch.cli.render import emit_json, out

inventory_app = typer.Typer(
    no_args_is_help=True, help="Inventories: hosts, groups, units, engine settings."
)


@inventory_app.command("show")
def inventory_show(
    target: Annotated[
        str,
        typer.Argument(help="Inventory, group, unit, host, comma list or glob", metavar="TARGET"),
    ],
    as_json: JsonOption = False,
) -> None:
    """The resolved hosts of a selection and their settings (merged defaults, groups, host),
    and the units (multi-node servers) they belong to."""
    from opspatch.config.inventory import inventory_show_json, inventory_show_table

    hosts = options.hosts(target)
    if as_json:
        emit_json(inventory_show_json(hosts, selection=target))
        return
    shown = inventory_show_table(hosts, selection=target)
    table = Table(title=shown.title, title_justify="left")
    for column in shown.columns:
        table.add_column(column)
    for row in shown.rows:
        table.add_row(*row)
    out.print(table)
    for line in shown.units:
        out.print(line, markup=False)


def register(app: typer.Typer) -> None:
    app.add_typer(inventory_app, name="inventory")
