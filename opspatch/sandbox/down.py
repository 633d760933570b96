"""`opspatch sandbox down [--purge]`: stop every engine and sshd by pid; purge on request."""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opspatch.core.codec import Record
from opspatch.errors import InputError
from opspatch.hosts.agent.processes import stop_process_tree
from opspatch.sandbox import containers as sandbox_containers
from opspatch.sandbox.layout import Progress, SandboxLayout, quiet
from opspatch.sandbox.manifest import HostRecord, Manifest, load_manifest
from opspatch.sandbox.processes import engine_pid, sandbox_lock, server_pid, sshd_pid
from opspatch.sandbox.router import router_dir, stop_router
from opspatch.sandbox.sshd import SshdServer, stop_sshd


@dataclass(frozen=True)
class HostDown(Record):
    """What `down` did to one host: the engine pids it stopped and whether it stopped an sshd."""

    host: str
    stopped: tuple[int, ...]
    sshd_stopped: int | None
    container: str | None = None
    """What was done to the host's container: `stopped` or `removed` (None: nothing)."""
    pid: int | None = None
    """The engine stopped, by the pid `up` and `status` name (`server_pid`: its own Python, not
    the start command's shell whose tree was stopped)."""


@dataclass(frozen=True)
class DownReport:
    root: Path
    hosts: tuple[HostDown, ...]
    removed: tuple[Path, ...]
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "sandbox": str(self.root),
            "hosts": [h.to_json() for h in self.hosts],
            "removed": [str(p) for p in self.removed],
            "notes": list(self.notes),
        }


def _host_names_on_disk(layout: SandboxLayout) -> list[str]:
    if not layout.hosts_dir.is_dir():
        return []
    return sorted(p.name for p in layout.hosts_dir.iterdir() if p.is_dir())


def sandbox_down(
    layout: SandboxLayout, *, purge: bool = False, progress: Progress = quiet
) -> DownReport:
    """Stop every sandbox engine (its process tree, by the pid in its pid file) and sshd (by the
    pid recorded for it); remove nothing unless `purge`, which also removes the host folders,
    the ssh folder, the manifest and the sandbox inventories.

    Hosts are taken from the manifest and from the host folders on disk, so an unreadable
    manifest still lets `down --purge` stop every engine and clean up.

    Raises:
        InputError: another sandbox command is running.
    """
    if not layout.root.exists():
        cleaned = _purge_inventories(layout) if purge else ()
        return DownReport(layout.root, (), cleaned, ("there is no sandbox here",))
    notes: list[str] = []
    with sandbox_lock(layout):
        try:
            manifest = load_manifest(layout) or Manifest()
        except InputError as exc:
            if not purge:
                raise
            notes.append(f"manifest ignored: {exc.message}")
            manifest = Manifest()
        records = {record.name: record for record in manifest.hosts}
        names = list(records) + [n for n in _host_names_on_disk(layout) if n not in records]
        results = []
        done = (
            _down_containers(layout, names, purge=purge, progress=progress)
            if manifest.containers
            else {}
        )
        for name in names:
            stopped: tuple[int, ...] = ()
            root = None if manifest.containers else engine_pid(layout, name)
            server = None if root is None else server_pid(layout, name)
            if root is not None:
                progress(f"{name}: stopping the engine (pid {server})")
                # The host agent's own stop logic, the one `restart` uses: TERM the tree, wait,
                # KILL what is left.
                stopped = tuple(stop_process_tree(root, manifest.stop_timeout))
            sshd_stopped = _stop_host_sshd(layout, records.get(name), progress)
            results.append(HostDown(name, stopped, sshd_stopped, done.get(name), pid=server))
        router = stop_router(layout)
        if router is not None:
            progress(f"router: stopped (pid {router})")
        removed: tuple[Path, ...] = ()
        if purge:
            removed = _purge(layout)
    if purge:
        with contextlib.suppress(OSError):
            layout.lock_file.unlink()
            layout.root.rmdir()
    return DownReport(layout.root, tuple(results), removed, tuple(notes))


def _down_containers(
    layout: SandboxLayout, names: list[str], *, purge: bool, progress: Progress
) -> dict[str, str]:
    """Stop each host's container (its writable layer, a patched file with it, kept for the
    next `up`), or with `purge` remove it; what was done, per host."""
    env = sandbox_containers.podman_env(layout)
    done: dict[str, str] = {}
    for name in names:
        found = sandbox_containers.inspect_container(layout, name)
        if found is None:
            continue
        if purge:
            progress(f"{name}: removing container {found.name}")
            sandbox_containers.remove_container(layout, name, env)
            done[name] = "removed"
        elif found.running:
            progress(f"{name}: stopping container {found.name}")
            sandbox_containers.stop_container(layout, name, env)
            done[name] = "stopped"
    return done


def _stop_host_sshd(
    layout: SandboxLayout, record: HostRecord | None, progress: Progress
) -> int | None:
    if record is None or record.ssh is None:
        return None
    pid = sshd_pid(layout, record)
    if pid is None:
        return None
    progress(f"{record.name}: stopping sshd (pid {pid})")
    ssh = record.ssh
    stop_sshd(
        SshdServer(
            address=ssh.address,
            port=ssh.port or 0,
            pid=pid,
            workdir=layout.sshd_dir(record.name),
            host_public_key=ssh.host_public_key or "",
            log_file=layout.sshd_dir(record.name) / "sshd.log",
        )
    )
    return pid


def _purge_inventories(layout: SandboxLayout) -> tuple[Path, ...]:
    removed = []
    for path in (layout.inventory, layout.ssh_inventory):
        if path.exists():
            path.unlink()
            removed.append(path)
    return tuple(removed)


def _purge(layout: SandboxLayout) -> tuple[Path, ...]:
    removed = []
    for directory in (layout.hosts_dir, layout.ssh_dir, router_dir(layout)):
        if directory.exists():
            shutil.rmtree(directory)
            removed.append(directory)
    if layout.manifest.exists():
        layout.manifest.unlink()
        removed.append(layout.manifest)
    return tuple(removed) + _purge_inventories(layout)
