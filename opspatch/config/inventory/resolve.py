"""From an inventory file to resolved hosts: the one conversion of `InventoryFile` into the
model, shared by the TOML and the Ansible YAML loaders."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace

from opspatch.config.inventory.model import (
    ALL_HOSTS,
    EngineLayer,
    Group,
    Inventory,
    RouterLayer,
    SettingsLayer,
    merge_layers,
)
from opspatch.config.inventory.schema import (
    CommandTable,
    ContainerRestartTable,
    InventoryFile,
    LayerTable,
    SupervisorTable,
    SystemdTable,
)
from opspatch.config.inventory.units import build_units, check_unit_routers
from opspatch.core.fileschema import FieldPath, SourceDocument, did_you_mean
from opspatch.core.host import (
    DEFAULT_AGENT,
    DEFAULT_BECOME_USER,
    DEFAULT_ENGINE_URL,
    DEFAULT_STATE_DIR,
    DEFAULT_TRANSPORT,
    BecomeSettings,
    CommandRestart,
    ContainerRestart,
    ContainerSettings,
    EngineSettings,
    Host,
    JumpHost,
    RestartStrategy,
    RouterSettings,
    SupervisorRestart,
    SystemdRestart,
    Transport,
    canonical_url,
)

_ADDRESS_FORBIDDEN = re.compile(r"[\s@/\\\x00-\x1f\x7f]")
_JUMP_RE = re.compile(r"^(?:(?P<user>[^@\s]+)@)?(?P<host>\[[^\]]+\]|[^:@\s]+)(?::(?P<port>\d+))?$")


def _restart(
    table: SystemdTable | SupervisorTable | CommandTable | ContainerRestartTable | None,
) -> RestartStrategy | None:
    if isinstance(table, SystemdTable):
        return SystemdRestart(unit=table.unit)
    if isinstance(table, SupervisorTable):
        return SupervisorRestart(program=table.program, config=table.config)
    if isinstance(table, CommandTable):
        return CommandRestart(
            start=table.start,
            pid_file=table.pid_file,
            workdir=table.workdir,
            stop_timeout=table.stop_timeout,
        )
    if isinstance(table, ContainerRestartTable):
        return ContainerRestart(stop_timeout=table.stop_timeout, pid_file=table.pid_file)
    return None


def _controller_path(value: str | None, base_dir: str) -> str | None:
    """A controller-side file path: `~` kept for the transport to expand, relative paths made
    relative to the inventory file's folder (so an inventory works from any directory)."""
    if value is None or value.startswith("~") or posixpath.isabs(value) or not base_dir:
        return value
    return posixpath.normpath(posixpath.join(base_dir, value))


def layer_from_table(table: LayerTable, base_dir: str) -> SettingsLayer:
    """One written level (defaults, a group, a host) as a settings layer."""
    engine = table.engine
    return SettingsLayer(
        user=table.user,
        port=table.port,
        identity_file=_controller_path(table.identity_file, base_dir),
        known_hosts=_controller_path(table.known_hosts, base_dir),
        transport=table.transport,
        state_dir=table.state_dir,
        jump=table.jump,
        become=table.become,
        become_user=table.become_user,
        become_method=table.become_method,
        become_password_env=table.become_password_env,
        container=None
        if table.container is None
        else ContainerSettings(runtime=table.container.runtime, name=table.container.name),
        live=table.live,
        agent=table.agent,
        vars=dict(table.vars),
        engine=EngineLayer(
            python=engine.python,
            url=engine.url,
            log_file=engine.log_file,
            speculative=engine.speculative,
            env=dict(engine.env),
            restart=_restart(engine.restart),
        ),
        router=RouterLayer(
            url=table.router.url,
            worker_url=table.router.worker_url,
            admin_key_env=table.router.admin_key_env,
        ),
    )


def _check_address(address: str, where: FieldPath, doc: SourceDocument) -> None:
    if _ADDRESS_FORBIDDEN.search(address) or address.startswith("-"):
        raise doc.error(
            where,
            f"address {address!r} is not a host name or IP address",
            hint="write the user and port as separate keys (user = ..., port = ...)",
        )
    if address.count(":") == 1:
        raise doc.error(where, f"address {address!r} has a port in it", hint="use port = N")


def _parents(written: InventoryFile) -> dict[str, list[str]]:
    parents: dict[str, list[str]] = {name: [] for name in written.groups}
    for name, group in written.groups.items():
        for child in group.children:
            parents[child].append(name)
    return parents


def _group_depths(written: InventoryFile) -> dict[str, int]:
    """Depth of each group below its outermost parent (0 = no parent); parents first in merges.
    Groups are checked to form no cycle first."""
    parents = _parents(written)
    depths: dict[str, int] = {}
    for start in written.groups:
        # iterative depth-first: a long chain of groups must not exhaust the recursion limit
        stack = [start]
        while stack:
            name = stack[-1]
            if name in depths:
                stack.pop()
                continue
            pending = [p for p in parents[name] if p not in depths]
            if pending:
                stack.extend(pending)
                continue
            depths[name] = 1 + max((depths[p] for p in parents[name]), default=-1)
            stack.pop()
    return depths


