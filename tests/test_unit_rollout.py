"""A unit (one server over two nodes, TP=2 on each: the stand-in's real gloo group of four
ranks, each node its own process tree and sandbox host) patched, restarted and proven as one,
through the console script, locally and over sshd: the incident reproduced on the head and
fixed; a patch that crashes one rank at start rolled back on every node, the unit serving
again; a node's engine killed during the restart named and the unit restored without waiting
for the readiness deadline; a controller killed between the two nodes' swaps, then `recover`
leaving the unit uniform; a restart of one node refused; a patch that changes one token of
what the unit says (the smoke passes it) judged `fail` on the head and rolled back on every node.

One fleet for the module: each test leaves the unit serving eagle-init-guard (the guard is what
the first test applies), so the next starts from there; a test that needs the unit serving
first (`guarded`) applies the guard itself when it runs without the first test (`-k`).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from opspatch.config.patches import load_patch
from opspatch.core.edit import detect
from opspatch.core.vocabulary import Detected, Step, StepStatus
from opspatch.hosts.agent.processes import stop_process_tree
from opspatch.ledger.store import Ledger
from tests.faultkit import arm_switch, install_wrapper
from tests.fleetkit import SandboxFleet, wait_until
from tests.patchkit import ONE_TOKEN, _test_patch
from tests.unitkit import HEAD, NODE, two_node_unit

pytestmark = [pytest.mark.engine, pytest.mark.ssh]


PLAYBOOK = """
name = "unit"
canary = 0
max_failures = 1
[timeouts]
ready = {ready}
restore_ready = {ready}
restart = 120
"""


@pytest.fixture(scope="module")
def unit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxFleet]:
    with two_node_unit(tmp_path_factory) as fleet:
        yield fleet


@pytest.fixture
def guarded(unit: SandboxFleet) -> None:
    """The unit serving eagle-init-guard, as the first test leaves it: applied here when it is
    not there (a test run alone), since the incident kills the first decode of the unit."""
    guard = load_patch(Path(__file__).resolve().parent.parent / "patches" / "eagle-init-guard.toml")
    carried = {detect(unit.file(n).read_bytes(), guard.spec).state for n in (HEAD, NODE)}
    if carried != {Detected.APPLIED}:
        run = unit.opspatch("apply", "eagle-init-guard", "--hosts", "sandbox:unit-01", "--yes")
        assert run.code == 0, run.stdout + run.stderr
    assert serving(unit)


def outcomes(doc: dict) -> dict[str, str]:  # type: ignore[type-arg]
    return {h["host"]: h["outcome"] for h in doc["hosts"]}


def serving(fleet: SandboxFleet) -> bool:
    out = fleet.generate(HEAD, tokens=8)
    return out is not None and "text" in out


def test_the_incident_on_a_unit_is_fixed_by_one_apply_over_both_nodes(
    unit: SandboxFleet,
) -> None:
    assert unit.generate(HEAD, tokens=8) is None  # the incident: the first decode kills it
    pre = {n: unit.sha(n) for n in (HEAD, NODE)}
    assert pre[HEAD] == pre[NODE]
    pids = {n: unit.pid(n) for n in (HEAD, NODE)}
    run = unit.opspatch(
        "apply",
        "eagle-init-guard",
        "--hosts",
        "sandbox:unit-01",  # the local transport
        "--yes",
        "--json",
    )
    assert run.code == 0, run.stdout + run.stderr
    doc = run.json()
    assert outcomes(doc) == {HEAD: "applied", NODE: "applied"}
    assert unit.sha(HEAD) == unit.sha(NODE) != pre[HEAD]
    assert all(unit.pid(n) not in (None, pids[n]) for n in (HEAD, NODE))  # both restarted
    steps = {h["host"]: [s["step"] for s in h["steps"]] for h in doc["hosts"]}
    assert steps[HEAD][-4:] == ["stop", "start", "ready", "smoke"]
    assert steps[NODE][-3:] == ["stop", "start", "smoke"]
    assert serving(unit)


@pytest.mark.usefixtures("guarded")
def test_a_patch_that_crashes_one_rank_at_start_is_rolled_back_on_every_node(
    unit: SandboxFleet,
) -> None:
    unit.write_playbook("unit", PLAYBOOK.format(ready=240))
    crash = _test_patch(
        "crash-rank-3",
        """
        import multiprocessing as _mp
        if _mp.current_process().name == "scheduler_TP3":
            raise RuntimeError("broken on rank 3 by a test patch")
        """,
        "crashes the last rank at start",
    )
    unit.write_patch("crash-rank-3", crash)
    pre = {n: unit.sha(n) for n in (HEAD, NODE)}
    run = unit.opspatch(
        "apply",
        "crash-rank-3",
        "--hosts",
        "sandbox-ssh:unit-01",
        "--playbook",
        "unit",
        "--yes",
        "--json",
        timeout=600,
    )
    assert run.code == 1, run.stdout + run.stderr
    doc = run.json()
    assert outcomes(doc) == {HEAD: "rolled-back", NODE: "rolled-back"}
    assert {n: unit.sha(n) for n in (HEAD, NODE)} == pre  # byte for byte, on every node
    errors = [h["error"] for h in doc["hosts"]]
    assert all(e.startswith(errors[0].split(":")[0]) for e in errors)  # one cause, named once
    assert serving(unit)


@pytest.mark.usefixtures("guarded")
def test_a_node_killed_during_the_restart_is_named_and_the_unit_restored(
    unit: SandboxFleet,
) -> None:
    """The head's start is slowed (a sleep at import on rank 0), the other node's engine is
    killed once it started; the run ends long before the readiness deadline (600 s), naming
    the node, with every node back and serving."""
    unit.write_playbook("slow", PLAYBOOK.format(ready=600).replace('"unit"', '"slow"'))
    slow = _test_patch(
        "slow-head",
        """
        import multiprocessing as _mp
        if _mp.current_process().name == "scheduler_TP0":
            import time as _time
            _time.sleep(40)
        """,
        "slows the head's start",
    )
    unit.write_patch("slow-head", slow)
    pre = {n: unit.sha(n) for n in (HEAD, NODE)}
    last_run = ledger_newest(unit)
    started = time.monotonic()
    proc = unit.spawn(
        "apply",
        "slow-head",
        "--hosts",
        "sandbox-ssh:unit-01",
        "--playbook",
        "slow",
        "--yes",
        "--json",
    )
    try:  # once the node's start is recorded done, the head is being awaited
        assert wait_until(lambda: node_started(unit, last_run), timeout=240)
        victim = unit.pid(NODE)
        assert victim is not None
        stop_process_tree(victim, 5.0)
        out, err = proc.communicate(timeout=480)
    finally:
        if proc.poll() is None:
            proc.kill()
    took = time.monotonic() - started
    assert proc.returncode == 1, out + err
    doc = json.loads(out)
    assert outcomes(doc) == {HEAD: "rolled-back", NODE: "rolled-back"}
    head = next(h for h in doc["hosts"] if h["host"] == HEAD)
    assert head["reason"] == "step-failed", head
    assert head["error"].startswith(f"{NODE}: ready: its engine exited"), head["error"]  # which
    assert took < 600  # seen by the look at the node, not at the readiness deadline
    assert {n: unit.sha(n) for n in (HEAD, NODE)} == pre
    assert serving(unit)


def node_started(fleet: SandboxFleet, after: str | None) -> bool:
    """Whether a run newer than `after` recorded the other node's `start` done."""
    newest = ledger_newest(fleet)
    if newest == after:
        return False
    with Ledger.open(fleet.ledger_path) as ledger:
        found = ledger.host_steps(NODE, [Step.START])
    return any(run == newest and step.status == StepStatus.OK for run, step in found)


