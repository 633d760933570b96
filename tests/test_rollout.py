"""End-to-end rollouts on the sandbox fleet: real engine processes, real files, a real ledger,
and (for the SSH variant) real OpenSSH sshd processes on loopback. Driven through the console
script, as an operator runs it."""

from __future__ import annotations

import os
import signal
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from opspatch.ledger.store import Ledger
from opspatch.sandbox.sshd import find_sshd
from tests.faultkit import isolated_home
from tests.fleetkit import GuardedFleet, SandboxFleet, Slot, wait_until
from tests.patchkit import _test_patch

pytestmark = [pytest.mark.engine, pytest.mark.ssh]

ATTRIBUTE_ERROR = (
    "AttributeError: 'EAGLEWorkerV2' object has no attribute 'spec_disable_batch_threshold'"
)

FAST = """
name = "fast"
canary = 1
batch = "50%"
max_in_flight = 2
max_failures = 1
[timeouts]
lock = 20
inspect = 60
swap = 30
restart = 30
ready = {ready}
smoke = 60
restore = 30
"""


@pytest.fixture()
def fleet(tmp_path: Path) -> Iterator[SandboxFleet]:
    sandbox = SandboxFleet(tmp_path, 3).up()
    try:
        yield sandbox
    finally:
        sandbox.close()


@pytest.fixture(scope="module")
def guarded_slot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Slot[GuardedFleet]]:
    """Three guarded hosts shared by the tests that start from them, each test starting where a
    fresh fleet with the guard applied starts (`GuardedFleet.at_baseline`; a test that leaves
    the fleet elsewhere gets a new one next). The module's own HOME: the fleet outlives each
    test's."""
    with isolated_home(tmp_path_factory.mktemp("rollout-home")):
        made = Slot(tmp_path_factory, "guarded", lambda root: GuardedFleet.up(root, 3))
        try:
            yield made
        finally:
            made.close()


@pytest.fixture
def guarded(guarded_slot: Slot[GuardedFleet]) -> SandboxFleet:
    """The fleet with eagle-init-guard applied on every host, as `_guarded` leaves it."""
    return guarded_slot.ready().fleet


def _outcomes(doc: dict) -> dict[str, str]:  # type: ignore[type-arg]
    return {h["host"]: h["outcome"] for h in doc["hosts"]}


def _guarded(fleet: SandboxFleet) -> None:
    """Bring the fleet to a healthy state first (eagle-init-guard applied)."""
    run = fleet.opspatch("apply", "eagle-init-guard", "--hosts", fleet.inventory, "--yes", "--json")
    assert run.code == 0, run.stdout + run.stderr
    assert set(_outcomes(run.json()).values()) == {"applied"}


# ---------------------------------------------------------------------------------------------
# the headline, over the local transport and over real sshd


@pytest.mark.parametrize("over_ssh", [False, True], ids=["local", "ssh"])
def test_incident_apply_status_rollback_apply_again(tmp_path: Path, over_ssh: bool) -> None:
    if over_ssh and find_sshd() is None:
        pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)")
    fleet = SandboxFleet(tmp_path, 3, ssh=over_ssh).up()
    try:
        names = fleet.names
        pre = {n: fleet.sha(n) for n in names}

        # before: healthy, and the first real decode crashes the engine
        first = names[0]
        assert fleet.generate(first, tokens=1) is not None  # /health-like: prefill only
        assert fleet.generate(first, tokens=16) is None
        assert wait_until(lambda: fleet.pid(first) is None, 20)
        assert ATTRIBUTE_ERROR in fleet.log(first)

        # apply: every host applied (the crashed one is restarted by its restart strategy)
        run = fleet.opspatch(
            "apply", "eagle-init-guard", "--hosts", fleet.inventory, "--yes", "--json"
        )
        assert run.code == 0, run.stdout + run.stderr
        doc = run.json()
        assert _outcomes(doc) == {n: "applied" for n in names}
        for host in doc["hosts"]:
            assert [s["step"] for s in host["steps"] if s["status"] == "ok"][:7] == [
                "begin",
                "plan",
                "backup",
                "swap",
                "restart",
                "ready",
                "smoke",
            ]
            assert host["file"]["sha256_before"] == pre[host["host"]]
        # decodes work, through the speculative path
        for name in names:
            out = fleet.generate(name, tokens=16)
            assert out is not None and out["meta_info"]["spec_verify_ct"] > 0

        # the ledger shows the run, finished ok, and its chain verifies
        runs = fleet.opspatch("ledger", "list", "--json").json()["runs"]
        assert runs[0]["run_id"] == doc["run_id"]
        assert (runs[0]["status"], runs[0]["outcome"]) == ("finished", "ok")
        verify = fleet.opspatch("ledger", "verify", "--json")
        assert verify.code == 0 and verify.json()["ok"]

        # status: applied, checked live against the ledger
        status = fleet.opspatch(
            "status", "--hosts", fleet.inventory, "--patch", "eagle-init-guard", "--json"
        )
        assert status.code == 0
        assert {s["host"]: s["state"] for s in status.json()["status"]} == {
            n: "applied" for n in names
        }

        # applying twice: already-applied, no restart
        pids = {n: fleet.pid(n) for n in names}
        again = fleet.opspatch(
            "apply", "eagle-init-guard", "--hosts", fleet.inventory, "--yes", "--json"
        )
        assert again.code == 0
        assert _outcomes(again.json()) == {n: "already-applied" for n in names}
        assert all("restart" not in [s["step"] for s in h["steps"]] for h in again.json()["hosts"])
        assert {n: fleet.pid(n) for n in names} == pids

        # rollback, canary first: a byte-identical pre-image, and the crash comes back with it:
        # the canary's restored file is not served, which halts the rollback (exit 1)
        back = fleet.opspatch(
            "rollback", "eagle-init-guard", "--hosts", fleet.inventory, "--yes", "--json"
        )
        assert back.code == 1, back.stdout + back.stderr
        canary, *rest = names
        assert _outcomes(back.json()) == {
            canary: "restored-not-serving",
            **dict.fromkeys(rest, "skipped"),
        }
        assert fleet.sha(canary) == pre[canary]
        status = fleet.opspatch(
            "status", "--hosts", fleet.inventory, "--patch", "eagle-init-guard", "--json"
        )
        states = {s["host"]: s for s in status.json()["status"]}
        assert states[canary]["state"] == "not-applied"
        assert states[canary]["server_running"] is False
        assert all(states[n]["state"] == "applied" and states[n]["server_running"] for n in rest)
    finally:
        fleet.close()


