"""The host lock as a fence: every exec of a run that holds a host's lock re-asserts it first
(`hosts.channel`), so a controller that is alive keeps its lock however long its run takes (and
however long it is cut off from the ledger), and an exec sent after another run took the lock
over is refused before it does anything. A recover of a run whose lease expired takes a host's
lock only once it expired, never by run id from a controller that may be alive.

Scripted hosts (tests/scriptedkit.py): real files, real state folders, the real agent's
lock; operator A's run in a thread, held inside an exec by the host's fault hook. A is cut off
from the ledger for real on PostgreSQL (its server session ended and its role kept out, as
behind a network cut); on SQLite, whose file cannot be cut, its heartbeat is made to fail.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from opspatch.core.ledgerlocation import PostgresLedger
from opspatch.core.policy import BatchSize, Playbook, StepTimeouts, TeamSettings
from opspatch.errors import LedgerError
from opspatch.hosts.transport.scripted import agent_operation
from opspatch.ledger import store
from opspatch.ledger.liveness import ControllerProcess
from opspatch.ledger.store import Ledger
from opspatch.runs.commands.apply import apply_to_hosts
from opspatch.runs.report import RunReport
from tests.fleetkit import wait_until
from tests.pgkit import BACKENDS, PostgresServer, backend_pid
from tests.scriptedkit import PRISTINE, REPO, STANDIN, FakeHost, Fleet, sha

pytestmark = pytest.mark.scripted

GRACE = 0.5  # A's lease expiry, and so how long its lock outlives an exec: short, to wait for
SLOW_STEP = 3600.0  # the held step's deadline: its lock cannot expire while the test runs


@dataclass
class Cut:
    """The ledger both operators share (`location`, as B reaches it; `a_location`, as A's
    controller does), how A is cut off from it (`cut`), and let back (`mend`)."""

    location: Path | PostgresLedger
    a_location: Path | PostgresLedger
    cut: Callable[[Ledger], None]
    mend: Callable[[Ledger], object]


@pytest.fixture(params=BACKENDS)
def cut(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cut:
    if request.param == "sqlite":
        renew = Ledger.renew_leases
        cut_off: set[int] = set()  # the connections cut: A's ledger and the run's view of it

        def renew_unless_cut(self: Ledger, run_id: str) -> int:
            if id(self._db) in cut_off:
                raise LedgerError("the ledger connection was cut")
            return renew(self, run_id)

        monkeypatch.setattr(Ledger, "renew_leases", renew_unless_cut)
        path = tmp_path / "ledger.sqlite3"
        return Cut(
            path,
            path,
            lambda a: cut_off.add(id(a._db)),
            lambda a: cut_off.discard(id(a._db)),
        )
    server: PostgresServer = request.getfixturevalue("postgres")
    shared = server.fresh_ledger()
    role, a_location = server.own_writer(shared)

    def keep_out(a: Ledger) -> None:
        server.keep_out(role)
        server.end_session(backend_pid(a))

    request.addfinalizer(lambda: server.keep_out(role, out=False))
    return Cut(shared, a_location, keep_out, lambda a: server.keep_out(role, out=False))


def one_host(tmp_path: Path, ledger: Ledger) -> Fleet:
    from opspatch.config.patches import load_patch

    fake = FakeHost("h1", tmp_path / "h1")
    fake.file.parent.mkdir(parents=True)
    fake.file.write_bytes((STANDIN / "eagle_worker_v2.py").read_bytes())
    return Fleet([fake], ledger, load_patch(REPO / "patches" / "eagle-init-guard.toml"))


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    with Ledger.open(tmp_path / "ledger.sqlite3") as ledger:
        yield one_host(tmp_path, ledger)


@pytest.fixture
def shared_fleet(cut: Cut, tmp_path: Path) -> Iterator[Fleet]:
    """One host, and B's connection to the ledger A is cut off from."""
    with Ledger.open(cut.location) as ledger:
        yield one_host(tmp_path, ledger)


def playbook() -> Playbook:
    base = Playbook(canary=0, batch=BatchSize(count=10))
    return replace(
        base,
        timeouts=replace(StepTimeouts(), restart=SLOW_STEP),
        team=TeamSettings(lease_expiry=GRACE),
    )


