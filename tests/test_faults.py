"""Issue 9's faults, tried from outside as an operator meets them, over SSH.

The real console script drives the sandbox fleet (`opspatch sandbox up --ssh`); faults are made
from outside opspatch: the controller SIGKILLed while the canary's request for a step is held by
its engine interpreter (a wrapper named in a test inventory, `tests/faultkit.py`), the host's
sshd killed before a step's reply goes back, the ledger deleted or its filesystem full or
read-only, a hand edit landing between preflight and swap. After each, the invariant is read
from the files and processes themselves (`FaultFleet.check_invariant`), never taken from
opspatch's own report: every host is byte-identical to its pre-image or to the patched text, its
engine alive, running the code on disk and decoding as before; no temp file, no lock left; the
ledger verifies and `status` says the truth.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from opspatch.sandbox.sshd import find_sshd
from tests.faultkit import FaultFleet, outcomes_of

pytestmark = [pytest.mark.slow, pytest.mark.ssh]


@pytest.fixture(scope="module")
def sshd_installed() -> None:
    if find_sshd() is None:
        pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)")


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The fleets outlive one test: give them (and every command) a HOME of their own."""
    folder = tmp_path_factory.mktemp("faults-home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOME", str(folder))
        patch.setenv("XDG_STATE_HOME", str(folder / ".local" / "state"))
        patch.setenv("XDG_CONFIG_HOME", str(folder / ".config"))
        for name in ("OPSPATCH_STATE_DIR", "OPSPATCH_LEDGER", "OPSPATCH_HOME", "SSH_AUTH_SOCK"):
            patch.delenv(name, raising=False)
        yield


@pytest.fixture(scope="module")
def kills(
    tmp_path_factory: pytest.TempPathFactory, sshd_installed: None, home: None
) -> Iterator[FaultFleet]:
    fleet = FaultFleet.up(tmp_path_factory.mktemp("faults-kills"))
    try:
        yield fleet
    finally:
        fleet.close()


# ---------------------------------------------------------------------------------------------
# 1. the controller SIGKILLed at each step boundary of an apply, then `recover`

# Where the canary's request is held when the controller is killed, and the step the ledger then
# shows the canary in (started, never finished). "backup" is a ledger step: the controller is
# killed once it recorded the backup, with its swap request held and then dropped (it never
# reaches the host). Every other step is killed after the host did it, before the reply came.
KILL_POINTS = {
    "begin": ("begin", "after", "begin"),
    "backup": ("swap", "before", "swap"),
    "swap": ("swap", "after", "swap"),
    "restart": ("restart", "after", "restart"),
    "ready": ("wait_ready", "after", "ready"),
    "smoke": ("smoke", "after", "smoke"),
    "release": ("unlock", "after", "release"),
}
# What recover makes of the canary: nothing was changed before the swap; a swapped file is
# finished (restarted, proven); one proven before the kill is left as it is.
CANARY_AFTER_RECOVER = {
    "begin": "restored",
    "backup": "restored",
    "swap": "applied",
    "restart": "applied",
    "ready": "applied",
    "smoke": "applied",
    "release": "applied",
}


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_controller_killed_at_each_step_then_recover(kills: FaultFleet, point: str) -> None:
    op, at, step = KILL_POINTS[point]
    canary = kills.canary
    pids = {n: kills.fleet.pid(n) for n in kills.others}
    kills.arm(op, at=at)
    kills.kill_when_held(kills.apply())

    run_id = kills.newest_run()
    assert kills.run_status(run_id)["status"] == "interrupted"
    last = kills.run_record(run_id)[canary]["last_step"]
    assert (last["step"], last["status"]) == (step, "started"), last
    # the other hosts were only locked (preflight): never changed, never restarted
    assert {n: kills.state(n) for n in kills.others} == dict.fromkeys(kills.others, "pre-image")
    assert {n: kills.fleet.pid(n) for n in kills.others} == pids

    recovered = kills.cli("recover", "--yes", "--json")
    assert recovered.code == 0, recovered.stdout + recovered.stderr
    outcomes = outcomes_of(recovered)
    states = kills.check_invariant(outcomes)
    assert outcomes[canary] == CANARY_AFTER_RECOVER[point], recovered.stdout
    assert all(outcomes[n] == "restored" for n in kills.others), outcomes
    assert {n: states[n] for n in kills.others} == dict.fromkeys(kills.others, "pre-image")
    summary = kills.run_status(run_id)
    assert summary["status"] == "recovered", summary
    assert summary["recovered_by"] == recovered.json()["run_id"]
    kills.reset()
