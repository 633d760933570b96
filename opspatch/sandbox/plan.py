"""What `opspatch sandbox up` will work to: the manifest planned from the recorded one and the
options given (pure; `up` then chooses ports and acts on it)."""

from __future__ import annotations

import getpass
from dataclasses import dataclass, replace

from opspatch.core.remedy import remedy_text
from opspatch.core.vocabulary import Command
from opspatch.errors import InputError
from opspatch.sandbox.dist import InstallShape
from opspatch.sandbox.layout import (
    DEFAULT_HOSTS,
    check_host_count,
    check_restart_seconds,
    host_name,
    ssh_address,
)
from opspatch.sandbox.manifest import HostRecord, Manifest, SshEndpoint, UnitRecord
from opspatch.sandbox.real.release import STANDIN, EngineChoice
from opspatch.sandbox.units import UnitShape, planned_units

PURGE = remedy_text(Command.SANDBOX_DOWN, purge=True)
"""The command that removes the sandbox, for hints."""


@dataclass(frozen=True)
class UpRequest:
    """What `up` was asked for; None: keep the sandbox's (or the default for a new one)."""

    count: int | None = None
    ssh: bool = False
    install: InstallShape | None = None
    containers: bool | None = None
    units: UnitShape | None = None
    restart_seconds: float | None = None
    engine: EngineChoice | None = None
    tp: int | None = None
    """Scheduler processes of each single-node server (a unit's are `units.tp`)."""
    live: bool | None = None
    router: bool = False


def planned_manifest(current: Manifest | None, asked: UpRequest) -> tuple[Manifest, set[str]]:
    """The manifest `up` will work to, and the names of hosts it adds (ports not yet chosen: 0).

    Raises:
        InputError: a count outside 1..MAX_HOSTS, fewer hosts than the sandbox has, another
            engine, install shape, unit shape or TP than the sandbox was built with, units or
            `--live` with containers, or what the chosen engine cannot do (named, with why).
    """
    unit_records = planned_units(current, asked.units, asked.count)
    count = sum(len(u.hosts) for u in unit_records) if unit_records else asked.count
    in_containers = _containers(current, asked)
    shape = _install_shape(current, asked.install, in_containers)
    engine = _engine(current, asked, shape, in_containers, unit_records)
    existing = current.hosts if current else ()
    wanted = count if count is not None else (len(existing) or DEFAULT_HOSTS)
    check_host_count(wanted)
    if wanted < len(existing):
        raise InputError(
            f"the sandbox has {len(existing)} hosts; `up --count {wanted}` would not remove any",
            hint=f"run `{PURGE}` first to build a smaller sandbox",
        )
    ssh_user = (current.ssh_user if current else None) or (getpass.getuser() if asked.ssh else None)
    records = list(existing)
    added = set()
    for index in range(len(existing), wanted):
        records.append(HostRecord(name=host_name(index), port=0))
        added.add(host_name(index))
    if ssh_user is not None:
        records = [
            record if record.ssh else replace(record, ssh=SshEndpoint(address=ssh_address(index)))
            for index, record in enumerate(records)
        ]
    live = current.live if asked.live is None and current else bool(asked.live)
    if live and in_containers:
        raise InputError(
            "--live does not go with --containers yet: the live plugin is installed into each "
            "host's environment before its engine starts, and a container's engine runs the "
            "image's environment, which holds no plugin (every live fix would be refused)",
            hint="drop --live (fixes then go out by restart), or drop --containers",
        )
    if unit_records and in_containers:
        raise InputError(
            "--units does not go with --containers yet (each node would need its own container)",
            hint=f"drop --containers, or `{PURGE}` first",
        )
    manifest = Manifest(
        tuple(records),
        ssh_user,
        shape,
        in_containers,
        current.router if current else None,  # like --ssh, it stays on for later `up`s
        unit_records,
        _restart_seconds(current, asked.restart_seconds, in_containers),
        engine,
        current.real if current else None,
        _tp(current, asked.tp, unit_records),
        live,
    )
    return manifest, added


