"""Inventories: which hosts exist, how to reach them, and how their engine is run.

An inventory is a file in a workspace's `inventories/` folder (`<name>.toml`, or an Ansible YAML
inventory `<name>.yml` / `<name>.yaml`). It names hosts, groups of hosts (groups may contain
groups), variables at fleet, group and host level, and per-host engine settings: the engine's own
Python interpreter, how to restart it, the server URL and log file as seen on the host. The format
is documented in `docs/inventory.md`.

Everything here is pure apart from reading the inventory files themselves: parsing returns frozen
values (`Inventory`, `Host`), host selection (`--hosts`) is a function of an inventory and an
expression, and the rendering of `opspatch inventory show` is a pure function too, so the CLI
stays thin.

Settings are merged in one order, by one function (`merge_layers`):

    defaults  <  groups (outermost parent first, then inner; ties by group name)  <  host

Scalars: the last layer that sets a key wins. `vars` and `engine.env` are merged key by key.
`engine.restart` is one unit: a layer that sets it replaces it whole (mixing a systemd unit from
one layer with a supervisor program from another would describe no real host).

Errors: malformed files, unknown keys and bad values raise `SpecError` naming the file, the line
and the field; selection problems raise `SelectionError` with the nearest names.
"""

from __future__ import annotations

import datetime
import difflib
import fnmatch
import posixpath
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from opspatch.config.lookup import Workspace, bundled_dir
from opspatch.core.host import (
    DEFAULT_ENGINE_URL,
    DEFAULT_STATE_DIR,
    DEFAULT_TRANSPORT,
    CommandRestart,
    EngineSettings,
    Host,
    JumpHost,
    RestartStrategy,
    SupervisorRestart,
    SystemdRestart,
    Transport,
)
from opspatch.core.tomlsource import FieldPath, format_field_path, parse_toml
from opspatch.errors import Location, SelectionError, SpecError

INVENTORY_SUFFIXES = (".toml", ".yml", ".yaml")
ALL_HOSTS = "all"
"""The reserved selection word for every host of an inventory (as in Ansible)."""


@dataclass(frozen=True)
class Group:
    """A named set of hosts. `hosts` and `children` are as written; `members` is every host in
    the group or in a group below it, in inventory order."""

    name: str
    hosts: tuple[str, ...]
    children: tuple[str, ...]
    members: tuple[str, ...]


@dataclass(frozen=True)
class Inventory:
    """A parsed inventory: its hosts in file order and its groups by name."""

    name: str
    source: str
    hosts: tuple[Host, ...]
    groups: Mapping[str, Group]

    @property
    def host_names(self) -> tuple[str, ...]:
        return tuple(h.name for h in self.hosts)

    def host(self, name: str) -> Host:
        """The host called `name`.

        Raises:
            SelectionError: there is no such host (near names suggested).
        """
        for candidate in self.hosts:
            if candidate.name == name:
                return candidate
        raise SelectionError(
            f"inventory {self.name!r} has no host {name!r}",
            hint=_did_you_mean(name, self.host_names),
        )


# ---------------------------------------------------------------------------------------------
# Layers and the one merge function


@dataclass(frozen=True)
class EngineLayer:
    """Engine settings one level (defaults, a group, a host) writes; `None` = not set here."""

    python: str | None = None
    url: str | None = None
    log_file: str | None = None
    speculative: bool | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    restart: RestartStrategy | None = None


@dataclass(frozen=True)
class SettingsLayer:
    """The settings one level (defaults, a group, a host) writes; `None` = not set here."""

    user: str | None = None
    port: int | None = None
    identity_file: str | None = None
    known_hosts: str | None = None
    transport: Transport | None = None
    state_dir: str | None = None
    jump: str | None = None
    vars: Mapping[str, Any] = field(default_factory=dict)
    engine: EngineLayer = field(default_factory=EngineLayer)


_SCALAR_SETTINGS = (
    "user",
    "port",
    "identity_file",
    "known_hosts",
    "transport",
    "state_dir",
    "jump",
)
_SCALAR_ENGINE = ("python", "url", "log_file", "speculative", "restart")