def test_a_rollback_onto_code_that_crashes_says_the_server_is_not_serving(
    fleet: SandboxFleet,
) -> None:
    """Rolling eagle-init-guard back restores the incident's own code, and the rollback's smoke
    decode crashes it. Before: the step `ok`, the host `restored`, exit 0, nothing said the
    server was down (`status` included)."""
    _guarded(fleet)
    first = fleet.names[0]
    back = fleet.opspatch("rollback", "eagle-init-guard", "--hosts", first, "--yes", "--json")
    assert back.code == 1, back.stdout + back.stderr
    doc = back.json()
    assert doc["outcome"] == "failed"
    host = doc["hosts"][0]
    assert host["outcome"] == "restored-not-serving", host
    assert host["reason"] == "not-serving", host
    assert f"`opspatch apply eagle-init-guard --hosts {first}`" in host["error"]
    smoke = next(s for s in host["steps"] if s["step"] == "smoke")
    assert smoke["status"] == "failed", smoke
    assert host["smoke"]["ok"] is False
    failures = " ".join(host["smoke"]["failures"])
    assert "the server crashed: AttributeError: 'EAGLEWorkerV2' object has no attribute" in failures
    assert "eagle_worker_v2.py" in failures  # where it was raised
    assert wait_until(lambda: fleet.pid(first) is None, 30)  # the decode crashed it
    run = fleet.opspatch("ledger", "show", doc["run_id"], "--json").json()
    recorded = next(h for h in run["host_records"] if h["host"] == first)
    assert recorded["outcome"] == "restored-not-serving"
    assert (
        next(s for s in recorded["steps"] if s["step"] == "smoke" and s["status"] != "started")[
            "status"
        ]
        == "failed"
    )
    status = fleet.opspatch("status", "--hosts", first, "--patch", "eagle-init-guard", "--json")
    (said,) = status.json()["status"]
    assert said["state"] == "not-applied" and said["server_running"] is False, said
    assert "the server is not running" in said["detail"], said


def test_dry_run_changes_nothing(fleet: SandboxFleet) -> None:
    pre = {n: fleet.sha(n) for n in fleet.names}
    pids = {n: fleet.pid(n) for n in fleet.names}
    run = fleet.opspatch("apply", "eagle-init-guard", "--hosts", "sandbox", "--dry-run", "--json")
    assert run.code == 0, run.stderr
    assert set(_outcomes(run.json()).values()) == {"would-apply"}
    assert all(
        "+    spec_disable_batch_threshold: int = 0" in h["diff"] for h in run.json()["hosts"]
    )
    assert {n: fleet.sha(n) for n in fleet.names} == pre
    assert {n: fleet.pid(n) for n in fleet.names} == pids
    assert not fleet.ledger_path.exists() or not Ledger.open(fleet.ledger_path).list_runs()
    # plan --hosts shows, per host, the facts, the resolved file and the diff
    plan = fleet.opspatch("plan", "eagle-init-guard", "--hosts", "sandbox")
    assert plan.code == 0, plan.stderr
    for name in fleet.names:
        assert f"== {name}: would-apply" in plan.stdout
        assert f"{fleet.file(name)} sha256 {pre[name][:12]}; python 3." in plan.stdout
    assert "sglang 0.5.23" in plan.stdout
    assert plan.stdout.count("+        self.spec_disable_batch_threshold = 0") == len(fleet.names)
    # and it left no lock behind: a real apply goes straight through
    assert fleet.opspatch("apply", "eagle-init-guard", "--hosts", "sandbox", "--yes").code == 0
    after = fleet.opspatch("plan", "eagle-init-guard", "--hosts", "sandbox")
    assert after.stdout.count(": already-applied") == len(fleet.names)