def _check_groups(written: InventoryFile, doc: SourceDocument, inventory_name: str) -> None:
    for group_name, group in written.groups.items():
        where: FieldPath = ("groups", group_name)
        if group_name == ALL_HOSTS:
            raise doc.error(where, "'all' is reserved (it selects every host)")
        if group_name in written.hosts:
            raise doc.error(where, f"group {group_name!r} has the same name as a host")
        if group_name == inventory_name:
            raise doc.error(where, f"group {group_name!r} has the inventory's own name")
        for index, member in enumerate(group.hosts):
            if member not in written.hosts:
                raise doc.error(
                    (*where, "hosts", index),
                    f"group {group_name!r} lists unknown host {member!r}",
                    hint=did_you_mean(member, tuple(written.hosts)),
                )
        for index, child in enumerate(group.children):
            if child not in written.groups:
                raise doc.error(
                    (*where, "children", index),
                    f"group {group_name!r} lists unknown child group {child!r}",
                    hint=did_you_mean(child, tuple(written.groups)),
                )
    _check_cycles(written, doc)
    for host_name in written.hosts:
        if host_name == ALL_HOSTS:
            raise doc.error(("hosts", host_name), "'all' is reserved (it selects every host)")
        if host_name == inventory_name:
            raise doc.error(
                ("hosts", host_name), f"host {host_name!r} has the inventory's own name"
            )


