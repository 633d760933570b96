"""`opspatch smoke`: the playbook's smoke decode and log scan on each host, changing nothing.

Hosts are visited in parallel (bounded); each result is a value, an unreachable host included.
Nothing is locked or recorded: a smoke is a question, not a change.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from opspatch.core.host import Host
from opspatch.core.jsonrecord import JsonRecord
from opspatch.core.policy import Playbook
from opspatch.errors import EXIT_HOST_FAILED, EXIT_OK, OpspatchError
from opspatch.hosts.engine import SmokeResult
from opspatch.runs.fleet.connect import TransportFactory
from opspatch.runs.fleet.executor import map_hosts
from opspatch.runs.fleet.recorder import NullRecorder
from opspatch.runs.fleet.session import HostSession, NoProgress, describe_error


@dataclass(frozen=True)
class HostSmoke(JsonRecord):
    """One host's smoke: the result, or why it could not be run. Its JSON is written by hand:
    two shapes (a result's keys after `host` and `ok`, or only the failures), not its fields."""

    host: str
    result: SmokeResult | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.result is not None and self.result.ok

    @property
    def failures(self) -> tuple[str, ...]:
        if self.result is None:
            return (self.error or "no result",)
        return self.result.failures

    def to_json(self) -> dict[str, Any]:
        if self.result is None:
            return {"host": self.host, "ok": False, "failures": list(self.failures)}
        return {"host": self.host, "ok": self.ok, **self.result.to_json()}


@dataclass(frozen=True)
class SmokeReport(JsonRecord):
    hosts: tuple[HostSmoke, ...]

    @property
    def exit_code(self) -> int:
        return EXIT_OK if all(h.ok for h in self.hosts) else EXIT_HOST_FAILED


def smoke_hosts(
    hosts: Sequence[Host], playbook: Playbook, *, factory: TransportFactory
) -> SmokeReport:
    """Run the smoke decode on every host (at most `max_in_flight` at once)."""

    def one(name: str) -> HostSmoke:
        host = by_name[name]
        with HostSession(
            host, factory, playbook, recorder=NullRecorder(), progress=NoProgress()
        ) as session:
            try:
                return HostSmoke(name, session.engine.smoke(log_offset=None))
            except OpspatchError as exc:
                return HostSmoke(name, None, describe_error(exc))

    by_name = {h.name: h for h in hosts}
    results = map_hosts(one, list(by_name), limit=playbook.max_in_flight or len(hosts) or 1)
    return SmokeReport(tuple(results[h.name] for h in hosts))
