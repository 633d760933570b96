"""The host model: one host with every setting resolved, as the rest of opspatch uses it (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from opspatch.core.vocabulary import RestartKind

DEFAULT_ENGINE_URL = "http://127.0.0.1:30000"
DEFAULT_STATE_DIR = "/var/tmp/opspatch"
DEFAULT_BECOME_USER = "root"

Transport = Literal["ssh", "local"]
DEFAULT_TRANSPORT: Transport = "ssh"

AgentMode = Literal["resident", "per-exec"]
"""How the host agent runs (the inventory's `agent`): one process per host and user for a run,
fed every request over the same connection (`resident`), or a fresh interpreter per request
(`per-exec`, for hosts where a long-lived process is not wanted)."""
DEFAULT_AGENT: AgentMode = "resident"


@dataclass(frozen=True)
class SystemdRestart:
    """Restart the engine with `systemctl restart <unit>`."""

    unit: str
    kind: Literal[RestartKind.SYSTEMD] = RestartKind.SYSTEMD

    def describe(self) -> str:
        return f"systemd unit {self.unit}"


@dataclass(frozen=True)
class SupervisorRestart:
    """Restart the engine with `supervisorctl [-c <config>] restart <program>`."""

    program: str
    config: str | None = None
    kind: Literal[RestartKind.SUPERVISOR] = RestartKind.SUPERVISOR

    def describe(self) -> str:
        return f"supervisor program {self.program}"


@dataclass(frozen=True)
class CommandRestart:
    """Stop the process tree whose pid is in `pid_file`, then run `start` (a shell command line
    the operator wrote, run by `/bin/sh -c` in `workdir`)."""

    start: str
    pid_file: str
    workdir: str | None = None
    stop_timeout: float = 30.0
    kind: Literal[RestartKind.COMMAND] = RestartKind.COMMAND

    def describe(self) -> str:
        return f"command (pid file {self.pid_file})"


@dataclass(frozen=True)
class ContainerRestart:
    """Restart the engine's container with its runtime (`podman restart` / `docker restart`):
    the container keeps its writable layer, so a file patched inside it survives. Needs the
    host's `container`. `stop_timeout` is the runtime's `--time` (seconds before it kills)."""

    stop_timeout: float = 10.0
    pid_file: str | None = None
    """The engine's pid file inside the container, when its image writes one (readiness and
    the smoke then watch that process); else whoever listens on the engine's port."""
    kind: Literal[RestartKind.CONTAINER] = RestartKind.CONTAINER

    def describe(self) -> str:
        return "container (runtime restart)"


RestartStrategy = SystemdRestart | SupervisorRestart | CommandRestart | ContainerRestart

ContainerRuntime = Literal["podman", "docker"]
CONTAINER_RUNTIMES: tuple[ContainerRuntime, ...] = ("podman", "docker")


@dataclass(frozen=True)
class ContainerSettings:
    """The container the engine runs in on a host: every operation runs inside it, through
    `<runtime> exec -i <name>` on the host (locally or over the host's SSH connection)."""

    runtime: ContainerRuntime
    name: str

    def describe(self) -> str:
        return f"{self.runtime} {self.name}"


@dataclass(frozen=True)
class EngineSettings:
    """How the engine runs on one host.

    `python` is the engine's own interpreter (host operations run under it, so they see the files
    the server imports); `None` means the inventory does not say, and host operations refuse.
    `speculative` says whether the smoke decode must see `spec_verify_ct > 0`. `serves` False:
    no server runs these files here (`apply --file`, `--root`), so no inspection looks for one.
    """

    python: str | None = None
    url: str = DEFAULT_ENGINE_URL
    log_file: str | None = None
    speculative: bool = False
    env: Mapping[str, str] = field(default_factory=dict)
    restart: RestartStrategy | None = None
    serves: bool = True


@dataclass(frozen=True)
class RouterSettings:
    """The router in front of a host's engine (sglang-router's HTTP control plane).

    `worker_url` is the engine as the router knows it (the router compares URLs as exact
    strings), by default the engine URL in its canonical form (`canonical_url`). `admin_key_env`
    names the environment variable *on the controller* that holds the control plane's admin key;
    the key itself is never part of the model (nor of any file). `peers`: every worker URL the
    inventory puts behind this router, this host's included, so a worker that a run does not
    touch and the router no longer lists still counts against the router's capacity.
    """

    url: str
    worker_url: str
    admin_key_env: str | None = None
    peers: tuple[str, ...] = ()

    def describe(self) -> str:
        key = f" (${self.admin_key_env})" if self.admin_key_env else ""
        return f"{self.url}{key} as {self.worker_url}"