def test_round_trips_per_host(fleet: SandboxFleet, tmp_path: Path) -> None:
    """plan is one exec per host; apply is five: begin, swap, restart, ready (the readiness
    polling, on the host) and smoke, which also gives the lock back when it passes."""
    from opspatch.config.patches import load_patch
    from opspatch.core.policy import Playbook
    from opspatch.hosts.operations import open_transport
    from opspatch.runs.commands.apply import apply_to_hosts

    patch = load_patch(Path(__file__).resolve().parent.parent / "patches" / "eagle-init-guard.toml")
    hosts = [fleet.hosts[n] for n in fleet.names]
    transports = []

    def counting(host):  # type: ignore[no-untyped-def]
        transports.append(open_transport(host))
        return transports[-1]

    dry = apply_to_hosts(patch, hosts, Playbook(), factory=counting, ledger=None, dry_run=True)
    assert {h.outcome for h in dry.hosts} == {"would-apply"}
    assert [t.exec_count for t in transports] == [1] * len(hosts)

    transports.clear()
    ledger = Ledger.open(tmp_path / "ledger.sqlite3")
    report = apply_to_hosts(patch, hosts, Playbook(), factory=counting, ledger=ledger)
    assert {h.outcome for h in report.hosts} == {"applied"}
    assert [t.exec_count for t in transports] == [5] * len(hosts)


def test_version_gate_uses_the_distribution_that_owns_the_file(fleet: SandboxFleet) -> None:
    """A patch for another distribution's build (a fork published as `sglang-fork`) must not
    pass the gate on the sandbox's own sglang 0.5.23 (before: the gate was off for any
    distribution but `sglang`); and one for sglang outside its range is refused too."""
    base = (
        Path(__file__).resolve().parent.parent / "patches" / "eagle-init-guard.toml"
    ).read_text()
    fork = base.replace('id = "eagle-init-guard"', 'id = "fork-guard"').replace(
        'distribution = "sglang"', 'distribution = "sglang-fork"'
    )
    assert 'distribution = "sglang-fork"' in fork
    fleet.write_patch("fork-guard", fork)
    run = fleet.opspatch("plan", "fork-guard", "--hosts", "sandbox", "--json")
    assert run.code == 2, run.stdout + run.stderr
    doc = run.json()
    assert doc["refused"] is True
    for host in doc["hosts"]:
        assert host["reason"] == "not-applicable", host
        assert "belongs to sglang 0.5.23, not to sglang-fork" in host["error"]  # why, once
    old = base.replace('id = "eagle-init-guard"', 'id = "old-guard"').replace(
        'versions = ">=0.5.4"', 'versions = ">=0.5.4,<0.5.20"'
    )
    assert 'versions = ">=0.5.4,<0.5.20"' in old
    fleet.write_patch("old-guard", old)
    run = fleet.opspatch("plan", "old-guard", "--hosts", "sandbox", "--json")
    assert run.code == 2, run.stdout + run.stderr
    assert {h["reason"] for h in run.json()["hosts"]} == {"not-applicable"}, run.stdout


def test_patch_not_fitting_one_host_refuses_the_whole_run(fleet: SandboxFleet) -> None:
    odd = fleet.names[-1]
    # on one host the class the patch anchors on is not there (a different build)
    path = fleet.file(odd)
    path.write_text(path.read_text().replace("class EAGLEWorkerV2(", "class EagleWorkerRenamed("))
    pre = {n: fleet.sha(n) for n in fleet.names}
    pids = {n: fleet.pid(n) for n in fleet.names}
    run = fleet.opspatch("apply", "eagle-init-guard", "--hosts", "sandbox", "--yes", "--json")
    assert run.code == 2, run.stdout + run.stderr
    doc = run.json()
    assert "refused before any change" in doc["halted"]
    by_host = {h["host"]: h for h in doc["hosts"]}
    assert by_host[odd]["reason"] == "not-applicable", by_host[odd]
    assert {n: fleet.sha(n) for n in fleet.names} == pre
    assert {n: fleet.pid(n) for n in fleet.names} == pids
    # and every lock was released: the other hosts can be patched right away
    other = fleet.opspatch("apply", "eagle-init-guard", "--hosts", fleet.names[0], "--yes")
    assert other.code == 0, other.stdout + other.stderr


# ---------------------------------------------------------------------------------------------
# failures past the swap