class HeldAt:
    """A fault hook that holds the host's first `op` request (inside its exec, after the lock
    was re-asserted) until `release()`."""

    def __init__(self, op: str) -> None:
        self.op = op
        self.reached = threading.Event()
        self._go = threading.Event()

    def __call__(self, op: str, args: dict[str, Any]) -> None:
        if op == self.op and not self.reached.is_set():
            self.reached.set()
            assert self._go.wait(120), "the test never released the held request"
        return None

    def release(self) -> None:
        self._go.set()


class OperatorA:
    """Operator A's apply in a thread, on its own connection to the ledger, begun on another
    controller (so its run is `unknown` to B); `cut` cuts it off from the ledger."""

    def __init__(
        self,
        fleet: Fleet,
        monkeypatch: pytest.MonkeyPatch,
        cut: Cut,
        *,
        playbook: Playbook | None = None,
    ) -> None:
        self.ledger = Ledger.open(cut.a_location)
        self.cut = cut
        self.playbook = playbook
        self.report: RunReport | None = None
        self._fleet = fleet
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._monkeypatch = monkeypatch

    def start(self, held: HeldAt) -> str:
        elsewhere = ControllerProcess("alices-laptop", 4242, None)
        with self._monkeypatch.context() as begun_elsewhere:
            begun_elsewhere.setattr(
                store.ControllerProcess, "current", classmethod(lambda cls: elsewhere)
            )
            self._thread.start()
            assert held.reached.wait(60), "A never reached the held step"
        run_id = self.ledger.list_runs(limit=1)[0].run_id
        self.cut.cut(self.ledger)
        return run_id

    def reconnected(self) -> None:
        """The network is back: A reaches the ledger again."""
        self.cut.mend(self.ledger)

    def _run(self) -> None:
        self.report = apply_to_hosts(
            self._fleet.patch,
            [h.host() for h in self._fleet.hosts],
            self.playbook or playbook(),
            factory=self._fleet.factory,
            ledger=self.ledger,
        )

    def join(self) -> RunReport:
        self._thread.join(60)
        assert not self._thread.is_alive() and self.report is not None
        self.ledger.close()
        return self.report


def held_in_restart(
    fleet: Fleet, cut: Cut, monkeypatch: pytest.MonkeyPatch, held: HeldAt
) -> tuple[OperatorA, str]:
    """Operator A's apply, begun elsewhere, held at `held` and then cut off from the ledger;
    A and its run id."""
    a = OperatorA(fleet, monkeypatch, cut)
    return a, a.start(held)


def lease_expired(ledger: Ledger, run_id: str) -> bool:
    held = ledger.leases_of([run_id])
    return bool(held) and not any(lease.live for lease in held)


