"""Ansible YAML inventories (`inventories/<name>.yml` / `.yaml`), read into the same schema as
TOML ones."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from opspatch.config.inventory.model import ALL_HOSTS, Inventory
from opspatch.config.inventory.resolve import build_inventory
from opspatch.config.inventory.schema import PASSWORD_SOURCE_HINT, validate_inventory
from opspatch.core.fileschema import (
    MAX_NESTING,
    FieldPath,
    check_nesting,
    did_you_mean,
    format_field_path,
)
from opspatch.core.tomlsource import first_line_nested_deeper_than
from opspatch.errors import Location, SpecError

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
    "ansible_become": ("become",),
    "ansible_sudo": ("become",),
    "ansible_become_user": ("become_user",),
    "ansible_sudo_user": ("become_user",),
    "ansible_become_method": ("become_method",),
}
# Secrets Ansible lets an inventory hold; opspatch refuses them (environment or terminal instead).
_ANSIBLE_SECRETS = (
    "ansible_become_password",
    "ansible_become_pass",
    "ansible_sudo_password",
    "ansible_sudo_pass",
)
_YAML_PASSWORD_HINT = PASSWORD_SOURCE_HINT.replace(
    'become_password_env = "OPSPATCH_BECOME_PASSWORD"',
    "opspatch_become_password_env: OPSPATCH_BECOME_PASSWORD",
)
_ANSIBLE_BOOLEANS = {
    "yes": True,
    "on": True,
    "true": True,
    "1": True,
    "y": True,
    "t": True,
    "no": False,
    "off": False,
    "false": False,
    "0": False,
    "n": False,
    "f": False,
}
_OPSPATCH_KEYS: dict[str, tuple[str, ...]] = {
    "opspatch_transport": ("transport",),
    "opspatch_known_hosts": ("known_hosts",),
    "opspatch_jump": ("jump",),
    "opspatch_state_dir": ("state_dir",),
    "opspatch_become_password_env": ("become_password_env",),
    "opspatch_live": ("live",),
    "opspatch_agent": ("agent",),
    "opspatch_engine_python": ("engine", "python"),
    "opspatch_engine_url": ("engine", "url"),
    "opspatch_engine_log_file": ("engine", "log_file"),
    "opspatch_engine_speculative": ("engine", "speculative"),
    "opspatch_engine_env": ("engine", "env"),
    "opspatch_engine_restart": ("engine", "restart"),
}
UNITS_VARIABLE = "opspatch_units"
"""`all: vars: opspatch_units: {NAME: {hosts: [...], head: ...}}`: the TOML file's `[units]`."""
_ANSIBLE_CONNECTIONS = {"ssh": "ssh", "paramiko": "ssh", "smart": "ssh", "local": "local"}
_GROUP_KEYS = ("hosts", "vars", "children")


# ---------------------------------------------------------------------------------------------
# The YAML document, with lines


@dataclass(frozen=True)
class YamlDocument:
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

    def location(self, field_path: Sequence[str | int]) -> Location:
        return Location(self.path, self.line_of(field_path), format_field_path(field_path))

    def error(
        self, field_path: Sequence[str | int], problem: str, *, hint: str | None = None
    ) -> SpecError:
        return SpecError(self.location(field_path), problem, hint=hint)


def _yaml_lines(root: yaml.Node) -> dict[FieldPath, int]:
    """The line of every key and item, walked iteratively and at most `MAX_NESTING` deep, each
    node once (an alias can make a node its own descendant)."""
    out: dict[FieldPath, int] = {}
    seen: set[int] = set()
    stack: list[tuple[yaml.Node, FieldPath]] = [(root, ())]
    while stack:
        node, prefix = stack.pop()
        if id(node) in seen or len(prefix) > MAX_NESTING:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                path = (*prefix, str(key_node.value))
                out.setdefault(path, key_node.start_mark.line + 1)
                stack.append((value_node, path))
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                out.setdefault((*prefix, index), item.start_mark.line + 1)
                stack.append((item, (*prefix, index)))
    return out


def parse_yaml(text: str, path: str) -> YamlDocument:
    """Parse YAML text (safe loader) keeping each key's line.

    Raises:
        SpecError: malformed YAML, nested too deeply, or an alias loop or bomb.
    """
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
    except (RecursionError, MemoryError):
        # PyYAML composes and constructs nested collections recursively
        raise SpecError(
            Location(path, first_line_nested_deeper_than(text, MAX_NESTING)),
            f"nested more than {MAX_NESTING} levels deep",
            hint="no inventory needs that; is the file generated or damaged?",
        ) from None
    document = YamlDocument(path=path, data=data, lines=_yaml_lines(node) if node else {})
    check_nesting(data, document)
    return document