def merge_layers(layers: Iterable[SettingsLayer]) -> SettingsLayer:
    """Merge settings layers, lowest priority first, into one layer (inputs are not changed).

    This is the one place the merge order is applied: pass `[defaults, *groups_outer_to_inner,
    host]`. A scalar set by a later layer wins; `vars` and `engine.env` are merged key by key;
    `engine.restart` is replaced whole.
    """
    scalars: dict[str, Any] = {}
    engine_scalars: dict[str, Any] = {}
    merged_vars: dict[str, Any] = {}
    merged_env: dict[str, str] = {}
    for layer in layers:
        for name in _SCALAR_SETTINGS:
            value = getattr(layer, name)
            if value is not None:
                scalars[name] = value
        for name in _SCALAR_ENGINE:
            value = getattr(layer.engine, name)
            if value is not None:
                engine_scalars[name] = value
        merged_vars.update(layer.vars)
        merged_env.update(layer.engine.env)
    return SettingsLayer(
        **scalars,
        vars=merged_vars,
        engine=EngineLayer(**engine_scalars, env=merged_env),
    )


# ---------------------------------------------------------------------------------------------
# The schema of one layer as written in a file (pydantic, strict: TOML and YAML give real types)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class _SystemdModel(_Strict):
    kind: Literal["systemd"]
    unit: Annotated[str, Field(min_length=1)]


class _SupervisorModel(_Strict):
    kind: Literal["supervisor"]
    program: Annotated[str, Field(min_length=1)]
    config: Annotated[str, Field(min_length=1)] | None = None


class _CommandModel(_Strict):
    kind: Literal["command"]
    start: Annotated[str, Field(min_length=1)]
    pid_file: Annotated[str, Field(min_length=1)]
    workdir: str | None = None
    stop_timeout: Annotated[float, Field(gt=0)] = 30.0


_RestartModel = Annotated[
    _SystemdModel | _SupervisorModel | _CommandModel, Field(discriminator="kind")
]


class _EngineModel(_Strict):
    python: Annotated[str, Field(min_length=1)] | None = None
    url: Annotated[str, Field(pattern=r"^https?://[^\s/]+")] | None = None
    log_file: Annotated[str, Field(min_length=1)] | None = None
    speculative: bool | None = None
    env: dict[str, str] = Field(default_factory=dict)
    restart: _RestartModel | None = None


class _LayerModel(_Strict):
    user: Annotated[str, Field(min_length=1)] | None = None
    port: Annotated[int, Field(ge=1, le=65535)] | None = None
    identity_file: Annotated[str, Field(min_length=1)] | None = None
    known_hosts: Annotated[str, Field(min_length=1)] | None = None
    transport: Literal["ssh", "local"] | None = None
    state_dir: Annotated[str, Field(min_length=1)] | None = None
    jump: Annotated[str, Field(min_length=1)] | None = None
    vars: dict[str, Any] = Field(default_factory=dict)
    engine: _EngineModel = Field(default_factory=_EngineModel)


class _HostModel(_LayerModel):
    address: Annotated[str, Field(min_length=1)] | None = None


class _GroupModel(_LayerModel):
    hosts: list[str] = Field(default_factory=list)
    children: list[str] = Field(default_factory=list)


class _InventoryModel(_Strict):
    description: str | None = None
    defaults: _LayerModel = Field(default_factory=_LayerModel)
    hosts: dict[str, _HostModel] = Field(default_factory=dict)
    groups: dict[str, _GroupModel] = Field(default_factory=dict)


def _known_keys() -> tuple[str, ...]:
    keys: set[str] = set()
    for model in (
        _InventoryModel,
        _HostModel,
        _GroupModel,
        _EngineModel,
        _SystemdModel,
        _SupervisorModel,
        _CommandModel,
    ):
        keys.update(model.model_fields)
    return tuple(sorted(keys))


_RESTART_KINDS = ("systemd", "supervisor", "command")


def _error_path(loc: Sequence[str | int]) -> FieldPath:
    """Pydantic's error location without the union tag it inserts after `restart`."""
    out: list[str | int] = []
    for i, part in enumerate(loc):
        if i > 0 and loc[i - 1] == "restart" and part in _RESTART_KINDS:
            continue
        out.append(part)
    return tuple(out)


def _problem_text(error: Mapping[str, Any]) -> tuple[str, str | None]:
    """A short problem statement and an optional hint for one pydantic error."""
    kind = error.get("type", "")
    loc = error.get("loc", ())
    if kind == "extra_forbidden" and loc:
        key = str(loc[-1])
        return f"unknown key {key!r}", _did_you_mean(key, _known_keys())
    if kind == "union_tag_invalid" or kind == "union_tag_not_found":
        return (
            'restart needs kind = "systemd", "supervisor" or "command"',
            'e.g. restart = { kind = "systemd", unit = "sglang.service" }',
        )
    if kind == "missing" and loc:
        return f"missing required key {str(loc[-1])!r}", None
    return str(error.get("msg", "invalid value")), None