def ledger_newest(fleet: SandboxFleet) -> str | None:
    with Ledger.open(fleet.ledger_path) as ledger:
        runs = ledger.list_runs(limit=1)
    return runs[0].run_id if runs else None


@pytest.mark.usefixtures("guarded")
def test_recover_after_a_controller_killed_between_the_two_swaps_leaves_the_unit_uniform(
    unit: SandboxFleet,
) -> None:
    """The other node's interpreter holds its swap (the fault switch of tests/faultkit.py in an
    inventory `faults`); the controller is killed there, the head swapped and the node not.
    `recover` puts the head back and restarts the unit as one: uniform, serving."""
    control = unit.root / "fault"
    control.mkdir(exist_ok=True)
    text = (unit.state / "inventories" / "sandbox-ssh.toml").read_text()
    real = unit.hosts[NODE].engine.python
    line = f"python = {json.dumps(real)}"
    assert text.count(line) == 1, line
    wrapper = install_wrapper(control, real)
    folder = unit.workspace / "inventories"
    folder.mkdir(exist_ok=True)
    (folder / "faults.toml").write_text(text.replace(line, f"python = {json.dumps(str(wrapper))}"))
    unit.write_patch("harmless", _test_patch("harmless", "_OPSPATCH_TEST_MARK = 1", "harmless"))
    pre = {n: unit.sha(n) for n in (HEAD, NODE)}
    arm_switch(control, "swap", at="before")
    proc = unit.spawn("apply", "harmless", "--hosts", "faults:unit-01", "--yes")
    try:
        assert wait_until((control / "reached.json").exists, timeout=180), "never held"
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        (control / "release").touch()
    assert unit.sha(HEAD) != pre[HEAD] and unit.sha(NODE) == pre[NODE]  # the nodes differ
    status = unit.opspatch("status", "--hosts", "faults:unit-01", "--patch", "harmless", "--json")
    assert status.code == 0, status.stdout + status.stderr
    assert {s["state"] for s in status.json()["status"]} == {"partial"}  # never "applied"

    run = unit.opspatch("recover", "--yes", "--json", timeout=600)
    assert run.code == 0, run.stdout + run.stderr
    assert outcomes(run.json()) == {HEAD: "restored", NODE: "restored"}
    assert {n: unit.sha(n) for n in (HEAD, NODE)} == pre  # uniform at the pre-image
    assert serving(unit)


