"""`opspatch smoke`: the playbook's smoke decode and log scan on each host, changing nothing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from opspatch.core.codec import Record
from opspatch.core.host import Host
from opspatch.core.policy import Playbook
from opspatch.core.remedy import remedy_text
from opspatch.core.vocabulary import Command
from opspatch.errors import EXIT_HOST_FAILED, EXIT_OK, OpspatchError
from opspatch.hosts.engine import SmokeResult
from opspatch.runs.fleet.connect import TransportFactory
from opspatch.runs.fleet.executor import CANCELLED
from opspatch.runs.fleet.recorded import unrecorded_run
from opspatch.runs.fleet.session import HostSession, Progress, describe_error
from opspatch.runs.judgments.units import serving_heads


@dataclass(frozen=True)
class HostSmoke(Record):
    """One host's smoke: the result, or why it could not be run. Its JSON is written by hand:
    two shapes (a result's keys after `host` and `ok`, or only the failures), not its fields."""

    host: str
    result: SmokeResult | None
    error: str | None = None
    unit: str | None = None
    """The unit `host` is the head of: the result is the unit's."""

    @property
    def ok(self) -> bool:
        return self.result is not None and self.result.ok

    @property
    def failures(self) -> tuple[str, ...]:
        if self.result is None:
            return (self.error or "no result",)
        return self.result.failures

    def to_json(self) -> dict[str, Any]:
        unit = {"unit": self.unit} if self.unit is not None else {}
        if self.result is None:
            return {"host": self.host, **unit, "ok": False, "failures": list(self.failures)}
        return {"host": self.host, **unit, "ok": self.ok, **self.result.to_json()}


@dataclass(frozen=True)
class SmokeReport(Record):
    hosts: tuple[HostSmoke, ...]

    @property
    def exit_code(self) -> int:
        return EXIT_OK if all(h.ok for h in self.hosts) else EXIT_HOST_FAILED


def smoke_hosts(
    hosts: Sequence[Host],
    playbook: Playbook,
    *,
    factory: TransportFactory,
    progress: Progress | None = None,
) -> SmokeReport:
    """The smoke decode on every server (a unit on its head); after a first Ctrl-C no more
    hosts are started, each saying so."""
    hosts = serving_heads(
        hosts, command="smoke", whole=lambda unit: remedy_text(Command.SMOKE, hosts=unit.name)
    )
    units = {h.name: h.unit.name for h in hosts if h.unit is not None}

    def one(session: HostSession) -> HostSmoke:
        unit = units.get(session.name)
        try:
            return HostSmoke(session.name, session.engine.smoke(log_offset=None), unit=unit)
        except OpspatchError as exc:
            return HostSmoke(session.name, None, describe_error(exc), unit=unit)

    with unrecorded_run(
        Command.SMOKE, hosts=hosts, factory=factory, playbook=playbook, progress=progress
    ) as fleet:
        results = fleet.visit(one, limit=playbook.max_in_flight or len(hosts) or 1)
    return SmokeReport(
        tuple(
            results.get(h.name)
            or HostSmoke(h.name, None, f"not started: {CANCELLED}", unit=units.get(h.name))
            for h in hosts
        )
    )
