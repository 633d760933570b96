"""Multi-node servers in the sandbox (`opspatch sandbox up --units U --nodes N [--tp T]`)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from opspatch.core.remedy import remedy_text
from opspatch.core.vocabulary import Command
from opspatch.errors import InputError
from opspatch.sandbox import MAX_HOSTS
from opspatch.sandbox.layout import host_name
from opspatch.sandbox.manifest import Manifest, UnitRecord

DEFAULT_NODES = 2
UNIT_HINT = (
    f"run `{remedy_text(Command.SANDBOX_DOWN, purge=True)}` first to build the sandbox with "
    "another shape"
)


@dataclass(frozen=True)
class UnitShape:
    """What `--units U --nodes N --tp T` asks for: U servers of N nodes, T ranks per node."""

    units: int
    nodes: int = DEFAULT_NODES
    tp: int = 1

    @property
    def hosts(self) -> int:
        return self.units * self.nodes

    def describe(self) -> str:
        return f"--units {self.units} --nodes {self.nodes} --tp {self.tp}"


def unit_name(index: int) -> str:
    """`unit-01` for index 0."""
    return f"unit-{index + 1:02d}"


def check_unit_shape(shape: UnitShape) -> None:
    """Refuse counts below 1 and more hosts than a sandbox holds.

    Raises:
        InputError: a count below 1, or units x nodes above MAX_HOSTS.
    """
    for flag, value in (("--units", shape.units), ("--nodes", shape.nodes), ("--tp", shape.tp)):
        if value < 1:
            raise InputError(f"{flag} must be at least 1 (got {value})")
    if shape.hosts > MAX_HOSTS:
        raise InputError(
            f"--units {shape.units} --nodes {shape.nodes} is {shape.hosts} hosts; a sandbox "
            f"holds at most {MAX_HOSTS}",
            hint="each node is a sandbox host running its own engine process tree on this machine",
        )


def shape_of(units: tuple[UnitRecord, ...]) -> UnitShape | None:
    """The shape recorded units have (None: no units)."""
    if not units:
        return None
    return UnitShape(len(units), len(units[0].hosts), units[0].tp)


def planned_units(
    current: Manifest | None, shape: UnitShape | None, count: int | None
) -> tuple[UnitRecord, ...]:
    """The units the sandbox will have: the recorded ones (ports kept), or new ones of `shape`
    over hosts `sandbox-01..` (rendezvous ports not yet chosen: 0).

    Raises:
        InputError: `--count` with `--units`, or a shape other than an existing sandbox's.
    """
    recorded = current.units if current else ()
    built = shape_of(recorded)
    size = len(current.hosts) if current else 0
    if shape is not None and count is not None:
        raise InputError(
            "--count does not go with --units: a sandbox of units has units x nodes hosts",
            hint=f"drop --count ({shape.describe()} makes {shape.hosts} hosts)",
        )
    if shape is None:
        if built is not None and count is not None and count != size:
            raise InputError(
                f"the sandbox is {built.describe()} ({size} hosts); "
                f"`up --count {count}` would not reshape it",
                hint=UNIT_HINT,
            )
        return recorded
    check_unit_shape(shape)
    if current is not None and built != shape:
        what = built.describe() if built else f"{size} single-node host{'s' if size != 1 else ''}"
        raise InputError(
            f"the sandbox is {what}; `up {shape.describe()}` would not reshape it", hint=UNIT_HINT
        )
    if recorded:
        return recorded
    return tuple(
        UnitRecord(
            unit_name(u),
            tuple(host_name(u * shape.nodes + n) for n in range(shape.nodes)),
            tp=shape.tp,
        )
        for u in range(shape.units)
    )


def partly_running(units: tuple[UnitRecord, ...], running: Collection[str]) -> list[UnitRecord]:
    """The units some of whose nodes run and others not: `up` restarts each whole."""
    return [
        unit
        for unit in units
        if any(h in running for h in unit.hosts) and not all(h in running for h in unit.hosts)
    ]
