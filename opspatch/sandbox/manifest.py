"""The sandbox manifest (`sandbox.json`) and the inventories written from it."""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opspatch.config.inventory import Inventory, parse_inventory
from opspatch.core.codec import Record
from opspatch.core.remedy import remedy_text
from opspatch.core.vocabulary import Command
from opspatch.errors import InputError
from opspatch.sandbox import containers
from opspatch.sandbox.dist import INSTALL_SHAPES, InstallShape
from opspatch.sandbox.incident import INCIDENT_ENV, INCIDENT_SERVER_FLAGS, is_incident_release
from opspatch.sandbox.layout import (
    CANARY_GROUP,
    ENGINE_ADDRESS,
    ENGINE_ENV,
    ENGINE_STOP_TIMEOUT,
    MANIFEST_FORMAT,
    REAL_ENGINE_STOP_TIMEOUT,
    STANDIN_ARGS,
    STANDIN_LOAD_ENV,
    SandboxLayout,
    engine_url,
    start_command,
)
from opspatch.sandbox.real.launch import CPU_ENV, OMP_BIND_ENV, cpu_env, server_args
from opspatch.sandbox.real.release import STANDIN, EngineChoice

PURGE = remedy_text(Command.SANDBOX_DOWN, purge=True)
"""The command that removes the sandbox, for hints."""

# ---------------------------------------------------------------------------------------------
# the manifest


@dataclass(frozen=True)
class SshEndpoint(Record):
    """A sandbox host's private sshd: where it listens, its pid and its pinned host key."""

    address: str
    port: int | None = None
    pid: int | None = None
    host_public_key: str | None = None


@dataclass(frozen=True)
class HostRecord(Record):
    """What the manifest remembers about one host: its name, engine port and sshd."""

    name: str
    port: int
    ssh: SshEndpoint | None = None


@dataclass(frozen=True)
class UnitRecord:
    """One multi-node server of the sandbox (`up --units U --nodes N --tp T`): its hosts in
    node-rank order (the head first), the port of its group's rendezvous on the head
    (`--dist-init-addr`, 0: not chosen yet) and its scheduler processes per node (`--tp`; the
    engine's `--tp-size` is `tp * nodes`)."""

    name: str
    hosts: tuple[str, ...]
    dist_port: int = 0
    tp: int = 1

    @property
    def head(self) -> str:
        return self.hosts[0]

    @property
    def tp_size(self) -> int:
        return self.tp * len(self.hosts)

    def node_args(self, host: str) -> tuple[str, ...]:
        """The multi-node arguments of `host`'s start command: the same on every node but for
        `--node-rank`, as SGLang needs."""
        return (
            "--tp-size",
            str(self.tp_size),
            "--nnodes",
            str(len(self.hosts)),
            "--node-rank",
            str(self.hosts.index(host)),
            "--dist-init-addr",
            f"{ENGINE_ADDRESS}:{self.dist_port}",
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "hosts": list(self.hosts),
            "dist_port": self.dist_port,
            "tp": self.tp,
        }

    @classmethod
    def from_json(cls, data: Any) -> UnitRecord:
        hosts = tuple(str(h) for h in data["hosts"])
        if not hosts:
            raise ValueError(f"unit {data['name']!r} has no host")
        return cls(str(data["name"]), hosts, int(data["dist_port"]), int(data["tp"]))


@dataclass(frozen=True)
class RealEngineRecord(Record):
    """Where a real-engine sandbox's shared parts are (`opspatch.sandbox.real`): the shared
    environment, the release's wheel, the two models. Recorded by the `up` that built them, so
    the inventories (rendered from the manifest alone) can name them."""

    base: str
    wheel: str
    target: str
    draft: str


@dataclass(frozen=True)
class RouterRecord:
    """The sandbox's router (`up --router`): its HTTP and Prometheus ports on loopback."""

    port: int
    prometheus_port: int

    @property
    def url(self) -> str:
        return f"http://{ENGINE_ADDRESS}:{self.port}"

    def to_json(self) -> dict[str, Any]:
        return {"port": self.port, "prometheus_port": self.prometheus_port}