def _containers(current: Manifest | None, asked: UpRequest) -> bool:
    moved = asked.containers is not None and current is not None
    if moved and current is not None and asked.containers != current.containers:
        built = "in podman containers" if current.containers else "without containers"
        raise InputError(
            f"the sandbox's engines run {built}; `up` would not move them",
            hint=f"run `{PURGE}` first to build it the other way",
        )
    return bool(asked.containers) if current is None else current.containers


def _install_shape(
    current: Manifest | None, install: InstallShape | None, in_containers: bool
) -> InstallShape:
    if current is not None and install is not None and install != current.install:
        raise InputError(
            f"the sandbox's hosts are installed as {current.install}; "
            f"`up --install {install}` would not reinstall them",
            hint=f"run `{PURGE}` first to build it with --install {install}",
        )
    if in_containers and install == "wheel":
        raise InputError(
            "`--containers` installs each engine editable in the image's checkout, as the "
            "upstream image does; `--install wheel` does not go with it",
            hint="drop --install (or use --install editable)",
        )
    return install or (current.install if current else ("editable" if in_containers else "wheel"))


def _engine(
    current: Manifest | None,
    asked: UpRequest,
    shape: InstallShape,
    in_containers: bool,
    units: tuple[UnitRecord, ...],
) -> EngineChoice:
    """The sandbox's engine: the one asked for, else the recorded one, else the stand-in.

    Raises:
        InputError: another engine than the sandbox's, or what real SGLang cannot do here.
    """
    recorded = current.engine if current else None
    engine = asked.engine or recorded or STANDIN
    if recorded is not None and engine != recorded:
        raise InputError(
            f"the sandbox runs {recorded.label}; `up --engine {engine.label}` would not replace "
            "its engines",
            hint=f"run `{PURGE}` first to build it with --engine {engine.label}",
        )
    if not engine.real:
        return engine
    reasons = (
        (
            in_containers,
            "--containers",
            "the engine image is built offline with the stand-in in it; an image holding real "
            "SGLang's 3 GB environment is not built yet",
        ),
        (
            shape == "editable",
            "--install editable",
            "the real engine is installed from its release's wheel by pip (each host its own "
            "copy); an editable checkout needs SGLang's git repository, which the sandbox does "
            "not fetch",
        ),
    )
    for refused, option, why in reasons:
        if refused:
            raise InputError(
                f"{option} does not go with --engine {engine.label}: {why}",
                hint=f"drop {option}, or use --engine standin",
            )
    return engine


def _tp(current: Manifest | None, tp: int | None, units: tuple[UnitRecord, ...]) -> int:
    """The single-node servers' TP: `tp`, else the sandbox's, else 1 (units keep their own).

    Raises:
        InputError: below 1, or another TP than the sandbox's servers run.
    """
    if tp is None or units:
        return current.tp if current else 1
    if tp < 1:
        raise InputError(f"--tp must be at least 1 (got {tp})")
    if current is not None and current.hosts and tp != current.tp:
        raise InputError(
            f"the sandbox's servers run {current.tp} TP rank(s); `up --tp {tp}` would not "
            "restart them",
            hint=f"run `{PURGE}` first to build it with --tp {tp}",
        )
    return tp


def _restart_seconds(current: Manifest | None, wanted: float | None, in_containers: bool) -> float:
    """The start delay the sandbox will have: `wanted`, else the sandbox's, else none.

    Raises:
        InputError: a delay out of range, or one with containers (their environment is baked
            into the image).
    """
    if wanted is None:
        return current.restart_seconds if current else 0.0
    check_restart_seconds(wanted)
    if wanted and in_containers:
        raise InputError(
            "--restart-seconds does not go with --containers yet (the engine's environment is "
            "baked into the image)",
            hint=f"drop --restart-seconds, or `{PURGE}` and build without --containers",
        )
    return wanted
