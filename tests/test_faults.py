"""Issue 9's faults, tried from outside as an operator meets them, over SSH.

The real console script drives the sandbox fleet (`opspatch sandbox up --ssh`); faults are made
from outside opspatch: the controller SIGKILLed while the canary's request for a step is held by
its engine interpreter (a wrapper named in a test inventory, `tests/faultkit.py`), the host's
sshd killed before a step's reply goes back, the ledger deleted (between runs or during one),
made immutable (`chattr +i`) or its filesystem full or read-only, a hand edit landing between
preflight and swap. After each, the invariant is read
from the files and processes themselves (`FaultFleet.check_invariant`), never taken from
opspatch's own report: every host is byte-identical to its pre-image or to the patched text, its
engine alive, running the code on disk and decoding as before; no temp file, no lock left; the
ledger verifies and `status` says the truth.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from opspatch.sandbox.sshd import find_sshd
from tests.faultkit import INVENTORY, PATCH_ID, FaultFleet, FleetSlot, isolated_home, outcomes_of
from tests.fleetkit import wait_until

pytestmark = [pytest.mark.engine, pytest.mark.ssh, pytest.mark.root]


@pytest.fixture(scope="module")
def sshd_installed() -> None:
    if find_sshd() is None:
        pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)")


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The fleets are closed when the module ends, after each test's own HOME (conftest) is
    gone: that last `sandbox down` gets a HOME of its own too, never the user's."""
    with isolated_home(tmp_path_factory.mktemp("faults-home")):
        yield


@pytest.fixture(scope="module")
def kills_slot(
    tmp_path_factory: pytest.TempPathFactory, sshd_installed: None, home: None
) -> Iterator[FleetSlot]:
    slot = FleetSlot(tmp_path_factory, "faults-kills")
    try:
        yield slot
    finally:
        slot.close()


@pytest.fixture
def kills(kills_slot: FleetSlot) -> FaultFleet:
    return kills_slot.ready()


# ---------------------------------------------------------------------------------------------
# 1. the controller SIGKILLed at each step boundary of an apply, then `recover`