def canonical_url(url: str) -> str:
    """`scheme://host:port` with no trailing slash and a lowercase scheme and host: the one
    spelling opspatch registers a worker under (`http://h:p/` would be a second worker)."""
    scheme, _, rest = url.partition("://")
    netloc, _, path = rest.partition("/")
    path = path.rstrip("/")
    return f"{scheme.lower()}://{netloc.lower()}" + (f"/{path}" if path else "")


BecomeMethod = Literal["sudo"]


@dataclass(frozen=True)
class BecomeSettings:
    """Raising privileges for the host operations that need them (Ansible's `become`).

    With `enabled`, the operations that change the host (swap and restore of the target file
    with its bytecode purge, backups in the state folder, the lock file, restarts) run through
    `sudo -u <user>`; everything else runs as the SSH login user. `password_env` names the
    environment variable *on the controller* that holds the sudo password, when sudo needs one;
    the password itself is never part of the model (nor of any file).
    """

    enabled: bool = False
    user: str = DEFAULT_BECOME_USER
    method: BecomeMethod = "sudo"
    password_env: str | None = None

    def describe(self) -> str:
        if not self.enabled:
            return "-"
        source = f" (${self.password_env})" if self.password_env else ""
        return f"{self.method} -u {self.user}{source}"


@dataclass(frozen=True)
class JumpHost:
    """A host to tunnel through (SSH `ProxyJump`). `name` is set when it is an inventory host."""

    address: str
    port: int | None = None
    user: str | None = None
    identity_file: str | None = None
    name: str | None = None

    def describe(self) -> str:
        user = f"{self.user}@" if self.user else ""
        port = f":{self.port}" if self.port else ""
        return f"{user}{self.address}{port}"


@dataclass(frozen=True)
class Unit:
    """The hosts that form one multi-node SGLang server (`--nnodes N --node-rank R
    --dist-init-addr HEAD:PORT`): `hosts` in node-rank order, so `hosts[0]` is the head (node
    rank 0, the only node that serves the HTTP API; the others serve a dummy `/health`).

    A unit is patched, restarted and proven as one: no node of it is restarted alone (a node
    restarted alone cannot rejoin its group; docs/inventory.md, "Units")."""

    name: str
    hosts: tuple[str, ...]

    @property
    def head(self) -> str:
        return self.hosts[0]

    @property
    def nodes(self) -> int:
        return len(self.hosts)

    def rank_of(self, host: str) -> int:
        """The node rank of `host` in this unit.

        Raises:
            ValueError: `host` is not one of the unit's hosts.
        """
        return self.hosts.index(host)

    def describe(self, host: str) -> str:
        """How `host` stands in this unit: `u1 rank 0 (head)`, `u1 rank 1`."""
        rank = self.rank_of(host)
        return f"{self.name} rank {rank}" + (" (head)" if rank == 0 else "")


@dataclass(frozen=True)
class Host:
    """One host, with every setting resolved (defaults < groups < host).

    `port` and `user` may be `None`: then `~/.ssh/config` (or port 22 and the local user) decides.
    `identity_file` and `known_hosts` are kept as written (`~` is expanded by the transport, on the
    controller); relative paths were made relative to the inventory file's folder. `become` says
    whether and as whom the operations that need privileges are raised.
    """

    name: str
    inventory: str
    address: str
    port: int | None
    user: str | None
    identity_file: str | None
    known_hosts: str | None
    jump: JumpHost | None
    transport: Transport
    state_dir: str
    vars: Mapping[str, Any]
    engine: EngineSettings
    groups: tuple[str, ...]
    become: BecomeSettings = field(default_factory=BecomeSettings)
    container: ContainerSettings | None = None
    """The container the engine runs in (None: on the host itself)."""
    router: RouterSettings | None = None
    unit: Unit | None = None
    """The multi-node server this host is one node of (None: the host is a server by itself)."""
    live: bool = False
    """Whether live fixes may be taken on this host's engine (the inventory's `live = true`):
    `opspatch live enable` and `apply --live` refuse a host that does not say so."""
    agent: AgentMode = DEFAULT_AGENT
    """How the host agent runs there (`AgentMode`)."""

    @classmethod
    def local(
        cls,
        name: str,
        state_dir: str,
        engine: EngineSettings,
        *,
        inventory: str = "local",
        container: ContainerSettings | None = None,
    ) -> Host:
        """This machine as a fleet of one: the local transport, no SSH settings, groups or
        vars; operations run under `engine.python` (inside `container` when given) and keep
        backups and the lock in `state_dir`. `inventory` is the name the ledger records."""
        return cls(
            name=name,
            inventory=inventory,
            address="localhost",
            port=None,
            user=None,
            identity_file=None,
            known_hosts=None,
            jump=None,
            transport="local",
            state_dir=state_dir,
            vars={},
            engine=engine,
            groups=(),
            container=container,
        )