def test_patch_that_breaks_the_engine_at_import_is_rolled_back_on_the_canary(
    guarded: SandboxFleet,
) -> None:
    guarded.write_playbook("fast", FAST.format(ready=30))
    guarded.write_patch(
        "break-at-import",
        _test_patch(
            "break-at-import", 'raise RuntimeError("broken by a test patch")', "breaks the engine"
        ),
    )
    pre = {n: guarded.sha(n) for n in guarded.names}
    pids = {n: guarded.pid(n) for n in guarded.names}
    run = guarded.opspatch(
        "apply", "break-at-import", "--hosts", "sandbox", "--playbook", "fast", "--yes", "--json"
    )
    assert run.code == 1, run.stdout + run.stderr
    doc = run.json()
    canary, *others = guarded.names
    outcomes = _outcomes(doc)
    assert outcomes[canary] == "rolled-back"
    assert all(outcomes[n] == "skipped" for n in others)
    assert doc["halted"]
    # the canary is restored byte-identically and healthy; the others were never touched
    assert {n: guarded.sha(n) for n in guarded.names} == pre
    assert all(guarded.pid(n) == pids[n] for n in others)
    out = guarded.generate(canary)
    assert out is not None and out["meta_info"]["spec_verify_ct"] > 0
    # the ledger says why
    show = guarded.opspatch("ledger", "show", doc["run_id"], "--json").json()
    record = next(h for h in show["host_records"] if h["host"] == canary)
    assert record["outcome"] == "rolled-back"
    assert record["reason"] == "step-failed", record
    assert [v["action"] for v in record["file_versions"]] == ["patch", "restore"]


def test_engine_that_never_becomes_ready_is_restored(guarded: SandboxFleet) -> None:
    guarded.write_playbook("fast", FAST.format(ready=4))
    guarded.write_patch(
        "hang-at-import", _test_patch("hang-at-import", "import time\ntime.sleep(3600)", "hangs")
    )
    pre = {n: guarded.sha(n) for n in guarded.names}
    run = guarded.opspatch(
        "apply",
        "hang-at-import",
        "--hosts",
        guarded.names[0],
        "--playbook",
        "fast",
        "--yes",
        "--json",
    )
    assert run.code == 1, run.stdout + run.stderr
    host = run.json()["hosts"][0]
    assert host["outcome"] == "rolled-back"
    assert host["reason"] == "step-failed", host
    assert guarded.sha(guarded.names[0]) == pre[guarded.names[0]]
    assert guarded.generate(guarded.names[0]) is not None


def test_restore_that_cannot_work_needs_attention_and_halts(guarded: SandboxFleet) -> None:
    canary = guarded.names[0]
    pre = guarded.sha(canary)
    backups = Path(guarded.hosts[canary].state_dir) / "backups"
    # The engine, importing the patched module, removes the host's backup and alters the
    # ledger's copy of the pre-image, then fails: neither copy can restore the file.
    code = f"""
    import shutil, sqlite3
    shutil.rmtree({str(backups)!r}, ignore_errors=True)
    _db = sqlite3.connect({str(guarded.ledger_path)!r}, timeout=30)
    _db.execute("DROP TRIGGER IF EXISTS blobs_refuse_update")
    _db.execute("UPDATE blobs SET data = X'00' WHERE sha256 = ?", ({pre!r},))
    _db.commit()
    raise RuntimeError("broken by a test patch")
    """
    guarded.write_playbook("fast", FAST.format(ready=30))
    guarded.write_patch(
        "sabotage", _test_patch("sabotage", code, "breaks the engine and its backups")
    )
    others = {n: guarded.sha(n) for n in guarded.names[1:]}
    run = guarded.opspatch(
        "apply", "sabotage", "--hosts", "sandbox", "--playbook", "fast", "--yes", "--json"
    )
    assert run.code == 3, run.stdout + run.stderr
    doc = run.json()
    outcomes = _outcomes(doc)
    assert outcomes[canary] == "needs-attention"
    assert doc["hosts"][0]["reason"] == "undo-failed", doc["hosts"][0]
    assert doc["halted"]
    assert all(outcomes[n] == "skipped" for n in guarded.names[1:])
    assert {n: guarded.sha(n) for n in guarded.names[1:]} == others
    # the ledger was tampered with: verify names it and apply refuses to run on it
    verify = guarded.opspatch("ledger", "verify", "--json")
    assert verify.code == 3 and verify.json()["ok"] is False
    refused = guarded.opspatch("apply", "eagle-init-guard", "--hosts", "sandbox", "--yes")
    assert refused.code == 3
    assert "ledger" in refused.stderr


# ---------------------------------------------------------------------------------------------
# concurrency and interruption


SLOW_SEQUENTIAL = """
name = "one-by-one"
canary = 0
batch = 1
max_in_flight = 1
max_failures = 1
"""


def _wait_for_step(fleet: SandboxFleet, step: str, count: int, timeout: float = 60) -> str:
    """Poll the ledger until the newest run has `count` hosts past `step`; its run id."""
    found: dict[str, str] = {}

    def reached() -> bool:
        if not fleet.ledger_path.exists():
            return False
        try:
            con = sqlite3.connect(f"file:{fleet.ledger_path}?mode=ro", uri=True, timeout=5)
            rows = con.execute(
                "SELECT run_id, host, body FROM events WHERE kind = 'step' ORDER BY id"
            ).fetchall()
            con.close()
        except sqlite3.Error:
            return False
        hosts = {
            (r, h) for r, h, body in rows if f'"step":"{step}"' in body and '"status":"ok"' in body
        }
        if len(hosts) >= count:
            found["run"] = sorted(hosts)[-1][0]
            return True
        return False

    assert wait_until(reached, timeout, 0.05), f"no {count} hosts reached {step}"
    return found["run"]