# Where the canary's request is held when the controller is killed, and the step the ledger then
# shows the canary in (started, never finished). "backup" is a ledger step: the controller is
# killed once it recorded the backup, with its swap request held and then dropped (it never
# reaches the host). Every other step is killed after the host did it, before the reply came.
KILL_POINTS = {
    "begin": ("inspect", "after", "begin"),  # begin's batch is lock, then inspect
    "backup": ("swap", "before", "swap"),
    "swap": ("swap", "after", "swap"),
    "restart": ("restart", "after", "restart"),
    "ready": ("wait_ready", "after", "ready"),
    "smoke": ("smoke", "after", "smoke"),
}
# (No `release` point: a smoke that passes gives the lock back in the same exec, so nothing of
# the host's pipeline runs after it.)
# What recover makes of the canary: nothing was changed before the swap; a swapped file is
# finished (restarted, proven); one proven before the kill is left as it is.
CANARY_AFTER_RECOVER = {
    "begin": "restored",
    "backup": "restored",
    "swap": "applied",
    "restart": "applied",
    "ready": "applied",
    "smoke": "applied",
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
    if kills.state(canary) == "patched":  # swapped, and not (yet) proven by a finished run
        said = kills.status()[canary]
        # before the restart the running server predates the file: staged, not applied
        assert said["state"] == ("staged" if point == "swap" else "applied"), said
        assert "never proven" in said["detail"], said

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


@pytest.mark.parametrize("point", ["backup", "smoke"])
def test_recover_brings_back_an_engine_that_died_while_the_controller_was_down(
    kills: FaultFleet, point: str
) -> None:
    """The controller killed, and the canary's engine gone too before `recover` runs (a crash,
    a reboot): recover must leave it serving, at once, not wait the playbook's 20 minutes for a
    server that is not there (file at its pre-image), nor call it `applied` while it is down
    (patched, its smoke's answer lost with the controller). The branch where the change was
    proven before the kill is tests/test_runs_scripted.py's (no exec follows a passing smoke)."""
    canary = kills.canary
    op, at, _ = KILL_POINTS[point]
    kills.arm(op, at=at)
    kills.kill_when_held(kills.apply())
    engine = kills.fleet.pid(canary)
    assert engine is not None
    os.killpg(engine, signal.SIGKILL)  # the engine's shell and the server under it
    assert wait_until(lambda: kills.fleet.pid(canary) is None, 30)

    recovered = kills.cli("recover", "--yes", "--json")
    assert recovered.code == 0, recovered.stdout + recovered.stderr
    outcomes = outcomes_of(recovered)
    kills.check_invariant(outcomes)
    assert outcomes[canary] == CANARY_AFTER_RECOVER[point], recovered.stdout
    kills.reset()


def test_a_swap_still_on_its_way_when_the_controller_died_is_refused_after_recover(
    kills: FaultFleet,
) -> None:
    """The controller killed while its swap request is still on its way to the canary; recover
    finds the file unchanged and says so. When the late request finally runs, the lock it was
    sent under is gone: it must write nothing."""
    canary = kills.canary
    kills.arm("swap", at="before", then="run")
    controller = kills.apply()
    kills.reached()
    os.kill(controller.pid, signal.SIGKILL)
    controller.communicate(timeout=30)

    recovered = kills.cli("recover", "--yes", "--json")
    assert recovered.code == 0, recovered.stdout + recovered.stderr
    assert outcomes_of(recovered)[canary] == "restored", recovered.stdout
    kills.release()  # the late swap runs now
    kills.check_invariant(outcomes_of(recovered))
    kills.reset()


# ---------------------------------------------------------------------------------------------
# 2. the recover itself killed, then the next recover follows the chain


@pytest.mark.parametrize(("point", "op"), [("begin", "inspect"), ("restart", "restart")])
def test_recover_killed_then_the_next_recover_follows_the_chain(
    kills: FaultFleet, point: str, op: str
) -> None:
    """The apply killed just after the canary's swap, then the recover killed as it takes the
    canary over (its lock taken over from the apply), or once it restarted the canary on the
    patched file (unproven): the next `recover` recovers both runs, proves or restores the
    canary and unlocks the other hosts, untouched."""
    canary = kills.canary
    pids = {n: kills.fleet.pid(n) for n in kills.others}
    kills.arm("swap")
    kills.kill_when_held(kills.apply())
    applied = kills.newest_run()
    assert kills.state(canary) == "patched"

    kills.arm(op)
    kills.kill_when_held(kills.spawn("recover", "--yes", "--json"))
    first = kills.newest_run()
    assert first != applied
    assert kills.run_record(first)[canary]["last_step"]["step"] == point
    assert kills.run_status(first)["status"] == "interrupted"

    again = kills.cli("recover", "--yes", "--json")
    assert again.code == 0, again.stdout + again.stderr
    outcomes = outcomes_of(again)
    states = kills.check_invariant(outcomes)
    assert outcomes[canary] in ("applied", "rolled-back"), again.stdout
    assert all(outcomes[n] == "restored" for n in kills.others), outcomes
    assert {n: states[n] for n in kills.others} == dict.fromkeys(kills.others, "pre-image")
    assert {n: kills.fleet.pid(n) for n in kills.others} == pids
    second = again.json()["run_id"]
    for run_id in (applied, first):
        summary = kills.run_status(run_id)
        assert (summary["status"], summary["recovered_by"]) == ("recovered", second), summary
    kills.reset()


# ---------------------------------------------------------------------------------------------
# 3. the canary's sshd killed at each of its steps, before the reply goes back


@pytest.fixture(scope="module")
def cuts_slot(
    tmp_path_factory: pytest.TempPathFactory, sshd_installed: None, home: None
) -> Iterator[FleetSlot]:
    slot = FleetSlot(tmp_path_factory, "faults-cuts")
    try:
        yield slot
    finally:
        slot.close()


@pytest.fixture
def cuts(cuts_slot: FleetSlot) -> FaultFleet:
    return cuts_slot.ready()


def truthful(outcome: str, error: str | None, state: str) -> None:
    """What a run said about a host agrees with its file: `applied` is the patched text,
    `failed` and `rolled-back` the pre-image; `needs-attention` (either may be true) says why."""
    if outcome == "applied":
        assert state == "patched", (outcome, state)
    elif outcome in ("failed", "rolled-back", "restored", "skipped"):
        assert state == "pre-image", (outcome, error, state)
    else:
        assert outcome == "needs-attention", outcome
        assert error and "the connection was lost" in error, error


# (the canary's operation, what is killed once it is done there, what is used afterwards)
CUT_POINTS = {
    "begin": ("inspect", "sshd", "unlock"),
    "swap-connection": ("swap", "connection", None),
    "swap": ("swap", "sshd", "recover"),
    "restart": ("restart", "sshd", "recover"),
    "ready": ("wait_ready", "sshd", "recover"),
    "smoke": ("smoke", "sshd", "recover"),
}


@pytest.mark.parametrize("point", list(CUT_POINTS))
def test_sshd_killed_at_each_step_of_a_host(cuts: FaultFleet, point: str) -> None:
    op, kind, then = CUT_POINTS[point]
    canary = cuts.canary
    cuts.arm(op, cut=kind)
    controller = cuts.apply()
    out, err = FaultFleet.finish(controller)
    said = cuts.reached()
    assert said["cut"] == kind and said["sessions"], said
    # a host lost in its begin is refused in preflight: nothing changed anywhere (exit 2)
    assert controller.returncode in ((2,) if point == "begin" else (0, 1, 3)), out + err
    report = {h["host"]: h for h in json.loads(out)["hosts"]}
    for name, host in report.items():
        truthful(host["outcome"], host.get("error"), cuts.state(name))
    mine = report[canary]
    if kind == "connection":  # the connection came back at once: the run reconciled it
        assert (mine["outcome"], mine["reason"]) == ("rolled-back", "step-failed"), mine
    if kind == "sshd":
        up = cuts.cli("sandbox", "up", "--json")
        assert up.code == 0, up.stdout + up.stderr
        engines = {h["host"]: h["outcome"] for h in up.json()["hosts"]}
        assert engines[canary] == "already-running", engines  # opspatch left it running
        cuts.write_inventory()
        if cuts.state(canary) == "patched":  # status must not pass an unproven change as live
            said = cuts.status()[canary]
            # cut at the swap, the running server predates the file: staged, not applied
            assert said["state"] == ("staged" if point == "swap" else "applied"), said
            proven = mine["outcome"] == "applied"
            assert ("never proven" in said["detail"]) != proven, (mine, said)
    if then == "unlock":
        # the lock the lost `begin` took outlived its run: the next apply is refused, saying
        # how to clear it, and changes nothing
        refused = cuts.cli("apply", PATCH_ID, "--hosts", INVENTORY, "--yes", "--json")
        assert refused.code == 2, refused.stdout + refused.stderr
        error = next(h for h in refused.json()["hosts"] if h["host"] == canary)["error"]
        assert f"`opspatch unlock --hosts {canary}`" in error, error
        assert {n: cuts.state(n) for n in cuts.names} == dict.fromkeys(cuts.names, "pre-image")
        unlocked = cuts.cli("unlock", "--hosts", f"{INVENTORY}:{canary}", "--yes", "--json")
        assert unlocked.code == 0, unlocked.stdout + unlocked.stderr
        assert outcomes_of(unlocked) == {canary: "unlocked"}
    elif then == "recover":
        recovered = cuts.cli("recover", "--hosts", f"{INVENTORY}:{canary}", "--yes", "--json")
        assert recovered.code == 0, recovered.stdout + recovered.stderr
    cuts.check_invariant()
    cuts.reset()


# ---------------------------------------------------------------------------------------------
# 4. the ledger deleted, its filesystem full or read-only


def test_ledger_deleted_between_apply_and_rollback(kills: FaultFleet, tmp_path: Path) -> None:
    """Rollback finds no record: it restores from the hosts' own backups, saying so."""
    ledger = tmp_path / "lost.sqlite3"
    with_ledger = ("--ledger", str(ledger))
    applied = kills.cli(*with_ledger, "apply", PATCH_ID, "--hosts", INVENTORY, "--yes", "--json")
    assert applied.code == 0, applied.stdout + applied.stderr
    assert {n: kills.state(n) for n in kills.names} == dict.fromkeys(kills.names, "patched")
    for suffix in ("", "-wal", "-shm"):
        Path(f"{ledger}{suffix}").unlink(missing_ok=True)

    back = kills.cli(*with_ledger, "rollback", PATCH_ID, "--hosts", INVENTORY, "--yes", "--json")
    assert back.code == 0, back.stdout + back.stderr
    for host in back.json()["hosts"]:
        assert host["outcome"] == "restored", host
        assert "host's own backup" in host["note"], host
    states = kills.check_invariant(outcomes_of(back), ledger=ledger)
    assert states == dict.fromkeys(kills.names, "pre-image")


@contextmanager
def small_filesystem(path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs mounted at `path` (root only), unmounted afterwards."""
    path.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(path)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def fill(folder: Path) -> Path:
    """Fill `folder`'s filesystem to the last byte; the filler file."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as handle:
        try:
            while True:
                handle.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    return filler


def untouched(fleet: FaultFleet, pids: dict[str, int | None]) -> None:
    for name in fleet.names:
        assert fleet.state(name) == "pre-image"
        assert fleet.fleet.pid(name) == pids[name]
        assert not fleet.runs_patch(name)
        assert not fleet.lock_file(name).exists()
        assert not fleet.temp_files(name)


def test_ledger_filesystem_full_or_read_only(kills: FaultFleet, tmp_path: Path) -> None:
    """Before the run: refused with the reason (full, read-only), nothing on any host changed.
    Filling up during the run, once the canary's swap is on its way: the run stops, saying the
    ledger is full, and once there is room again `recover` finishes it."""
    pids = {n: kills.fleet.pid(n) for n in kills.names}
    with small_filesystem(tmp_path / "fs") as folder:
        ledger = folder / "ledger.sqlite3"
        with_ledger = ("--ledger", str(ledger))
        made = kills.cli(*with_ledger, "ledger", "migrate")  # a new, empty ledger, made explicitly
        assert made.code == 0, made.stdout + made.stderr
        apply = (*with_ledger, "apply", PATCH_ID, "--hosts", INVENTORY, "--yes")

        filler = fill(folder)
        refused = kills.cli(*apply)
        assert refused.code == 3, refused.stdout + refused.stderr
        assert "the filesystem that holds it is full" in refused.stderr, refused.stderr
        untouched(kills, pids)
        filler.unlink()

        subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
        refused = kills.cli(*apply)
        subprocess.run(["mount", "-o", "remount,rw", str(folder)], check=True)
        assert refused.code == 3, refused.stdout + refused.stderr
        assert "read-only" in refused.stderr, refused.stderr
        untouched(kills, pids)

        kills.arm("swap", at="before", then="run")
        controller = kills.spawn(*apply)
        kills.reached()
        filler = fill(folder)
        kills.release()
        out, err = FaultFleet.finish(controller)
        assert controller.returncode == 3, out + err
        assert "the filesystem that holds it is full" in err, err
        assert "`opspatch recover` then brings the hosts run" in err, err
        filler.unlink()
        recovered = kills.cli(*with_ledger, "recover", "--yes", "--json")
        assert recovered.code == 0, recovered.stdout + recovered.stderr
        states = kills.check_invariant(outcomes_of(recovered), ledger=ledger)

        # a rollback on a read-only ledger is refused too, and leaves the patched hosts alone
        pids = {n: kills.fleet.pid(n) for n in kills.names}
        subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
        refused = kills.cli(*with_ledger, "rollback", PATCH_ID, "--hosts", INVENTORY, "--yes")
        subprocess.run(["mount", "-o", "remount,rw", str(folder)], check=True)
        assert refused.code == 3 and "read-only" in refused.stderr, refused.stderr
        assert {n: kills.state(n) for n in kills.names} == states
        assert {n: kills.fleet.pid(n) for n in kills.names} == pids
        kills.reset(ledger=ledger)


@contextmanager
def chattr_folder() -> Iterator[Path]:
    """A folder on a filesystem that keeps `chattr` attributes (not tmpfs), its attributes
    taken off again at the end whatever happened."""
    folder = Path(tempfile.mkdtemp(prefix="opspatch-chattr-", dir="/var/tmp"))
    tried = subprocess.run(["chattr", "+i", str(folder)], capture_output=True, text=True)
    subprocess.run(["chattr", "-i", str(folder)], capture_output=True)
    if tried.returncode != 0:
        shutil.rmtree(folder, ignore_errors=True)
        pytest.skip(f"chattr +i is not possible here: {tried.stderr.strip() or 'no chattr'}")
    try:
        yield folder
    finally:
        for entry in [folder, *folder.iterdir()]:
            subprocess.run(["chattr", "-i", "-a", str(entry)], capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("fault", ["deleted", "immutable"])
def test_ledger_deleted_or_made_immutable_while_the_canary_swaps(
    kills: FaultFleet, fault: str
) -> None:
    """Issue 42, items 12 and 13: the ledger deleted, or made immutable (`chattr +i` on the
    file, its -wal and -shm and its folder), while the canary's swap is on its way. Before: a
    deleted ledger took the run to `ok (exit 0)` with its record in a file nobody could open,
    and an immutable one killed the controller with a bus error, the canary swapped and
    restarted with no smoke. Now the run stops before the canary's next step, saying why, and
    `recover` finishes it from the ledger where its records are."""
    canary = kills.canary
    pids = {n: kills.fleet.pid(n) for n in kills.names}
    with chattr_folder() as folder:
        ledger = folder / "ledger.sqlite3"
        frozen = [str(ledger), f"{ledger}-wal", f"{ledger}-shm", str(folder)]
        kills.arm("swap", at="before", then="run")
        controller = kills.spawn(
            "--ledger", str(ledger), "apply", PATCH_ID, "--hosts", INVENTORY, "--yes"
        )
        kills.reached()
        if fault == "deleted":
            ledger.unlink()
        else:
            subprocess.run(["chattr", "+i", *frozen], check=True)
        kills.release()
        out, err = FaultFleet.finish(controller)
        subprocess.run(["chattr", "-i", *frozen], capture_output=True)
        assert controller.returncode == 3, (controller.returncode, out + err)
        if fault == "deleted":
            assert f"the ledger {ledger} was deleted or moved away" in err, err
            assert f"put back at {ledger}" in err, err
        else:
            assert "are immutable or append-only (chattr +i / +a)" in err, err
        assert "`opspatch recover" in err, err
        # the canary was swapped and nothing after it: not restarted, still the old code
        assert kills.state(canary) == "patched"
        assert kills.fleet.pid(canary) == pids[canary] and not kills.runs_patch(canary)
        assert {n: kills.state(n) for n in kills.others} == dict.fromkeys(kills.others, "pre-image")
        assert {n: kills.fleet.pid(n) for n in kills.others} == {n: pids[n] for n in kills.others}

        recovered = kills.cli("--ledger", str(ledger), "recover", "--yes", "--json")
        assert recovered.code == 0, recovered.stdout + recovered.stderr
        outcomes = outcomes_of(recovered)
        assert outcomes[canary] == "applied", recovered.stdout
        kills.check_invariant(outcomes, ledger=ledger)
        kills.reset(ledger=ledger)


# ---------------------------------------------------------------------------------------------
# 5. a hand edit racing the swap


def test_hand_edit_between_preflight_and_swap(kills: FaultFleet) -> None:
    """The canary's file is edited by hand after it was read and before the swap: the swap is
    refused (`failed`), the file keeps the hand edit, and neither `status` nor `rollback`
    says the run wrote it."""
    canary = kills.canary
    path = kills.fleet.file(canary)
    before = path.read_bytes()
    pids = {n: kills.fleet.pid(n) for n in kills.names}
    kills.arm("swap", at="before", then="run")
    controller = kills.apply()
    kills.reached()
    path.write_bytes(before + b"# a hand edit, made while the rollout was on its way\n")
    edited = kills.fleet.sha(canary)
    kills.release()
    out, err = FaultFleet.finish(controller)
    assert controller.returncode == 1, out + err
    report = json.loads(out)
    run_id = report["run_id"]
    host = next(h for h in report["hosts"] if h["host"] == canary)
    assert host["outcome"] == "failed", host
    assert host["reason"] == "changed-since", host
    assert kills.fleet.sha(canary) == edited
    assert {n: kills.fleet.pid(n) for n in kills.names} == pids
    assert not kills.runs_patch(canary) and not kills.temp_files(canary)
    assert {n: kills.state(n) for n in kills.others} == dict.fromkeys(kills.others, "pre-image")

    said = kills.status()[canary]
    assert said["state"] != "applied" and run_id not in said["detail"], said
    by_run = kills.cli("rollback", "--run", run_id, "--yes", "--json")
    assert by_run.code == 0, by_run.stdout + by_run.stderr
    mine = next(h for h in by_run.json()["hosts"] if h["host"] == canary)
    assert mine["outcome"] == "skipped" and mine["reason"] == "nothing-to-do", mine
    by_patch = kills.cli("rollback", PATCH_ID, "--hosts", INVENTORY, "--yes", "--json")
    mine = next(h for h in by_patch.json()["hosts"] if h["host"] == canary)
    assert mine["outcome"] == "skipped", mine
    assert run_id not in json.dumps(mine), mine
    assert kills.fleet.sha(canary) == edited  # the hand edit is still there

    path.write_bytes(before)  # the operator takes their edit back
    kills.check_invariant()