class _Document(Protocol):
    """A parsed inventory file that can point at a field: TOML (tomlsource) or YAML (below)."""

    @property
    def path(self) -> str: ...

    def error(
        self, field_path: Sequence[str | int], problem: str, *, hint: str | None = None
    ) -> SpecError: ...


def _validation_to_spec_error(
    exc: ValidationError, doc: _Document, translate: Callable[[FieldPath], FieldPath]
) -> SpecError:
    errors = exc.errors()
    first = errors[0]
    problem, hint = _problem_text(first)
    if len(errors) > 1:
        problem += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    return doc.error(translate(_error_path(first["loc"])), problem, hint=hint)


# ---------------------------------------------------------------------------------------------
# A file-independent intermediate form (TOML and YAML both become this, then one builder runs)


@dataclass(frozen=True)
class _RawHost:
    layer: SettingsLayer
    address: str | None
    where: FieldPath  # where the host is written, for errors


@dataclass(frozen=True)
class _RawGroup:
    layer: SettingsLayer
    hosts: tuple[str, ...]
    children: tuple[str, ...]
    where: FieldPath


@dataclass(frozen=True)
class _RawInventory:
    defaults: SettingsLayer
    hosts: dict[str, _RawHost]
    groups: dict[str, _RawGroup]


def _restart_from_model(model: BaseModel | None) -> RestartStrategy | None:
    if isinstance(model, _SystemdModel):
        return SystemdRestart(unit=model.unit)
    if isinstance(model, _SupervisorModel):
        return SupervisorRestart(program=model.program, config=model.config)
    if isinstance(model, _CommandModel):
        return CommandRestart(
            start=model.start,
            pid_file=model.pid_file,
            workdir=model.workdir,
            stop_timeout=model.stop_timeout,
        )
    return None


def _controller_path(value: str | None, base_dir: str) -> str | None:
    """A controller-side file path: `~` kept for the transport to expand, relative paths made
    relative to the inventory file's folder (so an inventory works from any directory)."""
    if value is None or value.startswith("~") or posixpath.isabs(value) or not base_dir:
        return value
    return posixpath.normpath(posixpath.join(base_dir, value))


def _layer_from_model(model: _LayerModel, base_dir: str) -> SettingsLayer:
    engine = model.engine
    return SettingsLayer(
        user=model.user,
        port=model.port,
        identity_file=_controller_path(model.identity_file, base_dir),
        known_hosts=_controller_path(model.known_hosts, base_dir),
        transport=model.transport,
        state_dir=model.state_dir,
        jump=model.jump,
        vars=dict(model.vars),
        engine=EngineLayer(
            python=engine.python,
            url=engine.url,
            log_file=engine.log_file,
            speculative=engine.speculative,
            env=dict(engine.env),
            restart=_restart_from_model(engine.restart),
        ),
    )


# ---------------------------------------------------------------------------------------------
# TOML


def _raw_from_toml(text: str, path: str) -> tuple[_RawInventory, _Document]:
    doc = parse_toml(text, path)
    try:
        model = _InventoryModel.model_validate(doc.data)
    except ValidationError as exc:
        raise _validation_to_spec_error(exc, doc, lambda p: p) from None
    base_dir = posixpath.dirname(path)
    hosts = {
        name: _RawHost(_layer_from_model(h, base_dir), h.address, ("hosts", name))
        for name, h in model.hosts.items()
    }
    groups = {
        name: _RawGroup(
            _layer_from_model(g, base_dir), tuple(g.hosts), tuple(g.children), ("groups", name)
        )
        for name, g in model.groups.items()
    }
    return _RawInventory(_layer_from_model(model.defaults, base_dir), hosts, groups), doc


# ---------------------------------------------------------------------------------------------
# Ansible YAML


@dataclass(frozen=True)
class _YamlDocument:
    """A YAML file with a key-path-to-line map, so errors can name file:line like TOML ones."""

    path: str
    data: Any
    lines: Mapping[FieldPath, int]

    def line_of(self, field_path: Sequence[str | int]) -> int:
        path = tuple(field_path)
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return 0

    def error(
        self, field_path: Sequence[str | int], problem: str, *, hint: str | None = None
    ) -> SpecError:
        location = Location(self.path, self.line_of(field_path), format_field_path(field_path))
        return SpecError(location, problem, hint=hint)


