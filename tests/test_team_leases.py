"""Two operators on one ledger, with real processes: the sandbox fleet over SSH (tests/faultkit.py),
the real console script, operator A's controller held at the canary's swap by the fault switch.

Operator B has a state folder of their own and the same `--ledger` (as a team shares one): B's
apply is refused while A's run heart-beats, naming A's operator, controller machine and run, and
so is B's `recover --run A`; once A's controller is SIGKILLed and its lease expired (the test
polls the lease, it does not sleep a fixed time), B's `recover --run A` takes the run over and
brings every host back to a known state. On both backends: the fleet's own SQLite file, and a
PostgreSQL ledger both controllers reach by one postgresql:// URL as the writer role (the fleet,
at its baseline again after each case, is shared).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from opspatch.core.ledgerlocation import PostgresLedger
from opspatch.ledger.store import Ledger
from opspatch.sandbox.sshd import find_sshd
from tests.clirunner import Run
from tests.faultkit import INVENTORY, PATCH_ID, FaultFleet, FleetSlot, isolated_home
from tests.fleetkit import wait_until
from tests.pgkit import BACKENDS, PostgresServer

pytestmark = [pytest.mark.engine, pytest.mark.ssh]

LEASE_EXPIRY = 3  # seconds: short enough to wait for, long enough for a heartbeat on a busy CI box


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with isolated_home(tmp_path_factory.mktemp("team-home")):
        yield


@pytest.fixture(scope="module")
def slot(tmp_path_factory: pytest.TempPathFactory, home: None) -> Iterator[FleetSlot]:
    if find_sshd() is None:
        pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)")
    made = FleetSlot(tmp_path_factory, "team")
    try:
        yield made
    finally:
        made.close()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def team_ledger(fleet: FaultFleet, backend: str, request: pytest.FixtureRequest) -> Path | str:
    """The ledger both operators share: the fleet's file, or a fresh PostgreSQL ledger's URL."""
    if backend == "sqlite":
        return fleet.fleet.ledger_path
    server: PostgresServer = request.getfixturevalue("postgres")
    return server.fresh_ledger().url


def opened(ledger: Path | str) -> Ledger:
    return Ledger.open(PostgresLedger(ledger) if isinstance(ledger, str) else ledger)


def operator_env(
    fleet: FaultFleet, ledger: Path | str, user: str, state: Path | None = None
) -> dict[str, str]:
    """Operator `user` (getpass reads LOGNAME first) with their own state folder, if given, and
    the team's ledger either way."""
    env = {**fleet.fleet.env, "LOGNAME": user, "OPSPATCH_LEDGER": str(ledger)}
    if state is not None:
        env["OPSPATCH_STATE_DIR"] = str(state)
    return env


def spawn(fleet: FaultFleet, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "opspatch.cli", *args],
        cwd=fleet.fleet.workspace,
        env={**os.environ, **env, "COLUMNS": "200"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def expired(ledger: Path | str, run_id: str) -> bool:
    with opened(ledger) as reading:
        held = reading.leases_of([run_id])
    return bool(held) and not any(lease.live for lease in held)


def test_a_second_operator_is_kept_off_a_live_run_and_takes_it_over_once_its_lease_expired(
    slot: FleetSlot, tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    fleet = slot.ready()
    ledger = team_ledger(fleet, backend, request)
    alice = operator_env(fleet, ledger, "alice")
    bob = operator_env(fleet, ledger, "bob", tmp_path / "bob-state")
    controller = socket.gethostname()

    fleet.arm("swap", at="before")  # A's canary swap held: the leases taken, nothing changed
    a = spawn(fleet, alice, "apply", PATCH_ID, "--hosts", INVENTORY,
              "--lease-expiry", str(LEASE_EXPIRY), "--yes", "--json")  # fmt: skip
    fleet.reached()
    with opened(ledger) as reading:
        run_a = reading.list_runs(limit=1)[0].run_id
        assert {lease.host for lease in reading.leases_of([run_a])} == set(fleet.names)

    refused = fleet.cli("apply", PATCH_ID, "--hosts", INVENTORY, "--yes", "--json", env=bob)
    assert refused.code == 2, refused.stdout + refused.stderr
    halted = json.loads(refused.stdout)["halted"]
    assert f"leased to run {run_a} of alice@{controller} (controller {controller})" in halted
    assert f"its lease expires {LEASE_EXPIRY} s after its last heartbeat" in halted  # A's flag
    assert "opspatch recover --run" in halted

    live = fleet.cli("recover", "--run", run_a, "--yes", "--json", env=bob)
    assert live.code == 2, live.stdout + live.stderr
    said = live.json()["error"]
    assert f"run {run_a} is alive: its lease is live" in said["message"]
    assert f"of alice@{controller} (controller {controller})" in said["message"]

    fleet.kill_when_held(a)  # SIGKILL, by its pid: no heartbeat, no give-back
    assert wait_until(lambda: expired(ledger, run_a), timeout=60, interval=0.2)

    taken = fleet.cli("recover", "--run", run_a, "--yes", "--json", env=bob)
    assert taken.code == 0, taken.stdout + taken.stderr
    run_b = taken.json()["run_id"]
    shown = fleet.cli("ledger", "show", run_b, "--json", env=bob).json()
    assert shown["operator"] == f"bob@{controller}"
    steps = [s["detail"] for h in shown["host_records"] for s in h["steps"] if s["step"] == "lease"]
    assert sum(f"taken over from run {run_a} of alice@" in d for d in steps) == len(fleet.names)
    assert sum(d.startswith("gave the lease on ") for d in steps) == len(fleet.names)
    fleet.check_invariant(_outcomes(taken), ledger=ledger)
    runs = fleet.cli("ledger", "list", "--json", env=bob).json()["runs"]
    assert next(r for r in runs if r["run_id"] == run_a)["status"] == "recovered"


def _outcomes(run: Run) -> dict[str, str]:
    return {h["host"]: h["outcome"] for h in run.json()["hosts"]}
