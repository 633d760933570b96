"""Host selection: the `--hosts` grammar, within one inventory and over a workspace."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from opspatch.config.inventory.load import load_inventory
from opspatch.config.inventory.model import ALL_HOSTS, Inventory
from opspatch.core.fileschema import did_you_mean
from opspatch.core.host import Host
from opspatch.core.remedy import remedy_text
from opspatch.core.vocabulary import Command
from opspatch.errors import SelectionError, SpecError

if TYPE_CHECKING:  # the lookup imports this module to offer Workspace.hosts
    from opspatch.config.lookup import Workspace

_GLOB_CHARS = re.compile(r"[*?\[]")
SANDBOX_INVENTORIES = {
    "sandbox": remedy_text(Command.SANDBOX_UP),
    "sandbox-ssh": remedy_text(Command.SANDBOX_UP, ssh=True),
}
"""The inventories `opspatch sandbox up` writes, and the command that writes each."""


def _split_expression(expr: str) -> list[str]:
    items = [item.strip() for item in expr.split(",")]
    if not expr.strip() or any(not item for item in items):
        raise SelectionError(
            f"host selection {expr!r} has an empty item",
            hint="use names, groups or globs separated by commas, e.g. canary,gpu-0*",
        )
    return items


def _match_in_inventory(inventory: Inventory, item: str) -> tuple[Host, ...] | None:
    """The hosts `item` names in `inventory`, or None when it names nothing there."""
    if item in (ALL_HOSTS, inventory.name):
        return inventory.hosts
    by_name = {h.name: h for h in inventory.hosts}
    if item in by_name:
        return (by_name[item],)
    if item in inventory.groups:
        return tuple(by_name[m] for m in inventory.groups[item].members)
    if item in inventory.units:  # a unit's hosts in node-rank order, the head first
        return tuple(by_name[m] for m in inventory.units[item].hosts)
    if _GLOB_CHARS.search(item):
        chosen: set[str] = set()
        for host in inventory.hosts:
            if fnmatch.fnmatchcase(host.name, item):
                chosen.add(host.name)
        for group in inventory.groups.values():
            if fnmatch.fnmatchcase(group.name, item):
                chosen.update(group.members)
        for unit in inventory.units.values():
            if fnmatch.fnmatchcase(unit.name, item):
                chosen.update(unit.hosts)
        if chosen:
            return tuple(h for h in inventory.hosts if h.name in chosen)
    return None


def _unique(hosts: Iterable[Host]) -> tuple[Host, ...]:
    seen: dict[str, Host] = {}
    for host in hosts:
        previous = seen.get(host.name)
        if previous is not None and previous.inventory != host.inventory:
            raise SelectionError(
                f"host name {host.name!r} is in both inventory {previous.inventory!r} "
                f"and {host.inventory!r}",
                hint="select from one inventory, or rename one of the hosts",
            )
        seen.setdefault(host.name, host)
    return tuple(seen.values())


def select_hosts(inventory: Inventory, expr: str) -> tuple[Host, ...]:
    """The hosts an expression selects in one inventory, in expression then inventory order.

    `expr` is a comma list of: the inventory's name or `all` (every host), a host, a group
    (every host in it or below it), a unit (its hosts, the head first), or a glob (`fnmatch`,
    case-sensitive) over host, group and unit names. Duplicates are dropped.

    Raises:
        SelectionError: an item names nothing (near names suggested), or the list is malformed.
    """
    chosen: list[Host] = []
    for item in _split_expression(expr):
        hosts = _match_in_inventory(inventory, item)
        if hosts is None:
            names = (*inventory.host_names, *inventory.groups, *inventory.units, inventory.name)
            kinds = "host, group or unit" if inventory.units else "host or group"
            what = f"matches no {kinds}" if _GLOB_CHARS.search(item) else f"is not a {kinds}"
            raise SelectionError(
                f"{item!r} {what} of inventory {inventory.name!r}",
                hint=did_you_mean(item, names),
            )
        if not hosts:
            raise _selects_no_host(item, inventory)
        chosen.extend(hosts)
    return _unique(chosen)


def _selects_no_host(item: str, inventory: Inventory) -> SelectionError:
    """`item` names `inventory` (or `all` of it) or one of its groups, and there is no host in
    it: a run over it would do nothing and report success, so it is refused as any bad
    selection is (exit 2), before a ledger or a host is touched."""
    if item in inventory.groups:
        return SelectionError(
            f"{item!r} selects no host: the group has no host in inventory {inventory.name!r} "
            f"({inventory.source})",
            hint="add hosts to the group, or select others "
            f"(`{remedy_text(Command.INVENTORY_SHOW, inventory.name)}` lists its hosts and "
            "groups)",
        )
    return SelectionError(
        f"{item!r} selects no host: inventory {inventory.name!r} ({inventory.source}) lists no "
        "host",
        hint="add a host to it (docs/inventory.md), or select another inventory",
    )


def _sandbox_hint(name: str) -> str | None:
    command = SANDBOX_INVENTORIES.get(name)
    if command is None:
        return None
    return f"no sandbox is set up: `{command}` creates one, with its {name!r} inventory"


def _found_nowhere(
    item: str, names: Iterable[str], workspace: Workspace, load: Callable[[Path], Inventory]
) -> SelectionError:
    """`item` names nothing: where it was looked for, and what to name instead."""
    looked = ", ".join(str(d) for d in workspace.search_dirs("inventories"))
    return SelectionError(
        f"{item!r} is not an inventory, host or group on the search path (looked in {looked})",
        hint=_sandbox_hint(item)
        or did_you_mean(item, tuple(names))
        or _in_a_bundled_example(item, workspace, load)
        or _known_inventories(workspace),
    )


def _in_a_bundled_example(
    item: str, workspace: Workspace, load: Callable[[Path], Inventory]
) -> str | None:
    """How to name `item` when it is a host or group of a bundled example inventory, which a
    bare name does not search (an example's `gpu-01` is not one of the operator's hosts)."""
    own = workspace.available("inventories", bundled=False)
    for name, path in workspace.available("inventories").items():
        if name in own:
            continue
        try:
            found = _match_in_inventory(load(path), item)
        except SpecError:
            continue
        if found:
            return (
                f"{item!r} is in the bundled example inventory {name!r}, which a bare name does "
                f"not search: name it {name}:{item}"
            )
    return None


def _known_inventories(workspace: Workspace) -> str:
    """What to name when nothing is near: the inventories there are."""
    known = ", ".join(sorted(workspace.available("inventories"))) or "none"
    return (
        f"known inventories: {known} (`opspatch inventory show INVENTORY` lists its hosts and "
        "groups)"
    )


def resolve_hosts(expr: str, workspace: Workspace) -> tuple[Host, ...]:
    """Resolve a `--hosts` expression over a workspace's inventories (module docstring).

    Raises:
        SelectionError: unknown inventory, host or group (near names suggested), or ambiguous.
        SpecError: an inventory that had to be read is malformed.
    """
    loaded: dict[Path, Inventory] = {}

    def load(path: Path) -> Inventory:
        if path not in loaded:
            loaded[path] = load_inventory(path)
        return loaded[path]

    def named(name: str) -> Inventory:
        path = workspace.locate("inventories", name)
        if path is not None:
            return load(path)
        if workspace.is_path("inventories", name):
            raise SelectionError(f"{name}: no such inventory file")
        known = workspace.available("inventories")
        searched = ", ".join(str(d) for d in workspace.search_dirs("inventories"))
        raise SelectionError(
            f"no inventory named {name!r} (searched {searched})",
            hint=_sandbox_hint(name) or did_you_mean(name, tuple(known)),
        )

    chosen: list[Host] = []
    for item in _split_expression(expr):
        if ":" in item:
            inventory_name, pattern = item.split(":", 1)
            chosen.extend(select_hosts(named(inventory_name), pattern or ALL_HOSTS))
            continue
        whole = workspace.locate("inventories", item)
        if whole is not None:
            inventory = load(whole)
            if not inventory.hosts:
                raise _selects_no_host(item, inventory)
            chosen.extend(inventory.hosts)
            continue
        matches: list[tuple[Inventory, tuple[Host, ...]]] = []
        empty: list[Inventory] = []  # where the item names a group with no host in it
        unreadable: list[SpecError] = []  # malformed: searched by no command until fixed
        for path in workspace.available("inventories", bundled=False).values():
            try:
                candidate = load(path)
            except SpecError as exc:
                unreadable.append(exc)
                continue
            hosts = _match_in_inventory(candidate, item)
            if hosts:
                matches.append((candidate, hosts))
            elif hosts is not None:
                empty.append(candidate)
        if len(matches) > 1:
            where = ", ".join(repr(inv.name) for inv, _ in matches)
            raise SelectionError(
                f"{item!r} matches in several inventories ({where})",
                hint=f"say which: {matches[0][0].name}:{item}",
            )
        if not matches and empty:
            raise _selects_no_host(item, empty[0])
        if not matches:
            names: list[str] = list(workspace.available("inventories"))
            for inv in loaded.values():
                names.extend((*inv.host_names, *inv.groups, *inv.units))
            if unreadable:  # the name may be in one of them: say which, and why
                raise SelectionError(
                    f"{item!r} is not an inventory, host, group or unit of any inventory that "
                    f"could be read; not searched: {'; '.join(str(e) for e in unreadable)}",
                    hint=unreadable[0].hint or "fix that inventory, or name the one to search",
                )
            raise _found_nowhere(item, names, workspace, load)
        chosen.extend(matches[0][1])
    return _unique(chosen)
