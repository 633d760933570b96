"""Issue 17's bugs of the fleet run, over SSH on the sandbox fleet, with the real console script.

The fleet is `tests/faultkit.py`'s (two hosts over SSH, the canary's interpreter wrapped with a
fault switch that holds one of its requests): Ctrl-C lands at a known step because the canary's
request is held there until the signal was sent. Each case starts and ends at the fleet's
baseline (eagle-init-guard applied and proven everywhere, `fault-marker` nowhere).
"""

from __future__ import annotations

import json
import signal
import socket
import time
from collections.abc import Iterator

import pytest

from opspatch.ledger.store import Ledger
from opspatch.sandbox.sshd import find_sshd
from tests.faultkit import INVENTORY, PATCH_ID, FaultFleet, FleetSlot, isolated_home, outcomes_of

pytestmark = [pytest.mark.engine, pytest.mark.ssh]


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A HOME of the module's own (the fleet outlives each test's HOME from conftest)."""
    with isolated_home(tmp_path_factory.mktemp("one-path-home")):
        yield


@pytest.fixture(scope="module")
def slot(tmp_path_factory: pytest.TempPathFactory, home: None) -> Iterator[FleetSlot]:
    if find_sshd() is None:
        pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)")
    made = FleetSlot(tmp_path_factory, "one-path")
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def fleet(slot: FleetSlot) -> FaultFleet:
    return slot.ready()


def run_outcome(fleet: FaultFleet, run_id: str) -> tuple[str, str | None]:
    with Ledger.open(fleet.fleet.ledger_path) as ledger:
        summary = ledger.get_run(run_id).summary
        return str(summary.status), summary.outcome


def pids(fleet: FaultFleet) -> dict[str, int | None]:
    return {name: fleet.fleet.pid(name) for name in fleet.names}


def sigint_when_held(fleet: FaultFleet, controller: object, times: int = 1) -> None:
    import subprocess

    assert isinstance(controller, subprocess.Popen)
    fleet.reached()
    for _ in range(times):
        controller.send_signal(signal.SIGINT)
        time.sleep(1.0)  # the first is taken before the second comes (a handler, then a wait)


# -- bug 3: one Ctrl-C during the preflight ------------------------------------------------------


def test_ctrl_c_in_preflight_gives_every_lock_back_and_says_so(fleet: FaultFleet) -> None:
    fleet.arm("inspect", at="after")  # the canary's begin ran (its lock taken); the reply held
    controller = fleet.apply()
    sigint_when_held(fleet, controller)
    fleet.release()
    out, err = fleet.finish(controller)
    assert controller.returncode == 2, out + err
    report = json.loads(out)
    assert report["refused"] is True
    assert "cancelled by the operator (Ctrl-C) during the preflight" in report["halted"]
    assert "Ctrl-C: no more hosts will be started" in err
    assert set(outcomes_of_json(report).values()) == {"skipped"}
    for name in fleet.names:
        assert not fleet.lock_file(name).exists(), name
        assert fleet.state(name) == "pre-image"
    assert run_outcome(fleet, report["run_id"]) == ("finished", "refused")
    fleet.check_invariant()
    # the next apply is not refused by a lock
    again = fleet.cli("apply", PATCH_ID, "--hosts", INVENTORY, "--yes", "--json")
    assert again.code == 0, again.stdout + again.stderr
    fleet.reset()


def outcomes_of_json(report: dict[str, object]) -> dict[str, str]:
    hosts = report["hosts"]
    assert isinstance(hosts, list)
    return {h["host"]: h["outcome"] for h in hosts}


# -- bug 4: a changed host never makes the run "refused (exit 2)" ----------------------------


def test_ctrl_c_after_the_canary_swapped_finishes_it_and_exits_1(fleet: FaultFleet) -> None:
    fleet.arm("swap", at="after")
    controller = fleet.apply()
    sigint_when_held(fleet, controller)
    fleet.release()
    out, err = fleet.finish(controller)
    assert controller.returncode == 1, out + err
    report = json.loads(out)
    assert report["refused"] is False and report["outcome"] == "failed"
    said = outcomes_of_json(report)
    assert said[fleet.canary] == "applied"  # in flight: finished and proven, not abandoned
    for name in fleet.others:
        assert said[name] == "skipped"
        assert fleet.state(name) == "pre-image"
    assert "cancelled by the operator" in report["halted"]
    assert run_outcome(fleet, report["run_id"]) == ("finished", "failed")
    fleet.check_invariant(said)
    fleet.reset()


# -- bug 3: a double Ctrl-C names the run and the command that finishes it -------------------


def test_a_second_ctrl_c_stops_waiting_and_names_recover(fleet: FaultFleet) -> None:
    fleet.arm("swap", at="after")
    controller = fleet.apply()
    sigint_when_held(fleet, controller, times=2)
    out, err = fleet.finish(controller)
    fleet.release()
    assert controller.returncode == 3, out + err
    assert "interrupted (second Ctrl-C)" in err
    assert f"stopped waiting for {fleet.canary} in flight" in err
    run_id = fleet.newest_run()
    assert f"opspatch recover --run {run_id}" in err
    assert run_outcome(fleet, run_id)[0] == "interrupted"
    recovered = fleet.cli("recover", "--run", run_id, "--yes", "--json")
    assert recovered.code == 0, recovered.stdout + recovered.stderr
    fleet.check_invariant(outcomes_of(recovered))
    fleet.reset()


# -- bug 9: a host preflight cannot begin refuses the run before any change -------------------


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_an_unreachable_host_refuses_the_rollout_in_preflight(fleet: FaultFleet) -> None:
    folder = fleet.fleet.workspace / "inventories"
    text = (folder / f"{INVENTORY}.toml").read_text()
    dead_state = fleet.fleet.root / "dead-state"
    text += (
        f'\n[hosts.dead]\naddress = "127.0.0.1"\nport = {closed_port()}\n'
        f"state_dir = {json.dumps(str(dead_state))}\n"
        '[hosts.dead.engine]\npython = "/usr/bin/python3"\n'
    )
    (folder / "with-dead.toml").write_text(text)
    run = fleet.cli("apply", PATCH_ID, "--hosts", "with-dead", "--yes", "--json")
    assert run.code == 2, run.stdout + run.stderr
    report = run.json()
    assert report["refused"] is True
    said = outcomes_of_json(report)
    assert said["dead"] == "failed"
    assert {h["host"]: h.get("reason") for h in report["hosts"]}["dead"] == "host-error"
    assert "swap" not in {s["step"] for h in report["hosts"] for s in h["steps"]}
    for name in fleet.names:
        assert fleet.state(name) == "pre-image"
        assert not fleet.lock_file(name).exists(), name
    fleet.check_invariant()


# -- bug 1: restart leaves a host with nothing staged alone ------------------------------------


def test_restart_restarts_only_the_hosts_with_a_staged_change(fleet: FaultFleet) -> None:
    before = pids(fleet)
    nothing = fleet.cli("restart", "--hosts", INVENTORY, "--yes", "--json")
    assert nothing.code == 0, nothing.stdout + nothing.stderr
    assert set(outcomes_of(nothing).values()) == {"skipped"}
    for host in nothing.json()["hosts"]:
        assert host["reason"] == "nothing-to-do", host
    assert pids(fleet) == before  # eagle-init-guard is proven everywhere: no server bounced

    staged_host = fleet.others[0]
    staged = fleet.cli(
        "apply", PATCH_ID, "--hosts", f"{INVENTORY}:{staged_host}", "--restart", "never",
        "--yes", "--json",
    )  # fmt: skip
    assert staged.code == 0, staged.stdout + staged.stderr
    assert outcomes_of(staged) == {staged_host: "staged"}
    done = fleet.cli("restart", "--hosts", INVENTORY, "--yes", "--json")
    assert done.code == 0, done.stdout + done.stderr
    said = outcomes_of(done)
    assert said[staged_host] == "applied"
    assert said[fleet.canary] == "skipped"
    after = pids(fleet)
    assert after[fleet.canary] == before[fleet.canary]
    assert after[staged_host] != before[staged_host]
    assert fleet.runs_patch(staged_host)

    again = fleet.cli("restart", "--hosts", INVENTORY, "--yes", "--json")
    assert again.code == 0, again.stdout + again.stderr
    assert set(outcomes_of(again).values()) == {"skipped"}
    assert pids(fleet) == after
    fleet.reset()