def _yaml_lines(node: yaml.Node, prefix: FieldPath, out: dict[FieldPath, int]) -> None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = str(key_node.value)
            out.setdefault(prefix + (key,), key_node.start_mark.line + 1)
            _yaml_lines(value_node, prefix + (key,), out)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            out.setdefault(prefix + (index,), item.start_mark.line + 1)
            _yaml_lines(item, prefix + (index,), out)


def _parse_yaml(text: str, path: str) -> _YamlDocument:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 0
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError(
            Location(path, line), f"malformed YAML: {problem}", hint="fix the syntax at that line"
        ) from None
    lines: dict[FieldPath, int] = {}
    if node is not None:
        _yaml_lines(node, (), lines)
    return _YamlDocument(path=path, data=data, lines=lines)


# Ansible variable -> (opspatch layer key path). Aliases Ansible itself accepts are included.
_ANSIBLE_KEYS: dict[str, tuple[str, ...]] = {
    "ansible_host": ("address",),
    "ansible_ssh_host": ("address",),
    "ansible_port": ("port",),
    "ansible_ssh_port": ("port",),
    "ansible_user": ("user",),
    "ansible_ssh_user": ("user",),
    "ansible_ssh_private_key_file": ("identity_file",),
    "ansible_private_key_file": ("identity_file",),
    "ansible_connection": ("transport",),
}
_OPSPATCH_KEYS: dict[str, tuple[str, ...]] = {
    "opspatch_transport": ("transport",),
    "opspatch_known_hosts": ("known_hosts",),
    "opspatch_jump": ("jump",),
    "opspatch_state_dir": ("state_dir",),
    "opspatch_engine_python": ("engine", "python"),
    "opspatch_engine_url": ("engine", "url"),
    "opspatch_engine_log_file": ("engine", "log_file"),
    "opspatch_engine_speculative": ("engine", "speculative"),
    "opspatch_engine_env": ("engine", "env"),
    "opspatch_engine_restart": ("engine", "restart"),
}
_ANSIBLE_CONNECTIONS = {"ssh": "ssh", "paramiko": "ssh", "smart": "ssh", "local": "local"}
_RESERVED_YAML_GROUP_KEYS = ("hosts", "vars", "children")


def _layer_from_ansible_vars(
    variables: Mapping[str, Any],
    where: FieldPath,
    doc: _YamlDocument,
    *,
    allow_address: bool,
) -> tuple[SettingsLayer, str | None]:
    """Turn one Ansible vars mapping into a settings layer (and an address for hosts)."""
    raw: dict[str, Any] = {"vars": {}}
    origin: dict[tuple[str, ...], str] = {}
    for key, value in variables.items():
        key = str(key)
        target = _ANSIBLE_KEYS.get(key) or _OPSPATCH_KEYS.get(key)
        if target is None:
            if key.startswith("opspatch_"):
                raise doc.error(
                    where + (key,),
                    f"unknown opspatch variable {key!r}",
                    hint=_did_you_mean(key, tuple(_OPSPATCH_KEYS)),
                )
            raw["vars"][key] = value
            continue
        if target == ("address",) and not allow_address:
            raise doc.error(where + (key,), f"{key} can only be set on a host")
        if target == ("transport",) and key == "ansible_connection":
            if value not in _ANSIBLE_CONNECTIONS:
                raise doc.error(
                    where + (key,),
                    f"ansible_connection {value!r} is not supported",
                    hint="use ssh or local",
                )
            value = _ANSIBLE_CONNECTIONS[value]
        if target == ("port",) and isinstance(value, str) and value.isdigit():
            value = int(value)  # Ansible writes ports as strings as often as numbers
        if len(target) == 2:
            raw.setdefault("engine", {})[target[1]] = value
        else:
            raw[target[0]] = value
        origin[target] = key
    address = raw.pop("address", None)
    if address is not None and not isinstance(address, str):
        raise doc.error(where + (origin[("address",)],), "the address must be a string")

    def translate(path: FieldPath) -> FieldPath:
        for size in (2, 1):
            head = tuple(str(p) for p in path[:size])
            if head in origin:
                return where + (origin[head],) + path[size:]
        if path[:1] == ("vars",):
            return where + path[1:]
        return where + path

    try:
        model = _LayerModel.model_validate(raw)
    except ValidationError as exc:
        raise _validation_to_spec_error(exc, doc, translate) from None
    return _layer_from_model(model, posixpath.dirname(doc.path)), address