# ---------------------------------------------------------------------------------------------
# Ansible's tree -> the TOML inventory's shape


@dataclass
class _Level:
    """A host, a group or `all` as gathered from the tree: its variables with where each was
    written, and (groups) the hosts and children listed."""

    where: FieldPath
    variables: dict[str, Any] = field(default_factory=dict)
    origins: dict[str, FieldPath] = field(default_factory=dict)
    hosts: list[str] = field(default_factory=list)
    children: list[str] = field(default_factory=list)

    def add(self, variables: Mapping[str, Any], where: FieldPath) -> None:
        for key, value in variables.items():
            self.variables[str(key)] = value
            self.origins[str(key)] = (*where, str(key))


class _Gatherer:
    """Walks Ansible's tree once, gathering every host's and group's variables."""

    def __init__(self, doc: YamlDocument) -> None:
        self.doc = doc
        self.defaults = _Level(where=(ALL_HOSTS, "vars"))
        self.hosts: dict[str, _Level] = {}
        self.groups: dict[str, _Level] = {}

    def mapping(self, value: Any, where: FieldPath, what: str) -> dict[Any, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.doc.error(where, f"{what} must be a mapping, not {type(value).__name__}")
        return value

    def walk(self) -> None:
        top = self.mapping(self.doc.data, (), "an Ansible inventory")
        # iterative: a group's children are walked after it (the tree is at most MAX_NESTING deep)
        todo: list[tuple[str, Any, FieldPath]] = [
            (str(name), body, (str(name),)) for name, body in reversed(list(top.items()))
        ]
        while todo:
            name, body, where = todo.pop()
            todo.extend(reversed(self.group(name, body, where)))

    def group(self, name: str, body: Any, where: FieldPath) -> list[tuple[str, Any, FieldPath]]:
        body = self.mapping(body, where, f"group {name!r}")
        for key in body:
            if key not in _GROUP_KEYS:
                raise self.doc.error(
                    (*where, str(key)),
                    f"unknown key {key!r} in group {name!r}",
                    hint="a group has hosts, vars and children",
                )
        variables = self.mapping(body.get("vars"), (*where, "vars"), "vars")
        hosts = self.mapping(body.get("hosts"), (*where, "hosts"), "hosts")
        children = self.mapping(body.get("children"), (*where, "children"), "children")
        level = self.defaults if name == ALL_HOSTS else self.groups.setdefault(name, _Level(where))
        level.add(variables, (*where, "vars"))
        for host_name, host_vars in hosts.items():
            here = (*where, "hosts", str(host_name))
            host = self.hosts.setdefault(str(host_name), _Level(here))
            host.add(self.mapping(host_vars, here, f"host {host_name!r}"), here)
            if name != ALL_HOSTS and str(host_name) not in level.hosts:
                level.hosts.append(str(host_name))
        walked = []
        for child_name, child_body in children.items():
            child = str(child_name)
            if child == ALL_HOSTS:
                raise self.doc.error((*where, "children", child), "'all' cannot be a child group")
            if name != ALL_HOSTS and child not in level.children:
                level.children.append(child)
            walked.append((child, child_body, (*where, "children", child)))
        return walked


def _settings(
    level: _Level, doc: YamlDocument, *, is_host: bool
) -> tuple[dict[str, Any], dict[FieldPath, FieldPath]]:
    """A level's variables as a layer of the TOML shape, and where each setting came from."""
    layer: dict[str, Any] = {}
    origins: dict[FieldPath, FieldPath] = {}
    free: dict[str, Any] = {}
    for key, value in level.variables.items():
        where = level.origins[key]
        if key == UNITS_VARIABLE:
            raise doc.error(
                where,
                f"{UNITS_VARIABLE} can only be set in all.vars",
                hint="units span groups: declare them once, under all: vars: "
                f"{UNITS_VARIABLE}: {{NAME: {{hosts: [...]}}}}",
            )
        if key in _ANSIBLE_SECRETS:
            raise doc.error(
                where,
                "a password does not belong in an inventory",
                hint=_YAML_PASSWORD_HINT,
            )
        target = _ANSIBLE_KEYS.get(key) or _OPSPATCH_KEYS.get(key)
        if target is None:
            if key.startswith("opspatch_"):
                raise doc.error(
                    where,
                    f"unknown opspatch variable {key!r}",
                    hint=did_you_mean(key, tuple(_OPSPATCH_KEYS)),
                )
            free[key] = value
            origins[("vars", key)] = where
            continue
        if target == ("address",) and not is_host:
            raise doc.error(where, f"{key} can only be set on a host")
        if key == "ansible_connection":
            if not isinstance(value, str) or value not in _ANSIBLE_CONNECTIONS:
                raise doc.error(
                    where, f"ansible_connection {value!r} is not supported", hint="use ssh or local"
                )
            value = _ANSIBLE_CONNECTIONS[value]
        if target == ("port",) and isinstance(value, str) and value.isdigit():
            value = int(value)  # Ansible writes ports as strings as often as numbers
        if target == ("become",) and isinstance(value, str):
            # Ansible's booleans: `ansible_become: "yes"` (a string in YAML 1.2 readers) is true
            value = _ANSIBLE_BOOLEANS.get(value.strip().lower(), value)
        if len(target) == 2:
            layer.setdefault("engine", {})[target[1]] = value
        else:
            layer[target[0]] = value
        origins[target] = where
    layer["vars"] = free
    return layer, origins


def parse_ansible_inventory(text: str, path: str, name: str) -> Inventory:
    """The inventory `name` from an Ansible YAML inventory; `path` names the file in errors.

    Raises:
        SpecError: malformed YAML, an unknown `opspatch_*` variable, a bad value (named by its
            Ansible variable and line), or a reference that does not resolve.
    """
    doc = parse_yaml(text, path)
    gathered = _Gatherer(doc)
    gathered.walk()
    origins: dict[FieldPath, FieldPath] = {("defaults",): gathered.defaults.where}
    units = gathered.defaults.variables.pop(UNITS_VARIABLE, None)
    units_where = gathered.defaults.origins.pop(UNITS_VARIABLE, None)
    if units_where is not None:
        origins[("units",)] = units_where
    defaults, found = _settings(gathered.defaults, doc, is_host=False)
    origins.update({("defaults", *k): v for k, v in found.items()})
    hosts: dict[str, Any] = {}
    for host_name, level in gathered.hosts.items():
        layer, found = _settings(level, doc, is_host=True)
        # Ansible's rule: without ansible_host the inventory name is the address.
        layer.setdefault("address", host_name)
        hosts[host_name] = layer
        origins[("hosts", host_name)] = level.where
        origins.update({("hosts", host_name, *k): v for k, v in found.items()})
    groups: dict[str, Any] = {}
    for group_name, level in gathered.groups.items():
        layer, found = _settings(level, doc, is_host=False)
        groups[group_name] = {**layer, "hosts": level.hosts, "children": level.children}
        origins[("groups", group_name)] = level.where
        origins.update({("groups", group_name, *k): v for k, v in found.items()})

    def to_yaml(schema_path: FieldPath) -> FieldPath:
        """Where a setting of the TOML shape is written in the YAML file."""
        for size in range(len(schema_path), 0, -1):
            written = origins.get(schema_path[:size])
            if written is not None:
                return written + schema_path[size:]
        return schema_path

    data = {"defaults": defaults, "hosts": hosts, "groups": groups}
    if units is not None:
        data["units"] = units
    written = validate_inventory(data, doc, to_document=to_yaml)
    return build_inventory(written, _MappedDocument(doc, to_yaml), name)


@dataclass(frozen=True)
class _MappedDocument:
    """The YAML document addressed by paths of the TOML shape (for the shared conversion)."""

    document: YamlDocument
    to_yaml: Callable[[FieldPath], FieldPath]

    @property
    def path(self) -> str:
        return self.document.path

    def line_of(self, field_path: Sequence[str | int]) -> int:
        return self.document.line_of(self.to_yaml(tuple(field_path)))

    def location(self, field_path: Sequence[str | int]) -> Location:
        return self.document.location(self.to_yaml(tuple(field_path)))

    def error(
        self, field_path: Sequence[str | int], problem: str, *, hint: str | None = None
    ) -> SpecError:
        return self.document.error(self.to_yaml(tuple(field_path)), problem, hint=hint)
