"""Every command through the one fleet run (issue 32): the on-halt rollback of an apply as a
second run of the fleet engine (its batches, its Ctrl-C, its lease check), and `smoke`, `adopt`
and sync's left-alone run through `FleetRun` (its sessions, executor, recorder and Ctrl-C), with
container identity said by the transport, not found by `isinstance`.

The hosts are `tests/scriptedkit.py`'s: a scripted transport whose file operations run the real
host agent on real files, the engine scripted. The operator's first Ctrl-C is the flag its
SIGINT handler sets (`Cancellation.request`), as test_runs_scripted drives it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from opspatch.config.patches import load_patch
from opspatch.core.host import ContainerSettings
from opspatch.core.policy import BatchSize, Playbook, TeamSettings
from opspatch.hosts.containers import ContainerIdentity
from opspatch.hosts.diagnosis import ModuleDiagnosis
from opspatch.hosts.results import RemoteFile
from opspatch.hosts.transport.base import ClosesOnExit, Command, CommandResult
from opspatch.hosts.transport.container import ContainerTransport
from opspatch.hosts.transport.local import LocalTransport
from opspatch.hosts.transport.scripted import ScriptedTransport
from opspatch.ledger.store import Ledger
from opspatch.runs.commands.apply import apply_to_hosts
from opspatch.runs.fleet import fleetrun
from opspatch.runs.fleet.executor import Cancellation
from opspatch.runs.report import RunReport
from tests.scriptedkit import (
    PRISTINE,
    REPO,
    FakeHost,
    Fleet,
    Notices,
    desired_everywhere,
    mark_patch,
    sha,
)

pytestmark = pytest.mark.scripted

ROLLBACK_RUN = {"canary": 0, "batch": BatchSize(count=10), "max_failures": 1}


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    """Four scripted hosts, h1..h4, with the stand-in's pristine file."""
    patch = load_patch(REPO / "patches" / "eagle-init-guard.toml")
    hosts = [FakeHost.installed(f"h{index}", tmp_path / f"h{index}") for index in range(1, 5)]
    ledger = Ledger.open(tmp_path / "ledger.sqlite3")
    try:
        yield Fleet(hosts, ledger, patch)
    finally:
        ledger.close()


@pytest.fixture
def ctrl_c(monkeypatch: pytest.MonkeyPatch) -> list[Cancellation]:
    """Every fleet run's Ctrl-C flag, in the order the runs were made (the last: the newest)."""
    made: list[Cancellation] = []

    def fresh() -> Cancellation:
        made.append(Cancellation())
        return made[-1]

    monkeypatch.setattr(fleetrun, "Cancellation", fresh)
    return made