def _check_cycles(written: InventoryFile, doc: SourceDocument) -> None:
    """Refuse groups that contain each other; the cycle is named in the order it is written."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for root in written.groups:
        if root in state:
            continue
        path: list[str] = [root]
        children = [iter(written.groups[root].children)]
        state[root] = 1
        while path:
            child = next(children[-1], None)
            if child is None:
                state[path.pop()] = 2
                children.pop()
                continue
            if state.get(child) == 1:
                cycle = [*path[path.index(child) :], child]
                raise doc.error(
                    ("groups", path[-1], "children"),
                    "groups contain each other: " + " -> ".join(cycle),
                    hint="a group cannot be its own child, directly or through others",
                )
            if child not in state:
                state[child] = 1
                path.append(child)
                children.append(iter(written.groups[child].children))


def _groups_of(host: str, written: InventoryFile, parents: Mapping[str, list[str]]) -> set[str]:
    found: set[str] = set()
    todo = [name for name, group in written.groups.items() if host in group.hosts]
    while todo:
        name = todo.pop()
        if name not in found:
            found.add(name)
            todo.extend(parents[name])
    return found


def _jump(
    spec: str,
    written: InventoryFile,
    merged: Mapping[str, SettingsLayer],
    where: FieldPath,
    doc: SourceDocument,
) -> JumpHost:
    if spec in written.hosts:
        target = merged[spec]
        address = written.hosts[spec].address
        if target.jump is not None:
            raise doc.error(
                where,
                f"jump host {spec!r} has a jump host itself",
                hint="chain jumps with ProxyJump in ~/.ssh/config",
            )
        if address is None:
            raise doc.error(where, f"jump host {spec!r} has no address")
        return JumpHost(address, target.port, target.user, target.identity_file, name=spec)
    match = _JUMP_RE.match(spec)
    if not match:
        raise doc.error(
            where,
            f"jump {spec!r} is neither a host of this inventory nor user@host:port",
            hint=did_you_mean(spec, tuple(written.hosts)),
        )
    port = int(match.group("port")) if match.group("port") else None
    if port is not None and not 1 <= port <= 65535:
        raise doc.error(where, f"jump port {port} is out of range")
    return JumpHost(match.group("host").strip("[]"), port, match.group("user"))


def build_inventory(written: InventoryFile, doc: SourceDocument, name: str) -> Inventory:
    """The resolved inventory `name` from its validated file (the one conversion to the model).

    Raises:
        SpecError: an unknown host or group reference, a group cycle, clashing names, an SSH
            host without an address, a bad address, a relative state_dir, a bad jump host, or
            a bad unit (`units.build_units`), a router on a unit's node other than its head.
    """
    _check_groups(written, doc, name)
    units = build_units(written, doc, name)
    unit_of = {host: unit for unit in units.values() for host in unit.hosts}
    base_dir = posixpath.dirname(doc.path)
    defaults = layer_from_table(written.defaults, base_dir)
    group_layers = {g: layer_from_table(t, base_dir) for g, t in written.groups.items()}
    depths = _group_depths(written)
    parents = _parents(written)
    merged: dict[str, SettingsLayer] = {}
    host_groups: dict[str, tuple[str, ...]] = {}
    for host_name, table in written.hosts.items():
        ordered = sorted(_groups_of(host_name, written, parents), key=lambda g: (depths[g], g))
        host_groups[host_name] = tuple(ordered)
        merged[host_name] = merge_layers(
            [defaults, *(group_layers[g] for g in ordered), layer_from_table(table, base_dir)]
        )
    hosts = _with_router_peers(
        [
            replace(
                _host(host_name, written, merged, host_groups[host_name], doc, name),
                unit=unit_of.get(host_name),
            )
            for host_name in written.hosts
        ]
    )
    check_unit_routers(hosts, written, host_groups, doc)
    order = {h: i for i, h in enumerate(written.hosts)}
    groups: dict[str, Group] = {}
    for group_name, group in written.groups.items():
        members = sorted(
            (h for h in written.hosts if group_name in host_groups[h]), key=lambda h: order[h]
        )
        groups[group_name] = Group(
            group_name, tuple(group.hosts), tuple(group.children), tuple(members)
        )
    return Inventory(name=name, source=doc.path, hosts=tuple(hosts), groups=groups, units=units)


def _host(
    host_name: str,
    written: InventoryFile,
    merged: Mapping[str, SettingsLayer],
    groups: tuple[str, ...],
    doc: SourceDocument,
    inventory: str,
) -> Host:
    where: FieldPath = ("hosts", host_name)
    settings = merged[host_name]
    transport: Transport = settings.transport or DEFAULT_TRANSPORT
    address = written.hosts[host_name].address
    if address is None:
        if transport == "ssh":
            raise doc.error(
                where,
                f"host {host_name!r} has no address",
                hint='add address = "..." (or transport = "local" for this machine)',
            )
        address = "localhost"
    _check_address(address, (*where, "address"), doc)
    state_dir = settings.state_dir or DEFAULT_STATE_DIR
    if not posixpath.isabs(state_dir):
        raise doc.error(
            (*where, "state_dir"), f"state_dir {state_dir!r} must be an absolute path on the host"
        )
    jump = _jump(settings.jump, written, merged, (*where, "jump"), doc) if settings.jump else None
    engine = settings.engine
    _check_container(host_name, settings, where, doc)
    engine_url = engine.url or DEFAULT_ENGINE_URL
    router = _router(settings.router, engine_url, (*where, "router"), doc)
    return Host(
        name=host_name,
        inventory=inventory,
        address=address,
        port=settings.port,
        user=settings.user,
        identity_file=settings.identity_file,
        known_hosts=settings.known_hosts,
        jump=jump,
        transport=transport,
        state_dir=state_dir,
        vars=dict(settings.vars),
        engine=EngineSettings(
            python=engine.python,
            url=engine_url,
            log_file=engine.log_file,
            speculative=bool(engine.speculative),
            env=dict(engine.env),
            restart=engine.restart,
        ),
        groups=groups,
        become=BecomeSettings(
            enabled=bool(settings.become),
            user=settings.become_user or DEFAULT_BECOME_USER,
            method=settings.become_method or "sudo",
            password_env=settings.become_password_env,
        ),
        container=settings.container,
        router=router,
        live=bool(settings.live),
        agent=settings.agent or DEFAULT_AGENT,
    )


def _router(
    layer: RouterLayer, engine_url: str, where: FieldPath, doc: SourceDocument
) -> RouterSettings | None:
    """The host's router, or None; a worker URL or key source without a router URL is refused
    (the host would silently be restarted without a drain)."""
    if layer.url is None:
        if layer.worker_url is not None or layer.admin_key_env is not None:
            raise doc.error(
                where,
                "the router has no url",
                hint='e.g. router = { url = "http://router:30000" } in the group or [defaults]',
            )
        return None
    return RouterSettings(
        url=canonical_url(layer.url),
        worker_url=canonical_url(layer.worker_url or engine_url),
        admin_key_env=layer.admin_key_env,
    )


def _with_router_peers(hosts: Sequence[Host]) -> list[Host]:
    """Each host's router with every worker URL this inventory puts behind it (`peers`)."""
    peers: dict[str, list[str]] = {}
    for host in hosts:
        if host.router is not None and host.router.worker_url not in peers.get(host.router.url, []):
            peers.setdefault(host.router.url, []).append(host.router.worker_url)
    return [
        replace(host, router=replace(host.router, peers=tuple(peers[host.router.url])))
        if host.router is not None
        else host
        for host in hosts
    ]


def _check_container(
    host_name: str, settings: SettingsLayer, where: FieldPath, doc: SourceDocument
) -> None:
    """A container restart needs a container; a container is reached without sudo (the runtime
    is run by the login user, who must be allowed to use it)."""
    if isinstance(settings.engine.restart, ContainerRestart) and settings.container is None:
        raise doc.error(
            where,
            f'host {host_name!r} restarts with kind = "container" but names no container',
            hint='add container = { runtime = "podman", name = "..." } (at the host, a group '
            "or [defaults])",
        )
    if settings.container is not None and settings.become:
        raise doc.error(
            where,
            f"host {host_name!r} has both a container and become = true, which opspatch does "
            "not combine (sudo would run inside the container, not the runtime)",
            hint="let the login user run the runtime (podman as root, or the docker group) and "
            "set become = false for this host",
        )
