"""Whether a unit (one multi-node server) is uniform: one release, one pre-image of every target."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from opspatch.core.host import Host, Unit
from opspatch.core.remedy import remedy_text
from opspatch.core.vocabulary import Command, Word
from opspatch.errors import UnitRefused
from opspatch.hosts.results import HostInspection


class UnitFact(Word):
    """What can differ between the nodes of a unit."""

    RELEASE = "release"
    """The installed SGLang release (`sglang` distribution version)."""
    PRE_IMAGE = "pre-image"
    """The sha256 of a target file's bytes before the patch (None: the node has no such file)."""
    UNREAD = "unread"
    """The node was not inspected: nothing can be said of it, so the unit is not uniform."""


@dataclass(frozen=True)
class NodeReading:
    """Keyed by target's module, else path: install paths may differ between nodes."""

    host: str
    release: str | None
    files: Mapping[str, str | None]

    @classmethod
    def read(cls, host: str, inspections: Mapping[str, HostInspection]) -> NodeReading:
        release = None
        files: dict[str, str | None] = {}
        for target, seen in inspections.items():
            release = release or seen.facts.sglang_version
            if release is None and seen.module is not None:
                release = seen.module["distribution_version"]
            files[target] = seen.file.sha256
        return cls(host, release, files)


@dataclass(frozen=True)
class Difference:
    """`key`: the target for a pre-image; `value` the odd node's, `expected` the others'."""

    node: str
    fact: UnitFact
    key: str
    value: str | None
    expected: str | None
    agreeing: tuple[str, ...]

    def describe(self) -> str:
        """`sandbox-02: release 0.5.24, the others (sandbox-01) 0.5.23`."""
        others = ", ".join(self.agreeing)
        if self.fact is UnitFact.UNREAD:
            return f"{self.node}: not inspected"
        what = "release" if self.fact is UnitFact.RELEASE else f"{self.key} pre-image sha256"
        return (
            f"{self.node}: {what} {_shown(self.value)}, the others ({others}) "
            f"{_shown(self.expected)}"
        )


@dataclass(frozen=True)
class Uniform:
    """Every node of `unit` runs `release` and holds the same pre-image of every target."""

    unit: str
    release: str | None
    files: Mapping[str, str | None]

    def describe(self) -> str:
        return f"unit {self.unit} is uniform (release {_shown(self.release)})"


@dataclass(frozen=True)
class NotUniform:
    """The nodes of `unit` differ: each difference names the odd node and the value."""

    unit: str
    differences: tuple[Difference, ...]

    @property
    def odd_nodes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(d.node for d in self.differences))

    def describe(self) -> str:
        """One line per difference, after the unit: what a refusal says."""
        lines = [f"unit {self.unit} is not uniform:"]
        lines += [f"  {d.describe()}" for d in self.differences]
        return "\n".join(lines)


UnitJudgment = Uniform | NotUniform


def judge_unit(unit: Unit, readings: Mapping[str, NodeReading]) -> UnitJudgment:
    """A node with no reading is a difference (`UNREAD`); the release is compared first."""
    differences: list[Difference] = [
        Difference(host, UnitFact.UNREAD, "", None, None, ())
        for host in unit.hosts
        if host not in readings
    ]
    read = [readings[h] for h in unit.hosts if h in readings]
    if not read:
        return NotUniform(unit.name, tuple(differences))
    differences += _odd(read, UnitFact.RELEASE, "release", {r.host: r.release for r in read})
    targets = list(dict.fromkeys(key for r in read for key in r.files))
    for target in targets:
        values = {r.host: r.files.get(target) for r in read}
        differences += _odd(read, UnitFact.PRE_IMAGE, target, values)
    if differences:
        return NotUniform(unit.name, tuple(differences))
    return Uniform(unit.name, read[0].release, dict(read[0].files))


def _odd(
    read: list[NodeReading], fact: UnitFact, key: str, values: Mapping[str, str | None]
) -> list[Difference]:
    """Against the most common value (a tie: the first node's in rank order)."""
    from opspatch.runs.judgments.views import most_common  # the status views: off `apply --file`

    expected = most_common([values[r.host] for r in read])
    agreeing = tuple(r.host for r in read if values[r.host] == expected)
    return [
        Difference(r.host, fact, key, values[r.host], expected, agreeing)
        for r in read
        if values[r.host] != expected
    ]


