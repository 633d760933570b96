"""`opspatch sandbox status`: each host's engine, health, install shape, patches and sshd, and
each unit (multi-node server): its head, its nodes, whether the head serves."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opspatch.config.lookup import Workspace
from opspatch.config.patches import load_patch
from opspatch.core.codec import Record
from opspatch.core.edit import detect
from opspatch.core.host import Host
from opspatch.core.policy import StepTimeouts
from opspatch.core.remedy import remedy_text
from opspatch.core.spec import LoadedPatch, PatchSpec
from opspatch.core.vocabulary import Command
from opspatch.errors import HostError, InputError, OpspatchError
from opspatch.hosts.operations import HostOperations, open_transport
from opspatch.hosts.transport.container import ContainerIdentity
from opspatch.runs.fleet.pipeline import gate_inspection
from opspatch.sandbox import containers as sandbox_containers
from opspatch.sandbox.dist import InstallShape, installed_shape
from opspatch.sandbox.install import host_venv_dir, venv_site_packages
from opspatch.sandbox.layout import ENGINE_ADDRESS, HEALTH_TIMEOUT, SandboxLayout, engine_url
from opspatch.sandbox.manifest import (
    HostRecord,
    SshEndpoint,
    UnitRecord,
    load_manifest,
    sandbox_inventory,
)
from opspatch.sandbox.processes import server_pid, sshd_pid
from opspatch.sandbox.real.release import STANDIN, EngineChoice
from opspatch.sandbox.router import router_pid

UP = remedy_text(Command.SANDBOX_UP)
"""The command that builds the sandbox, for hints."""


@dataclass(frozen=True)
class PatchState(Record):
    """Whether a host's copy of a patch's target file carries the patch (`detect`)."""

    patch: str
    state: str  # applied | not-applied | partial | unknown
    file: str
    reason: str


@dataclass(frozen=True)
class HostStatus:
    """One sandbox host as it is now."""

    host: str
    port: int
    url: str
    pid: int | None
    health: int | None
    health_detail: str
    patches: tuple[PatchState, ...]
    ssh: SshEndpoint | None
    ssh_running: bool | None
    log_file: str
    install: InstallShape | None = None
    checkout: str | None = None
    notes: tuple[str, ...] = ()
    container: ContainerIdentity | None = None

    @property
    def running(self) -> bool:
        if self.container is not None:
            return self.container.running
        return self.pid is not None

    @property
    def carries(self) -> tuple[str, ...]:
        return tuple(p.patch for p in self.patches if p.state == "applied")

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "running": self.running,
            "pid": self.pid,
            "port": self.port,
            "url": self.url,
            "health": {"status": self.health, "detail": self.health_detail},
            "patches": [p.to_json() for p in self.patches],
            "ssh": None
            if self.ssh is None
            else {
                "address": self.ssh.address,
                "port": self.ssh.port,
                "pid": self.ssh.pid if self.ssh_running else None,
                "running": self.ssh_running,
            },
            "log_file": self.log_file,
            "install": self.install,
            "checkout": self.checkout,
            "notes": list(self.notes),
            "container": None
            if self.container is None
            else {
                "runtime": self.container.runtime,
                "name": self.container.name,
                "id": self.container.id,
            },
        }


@dataclass(frozen=True)
class RouterStatus:
    """The sandbox router (`up --router`): its URL and pid (None: not running)."""

    url: str
    pid: int | None

    def to_json(self) -> dict[str, Any]:
        return {"url": self.url, "pid": self.pid}


@dataclass(frozen=True)
class UnitStatus:
    """One multi-node server of the sandbox: its head, its nodes in rank order, which of them
    run, and whether the head serves (its engine runs and its `/health`, which on the head runs
    a decode across every rank, answers 200). A non-head node's `/health` is SGLang's dummy one
    and proves nothing, so it never counts as serving."""

    name: str
    head: str
    nodes: tuple[str, ...]
    running: tuple[str, ...]
    head_serves: bool
    dist_init_addr: str
    tp_size: int

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "head": self.head,
            "nodes": list(self.nodes),
            "running": list(self.running),
            "head_serves": self.head_serves,
            "dist_init_addr": self.dist_init_addr,
            "tp_size": self.tp_size,
        }


def unit_statuses(
    units: Sequence[UnitRecord], hosts: Sequence[HostStatus]
) -> tuple[UnitStatus, ...]:
    """Each unit as its nodes' statuses show it (pure)."""
    by_name = {h.host: h for h in hosts}
    found = []
    for unit in units:
        head = by_name.get(unit.head)
        found.append(
            UnitStatus(
                name=unit.name,
                head=unit.head,
                nodes=unit.hosts,
                running=tuple(h for h in unit.hosts if h in by_name and by_name[h].running),
                head_serves=head is not None and head.running and head.health == 200,
                dist_init_addr=f"{ENGINE_ADDRESS}:{unit.dist_port}",
                tp_size=unit.tp_size,
            )
        )
    return tuple(found)


