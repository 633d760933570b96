"""Units: the hosts that form one multi-node SGLang server, checked against the inventory."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from opspatch.config.inventory.model import ALL_HOSTS
from opspatch.config.inventory.schema import InventoryFile, UnitTable
from opspatch.core.fileschema import FieldPath, SourceDocument, did_you_mean
from opspatch.core.host import Host, Unit

UNIT_EXAMPLE = 'e.g. [units.kimi-a] hosts = ["node-a0", "node-a1"] (the first is the head)'


def build_units(
    written: InventoryFile, doc: SourceDocument, inventory_name: str
) -> dict[str, Unit]:
    """Every unit of the file, checked, with its hosts in node-rank order.

    Raises:
        SpecError: an empty unit, an unknown or repeated host, a host in two units, a head not
            among the unit's hosts, or a unit name that names something else too.
    """
    owner: dict[str, str] = {}  # host -> the unit that listed it first
    units: dict[str, Unit] = {}
    for unit_name, table in written.units.items():
        where: FieldPath = ("units", unit_name)
        _check_name(unit_name, written, doc, inventory_name)
        if not table.hosts:
            raise doc.error(
                (*where, "hosts"),
                f"unit {unit_name!r} has no host",
                hint=f"list the hosts that form the server, {UNIT_EXAMPLE}; or remove the unit",
            )
        for index, member in enumerate(table.hosts):
            _check_member(unit_name, member, (*where, "hosts", index), written, doc, owner)
            owner[member] = unit_name
        units[unit_name] = Unit(unit_name, _rank_order(unit_name, table, where, doc))
    return units


def _check_name(
    unit_name: str, written: InventoryFile, doc: SourceDocument, inventory_name: str
) -> None:
    where: FieldPath = ("units", unit_name)
    if unit_name == ALL_HOSTS:
        raise doc.error(where, "'all' is reserved (it selects every host)", hint="rename the unit")
    for kind, names in (("host", written.hosts), ("group", written.groups)):
        if unit_name in names:
            raise doc.error(
                where,
                f"unit {unit_name!r} has the same name as a {kind}",
                hint="a unit's name selects its hosts (--hosts); rename the unit or the " + kind,
            )
    if unit_name == inventory_name:
        raise doc.error(
            where, f"unit {unit_name!r} has the inventory's own name", hint="rename the unit"
        )


def _check_member(
    unit_name: str,
    member: str,
    where: FieldPath,
    written: InventoryFile,
    doc: SourceDocument,
    owner: dict[str, str],
) -> None:
    if member not in written.hosts:
        near = did_you_mean(member, tuple(written.hosts))
        todo = f"add host {member!r} to the inventory, or remove it from the unit"
        raise doc.error(
            where,
            f"unit {unit_name!r} lists host {member!r}, which the inventory does not have",
            hint=f"{near}; or {todo}" if near else todo,
        )
    previous = owner.get(member)
    if previous == unit_name:
        raise doc.error(
            where,
            f"unit {unit_name!r} lists host {member!r} twice",
            hint="each node of a server is listed once; remove the second one",
        )
    if previous is not None:
        raise doc.error(
            where,
            f"host {member!r} is in unit {previous!r} and in unit {unit_name!r}",
            hint="a host is a node of one server only: remove it from one of the units",
        )


def _rank_order(
    unit_name: str, table: UnitTable, where: FieldPath, doc: SourceDocument
) -> tuple[str, ...]:
    """The unit's hosts by node rank: the head first, the others in the order written."""
    if table.head is None:
        return tuple(table.hosts)
    if table.head not in table.hosts:
        raise doc.error(
            (*where, "head"),
            f"unit {unit_name!r} names head {table.head!r}, which is not one of its hosts "
            f"({', '.join(table.hosts)})",
            hint="the head is the node with --node-rank 0: name one of the unit's hosts, or "
            "leave head out (the first host is the head)",
        )
    return (table.head, *(h for h in table.hosts if h != table.head))


def check_unit_routers(
    hosts: Sequence[Host],
    written: InventoryFile,
    host_groups: Mapping[str, tuple[str, ...]],
    doc: SourceDocument,
) -> None:
    """Only a unit's head is a router worker: the other nodes serve no API (a dummy `/health`
    only), so a router that sent them requests, or a drain of one, would be wrong.

    Raises:
        SpecError: a node other than its unit's head has a router, at the level that set it
            (the host, else its most specific group that did, else `[defaults]`).
    """
    for host in hosts:
        unit = host.unit
        if unit is None or host.router is None or host.name == unit.head:
            continue
        raise doc.error(
            _router_written(host.name, written, host_groups[host.name]),
            f"host {host.name!r} is node rank {unit.rank_of(host.name)} of unit {unit.name!r} "
            f"and has a router ({host.router.url}): only a unit's head is a router worker (its "
            "other nodes serve no API)",
            hint=f"give the router to the head {unit.head!r} only: under [hosts.{unit.head}], "
            "or in a group that holds only units' heads and single-node hosts",
        )


def _router_written(host: str, written: InventoryFile, groups: tuple[str, ...]) -> FieldPath:
    """Where the host's router URL is written: the host, its most specific group, defaults."""
    if written.hosts[host].router.url is not None:
        return ("hosts", host, "router")
    for group in reversed(groups):  # outer to inner: the last is the most specific
        if written.groups[group].router.url is not None:
            return ("groups", group, "router")
    return ("defaults", "router")