@dataclass(frozen=True)
class Manifest:
    """`sandbox.json`: the hosts in order, the SSH login user (None: no `--ssh`) and how every
    host's engine is installed (`install`: a wheel in site-packages, or an editable git
    checkout). A manifest written before the install shape was recorded reads as `wheel`, the
    only shape there was."""

    hosts: tuple[HostRecord, ...] = ()
    ssh_user: str | None = None
    install: InstallShape = "wheel"
    containers: bool = False
    """Each engine runs in a podman container (`opspatch.sandbox.containers`), installed
    editable in the image's checkout."""
    router: RouterRecord | None = None
    """Set by `up --router` and kept by later `up`s, like `--ssh`."""
    units: tuple[UnitRecord, ...] = ()
    """Set by `up --units`: the multi-node servers, each host in at most one; kept by later
    `up`s. A manifest written before units were recorded has none."""
    restart_seconds: float = 0.0
    """Set by `up --restart-seconds S`, kept by later `up`s: each engine start (and restart)
    takes S more seconds, written into the inventories' engine environment."""
    engine: EngineChoice = STANDIN
    """Set by the first `up` (`--engine`); a manifest written before engines were recorded runs
    the stand-in."""
    real: RealEngineRecord | None = None
    """Where a real engine's shared parts are (None for the stand-in)."""
    tp: int = 1
    """Scheduler processes (TP ranks) of each single-node server (`up --tp T`); a unit's are
    its own (`UnitRecord.tp`)."""
    live: bool = False
    """`up --live`: the inventories say `live = true` (live fixes may be taken); kept by later
    `up`s until `--no-live`."""

    @property
    def ssh(self) -> bool:
        return self.ssh_user is not None

    @property
    def stop_timeout(self) -> float:
        return REAL_ENGINE_STOP_TIMEOUT if self.engine.real else ENGINE_STOP_TIMEOUT

    def engine_args(self, host: str) -> tuple[str, ...]:
        """The engine's arguments of `host`'s start command (before a unit node's own)."""
        unit = self.unit_of(host)
        tp = () if unit is not None or self.tp == 1 else ("--tp-size", str(self.tp))
        if self.real is None:
            return STANDIN_ARGS + tp
        args = server_args(Path(self.real.target), Path(self.real.draft), 1) + tp
        if is_incident_release(self.engine.version):
            args += INCIDENT_SERVER_FLAGS
        return args

    def engine_env(self, host: str | None = None) -> dict[str, str]:
        """The engine's environment (every host's the same but a real unit node's ranks)."""
        env = dict(ENGINE_ENV)
        if self.restart_seconds:
            env[STANDIN_LOAD_ENV] = f"{self.restart_seconds:g}"
        if self.engine.real:
            unit = None if host is None else self.unit_of(host)
            if unit is None or host is None:
                env.update(cpu_env(self.tp))
            else:  # a node's ranks on cores of their own, node after node
                cores = sorted(os.sched_getaffinity(0))
                first = unit.hosts.index(host) * unit.tp
                mine = [cores[(first + rank) % len(cores)] for rank in range(unit.tp)]
                env.update({**CPU_ENV, OMP_BIND_ENV: "|".join(map(str, mine))})
            if is_incident_release(self.engine.version):
                env.update(INCIDENT_ENV)
        return env

    def unit_of(self, host: str) -> UnitRecord | None:
        """The unit `host` is a node of, or None (a server by itself)."""
        return next((u for u in self.units if host in u.hosts), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": MANIFEST_FORMAT,
            "engine_address": ENGINE_ADDRESS,
            "ssh_user": self.ssh_user,
            "install": self.install,
            "containers": self.containers,
            "hosts": [record.to_json() for record in self.hosts],
            "router": self.router.to_json() if self.router else None,
            "units": [unit.to_json() for unit in self.units],
            "restart_seconds": self.restart_seconds,
            "engine": self.engine.to_json(),
            "real": None if self.real is None else self.real.to_json(),
            "tp": self.tp,
            "live": self.live,
        }

    @classmethod
    def from_json(cls, data: Any, path: Path) -> Manifest:
        """Parse a manifest document.

        Raises:
            InputError: the document is not a manifest this version wrote.
        """
        try:
            if data.get("format") != MANIFEST_FORMAT:
                raise ValueError(f"unknown format {data.get('format')!r}")
            hosts = []
            for entry in data["hosts"]:
                ssh = entry.get("ssh")
                hosts.append(
                    HostRecord(
                        name=str(entry["name"]),
                        port=int(entry["port"]),
                        ssh=None
                        if ssh is None
                        else SshEndpoint(
                            address=str(ssh["address"]),
                            port=None if ssh.get("port") is None else int(ssh["port"]),
                            pid=None if ssh.get("pid") is None else int(ssh["pid"]),
                            host_public_key=ssh.get("host_public_key"),
                        ),
                    )
                )
            user = data.get("ssh_user")
            install = data.get("install", "wheel")
            if install not in INSTALL_SHAPES:
                raise ValueError(f"unknown install shape {install!r}")
            written = data.get("router")
            router = (
                None
                if written is None
                else RouterRecord(int(written["port"]), int(written["prometheus_port"]))
            )
            containers = data.get("containers", False)
            if not isinstance(containers, bool):
                raise ValueError(f"containers must be true or false, not {containers!r}")
            units = tuple(UnitRecord.from_json(u) for u in data.get("units", []))
            restart_seconds = data.get("restart_seconds", 0.0)
            if not isinstance(restart_seconds, (int, float)) or restart_seconds < 0:
                raise ValueError(
                    f"restart_seconds must be a number of seconds, not {restart_seconds!r}"
                )
            real = data.get("real")
            tp, live = data.get("tp", 1), data.get("live", False)
            if not isinstance(tp, int) or tp < 1 or not isinstance(live, bool):
                raise ValueError(f"tp must be a count and live true or false: {tp!r}, {live!r}")
            return cls(
                tuple(hosts),
                None if user is None else str(user),
                install,
                containers,
                router,
                units,
                float(restart_seconds),
                EngineChoice.from_json(data.get("engine")),
                None if real is None else RealEngineRecord.from_json(real),
                tp,
                live,
            )
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise InputError(
                f"{path}: not a sandbox manifest ({type(exc).__name__}: {exc})",
                hint=f"{PURGE} removes the sandbox so `up` can start afresh",
            ) from None