@dataclass(frozen=True)
class StatusReport:
    """The sandbox's hosts, the inventories written, and the install shape it was built with
    (each host's `install` says what its environment really holds)."""

    root: Path
    hosts: tuple[HostStatus, ...]
    inventories: tuple[Path, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)
    install: InstallShape = "wheel"
    containers: bool = False
    router: RouterStatus | None = None
    units: tuple[UnitStatus, ...] = ()
    engine: EngineChoice = STANDIN
    tp: int = 1
    live: bool = False

    def unit_of(self, host: str) -> UnitStatus | None:
        return next((u for u in self.units if host in u.nodes), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "sandbox": str(self.root),
            "engine": self.engine.label,
            "tp": self.tp,
            "live": self.live,
            "router": self.router.to_json() if self.router else None,
            "units": [u.to_json() for u in self.units],
            "install": self.install,
            "containers": self.containers,
            "inventories": [str(p) for p in self.inventories],
            "hosts": [h.to_json() for h in self.hosts],
            "notes": list(self.notes),
        }


def health_of(url: str, timeout: float = HEALTH_TIMEOUT) -> tuple[int | None, str]:
    """`GET <url>/health` from here (the engines listen on this machine's loopback)."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=timeout) as reply:  # noqa: S310 - our loopback URL
            return int(reply.status), "ok"
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.reason if isinstance(exc.reason, str) else str(exc.reason)
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return None, f"no answer ({reason})"


def _workspace_patches(workspace: Workspace) -> tuple[list[LoadedPatch], list[str]]:
    loaded, notes = [], []
    for name, path in sorted(workspace.available("patches").items()):
        try:
            loaded.append(load_patch(path))
        except OpspatchError as exc:
            notes.append(f"patch {name} skipped: {exc.render()}")
    return loaded, notes


def _patch_states(host: Host, patches: Sequence[LoadedPatch]) -> tuple[list[PatchState], list[str]]:
    """Detect each patch whose target module resolves under the host's interpreter (and passes
    the version gate a rollout applies, `gate_inspection`: the RECORD owner's version for a
    wheel, the installed distribution's for an editable checkout) in the file that interpreter
    imports: one exec per target module, through the same host operations a rollout uses."""
    ops = HostOperations(open_transport(host), host)
    by_module: dict[str, list[PatchSpec]] = {}
    for patch in patches:
        for part in patch.parts:  # a patch set: each file is reported on its own
            by_module.setdefault(part.target.module, []).append(part)
    states: list[PatchState] = []
    notes: list[str] = []
    for module, group in by_module.items():
        try:
            seen = ops.inspect(module, timeout=StepTimeouts().inspect)
        except OpspatchError as exc:
            notes.append(f"{module}: {exc.detail if isinstance(exc, HostError) else exc.message}")
            continue
        if seen.module is None:
            continue
        for part in group:
            if gate_inspection(part.target, seen) is not None:
                continue
            found = detect(seen.file.content, part)
            states.append(PatchState(part.id, found.state, seen.file.path, found.reason))
    return sorted(states, key=lambda s: s.patch), notes


def _container_status(
    layout: SandboxLayout, record: HostRecord, host: Host, patches: Sequence[LoadedPatch]
) -> HostStatus:
    """A containerised host: its container as podman sees it, /health, and the patches the
    file inside the container carries (read by exec, as a rollout reads it)."""
    container = sandbox_containers.inspect_container(layout, record.name)
    notes: list[str] = []
    states: list[PatchState] = []
    running = container is not None and container.running
    if container is None:
        notes.append(f"no container (run `{UP}`)")
    elif running:
        states, notes = _patch_states(host, patches)
    else:
        notes.append(f"container {container.name} is {container.status}")
    health, detail = health_of(engine_url(record.port)) if running else (None, "not running")
    return HostStatus(
        host=record.name,
        port=record.port,
        url=engine_url(record.port),
        pid=None,
        health=health,
        health_detail=detail,
        patches=tuple(states),
        ssh=record.ssh,
        ssh_running=None if record.ssh is None else sshd_pid(layout, record) is not None,
        log_file=sandbox_containers.LOG_FILE,
        install="editable",
        checkout=sandbox_containers.CHECKOUT,
        notes=tuple(notes),
        container=container,
    )


def sandbox_status(layout: SandboxLayout, workspace: Workspace) -> StatusReport:
    """Each host's engine pid, port, /health answer, install shape (and checkout), patches its
    file carries, and its sshd.

    Patches are the workspace's and the bundled ones (`Workspace.available("patches")`).

    Raises:
        InputError: there is no sandbox, or its manifest is unreadable.
    """
    manifest = load_manifest(layout)
    if manifest is None:
        raise InputError(
            f"no sandbox in {layout.root}",
            hint=f"create one with `{UP}`",
        )
    inventory = sandbox_inventory(layout, manifest, over_ssh=False)
    patches, notes = _workspace_patches(workspace)
    statuses = []
    for record in manifest.hosts:
        if manifest.containers:
            statuses.append(_container_status(layout, record, inventory.host(record.name), patches))
            continue
        pid = server_pid(layout, record.name)
        health, detail = (
            health_of(engine_url(record.port)) if pid is not None else (None, "not running")
        )
        host_notes: list[str] = []
        states: list[PatchState] = []
        shape: InstallShape | None = None
        if layout.python(record.name).exists():
            shape = installed_shape(venv_site_packages(host_venv_dir(layout.host_dir(record.name))))
            states, host_notes = _patch_states(inventory.host(record.name), patches)
        else:
            host_notes.append(f"no environment yet (run `{UP}`)")
        if shape is not None and shape != manifest.install:
            host_notes.append(
                f"installed as {shape}, though the sandbox was built with --install "
                f"{manifest.install} (its environment was there before)"
            )
        checkout = layout.checkout(record.name)
        statuses.append(
            HostStatus(
                host=record.name,
                port=record.port,
                url=engine_url(record.port),
                pid=pid,
                health=health,
                health_detail=detail,
                patches=tuple(states),
                ssh=record.ssh,
                ssh_running=None if record.ssh is None else sshd_pid(layout, record) is not None,
                log_file=str(layout.log_file(record.name)),
                install=shape,
                checkout=str(checkout) if shape == "editable" else None,
                notes=tuple(host_notes),
            )
        )
    written = tuple(p for p in (layout.inventory, layout.ssh_inventory) if p.exists())
    router = (
        None if manifest.router is None else RouterStatus(manifest.router.url, router_pid(layout))
    )
    return StatusReport(
        layout.root,
        tuple(statuses),
        written,
        tuple(notes),
        manifest.install,
        manifest.containers,
        router,
        unit_statuses(manifest.units, statuses),
        manifest.engine,
        manifest.tp,
        manifest.live,
    )