def _mapping_or_empty(
    value: Any, where: FieldPath, doc: _YamlDocument, what: str
) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise doc.error(where, f"{what} must be a mapping, not {type(value).__name__}")
    return value


def _raw_from_yaml(text: str, path: str) -> tuple[_RawInventory, _Document]:
    doc = _parse_yaml(text, path)
    top = _mapping_or_empty(doc.data, (), doc, "an Ansible inventory")
    host_layers: dict[str, list[SettingsLayer]] = {}
    host_addresses: dict[str, str | None] = {}
    host_where: dict[str, FieldPath] = {}
    groups: dict[str, dict[str, Any]] = {}
    defaults = SettingsLayer()

    def walk_group(name: str, body: Any, where: FieldPath) -> None:
        nonlocal defaults
        body = _mapping_or_empty(body, where, doc, f"group {name!r}")
        for key in body:
            if key not in _RESERVED_YAML_GROUP_KEYS:
                raise doc.error(
                    where + (key,),
                    f"unknown key {key!r} in group {name!r}",
                    hint="a group has hosts, vars and children",
                )
        variables = _mapping_or_empty(body.get("vars"), where + ("vars",), doc, "vars")
        layer, _ = _layer_from_ansible_vars(variables, where + ("vars",), doc, allow_address=False)
        hosts = _mapping_or_empty(body.get("hosts"), where + ("hosts",), doc, "hosts")
        children = _mapping_or_empty(body.get("children"), where + ("children",), doc, "children")
        if name == ALL_HOSTS:
            defaults = merge_layers([defaults, layer])
        else:
            entry = groups.setdefault(
                name, {"layers": [], "hosts": [], "children": [], "where": where}
            )
            entry["layers"].append(layer)
        for host_name, host_vars in hosts.items():
            host_name = str(host_name)
            here = where + ("hosts", host_name)
            host_vars = _mapping_or_empty(host_vars, here, doc, f"host {host_name!r}")
            host_layer, address = _layer_from_ansible_vars(host_vars, here, doc, allow_address=True)
            host_layers.setdefault(host_name, []).append(host_layer)
            host_where.setdefault(host_name, here)
            if address is not None or host_name not in host_addresses:
                # Ansible's rule: without ansible_host the inventory name is the address.
                host_addresses[host_name] = address or host_addresses.get(host_name) or host_name
            if name != ALL_HOSTS and host_name not in groups[name]["hosts"]:
                groups[name]["hosts"].append(host_name)
        for child_name, child_body in children.items():
            child_name = str(child_name)
            if child_name == ALL_HOSTS:
                raise doc.error(where + ("children", child_name), "'all' cannot be a child group")
            if name != ALL_HOSTS and child_name not in groups[name]["children"]:
                groups[name]["children"].append(child_name)
            walk_group(child_name, child_body, where + ("children", child_name))

    for group_name, body in top.items():
        walk_group(str(group_name), body, (str(group_name),))

    raw_hosts = {
        name: _RawHost(merge_layers(layers), host_addresses.get(name), host_where[name])
        for name, layers in host_layers.items()
    }
    raw_groups = {
        name: _RawGroup(
            merge_layers(entry["layers"]),
            tuple(entry["hosts"]),
            tuple(entry["children"]),
            entry["where"],
        )
        for name, entry in groups.items()
    }
    return _RawInventory(defaults, raw_hosts, raw_groups), doc


# ---------------------------------------------------------------------------------------------
# Building the resolved inventory (shared by both formats)

_ADDRESS_FORBIDDEN = re.compile(r"[\s@/\\\x00-\x1f\x7f]")
_JUMP_RE = re.compile(r"^(?:(?P<user>[^@\s]+)@)?(?P<host>\[[^\]]+\]|[^:@\s]+)(?::(?P<port>\d+))?$")


def _check_address(address: str, where: FieldPath, doc: _Document) -> None:
    if _ADDRESS_FORBIDDEN.search(address) or address.startswith("-"):
        raise doc.error(
            where,
            f"address {address!r} is not a host name or IP address",
            hint="write the user and port as separate keys (user = ..., port = ...)",
        )
    if address.count(":") == 1:
        raise doc.error(where, f"address {address!r} has a port in it", hint="use port = N")