def load_manifest(layout: SandboxLayout) -> Manifest | None:
    """The recorded sandbox, or None when there is none.

    Raises:
        InputError: the manifest exists but cannot be read as one.
    """
    try:
        text = layout.manifest.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise InputError(
            f"{layout.manifest}: not JSON ({exc})",
            hint=f"{PURGE} removes the sandbox so `up` can start afresh",
        ) from None
    return Manifest.from_json(data, layout.manifest)


def write_atomically(path: Path, text: str) -> None:
    """Replace `path` by `text` whole (temp file beside it, fsync, rename): a reader sees the old
    file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise


def save_manifest(layout: SandboxLayout, manifest: Manifest) -> None:
    write_atomically(layout.manifest, json.dumps(manifest.to_json(), indent=2) + "\n")


# ---------------------------------------------------------------------------------------------
# the inventories (pure)


def _toml_string(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def render_inventory(layout: SandboxLayout, manifest: Manifest, *, over_ssh: bool) -> str:
    """The `sandbox` (local) or `sandbox-ssh` inventory text for the recorded hosts.

    Both describe the same hosts with the same engine settings and host-side state folder (so the
    host lock is shared whichever way a host is reached); only how they are reached differs.
    """
    kind = "SSH to a private sshd per host" if over_ssh else "local transport"
    engines = (
        f"real SGLang {manifest.engine.version}" if manifest.engine.real else "stand-in SGLang"
    )
    lines = [
        "# Written by `opspatch sandbox up`; rewritten by every `up` (edits here are lost).",
        f"# {len(manifest.hosts)} {engines} engine(s), each in its own "
        + ("podman container" if manifest.containers else "folder of the sandbox")
        + f" (install: {manifest.install}).",
        f"description = {_toml_string(f'opspatch sandbox: local {engines} hosts ({kind})')}",
        "",
        "[defaults]",
    ]
    if manifest.live:
        lines.append("live = true")
    if over_ssh:
        lines += [
            'transport = "ssh"',
            f"user = {_toml_string(manifest.ssh_user or getpass.getuser())}",
            f"identity_file = {_toml_string(str(layout.user_key))}",
            f"known_hosts = {_toml_string(str(layout.known_hosts))}",
        ]
    else:
        lines.append('transport = "local"')
    if manifest.router is not None:
        # every engine behind the one router, registered under its engine URL (the default)
        lines.append(f"router = {{ url = {_toml_string(manifest.router.url)} }}")
    lines += ["", "[defaults.engine]", "speculative = true", _env_line(manifest.engine_env())]
    for record in manifest.hosts:
        name = record.name
        if manifest.containers:
            lines += ["", f"[hosts.{name}]"]
            if over_ssh:
                lines += _ssh_address_lines(record)
            lines += _container_host_lines(layout, record)
            continue
        lines += ["", f"[hosts.{name}]"]
        if over_ssh:
            lines += _ssh_address_lines(record)
        lines += _host_engine_lines(layout, manifest, record)
    for unit in manifest.units:
        members = ", ".join(_toml_string(h) for h in unit.hosts)
        lines += ["", f"[units.{unit.name}]", f"hosts = [{members}]  # the head first"]
    if manifest.hosts:
        # the canary is the first server: one host, or every node of the first unit
        first = manifest.unit_of(manifest.hosts[0].name)
        canary = first.hosts if first else (manifest.hosts[0].name,)
        lines += [
            "",
            f"[groups.{CANARY_GROUP}]",
            f"hosts = [{', '.join(_toml_string(h) for h in canary)}]",
        ]
    return "\n".join(lines) + "\n"


def _host_engine_lines(layout: SandboxLayout, manifest: Manifest, record: HostRecord) -> list[str]:
    """A host of the sandbox's folders: its state folder and engine, started by a command."""
    name = record.name
    unit = manifest.unit_of(name)
    start = start_command(
        layout.python(name),
        record.port,
        unit.node_args(name) if unit else (),
        manifest.engine_args(name),
    )
    restart = (
        f'{{ kind = "command", start = {_toml_string(start)}, '
        f"pid_file = {_toml_string(str(layout.pid_file(name)))}, "
        f"workdir = {_toml_string(str(layout.host_dir(name)))}, "
        f"stop_timeout = {int(manifest.stop_timeout)} }}"
    )
    lines = [
        f"state_dir = {_toml_string(str(layout.host_state_dir(name)))}",
        f"[hosts.{name}.engine]",
        f"python = {_toml_string(str(layout.python(name)))}",
        f"url = {_toml_string(engine_url(record.port))}",
        f"log_file = {_toml_string(str(layout.log_file(name)))}",
        f"restart = {restart}",
    ]
    if manifest.engine_env(name) != manifest.engine_env():  # a real unit node's own ranks
        lines.append(_env_line(manifest.engine_env(name)))
    return lines