def test_second_apply_on_a_locked_host_is_refused_and_names_the_holder(fleet: SandboxFleet) -> None:
    fleet.write_playbook("one-by-one", SLOW_SEQUENTIAL)
    first = fleet.spawn(
        "apply", "eagle-init-guard", "--hosts", "sandbox", "--playbook", "one-by-one", "--yes"
    )
    try:
        holder = _wait_for_step(fleet, "lease", 3)  # locked, then leased after its preflight
        second = fleet.opspatch(
            "apply", "eagle-init-guard", "--hosts", "sandbox", "--yes", "--json"
        )
        # held by a live run: refused in preflight, before any change (exit 2, issue 17 bug 9)
        assert second.code == 2, second.stdout + second.stderr
        assert second.json()["refused"] is True
        hosts = second.json()["hosts"]
        assert all(host["outcome"] == "skipped" for host in hosts), hosts
        # not started: the holder's lease named (issue 23); a host the first run already finished
        # (a busy machine can get there before this preflight) is no longer held, only not started
        held = [host for host in hosts if host["reason"] == "lease-held"]
        assert held and all(h["reason"] in ("lease-held", "not-started") for h in hosts), hosts
        for host in held:
            (begin,) = host["steps"]
            assert begin["status"] == "failed" and f"(run {holder})" in begin["detail"], begin
    finally:
        assert first.wait(120) == 0, first.stderr.read() if first.stderr else ""


def test_controller_killed_mid_rollout_is_recovered(fleet: SandboxFleet) -> None:
    fleet.write_playbook("one-by-one", SLOW_SEQUENTIAL)
    pre = {n: fleet.sha(n) for n in fleet.names}
    controller = fleet.spawn(
        "apply", "eagle-init-guard", "--hosts", "sandbox", "--playbook", "one-by-one", "--yes"
    )
    run_id = _wait_for_step(fleet, "swap", 1)
    os.kill(controller.pid, signal.SIGKILL)
    controller.wait(30)

    runs = fleet.opspatch("ledger", "list", "--json").json()["runs"]
    assert runs[0]["run_id"] == run_id and runs[0]["status"] == "interrupted"

    recovered = fleet.opspatch("recover", "--yes", "--json")
    assert recovered.code == 0, recovered.stdout + recovered.stderr
    outcomes = _outcomes(recovered.json())
    assert set(outcomes.values()) <= {"applied", "restored"}
    post = fleet.opspatch(
        "status", "--hosts", "sandbox", "--patch", "eagle-init-guard", "--json"
    ).json()
    for state in post["status"]:
        name = state["host"]
        if outcomes[name] == "applied":
            assert state["state"] == "applied"
            out = fleet.generate(name)
            assert out is not None and out["meta_info"]["spec_verify_ct"] > 0
        else:
            assert fleet.sha(name) == pre[name]
    # the patch was never applied twice, and the chain still verifies
    assert all(
        fleet.file(n).read_text().count("# opspatch:eagle-init-guard: set before") <= 1
        for n in fleet.names
    )
    assert fleet.opspatch("ledger", "verify").code == 0


def test_halt_with_rollback_run_restores_every_host_the_run_changed(fleet: SandboxFleet) -> None:
    # sandbox-02 restarts without speculative decoding although the inventory says it runs it:
    # its smoke decode (spec_verify_ct required) fails after the swap.
    inventory = (fleet.state / "inventories" / "sandbox.toml").read_text()
    second = fleet.names[1]
    start = f"--port {fleet.port(second)} --speculative-algorithm EAGLE3"
    assert start in inventory
    (fleet.workspace / "inventories").mkdir(exist_ok=True)
    (fleet.workspace / "inventories" / "mixed.toml").write_text(
        inventory.replace(start, f"--port {fleet.port(second)} --speculative-algorithm NONE")
    )
    fleet.write_playbook(
        "undo-all",
        'name = "undo-all"\ncanary = 0\nbatch = 1\nmax_in_flight = 1\nmax_failures = 1\non_halt = "rollback-run"\n',
    )
    pre = {n: fleet.sha(n) for n in fleet.names}
    run = fleet.opspatch(
        "apply", "eagle-init-guard", "--hosts", "mixed", "--playbook", "undo-all", "--yes", "--json"
    )
    assert run.code == 1, run.stdout + run.stderr
    outcomes = _outcomes(run.json())
    first, second, third = fleet.names
    assert outcomes == {first: "rolled-back", second: "rolled-back", third: "skipped"}
    reasons = {h["host"]: h.get("reason") for h in run.json()["hosts"]}
    assert reasons == {first: "halted", second: "smoke-failed", third: "not-started"}, reasons
    assert {n: fleet.sha(n) for n in fleet.names} == pre