def test_a_recover_does_not_take_the_lock_of_a_live_controller_whose_lease_expired(
    shared_fleet: Fleet, cut: Cut, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A is cut off from the ledger (its lease expires) but still at work on its host, held in
    its restart: B's `recover --run A` is refused there, naming why, and changes nothing; A
    finishes its host, keeping the lock with every exec."""
    fleet = shared_fleet
    host, held = fleet.hosts[0], HeldAt("restart")
    host.fault = held
    a, run_a = held_in_restart(fleet, cut, monkeypatch, held)
    assert wait_until(lambda: lease_expired(fleet.ledger, run_a), timeout=60, interval=0.05)
    patched = host.file.read_bytes()
    assert sha(patched) != PRISTINE  # A swapped before its restart

    b = fleet.recover(host, run=run_a)
    (refused,) = b.hosts
    assert (refused.outcome, refused.reason) == ("failed", "lock-held"), refused
    assert f"(run {run_a})" in (refused.error or "")
    assert "controller may still be at work here" in (refused.error or "")
    assert f"`opspatch recover --run {run_a}` takes the host over" in (refused.error or "")
    assert host.file.read_bytes() == patched  # B wrote nothing

    a.reconnected()
    held.release()
    report = a.join()
    (outcome,) = report.hosts
    assert outcome.outcome == "applied", outcome  # A kept its lock to the end of its host
    assert not (host.state / "lock.json").exists()


def test_an_exec_sent_after_another_run_took_the_lock_over_is_refused_before_it_runs(
    shared_fleet: Fleet, cut: Cut, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lock is taken over while A is held in its restart (its lock expired or removed by
    force): A's next exec is refused at the lock it re-asserts, so nothing of it runs, and A
    says the host needs attention rather than claiming a result."""
    fleet = shared_fleet
    host, held = fleet.hosts[0], HeldAt("restart")
    host.fault = held
    a, run_a = held_in_restart(fleet, cut, monkeypatch, held)
    taken = agent_operation(
        "lock",
        {
            "state_dir": str(host.state),
            "owner": "bob@ctl",
            "run_id": "run-of-bob",
            "ttl_seconds": 600,
            "takeover_run": run_a,
        },
    )
    assert isinstance(taken, dict)
    asked_before = len(host.requests)
    a.reconnected()
    held.release()
    report = a.join()
    (outcome,) = report.hosts
    assert (outcome.outcome, outcome.reason) == ("needs-attention", "lock-lost"), outcome
    assert f"this run ({run_a}) no longer holds the host's lock" in str(outcome.to_json())
    after = host.requests[asked_before:]
    # no wait_ready, smoke or restore reached the host: only refused locks, and a give-back that
    # the agent refuses (not this run's lock)
    assert set(after) <= {"lock", "unlock"} and "lock" in after, after
    assert "run-of-bob" in (host.state / "lock.json").read_text()  # bob's lock untouched


def test_a_recover_takes_an_unknown_runs_lock_once_it_expired(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A controller gone for good: its lock expires `lease_expiry` after its last exec could
    have ended, and `recover --hosts` then takes the host over (not by run id: by expiry)."""
    host = fleet.hosts[0]
    elsewhere = ControllerProcess("alices-laptop", 4242, None)
    with monkeypatch.context() as begun_elsewhere:
        begun_elsewhere.setattr(
            store.ControllerProcess, "current", classmethod(lambda cls: elsewhere)
        )
        gone = fleet.ledger.begin_run(
            command="apply",
            patch_id=fleet.patch.spec.id,
            patch_sha256=fleet.patch.sha256,
            operator="alice@laptop",
            command_line="opspatch apply",
            hosts=[host.name],
        )
    assert fleet.ledger.get_run(gone).summary.status == "unknown"
    lock = {"state_dir": str(host.state), "owner": "alice@laptop", "run_id": gone}
    assert isinstance(agent_operation("lock", {**lock, "ttl_seconds": GRACE}), dict)
    assert wait_until(lambda: _expired(host), timeout=60, interval=0.05)
    report = fleet.recover(host)
    (outcome,) = report.hosts
    assert outcome.outcome == "restored", outcome
    assert sha(host.file.read_bytes()) == PRISTINE
    assert not (host.state / "lock.json").exists()


def _expired(host: FakeHost) -> bool:
    import json

    expires = float(json.loads((host.state / "lock.json").read_text())["expires_at"])
    return expires < time.time()


def test_refresh_only_re_asserts_a_lock_still_the_runs_and_nothing_else(tmp_path: Path) -> None:
    """The agent's side of the fence: its own lock (expired or not) is refreshed; another's is
    `lock-held`; a lock that is gone is `lock-lost`, never silently taken again."""
    from opspatch.hosts.transport.scripted import Refusal

    state = str(tmp_path / "state")
    mine = {"state_dir": state, "owner": "a@c", "run_id": "run-a", "takeover_run": None}
    assert isinstance(agent_operation("lock", {**mine, "ttl_seconds": 0.01}), dict)
    time.sleep(0.05)  # let it expire: the run's own expired lock is still the run's
    again = agent_operation("lock", {**mine, "ttl_seconds": 60, "refresh_only": True})
    assert isinstance(again, dict) and again["refreshed"] is True

    theirs = {**mine, "owner": "b@c", "run_id": "run-b", "takeover_run": "run-a"}
    assert isinstance(agent_operation("lock", {**theirs, "ttl_seconds": 60}), dict)
    held = agent_operation("lock", {**mine, "ttl_seconds": 60, "refresh_only": True})
    assert isinstance(held, Refusal) and held.code == "lock-held", held

    unlocked = agent_operation("unlock", {"state_dir": state, "run_id": "run-b", "force": False})
    assert isinstance(unlocked, dict) and unlocked["released"]
    lost = agent_operation("lock", {**mine, "ttl_seconds": 60, "refresh_only": True})
    assert isinstance(lost, Refusal) and lost.code == "lock-lost", lost
    assert not (tmp_path / "state" / "lock.json").exists()


def test_a_host_waiting_for_its_batch_keeps_its_lock_until_the_run_reaches_it(
    tmp_path: Path,
) -> None:
    """A rollout begins (locks) every host at preflight, and a later batch's host sees no exec
    while the canary runs: its lock lasts until the run reaches it, not its begin's deadline,
    so another run cannot take that host meanwhile; the run then finishes it."""
    from opspatch.config.patches import load_patch
    from opspatch.hosts.transport.scripted import Refusal

    canary, later = (
        FakeHost.installed("h1", tmp_path / "h1"),
        FakeHost.installed("h2", tmp_path / "h2"),
    )
    held = HeldAt("restart")
    canary.fault = held
    quick_begin = replace(playbook(), canary=1)
    quick_begin = replace(
        quick_begin, timeouts=replace(quick_begin.timeouts, lock=0.1, inspect=0.1)
    )
    with Ledger.open(tmp_path / "ledger.sqlite3") as ledger:
        fleet = Fleet(
            [canary, later], ledger, load_patch(REPO / "patches" / "eagle-init-guard.toml")
        )
        reports: list[RunReport] = []
        rollout = threading.Thread(
            target=lambda: reports.append(
                apply_to_hosts(
                    fleet.patch,
                    [h.host() for h in fleet.hosts],
                    quick_begin,
                    factory=fleet.factory,
                    ledger=ledger,
                )
            ),
            daemon=True,
        )
        rollout.start()
        try:
            assert held.reached.wait(60), "the canary never reached its restart"
            # well past begin's deadline plus the grace (0.7 s): a lock that lasted only that
            # long would be expired now, and free for the taking
            time.sleep(2.0)
            carol = {"state_dir": str(later.state), "owner": "carol@ctl", "run_id": "carols"}
            taken = agent_operation("lock", {**carol, "ttl_seconds": 600, "takeover_run": None})
            assert isinstance(taken, Refusal) and taken.code == "lock-held", taken
        finally:
            held.release()
            rollout.join(60)
        assert not rollout.is_alive()
    (report,) = reports
    assert {h.host: str(h.outcome) for h in report.hosts} == {"h1": "applied", "h2": "applied"}
    assert not (later.state / "lock.json").exists()


def test_a_recover_takes_at_once_the_hosts_a_cut_off_run_has_no_command_running_on(
    cut: Cut, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A is cut off with its canary held in its restart and a later batch's host locked at
    preflight but not reached: B's `recover --run A` is refused on the canary (A's restart
    may still be running there) but takes the waiting host over at once, its lock idle (no
    command of A's can still be running there) though not expired; A never changes it after
    (its leases lost, it starts no more hosts)."""
    from opspatch.config.patches import load_patch

    canary = FakeHost.installed("h1", tmp_path / "h1")
    waiting = FakeHost.installed("h2", tmp_path / "h2")
    held = HeldAt("restart")
    canary.fault = held
    quick_begin = replace(playbook(), canary=1)
    quick_begin = replace(
        quick_begin, timeouts=replace(quick_begin.timeouts, lock=0.1, inspect=0.1)
    )
    with Ledger.open(cut.location) as ledger:
        patch = load_patch(REPO / "patches" / "eagle-init-guard.toml")
        fleet = Fleet([canary, waiting], ledger, patch)
        a = OperatorA(fleet, monkeypatch, cut, playbook=quick_begin)
        run_a = a.start(held)
        try:
            assert wait_until(lambda: lease_expired(ledger, run_a), timeout=60, interval=0.05)
            assert wait_until(lambda: _idle(waiting), timeout=60, interval=0.05)
            assert not _expired(waiting)  # it still keeps other runs off

            b = fleet.recover(canary, waiting, run=run_a)
        finally:
            a.reconnected()
            held.release()
        outcomes = {h.host: h for h in b.hosts}
        assert outcomes["h1"].outcome == "failed", outcomes["h1"]
        assert outcomes["h1"].reason == "lock-held", outcomes["h1"]
        assert outcomes["h2"].outcome == "restored", outcomes["h2"]
        begin = next(s for s in outcomes["h2"].steps if s.step == "begin")
        assert f"took the lock over from run {run_a} (no command of it" in begin.detail
        report = a.join()
    by_host = {h.host: h for h in report.hosts}
    assert by_host["h1"].outcome == "applied", by_host["h1"]  # A kept its canary's lock
    # A, its leases lost, starts no more hosts (were it to, its first exec there is fenced)
    assert by_host["h2"].outcome == "skipped", by_host["h2"]
    assert by_host["h2"].reason == "not-started", by_host["h2"]
    assert sha(waiting.file.read_bytes()) == PRISTINE  # A changed nothing there after B
    assert "swap" not in waiting.requests
    assert not (waiting.state / "lock.json").exists()


def _idle(host: FakeHost) -> bool:
    import json

    busy = float(json.loads((host.state / "lock.json").read_text())["busy_until"])
    return busy < time.time()