def _group_depths(groups: Mapping[str, _RawGroup]) -> dict[str, int]:
    """Depth of each group below its outermost parent (0 = no parent); parents first in merges."""
    parents: dict[str, list[str]] = {name: [] for name in groups}
    for name, group in groups.items():
        for child in group.children:
            parents[child].append(name)
    depths: dict[str, int] = {}

    def depth(name: str) -> int:
        if name not in depths:
            depths[name] = 1 + max((depth(p) for p in parents[name]), default=-1)
        return depths[name]

    for name in groups:
        depth(name)
    return depths


def _check_groups(raw: _RawInventory, doc: _Document, inventory_name: str) -> None:
    names = set(raw.hosts)
    for group_name, group in raw.groups.items():
        if group_name == ALL_HOSTS:
            raise doc.error(group.where, "'all' is reserved (it selects every host)")
        if group_name in names:
            raise doc.error(group.where, f"group {group_name!r} has the same name as a host")
        if group_name == inventory_name:
            raise doc.error(group.where, f"group {group_name!r} has the inventory's own name")
        for index, member in enumerate(group.hosts):
            if member not in raw.hosts:
                raise doc.error(
                    group.where + ("hosts", index),
                    f"group {group_name!r} lists unknown host {member!r}",
                    hint=_did_you_mean(member, tuple(raw.hosts)),
                )
        for index, child in enumerate(group.children):
            if child not in raw.groups:
                raise doc.error(
                    group.where + ("children", index),
                    f"group {group_name!r} lists unknown child group {child!r}",
                    hint=_did_you_mean(child, tuple(raw.groups)),
                )
    # Cycles: depth-first search; the cycle is reported in the order it is written.
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(name: str) -> None:
        state[name] = 1
        stack.append(name)
        for child in raw.groups[name].children:
            if state.get(child) == 1:
                cycle = [*stack[stack.index(child) :], child]
                raise doc.error(
                    raw.groups[name].where + ("children",),
                    "groups contain each other: " + " -> ".join(cycle),
                    hint="a group cannot be its own child, directly or through others",
                )
            if child not in state:
                visit(child)
        stack.pop()
        state[name] = 2

    for name in raw.groups:
        if name not in state:
            visit(name)
    for host_name, host in raw.hosts.items():
        if host_name == ALL_HOSTS:
            raise doc.error(host.where, "'all' is reserved (it selects every host)")
        if host_name == inventory_name:
            raise doc.error(host.where, f"host {host_name!r} has the inventory's own name")


def _groups_of(host: str, raw: _RawInventory) -> set[str]:
    direct = {name for name, group in raw.groups.items() if host in group.hosts}
    parents: dict[str, set[str]] = {name: set() for name in raw.groups}
    for name, group in raw.groups.items():
        for child in group.children:
            parents[child].add(name)
    found: set[str] = set()
    todo = list(direct)
    while todo:
        name = todo.pop()
        if name not in found:
            found.add(name)
            todo.extend(parents[name])
    return found


def _parse_jump(
    spec: str,
    raw: _RawInventory,
    merged: Mapping[str, SettingsLayer],
    where: FieldPath,
    doc: _Document,
) -> JumpHost:
    if spec in raw.hosts:
        target = merged[spec]
        address = raw.hosts[spec].address
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
            hint=_did_you_mean(spec, tuple(raw.hosts)),
        )
    port = int(match.group("port")) if match.group("port") else None
    if port is not None and not 1 <= port <= 65535:
        raise doc.error(where, f"jump port {port} is out of range")
    return JumpHost(match.group("host").strip("[]"), port, match.group("user"))