def wait_for(done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 60  # bounds a broken test only
    while not done():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def apply(fleet: Fleet, playbook: Playbook, progress: Notices | None = None) -> RunReport:
    return apply_to_hosts(
        fleet.patch,
        [h.host() for h in fleet.hosts],
        playbook,
        factory=fleet.factory,
        ledger=fleet.ledger,
        progress=progress,
    )


# -- the on-halt rollback: a second fleet run ---------------------------------------------------


def test_the_on_halt_rollback_runs_in_the_playbooks_batches_and_a_first_ctrl_c_stops_it(
    fleet: Fleet, ctrl_c: list[Cancellation]
) -> None:
    """h4's smoke fails: the run halts with h1..h3 applied, and rolls them back two at a time
    (the playbook's max_in_flight). The operator's first Ctrl-C while h1 and h2 are being
    restored lets them finish and starts no more: h3 keeps the patch, `applied`, saying it was
    not rolled back. Before, the rollback was a serial loop that no Ctrl-C stopped."""
    h1, h2, h3, h4 = fleet.hosts
    h4.smoke_ok = False
    restoring: list[str] = []

    def two_restores_then_ctrl_c(name: str) -> Callable[[str, dict[str, Any]], None]:
        def fault(op: str, args: dict[str, Any]) -> None:
            if op == "restore":
                restoring.append(name)
                if len(restoring) == 1:  # both hosts of the batch are in flight at once
                    wait_for(lambda: len(restoring) >= 2, "the rollback was not two at a time")
                    ctrl_c[-1].request()
                else:  # the second holds its slot until the Ctrl-C is in, however slow the first
                    wait_for(lambda: ctrl_c[-1].requested, "no Ctrl-C was requested")
            return None

        return fault

    for fake in (h1, h2, h3):
        fake.fault = two_restores_then_ctrl_c(fake.name)
    notices = Notices()
    playbook = Playbook(**ROLLBACK_RUN, max_in_flight=2, on_halt="rollback-run")

    report = apply(fleet, playbook, notices)

    assert fleet.outcomes(report) == {
        "h1": "rolled-back",
        "h2": "rolled-back",
        "h3": "applied",
        "h4": "rolled-back",
    }
    assert sorted(restoring) == ["h1", "h2"] and "restore" not in h3.requests
    kept = report.hosts[2]
    assert "on_halt = rollback-run did not roll it back: the operator cancelled" in (
        kept.note or ""
    )
    assert report.halted is not None
    assert "the rollback (on_halt = rollback-run) stopped: cancelled by the operator" in (
        report.halted
    )
    assert any(line.startswith("Ctrl-C: no more hosts will be started") for line in notices.lines)
    assert sha(h3.file.read_bytes()) != PRISTINE
    assert all(sha(h.file.read_bytes()) == PRISTINE for h in (h1, h2, h4))
    recorded = fleet.ledger.get_run(str(report.run_id))
    assert str(recorded.host("h3").outcome) == "applied"
    assert str(recorded.host("h1").outcome) == "rolled-back"
    assert report.exit_code == 1


def test_the_on_halt_rollback_starts_no_host_another_live_run_leases_now(
    fleet: Fleet, ctrl_c: list[Cancellation]
) -> None:
    """While h4 fails, bob's run takes h2's lease over from this one (as a recover of a run it
    believes dead would): the rollback checks each host's lease before it starts any, leaves
    h2 as it is, `applied`, naming bob's run, and rolls back h1 and h3. Before, it restored
    every host this run applied without asking whose it was now."""
    h1, h2, h3, h4 = fleet.hosts
    h4.smoke_ok = False
    bob: list[str] = []

    def bob_takes_h2(op: str, args: dict[str, Any]) -> None:
        if op == "smoke" and not bob:
            (ours,) = fleet.ledger.list_runs()
            (lease,) = [h for h in fleet.ledger.leases_of([ours.run_id]) if h.host == "h2"]
            bob.append(
                fleet.ledger.begin_run(
                    command="recover",
                    patch_id=None,
                    patch_sha256=None,
                    operator="bob@desk",
                    command_line="opspatch recover --run ...",
                    hosts=["h2"],
                )
            )
            grant = fleet.ledger.take_leases(
                bob[0], {"h2": lease.identity}, expires_after=3600, taking_over=[ours.run_id]
            )
            assert grant.refused == ()
        return None

    h4.fault = bob_takes_h2
    playbook = Playbook(
        **ROLLBACK_RUN,
        max_in_flight=1,
        on_halt="rollback-run",
        team=TeamSettings(lease_expiry=3600),  # no heartbeat beats within the test
    )

    report = apply(fleet, playbook)

    assert fleet.outcomes(report) == {
        "h1": "rolled-back",
        "h2": "applied",
        "h3": "rolled-back",
        "h4": "rolled-back",
    }
    kept = report.hosts[1]
    assert f"on_halt = rollback-run did not roll it back: h2 is leased to run {bob[0]}" in (
        kept.note or ""
    )
    assert "restore" not in h2.requests
    assert sha(h2.file.read_bytes()) != PRISTINE
    assert all(sha(h.file.read_bytes()) == PRISTINE for h in (h1, h3, h4))


# -- smoke, adopt, sync's left-alone run through FleetRun ---------------------------------------


def test_smoke_goes_through_the_fleet_run_and_a_first_ctrl_c_stops_starting_hosts(
    fleet: Fleet, ctrl_c: list[Cancellation]
) -> None:
    """The operator's first Ctrl-C during h1's smoke: h1 finishes, h2..h4 are never smoked and
    say so. Before, smoke was its own loop with no Ctrl-C of its own: every host was smoked."""
    from opspatch.runs.commands.smoke import smoke_hosts

    def ctrl_c_during_the_smoke(op: str, args: dict[str, Any]) -> None:
        if op == "smoke":
            ctrl_c[-1].request()
        return None

    fleet.hosts[0].fault = ctrl_c_during_the_smoke
    report = smoke_hosts(
        [h.host() for h in fleet.hosts], Playbook(max_in_flight=1), factory=fleet.factory
    )

    assert [(h.host, h.ok) for h in report.hosts] == [
        ("h1", True),
        ("h2", False),
        ("h3", False),
        ("h4", False),
    ]
    assert report.hosts[1].failures == ("not started: " + fleetrun.CANCELLED,)
    assert all("smoke" not in h.requests for h in fleet.hosts[1:])
    assert report.exit_code == 1


def _edited(fake: FakeHost, pristine: bytes, live: bytes) -> ModuleDiagnosis:
    """What adopt read on `fake`: its module's file, `live`, whose pristine text is `pristine`."""
    path = str(fake.file)
    return ModuleDiagnosis(
        "sglang.srt.speculative.eagle_worker_v2",
        file=RemoteFile(
            path, path, None, live, sha(live), len(live), 0o644, 0, 0, None, None, 0, 1
        ),
        server_older_than_file=False,
    )


def test_adopt_records_its_hosts_through_the_fleet_run_and_honours_a_ctrl_c(
    fleet: Fleet, ctrl_c: list[Cancellation], monkeypatch: pytest.MonkeyPatch
) -> None:
    """adopt's recording is a fleet run: without a Ctrl-C each edited host is recorded staged
    (its server runs the old code) with its file version; after one, no host is recorded as
    adopted: each is `skipped`, not started, and the ledger holds no file version. Before,
    adopt recorded its hosts in a loop of its own that no Ctrl-C reached."""
    from opspatch.runs.commands.adopt import Pristine, _record

    pristine = fleet.hosts[0].file.read_bytes()
    live = pristine + b"# by hand\n"
    hosts = fleet.hosts[:2]
    edited = {h.name: (_edited(h, pristine, live), Pristine(pristine, "test")) for h in hosts}
    args = (fleet.ledger, fleet.patch, [h.host() for h in hosts], edited, (), {"h1", "h2"})

    done = _record(*args, fleet.factory)
    assert fleet.outcomes(done) == {"h1": "staged", "h2": "staged"}
    assert [s.step for s in done.hosts[0].steps] == ["read", "adopt"]
    assert len(fleet.ledger.file_history("h1")) == 1

    class CancelledAtOnce(Cancellation):
        def __init__(self) -> None:
            super().__init__()
            self.request()  # the operator's Ctrl-C as the run starts

    monkeypatch.setattr(fleetrun, "Cancellation", CancelledAtOnce)
    cancelled = _record(*args, fleet.factory)
    assert fleet.outcomes(cancelled) == {"h1": "skipped", "h2": "skipped"}
    assert cancelled.hosts[0].reason == "not-started"
    assert len(fleet.ledger.file_history("h1")) == 1  # the first adoption's only
    recorded = fleet.ledger.get_run(str(cancelled.run_id))
    assert str(recorded.host("h2").outcome) == "skipped"


def test_adopt_on_the_nodes_of_a_unit_names_the_restart_of_the_unit(fleet: Fleet) -> None:
    """An edit adopted on both nodes of a unit: the restart that proves it is named over the
    unit (a node restarted alone is refused). Before, each node's note named `restart --hosts
    NODE`."""
    from opspatch.core.host import Unit
    from opspatch.runs.commands.adopt import Pristine, _record

    pristine = fleet.hosts[0].file.read_bytes()
    live = pristine + b"# by hand\n"
    unit = Unit("u1", ("h1", "h2"))
    hosts = [replace(h.host(), unit=unit) for h in fleet.hosts[:2]]
    edited = {
        h.name: (_edited(h, pristine, live), Pristine(pristine, "test")) for h in fleet.hosts[:2]
    }
    done = _record(fleet.ledger, fleet.patch, hosts, edited, (), {"h1", "h2"}, fleet.factory)
    assert fleet.outcomes(done) == {"h1": "staged", "h2": "staged"}
    for outcome in done.hosts:  # the diagnosis found no server: restart starts it
        assert "`opspatch restart --hosts u1` starts it" in (outcome.note or ""), outcome


@dataclass
class Spied:
    command: str
    hosts: tuple[str, ...]
    decided: dict[str, str]


def test_syncs_left_alone_run_is_a_fleet_run_that_starts_no_host(
    fleet: Fleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second patch's hosts, left alone after the first patch's run failed, are decided in
    a fleet run (`FleetRun.decide`), which starts none of them and records each as it reports
    it. Before, sync recorded them in a loop of its own."""
    from opspatch.runs.commands import sync
    from opspatch.runs.fleet import recorded

    runs: list[Spied] = []

    class Spy(fleetrun.FleetRun):
        def decide(self, outcomes: Any) -> None:
            said = {n: str(o.outcome) for n, o in outcomes.items()}
            runs.append(Spied(self.command, tuple(self.names), said))
            super().decide(outcomes)

    monkeypatch.setattr(recorded, "FleetRun", Spy)
    fleet.hosts = fleet.hosts[:3]
    mark = mark_patch(tmp_path)
    fleet.hosts[0].smoke_ok = False
    desired = desired_everywhere(fleet, fleet.patch, mark)
    hosts = list(desired.hosts.values())
    report = sync.sync_fleet(
        desired,
        hosts,
        [],
        Playbook(canary=1, batch=BatchSize(count=10), max_failures=1),
        factory=fleet.factory,
        ledger=fleet.ledger,
    )

    (left,) = report.left_alone
    assert runs == [Spied("sync", ("h1", "h2", "h3"), dict.fromkeys(("h1", "h2", "h3"), "skipped"))]
    assert fleet.outcomes(left) == dict.fromkeys(("h1", "h2", "h3"), "skipped")
    recorded = fleet.ledger.get_run(str(left.run_id))
    assert recorded.summary.command == "sync"
    assert all(str(recorded.host(n).outcome) == "skipped" for n in ("h1", "h2", "h3"))


# -- container identity is the transport's ------------------------------------------------------


class FakeRuntime(ClosesOnExit):
    """A host whose container runtime answers `container inspect` with one running container."""

    def __init__(self) -> None:
        self.host = "gpu-01"
        self.exec_count = 0

    def run(self, command: Command, *, stdin: bytes = b"", timeout: float) -> CommandResult:
        self.exec_count += 1
        if command.argv[1:3] == ("container", "inspect"):
            out = (
                b'[{"Id": "c0ffee", "Created": "today", "ImageName": "sglang:1", '
                b'"State": {"Running": true, "Status": "running"}, "Config": {"Labels": {}}}]'
            )
            return CommandResult(command.render(), 0, out, b"", 0.0)
        return CommandResult(command.render(), 0, b"", b"", 0.0)


def test_the_transport_says_which_container_its_commands_run_in() -> None:
    """`Transport.container`: None on the host itself; the container transport's pinned
    identity once it ran a command (the session and status read it, never `isinstance`)."""
    assert LocalTransport("gpu-01").container is None
    assert ScriptedTransport(lambda op, args: {}, host="gpu-01").container is None
    transport = ContainerTransport(FakeRuntime(), ContainerSettings("podman", "sglang-0"))
    assert transport.container is None  # nothing pinned before the first command
    transport.run(Command(("true",)), timeout=5)
    seen = transport.container
    assert isinstance(seen, ContainerIdentity)
    assert (seen.runtime, seen.name, seen.id, seen.image) == (
        "podman",
        "sglang-0",
        "c0ffee",
        "sglang:1",
    )
