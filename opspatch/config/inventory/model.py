"""The inventory model: an inventory's hosts and groups, and the settings layers they merge."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from opspatch.core.fileschema import did_you_mean
from opspatch.core.host import (
    AgentMode,
    BecomeMethod,
    ContainerSettings,
    Host,
    RestartStrategy,
    Transport,
    Unit,
)
from opspatch.errors import SelectionError

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
    """A parsed inventory: its hosts in file order, its groups and its units by name."""

    name: str
    source: str
    hosts: tuple[Host, ...]
    groups: Mapping[str, Group]
    units: Mapping[str, Unit] = field(default_factory=dict)
    """The multi-node servers, each host in at most one (`Host.unit` says which)."""

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
            hint=did_you_mean(name, self.host_names),
        )


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
class RouterLayer:
    """Router settings one level writes; `None` = not set here (merged key by key)."""

    url: str | None = None
    worker_url: str | None = None
    admin_key_env: str | None = None


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
    become: bool | None = None
    become_user: str | None = None
    become_method: BecomeMethod | None = None
    become_password_env: str | None = None
    container: ContainerSettings | None = None
    live: bool | None = None
    agent: AgentMode | None = None
    vars: Mapping[str, Any] = field(default_factory=dict)
    engine: EngineLayer = field(default_factory=EngineLayer)
    router: RouterLayer = field(default_factory=RouterLayer)


_SCALAR_SETTINGS = (
    "user",
    "port",
    "identity_file",
    "known_hosts",
    "transport",
    "state_dir",
    "jump",
    "become",
    "become_user",
    "become_method",
    "become_password_env",
    "container",
    "live",
    "agent",
)
_SCALAR_ENGINE = ("python", "url", "log_file", "speculative", "restart")
_SCALAR_ROUTER = ("url", "worker_url", "admin_key_env")


def merge_layers(layers: Iterable[SettingsLayer]) -> SettingsLayer:
    """Merge settings layers, lowest priority first, into one layer (inputs are not changed).

    This is the one place the merge order is applied: pass `[defaults, *groups_outer_to_inner,
    host]`. A scalar set by a later layer wins; `vars` and `engine.env` are merged key by key;
    `engine.restart` is replaced whole.
    """
    scalars: dict[str, Any] = {}
    engine_scalars: dict[str, Any] = {}
    router_scalars: dict[str, Any] = {}
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
        for name in _SCALAR_ROUTER:
            value = getattr(layer.router, name)
            if value is not None:
                router_scalars[name] = value
        merged_vars.update(layer.vars)
        merged_env.update(layer.engine.env)
    return SettingsLayer(
        **scalars,
        vars=merged_vars,
        engine=EngineLayer(**engine_scalars, env=merged_env),
        router=RouterLayer(**router_scalars),
    )