def _build_inventory(raw: _RawInventory, doc: _Document, name: str) -> Inventory:
    _check_groups(raw, doc, name)
    depths = _group_depths(raw.groups)
    merged: dict[str, SettingsLayer] = {}
    host_groups: dict[str, tuple[str, ...]] = {}
    for host_name, host in raw.hosts.items():
        ordered = sorted(_groups_of(host_name, raw), key=lambda g: (depths[g], g))
        host_groups[host_name] = tuple(ordered)
        merged[host_name] = merge_layers(
            [raw.defaults, *(raw.groups[g].layer for g in ordered), host.layer]
        )
    hosts: list[Host] = []
    for host_name, host in raw.hosts.items():
        settings = merged[host_name]
        transport: Transport = settings.transport or DEFAULT_TRANSPORT
        address = host.address
        if address is None:
            if transport == "ssh":
                raise doc.error(
                    host.where,
                    f"host {host_name!r} has no address",
                    hint='add address = "..." (or transport = "local" for this machine)',
                )
            address = "localhost"
        _check_address(address, host.where + ("address",), doc)
        state_dir = settings.state_dir or DEFAULT_STATE_DIR
        if not posixpath.isabs(state_dir):
            raise doc.error(
                host.where + ("state_dir",),
                f"state_dir {state_dir!r} must be an absolute path on the host",
            )
        jump = (
            _parse_jump(settings.jump, raw, merged, host.where + ("jump",), doc)
            if settings.jump
            else None
        )
        engine = settings.engine
        hosts.append(
            Host(
                name=host_name,
                inventory=name,
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
                    url=engine.url or DEFAULT_ENGINE_URL,
                    log_file=engine.log_file,
                    speculative=bool(engine.speculative),
                    env=dict(engine.env),
                    restart=engine.restart,
                ),
                groups=host_groups[host_name],
            )
        )
    order = {h: i for i, h in enumerate(raw.hosts)}
    groups: dict[str, Group] = {}
    for group_name, group in raw.groups.items():
        members = sorted(
            (h for h in raw.hosts if group_name in host_groups[h]), key=lambda h: order[h]
        )
        groups[group_name] = Group(group_name, group.hosts, group.children, tuple(members))
    return Inventory(name=name, source=doc.path, hosts=tuple(hosts), groups=groups)


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
        raw, doc = _raw_from_toml(text, path)
    elif suffix in (".yml", ".yaml"):
        raw, doc = _raw_from_yaml(text, path)
    else:
        raise SpecError(
            Location(path),
            f"unknown inventory format {suffix or '(no suffix)'!r}",
            hint="use .toml, or .yml/.yaml for Ansible inventories",
        )
    return _build_inventory(raw, doc, inventory_name)