def test_nodes_with_different_pre_images_are_refused_naming_the_odd_node(
    unit: SandboxFleet,
) -> None:
    odd = unit.file(NODE)
    kept = odd.read_bytes()
    odd.write_bytes(kept + b"# a hand edit on one node\n")
    try:
        before = {n: unit.sha(n) for n in (HEAD, NODE)}
        pids = {n: unit.pid(n) for n in (HEAD, NODE)}
        unit.write_patch("harmless", _test_patch("harmless", "_OPSPATCH_TEST_MARK = 1", "harmless"))
        run = unit.opspatch(
            "apply", "harmless", "--hosts", "sandbox-ssh:unit-01", "--yes", "--json"
        )
        assert run.code == 2, run.stdout + run.stderr
        doc = run.json()
        assert (
            f"unit unit-01: {NODE}: sglang.srt.speculative.eagle_worker_v2 pre-image"
            in (doc["halted"])
        )
        assert {n: unit.sha(n) for n in (HEAD, NODE)} == before  # nothing swapped
        assert {n: unit.pid(n) for n in (HEAD, NODE)} == pids  # nothing restarted
    finally:
        odd.write_bytes(kept)


def test_a_restart_of_one_node_is_refused_and_touches_nothing(unit: SandboxFleet) -> None:
    pids = {n: unit.pid(n) for n in (HEAD, NODE)}
    run = unit.opspatch("restart", "--hosts", f"sandbox-ssh:{NODE}", "--yes")
    assert run.code == 2, run.stdout + run.stderr
    assert "unit-01" in run.stdout + run.stderr
    assert {n: unit.pid(n) for n in (HEAD, NODE)} == pids


@pytest.mark.usefixtures("guarded")
def test_a_patch_that_changes_one_token_on_the_unit_is_judged_fail_and_rolled_back(
    unit: SandboxFleet,
) -> None:
    """The canary judge on the unit's head: its old server measured before the swap, the
    changed one after the smoke (which passes it); `tokens fail` undoes it on both nodes."""
    judged = PLAYBOOK.format(ready=240).replace("canary = 0", "canary = 1")
    # one round: tokens are the same in every round (greedy; docs/judge.md)
    unit.write_playbook("unit", judged + "[judge]\ncount = 9\nmax_new_tokens = 32\nrepeats = 1\n")
    unit.write_patch("one-token", ONE_TOKEN)

    def sampler(node: str) -> bytes:
        return (unit.file(node).parents[1] / "layers" / "sampler.py").read_bytes()

    pre = {n: sampler(n) for n in (HEAD, NODE)}
    run = unit.opspatch(
        "apply", "one-token", "--hosts", "sandbox:unit-01", "--playbook", "unit", "--yes",
        "--json", timeout=600,
    )  # fmt: skip
    assert run.code == 1, run.stdout + run.stderr
    doc = run.json()
    assert outcomes(doc) == {HEAD: "rolled-back", NODE: "rolled-back"}
    hosts = {h["host"]: h for h in doc["hosts"]}
    assert hosts[HEAD]["judgment"]["verdict"] == "fail"
    assert "judgment" not in hosts[NODE]
    steps = {n: {s["step"]: s for s in h["steps"]} for n, h in hosts.items()}
    assert steps[HEAD]["smoke"]["status"] == "ok" and steps[HEAD]["judge"]["status"] == "failed"
    assert steps[NODE]["judge"]["status"] == "failed"
    assert steps[NODE]["judge"]["detail"].startswith(f"judged through the head ({HEAD}, ")
    assert {n: hosts[n].get("reason") for n in (HEAD, NODE)} == dict.fromkeys(
        (HEAD, NODE), "judge-failed"
    ), hosts
    assert {n: sampler(n) for n in (HEAD, NODE)} == pre  # byte for byte, on every node
    report = unit.opspatch("ledger", "report", doc["run_id"])
    assert report.code == 0, report.stderr
    assert report.stdout.count("tokens fail") >= 2  # the head's judge step and the node's
    assert serving(unit)