def test_rollback_with_the_ledger_deleted_uses_the_host_backups_or_refuses(
    fleet: SandboxFleet,
) -> None:
    """The ledger is gone but every host still carries the patch and (but one) its backup:
    rollback restores from the hosts' own backups, saying so, and refuses (exit 2, nothing
    changed) the host without one. Before, it exited 0 with every host skipped."""
    pre = {n: fleet.sha(n) for n in fleet.names}
    _guarded(fleet)
    patched = {n: fleet.sha(n) for n in fleet.names}
    for suffix in ("", "-wal", "-shm"):
        Path(str(fleet.ledger_path) + suffix).unlink(missing_ok=True)
    bare = fleet.names[-1]
    backups = fleet.host_dir(bare) / "state" / "backups"
    assert (backups / pre[bare]).is_file()
    for backup in backups.iterdir():
        backup.unlink()
    # host by host: the restored incident code is not served (its decode crashes it), which
    # halts a rollback of several hosts after the first
    for name in fleet.names[:-1]:
        run = fleet.opspatch("rollback", "eagle-init-guard", "--hosts", f"sandbox:{name}",
                             "--yes", "--json")  # fmt: skip
        assert run.code == 1, run.stdout + run.stderr
        (host,) = run.json()["hosts"]
        assert host["outcome"] == "restored-not-serving", host
        assert "host's own backup" in host["note"]
        assert fleet.sha(name) == pre[name]
    run = fleet.opspatch("rollback", "eagle-init-guard", "--hosts", f"sandbox:{bare}", "--yes",
                         "--json")  # fmt: skip
    assert run.code == 2, run.stdout + run.stderr
    (host,) = run.json()["hosts"]
    assert host["outcome"] == "skipped"
    assert host["reason"] == "no-record", host
    assert "no backup of its pre-image" in host["error"]  # the wording, checked here once
    assert fleet.sha(bare) == patched[bare]


BASELINE = """
name = "{name}"
canary = 1
batch = "all"
max_failures = 3
[smoke]
baseline = {baseline}
"""


def test_a_baseline_that_cannot_be_taken_is_said_and_can_be_required(fleet: SandboxFleet) -> None:
    """On the incident's servers the pre-patch decode is what crashes them: with `baseline =
    true` the patch still goes on, and the outcome says output preservation was not checked
    (before: silently `applied`); with `baseline = "required"` the host is refused before any
    change."""
    first, second, *rest = fleet.names
    pre = {n: fleet.sha(n) for n in fleet.names}
    fleet.write_playbook("best-effort", BASELINE.format(name="best-effort", baseline="true"))
    run = fleet.opspatch("apply", "eagle-init-guard", "--hosts", first, "--playbook",
                         "best-effort", "--yes", "--json")  # fmt: skip
    assert run.code == 0, run.stdout + run.stderr
    (host,) = run.json()["hosts"]
    assert host["outcome"] == "applied"
    assert "output preservation was not checked" in host["note"]
    fleet.write_playbook("strict", BASELINE.format(name="strict", baseline='"required"'))
    run = fleet.opspatch("apply", "eagle-init-guard", "--hosts", second, "--playbook", "strict",
                         "--yes", "--json")  # fmt: skip
    assert run.code == 1, run.stdout + run.stderr
    (host,) = run.json()["hosts"]
    assert host["outcome"] == "failed"
    assert host["reason"] == "baseline-failed", host
    assert fleet.sha(second) == pre[second]
    assert "swap" not in [s["step"] for s in host["steps"]]


def test_a_staged_apply_leaves_servers_running_old_code_until_restart_proves_it(
    fleet: SandboxFleet,
) -> None:
    """`apply --restart never` swaps the files only: every host is `staged`, its server (same
    pid) still runs the old code, and `status` says so; `opspatch restart` then restarts, proves
    and completes it. A staged change that breaks the engine is rolled back by `restart`."""
    pids = {n: fleet.pid(n) for n in fleet.names}
    pre = {n: fleet.sha(n) for n in fleet.names}
    run = fleet.opspatch("apply", "eagle-init-guard", "--hosts", "sandbox", "--restart", "never",
                         "--yes", "--json")  # fmt: skip
    assert run.code == 0, run.stdout + run.stderr
    assert set(_outcomes(run.json()).values()) == {"staged"}
    assert {n: fleet.pid(n) for n in fleet.names} == pids  # nothing restarted
    assert all(fleet.sha(n) != pre[n] for n in fleet.names)
    status = fleet.opspatch("status", "--hosts", "sandbox", "--patch", "eagle-init-guard", "--json")
    assert {s["state"] for s in status.json()["status"]} == {"staged"}, status.stdout
    done = fleet.opspatch("restart", "--hosts", "sandbox", "--yes", "--json")
    assert done.code == 0, done.stdout + done.stderr
    assert set(_outcomes(done.json()).values()) == {"applied"}
    assert all(fleet.pid(n) != pids[n] for n in fleet.names)
    status = fleet.opspatch("status", "--hosts", "sandbox", "--patch", "eagle-init-guard", "--json")
    assert {s["state"] for s in status.json()["status"]} == {"applied"}
    # a staged change that breaks the engine: restart rolls it back on the canary and halts
    fleet.write_playbook("fast", FAST.format(ready=30))
    fleet.write_patch(
        "break-at-import",
        _test_patch("break-at-import", 'raise RuntimeError("broken by a test patch")', "breaks"),
    )
    guarded = {n: fleet.sha(n) for n in fleet.names}
    staged = fleet.opspatch("apply", "break-at-import", "--hosts", "sandbox", "--restart", "never",
                            "--yes", "--json")  # fmt: skip
    assert staged.code == 0, staged.stdout + staged.stderr
    broken = fleet.opspatch(
        "restart", "--hosts", "sandbox", "--playbook", "fast", "--yes", "--json"
    )
    assert broken.code == 1, broken.stdout + broken.stderr
    canary, *others = fleet.names
    outcomes = _outcomes(broken.json())
    assert outcomes[canary] == "rolled-back"
    assert all(outcomes[n] == "skipped" for n in others)
    assert fleet.sha(canary) == guarded[canary]
    (said,) = [h for h in broken.json()["hosts"] if h["host"] == canary]
    assert said["reason"] == "step-failed", said
    assert "RuntimeError: broken by a test patch" in said["error"]  # the engine's own words