def load_inventory(path: Path, *, name: str | None = None) -> Inventory:
    """Read and parse an inventory file.

    Raises:
        SpecError: the file cannot be read, is not UTF-8, or is not a valid inventory.
    """
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise SpecError(Location(str(path)), "inventory file not found") from None
    except UnicodeDecodeError as exc:
        raise SpecError(Location(str(path)), f"not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise SpecError(Location(str(path)), f"cannot read: {exc.strerror}") from None
    return parse_inventory(text, str(path), name=name)


# ---------------------------------------------------------------------------------------------
# Finding inventories by name


def list_inventories(search_path: Sequence[Path]) -> dict[str, Path]:
    """Every inventory on the search path by name; an earlier folder shadows a later one.

    Within one folder `.toml` wins over `.yml` over `.yaml` for the same name.
    """
    found: dict[str, Path] = {}
    for folder in search_path:
        if not folder.is_dir():
            continue
        for suffix in INVENTORY_SUFFIXES:
            for path in sorted(folder.glob(f"*{suffix}")):
                if path.is_file():
                    found.setdefault(path.stem, path)
    return found


def find_inventory(name: str, search_path: Sequence[Path]) -> Path:
    """The file of inventory `name` (or `name` itself when it is a path to an inventory file).

    Raises:
        SelectionError: no inventory of that name on the search path (near names suggested).
    """
    as_path = Path(name).expanduser()
    if as_path.suffix.lower() in INVENTORY_SUFFIXES and as_path.is_file():
        return as_path
    known = list_inventories(search_path)
    if name in known:
        return known[name]
    searched = ", ".join(str(p) for p in search_path) or "(no folders)"
    raise SelectionError(
        f"no inventory named {name!r} (searched {searched})",
        hint=_did_you_mean(name, tuple(known)),
    )


# ---------------------------------------------------------------------------------------------
# Host selection (--hosts)

_GLOB_CHARS = re.compile(r"[*?\[]")


def _did_you_mean(name: str, candidates: Sequence[str]) -> str | None:
    near = difflib.get_close_matches(name, list(candidates), n=3, cutoff=0.6)
    if not near:
        return None
    return "did you mean " + " or ".join(repr(n) for n in near) + "?"


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
    if _GLOB_CHARS.search(item):
        chosen: set[str] = set()
        for host in inventory.hosts:
            if fnmatch.fnmatchcase(host.name, item):
                chosen.add(host.name)
        for group in inventory.groups.values():
            if fnmatch.fnmatchcase(group.name, item):
                chosen.update(group.members)
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
    (every host in it or below it), or a glob (`fnmatch`, case-sensitive) over host and group
    names. Duplicates are dropped.

    Raises:
        SelectionError: an item names nothing (near names suggested), or the list is malformed.
    """
    chosen: list[Host] = []
    for item in _split_expression(expr):
        hosts = _match_in_inventory(inventory, item)
        if hosts is None:
            names = (*inventory.host_names, *inventory.groups, inventory.name)
            what = (
                "matches no host or group" if _GLOB_CHARS.search(item) else "is not a host or group"
            )
            raise SelectionError(
                f"{item!r} {what} of inventory {inventory.name!r}",
                hint=_did_you_mean(item, names),
            )
        if not hosts:
            raise SelectionError(f"{item!r} selects no hosts in inventory {inventory.name!r}")
        chosen.extend(hosts)
    return _unique(chosen)


def resolve_hosts(
    expr: str,
    search_path: Sequence[Path],
    *,
    examples: Sequence[Path] = (),
    loader: Callable[[Path], Inventory] = load_inventory,
) -> tuple[Host, ...]:
    """Resolve a `--hosts` expression against the inventories on a search path.

    Each comma item is one of:
    - `INVENTORY` (a name on the search path or in `examples`, or a path to an inventory file):
      all its hosts;
    - `INVENTORY:PATTERN`: PATTERN (host, group, glob, `all`) within that inventory;
    - `PATTERN`: a host, group or glob looked up in every inventory on `search_path` (not in the
      bundled `examples`, so a placeholder example host is only reached by naming its inventory);
      it must match in exactly one inventory.

    Raises:
        SelectionError: unknown inventory, host or group (near names suggested), or ambiguous.
        SpecError: an inventory that had to be read is malformed.
    """
    everywhere = (*search_path, *examples)
    loaded: dict[Path, Inventory] = {}

    def load(path: Path) -> Inventory:
        if path not in loaded:
            loaded[path] = loader(path)
        return loaded[path]

    def named(name: str) -> Inventory | None:
        try:
            return load(find_inventory(name, everywhere))
        except SelectionError:
            return None

    chosen: list[Host] = []
    for item in _split_expression(expr):
        if ":" in item:
            inventory_name, pattern = item.split(":", 1)
            inventory = load(find_inventory(inventory_name, everywhere))
            chosen.extend(select_hosts(inventory, pattern or ALL_HOSTS))
            continue
        whole = named(item)
        if whole is not None:
            chosen.extend(whole.hosts)
            continue
        matches: list[tuple[Inventory, tuple[Host, ...]]] = []
        for path in list_inventories(search_path).values():
            candidate = load(path)
            hosts = _match_in_inventory(candidate, item)
            if hosts:
                matches.append((candidate, hosts))
        if len(matches) > 1:
            where = ", ".join(repr(inv.name) for inv, _ in matches)
            raise SelectionError(
                f"{item!r} matches in several inventories ({where})",
                hint=f"say which: {matches[0][0].name}:{item}",
            )
        if not matches:
            names: list[str] = list(list_inventories(everywhere))
            for inv in loaded.values():
                names.extend((*inv.host_names, *inv.groups))
            raise SelectionError(
                f"{item!r} is not an inventory, host or group on the search path",
                hint=_did_you_mean(item, names),
            )
        chosen.extend(matches[0][1])
    return _unique(chosen)


def resolve_workspace_hosts(expr: str, workspace: Workspace) -> tuple[Host, ...]:
    """`resolve_hosts` over a workspace's inventory folders: the workspace's `inventories/`,
    then the state directory's (sandbox inventories); the bundled examples by name only.

    Raises:
        SelectionError, SpecError: as `resolve_hosts`.
    """
    bundled = bundled_dir("inventories")
    bundled_real = bundled.resolve() if bundled is not None else None
    folders = workspace.search_dirs("inventories")
    search = [f for f in folders if f.resolve() != bundled_real]
    examples = [bundled] if bundled is not None else []
    return resolve_hosts(expr, search, examples=examples)


# ---------------------------------------------------------------------------------------------
# `opspatch inventory show`: rows for a table and a JSON document, both pure


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
    return {
        "kind": restart.kind,
        "start": restart.start,
        "pid_file": restart.pid_file,
        "workdir": restart.workdir,
        "stop_timeout": restart.stop_timeout,
    }


def _json_safe(value: Any) -> Any:
    """TOML dates and times (allowed in `vars`) as ISO text; containers recursively."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    return value


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
        )
        for h in hosts
    )
    title = f"{len(hosts)} host{'s' if len(hosts) != 1 else ''}" + (
        f" selected by {selection!r}" if selection else ""
    )
    return InventoryTable(title=title, columns=INVENTORY_COLUMNS, rows=rows)