def _shown(value: str | None) -> str:
    return "(none)" if value is None else value


# ---------------------------------------------------------------------------------------------
# the selection: whole units, never a node alone


@dataclass(frozen=True)
class Selected:
    """A unit some selected hosts belong to, and which of its nodes they are (rank order)."""

    unit: Unit
    taken: tuple[str, ...]

    @property
    def left_out(self) -> tuple[str, ...]:
        return tuple(h for h in self.unit.hosts if h not in self.taken)

    @property
    def whole(self) -> bool:
        return not self.left_out


def selected_units(hosts: Sequence[Host]) -> tuple[Selected, ...]:
    """Each in its own inventory (two inventories may both name a unit `u1`)."""
    found: dict[tuple[str, str], Unit] = {}
    taken: dict[tuple[str, str], list[str]] = {}
    for host in hosts:
        if host.unit is None:
            continue
        key = (host.inventory, host.unit.name)
        found.setdefault(key, host.unit)
        taken.setdefault(key, []).append(host.name)
    return tuple(
        Selected(unit, tuple(h for h in unit.hosts if h in taken[key]))
        for key, unit in found.items()
    )


def serving_heads(
    hosts: Sequence[Host], *, command: str, whole: Callable[[Unit], str]
) -> list[Host]:
    """A unit by its head (its other nodes serve only a dummy `/health`), for `smoke` and `judge`;
    `UnitRefused` for a node selected without its head."""
    names = {host.name for host in hosts}
    stray = [(h, h.unit) for h in hosts if h.unit is not None and h.unit.head not in names]
    if stray:
        said = "; ".join(
            f"{h.name} is {unit.describe(h.name)}, whose head is {unit.head}" for h, unit in stray
        )
        units = {unit.name: unit for _, unit in stray}
        raise UnitRefused(
            f"{command}: {said}: a node that is not its unit's head serves no prompts (only a "
            "dummy /health); the unit answers through its head",
            hint=f"{command} the unit: "
            + "; ".join(f"`{whole(unit)}`" for _, unit in sorted(units.items())),
        )
    return [h for h in hosts if h.unit is None or h.unit.head == h.name]


def target_of(host: Host) -> str:
    return host.unit.name if host.unit is not None else host.name


def recover_remedy(host: Host) -> str:
    """Recover takes a unit whole: a hint naming the node would name a refused command."""
    return remedy_text(Command.RECOVER, hosts=target_of(host))


def nodes_of(unit: Unit) -> str:
    """`sandbox-01 (head), sandbox-02`: the unit's nodes in rank order."""
    return ", ".join(f"{h} (head)" if h == unit.head else h for h in unit.hosts)


def unit_refusal(
    hosts: Sequence[Host], *, command: str, whole: Callable[[Unit], str]
) -> UnitRefused | None:
    """Some but not all nodes of a unit taken: refused before anything changes (`whole(unit)`: the
    remedy)."""
    split = [s for s in selected_units(hosts) if not s.whole]
    if not split:
        return None
    what = "; ".join(
        f"unit {s.unit.name} is {nodes_of(s.unit)}, and the selection leaves out "
        f"{', '.join(s.left_out)}"
        for s in split
    )
    return UnitRefused(
        f"{command} would change part of a multi-node server ({what}): a unit is one server: a "
        "node patched alone runs other code than the rest of it, and a node restarted alone "
        "cannot rejoin its group; nothing was changed",
        hint="select every node of the unit: " + "; ".join(f"`{whole(s.unit)}`" for s in split),
    )


def require_whole_units(
    hosts: Sequence[Host], command: Command | str, whole: Callable[[Unit], str] | None = None
) -> None:
    """`command`: what is refused (a `Command`, whose remedy is the default `whole`)."""
    refused = unit_refusal(
        hosts,
        command=str(command),
        whole=whole or (lambda unit: remedy_text(Command(command), hosts=unit.name)),
    )
    if refused is not None:
        raise refused