def test_stacked_patches_over_ssh_status_names_the_run_on_top_and_roll_back_in_order(
    tmp_path: Path,
) -> None:
    """Patch B applied on top of patch A on one host (over real sshd): `status` says A is
    applied and patched further by B's run (not drifted), `rollback A` is refused naming B,
    and B then A gives back the bytes before A."""
    if find_sshd() is None:
        pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)")
    fleet = SandboxFleet(tmp_path, 1, ssh=True).up()
    try:
        (name,) = fleet.names
        _guarded(fleet)  # a healthy engine, so every restart's smoke decode passes
        guarded = fleet.sha(name)
        for patch_id, line in (("stack-a", "STACK_A = 1"), ("stack-b", "STACK_B = 2")):
            fleet.write_patch(patch_id, _test_patch(patch_id, line, f"appends {line}"))
        applied = {}
        for patch_id in ("stack-a", "stack-b"):
            run = fleet.opspatch("apply", patch_id, "--hosts", fleet.inventory, "--yes", "--json")
            assert run.code == 0, run.stdout + run.stderr
            assert _outcomes(run.json()) == {name: "applied"}
            applied[patch_id] = run.json()["run_id"]
        stacked = fleet.sha(name)
        run_a, run_b = applied["stack-a"], applied["stack-b"]

        status = fleet.opspatch("status", "--hosts", fleet.inventory, "--patch", "stack-a",
                                "--patch", "stack-b", "--patch", "eagle-init-guard", "--json")  # fmt: skip
        assert status.code == 0, status.stdout + status.stderr
        found = {s["patch"]: (s["state"], s["detail"]) for s in status.json()["status"]}
        assert found["stack-b"] == (
            "applied",
            f"as written by run {run_b}, proven by its smoke decode",
        )
        assert found["stack-a"] == (
            "applied",
            f"written by run {run_a}, patched further by run {run_b} (stack-b): "
            "roll stack-b back first",
        )
        assert found["eagle-init-guard"][0] == "applied"
        assert found["eagle-init-guard"][1].endswith(
            f"patched further by run {run_a} (stack-a), then run {run_b} (stack-b): "
            "roll stack-b back first"
        )

        refused = fleet.opspatch("rollback", "stack-a", "--hosts", fleet.inventory, "--yes",
                                 "--json")  # fmt: skip
        assert refused.code == 2, refused.stdout + refused.stderr
        (host,) = refused.json()["hosts"]
        assert host["outcome"] == "skipped"
        assert host["reason"] == "patched-further", host
        assert fleet.sha(name) == stacked

        for patch_id in ("stack-b", "stack-a"):
            back = fleet.opspatch("rollback", patch_id, "--hosts", fleet.inventory, "--yes",
                                  "--json")  # fmt: skip
            assert back.code == 0, back.stdout + back.stderr
            assert _outcomes(back.json()) == {name: "restored"}
        assert fleet.sha(name) == guarded
        status = fleet.opspatch("status", "--hosts", fleet.inventory, "--patch", "stack-a",
                                "--json")  # fmt: skip
        assert [s["state"] for s in status.json()["status"]] == ["not-applied"]
    finally:
        fleet.close()