def _env_line(env: dict[str, str]) -> str:
    pairs = ", ".join(f"{name} = {_toml_string(value)}" for name, value in env.items())
    return f"env = {{ {pairs} }}"


def _ssh_address_lines(record: HostRecord) -> list[str]:
    if record.ssh is None or record.ssh.port is None:
        raise InputError(
            f"{record.name} has no sshd recorded; run `{remedy_text(Command.SANDBOX_UP, ssh=True)}`"
        )
    return [f"address = {_toml_string(record.ssh.address)}", f"port = {record.ssh.port}"]


def _container_host_lines(layout: SandboxLayout, record: HostRecord) -> list[str]:
    """A containerised host: its container, and the engine as the image runs it (the paths
    are inside the container; the state folder too, in its writable layer)."""
    settings = containers.container_settings(layout, record.name)
    restart = (
        f'{{ kind = "container", stop_timeout = {int(containers.STOP_TIMEOUT)}, '
        f"pid_file = {_toml_string(containers.PID_FILE)} }}"
    )
    return [
        f"state_dir = {_toml_string(containers.STATE_DIR)}",
        f"container = {{ runtime = {_toml_string(settings.runtime)}, "
        f"name = {_toml_string(settings.name)} }}",
        f"[hosts.{record.name}.engine]",
        f"python = {_toml_string(containers.PYTHON)}",
        f"url = {_toml_string(engine_url(record.port))}",
        f"log_file = {_toml_string(containers.LOG_FILE)}",
        f"restart = {restart}",
    ]


def sandbox_inventory(layout: SandboxLayout, manifest: Manifest, *, over_ssh: bool) -> Inventory:
    """The rendered inventory, parsed by the real inventory parser (what `--hosts` will see)."""
    path = layout.ssh_inventory if over_ssh else layout.inventory
    return parse_inventory(render_inventory(layout, manifest, over_ssh=over_ssh), str(path))