def test_one_machine_through_two_inventories_is_one_host_to_status_and_rollback(
    tmp_path: Path,
) -> None:
    """The operator's own inventory names the sandbox host `lab-gpu`; the sandbox's `sandbox-ssh`
    names it `sandbox-01`. An apply through one is the same machine's change to `status` and
    `rollback` through the other (matched by /etc/machine-id and the file's path), not "no
    ledger record"."""
    if find_sshd() is None:
        pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)")
    fleet = SandboxFleet(tmp_path, 1, ssh=True).up()
    try:
        (name,) = fleet.names
        _guarded(fleet)  # a healthy engine, so every restart's smoke decode passes
        text = (fleet.state / "inventories" / "sandbox-ssh.toml").read_text()
        (fleet.workspace / "inventories").mkdir(exist_ok=True)
        (fleet.workspace / "inventories" / "lab.toml").write_text(
            text.replace(f"[hosts.{name}", "[hosts.lab-gpu").replace(f'"{name}"', '"lab-gpu"')
        )
        fleet.write_patch("mark", _test_patch("mark", "MARK = 1", "appends a mark"))
        before = fleet.sha(name)
        run = fleet.opspatch("apply", "mark", "--hosts", "lab:lab-gpu", "--yes", "--json")
        assert run.code == 0, run.stdout + run.stderr
        assert _outcomes(run.json()) == {"lab-gpu": "applied"}
        status = fleet.opspatch("status", "--hosts", "sandbox-ssh", "--patch", "mark", "--json")
        assert status.code == 0, status.stdout + status.stderr
        (found,) = status.json()["status"]
        assert (found["host"], found["state"]) == (name, "applied")
        assert found["detail"] == (
            f"as written by run {run.json()['run_id']}, proven by its smoke decode"
        ), found

        back = fleet.opspatch("rollback", "mark", "--hosts", "sandbox-ssh", "--yes", "--json")
        assert back.code == 0, back.stdout + back.stderr
        (host,) = back.json()["hosts"]
        assert (host["host"], host["outcome"], host["note"]) == (name, "restored", None), host
        assert fleet.sha(name) == before
        status = fleet.opspatch("status", "--hosts", "lab:lab-gpu", "--patch", "mark", "--json")
        (found,) = status.json()["status"]
        assert found["state"] == "not-applied", found
    finally:
        fleet.close()


def test_recover_twice_restarts_a_host_once(fleet: SandboxFleet) -> None:
    """A staged change finished by `recover --hosts`, then `recover --hosts` again: the second
    finds it proven and its server started after the write, and leaves it alone (before, every
    recover said "finished run R's change" and restarted the engine again)."""
    first = fleet.names[0]
    staged = fleet.opspatch("apply", "eagle-init-guard", "--hosts", first, "--restart", "never",
                            "--yes", "--json")  # fmt: skip
    assert staged.code == 0, staged.stdout + staged.stderr
    before = fleet.pid(first)
    once = fleet.opspatch("recover", "--hosts", first, "--yes", "--json")
    assert once.code == 0, once.stdout + once.stderr
    (host,) = once.json()["hosts"]
    assert host["outcome"] == "applied" and "finished run" in host["note"], host
    pid = fleet.pid(first)
    assert pid is not None and pid != before
    twice = fleet.opspatch("recover", "--hosts", first, "--yes", "--json")
    assert twice.code == 0, twice.stdout + twice.stderr
    (host,) = twice.json()["hosts"]
    assert host["outcome"] == "applied", host
    assert "left alone" in host["note"] and "finished run" not in host["note"], host
    assert "restart" not in [s["step"] for s in host["steps"]]
    assert fleet.pid(first) == pid
    out = fleet.generate(first)
    assert out is not None and out["meta_info"]["spec_verify_ct"] > 0


def test_a_bare_recover_reaches_a_host_a_finished_run_left_needing_attention(
    fleet: SandboxFleet,
) -> None:
    """A run that finished with a host `needs-attention` (its connection lost mid-swap, its lock
    still held) and nothing interrupted: before, a bare `recover` answered "no interrupted run
    in the ledger" (exit 2) and left the host locked."""
    from opspatch.hosts.transport.scripted import agent_operation
    from tests.ledgerkit import begin

    _guarded(fleet)
    first = fleet.names[0]
    with Ledger.open(fleet.ledger_path) as ledger:
        lost = begin(ledger, hosts=(first,), inventories={first: "sandbox"})
        ledger.record_step(lost, first, "swap", "failed", 1.0, "the connection was lost")
        ledger.record_host_outcome(
            lost, first, "needs-attention", "the swap did not answer: the connection was lost", None
        )
        ledger.finish_run(lost, "needs-attention")
    state = fleet.hosts[first].state_dir
    held = agent_operation(
        "lock", {"state_dir": state, "owner": "ops@lost", "run_id": lost, "ttl_seconds": 1800}
    )
    assert isinstance(held, dict)
    recovered = fleet.opspatch("recover", "--yes", "--json")
    assert recovered.code == 0, recovered.stdout + recovered.stderr
    (host,) = recovered.json()["hosts"]
    assert host["host"] == first and host["outcome"] == "applied", host
    assert f"took the lock over from run {lost}" in host["steps"][0]["detail"]
    assert not (Path(state) / "lock.json").exists()
    again = fleet.opspatch("recover", "--yes")
    assert again.code == 2 and "no host that a recent run left" in again.stderr, again.stderr
