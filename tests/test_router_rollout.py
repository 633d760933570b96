"""Rollouts behind the real sglang-router (0.3.2, `--disable-retries`, so no retry can hide a
dropped request): drain, prove, re-admit under steady load, and the router's faults.

One sandbox of 3 stand-in hosts behind one router is shared by the module, in the order the
tests are written (each leaves every worker registered and healthy for the next): the harmless
apply under load, a rollback of it on the canary under load, the smoke-rejected canary, the
refusals (capacity, then fleet_down going ahead; unreachable router, unknown worker URL), the
keyed router, the controller killed while a worker was drained and its recover, a proven host
found out of rotation and re-admitted by recover after a smoke decode, the router killed
mid-run, and last the same apply without a router (it opens the router's circuit breakers).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from opspatch.sandbox.load import LoadReport, run_load
from opspatch.sandbox.processes import free_port
from tests.clirunner import opspatch
from tests.fleetkit import SandboxFleet, alive, copy_patch, wait_until

pytest.importorskip("sglang_router", reason="sglang-router (the sandbox extra) is not installed")

pytestmark = [pytest.mark.engine, pytest.mark.router, pytest.mark.timeout(300)]

HARMLESS = '''
id = "{patch_id}"
summary = "A harmless module-level constant"
rationale = "rotation tests: a change whose restart must cost no client request"
[target]
module = "sglang.srt.speculative.eagle_worker_v2"
versions = ">=0.5.4"
[[edits]]
kind = "insert"
scope = "<module>"
position = "end"
code = """
{code}
"""
'''


# one canary, then the other two at once: the router may lose two of its three workers
TWO_AT_ONCE = 'canary = 1\nbatch = "all"\n[rotation]\nmax_unavailable = 2\n'


def harmless(fleet: SandboxFleet, patch_id: str, code: str | None = None) -> None:
    constant = patch_id.upper().replace("-", "_")
    fleet.write_patch(patch_id, HARMLESS.format(patch_id=patch_id, code=code or f"{constant} = 1"))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxFleet]:
    fleet = SandboxFleet(tmp_path_factory.mktemp("routed"), 3, router=True).up()
    copy_patch(fleet, "eagle-init-guard")
    # every engine must decode before load can run (the sandbox reproduces the incident): the
    # incident playbook (fleet down, all at once) already drains and admits each host
    run = fleet.opspatch(
        "apply", "eagle-init-guard", "--hosts", "sandbox", "--yes", "--playbook", "incident"
    )
    assert run.code == 0, run.stdout + run.stderr
    try:
        yield fleet
    finally:
        fleet.close()


def router_url(fleet: SandboxFleet) -> str:
    """The router `sandbox up --router` wrote into the inventory (every host's)."""
    routers = {h.router.url for h in fleet.hosts.values() if h.router is not None}
    assert len(routers) == 1, routers
    return routers.pop()


def test_sandbox_status_gives_the_router_with_its_pid(fleet: SandboxFleet) -> None:
    router = fleet.opspatch("sandbox", "status", "--json").json()["router"]
    assert router["url"] == router_url(fleet)
    assert router["pid"] and alive(router["pid"])


def router_workers(fleet: SandboxFleet) -> dict[str, dict[str, Any]]:
    with urllib.request.urlopen(router_url(fleet) + "/workers", timeout=5) as response:
        return {w["url"]: w for w in json.loads(response.read())["workers"]}


def all_in_rotation(fleet: SandboxFleet) -> bool:
    workers = router_workers(fleet)
    return all(
        fleet.hosts[n].engine.url in workers and workers[fleet.hosts[n].engine.url]["is_healthy"]
        for n in fleet.names
    )


class Load:
    """`run_load` in a thread until `stop()`, a few seconds after the work under test."""

    def __init__(self, fleet: SandboxFleet) -> None:
        self.until = threading.Event()
        self.report: LoadReport | None = None
        url = router_url(fleet)

        def go() -> None:
            self.report = run_load(url, requests=100_000, seconds=240, until=self.until)

        self.thread = threading.Thread(target=go, daemon=True)
        self.thread.start()
        time.sleep(1.0)  # steady before the rollout starts

    def stop(self, *, settle: float = 3.0) -> LoadReport:
        time.sleep(settle)  # re-admitted workers get traffic before the load ends
        self.until.set()
        self.thread.join(timeout=120)
        assert self.report is not None
        return self.report


def steps_of(host: dict[str, Any]) -> list[tuple[str, str]]:
    return [(s["step"], s["status"]) for s in host["steps"]]


def test_an_apply_under_load_drains_proves_and_readmits_every_host_with_no_failed_request(
    fleet: SandboxFleet,
) -> None:
    harmless(fleet, "harmless-one")
    book = fleet.write_playbook("two", TWO_AT_ONCE)
    load = Load(fleet)
    run = fleet.opspatch(
        "apply", "harmless-one", "--hosts", "sandbox", "--yes", "--json", "--playbook", str(book)
    )
    report = load.stop()
    assert run.code == 0, run.stdout + run.stderr
    hosts = {h["host"]: h for h in run.json()["hosts"]}
    for name, host in hosts.items():
        assert host["outcome"] == "applied", name
        assert host["rotation"] == "in-rotation", name
        steps = [s for s, status in steps_of(host) if status == "ok"]
        assert steps.index("drain") < steps.index("restart") < steps.index("smoke")
        assert steps[-1] == "admit", steps
    assert report.sent > 50 and report.failed == 0, report.to_json()
    assert all_in_rotation(fleet)
    served = {w.url: w for w in report.workers}
    for name in fleet.names:
        worker = served[fleet.hosts[name].engine.url]
        assert worker.registrations > 1, worker  # re-admitted under a new id
        assert (worker.served_after_last_admission or 0) > 0, worker
    # every step is in the ledger, drain and admit included
    ledger = fleet.opspatch("ledger", "show", run.json()["run_id"], "--json")
    assert ledger.code == 0, ledger.stderr
    assert '"admit"' in ledger.stdout and '"drain"' in ledger.stdout


def test_a_rollback_behind_the_router_drains_and_readmits_too(fleet: SandboxFleet) -> None:
    canary = fleet.names[0]
    load = Load(fleet)
    run = fleet.opspatch(
        "rollback", "harmless-one", "--hosts", f"sandbox:{canary}", "--yes", "--json"
    )
    report = load.stop(settle=1.0)
    assert run.code == 0, run.stdout + run.stderr
    (host,) = run.json()["hosts"]
    assert host["outcome"] == "restored" and host["rotation"] == "in-rotation"
    done = [s for s, status in steps_of(host) if status == "ok"]
    assert done.index("drain") < done.index("restart") and done[-1] == "admit", done
    assert report.failed == 0, report.to_json()
    assert all_in_rotation(fleet)


def test_a_smoke_rejected_canary_is_drained_restored_and_readmitted_with_no_failed_request(
    fleet: SandboxFleet,
) -> None:
    # The engine keeps serving, but its log says what the playbook's fail_patterns reject.
    harmless(fleet, "noisy", code='print("Traceback (most recent call last):", flush=True)')
    canary = fleet.names[0]
    before = {n: fleet.sha(n) for n in fleet.names}
    load = Load(fleet)
    run = fleet.opspatch("apply", "noisy", "--hosts", "sandbox", "--yes", "--json")
    report = load.stop()
    assert run.code == 1, run.stdout + run.stderr
    hosts = {h["host"]: h for h in run.json()["hosts"]}
    assert hosts[canary]["outcome"] == "rolled-back"
    assert hosts[canary]["rotation"] == "in-rotation"
    done = [s for s, status in steps_of(hosts[canary]) if status == "ok"]
    assert "drain" in done and done[-1] == "admit", done
    assert ("smoke", "failed") in steps_of(hosts[canary])
    assert all(hosts[n]["outcome"] == "skipped" for n in fleet.names[1:])
    assert {n: fleet.sha(n) for n in fleet.names} == before
    assert report.failed == 0, report.to_json()
    assert all_in_rotation(fleet)


def remove_by_hand(fleet: SandboxFleet, worker: str) -> None:
    url = router_url(fleet)
    worker_id = router_workers(fleet)[worker]["id"]
    urllib.request.urlopen(
        urllib.request.Request(f"{url}/workers/{worker_id}", method="DELETE"), timeout=5
    ).read()
    assert wait_until(lambda: worker not in router_workers(fleet), 10)


def test_workers_the_router_cannot_use_count_and_only_fleet_down_drains_its_last_healthy_one(
    fleet: SandboxFleet,
) -> None:
    """Only the canary is in each run. One other worker removed by hand (the inventory's, not
    the run's) already is the one max_unavailable = 1 allows: refused. Both removed: draining
    the canary would leave the router none: refused, unless the playbook says fleet_down."""
    harmless(fleet, "harmless-two")
    url = router_url(fleet)
    canary = fleet.names[0]
    only = f"sandbox:{canary}"
    others = [fleet.hosts[n].engine.url for n in fleet.names[1:]]
    before = fleet.sha(canary)
    try:
        remove_by_hand(fleet, others[1])
        one_out = fleet.opspatch("apply", "harmless-two", "--hosts", only, "--yes")
        assert one_out.code == 2, one_out.stdout + one_out.stderr
        assert f"1 already unavailable: {others[1]}" in one_out.stderr, one_out.stderr
        assert "nothing was changed" in one_out.stderr and fleet.sha(canary) == before

        remove_by_hand(fleet, others[0])
        wide = fleet.write_playbook("wide", '[rotation]\nmax_unavailable = "all"\n')
        run = fleet.opspatch(
            "apply", "harmless-two", "--hosts", only, "--yes", "--playbook", str(wide)
        )
        assert run.code == 2, run.stdout + run.stderr
        assert "would leave it no healthy worker" in run.stderr
        assert "nothing was changed" in run.stderr
        assert fleet.sha(canary) == before
        assert fleet.hosts[canary].engine.url in router_workers(fleet)

        down = fleet.write_playbook(
            "down", '[rotation]\nmax_unavailable = "all"\nfleet_down = true\n'
        )
        run = fleet.opspatch(
            "apply", "harmless-two", "--hosts", only, "--yes", "--json", "--playbook", str(down)
        )
        assert run.code == 0, run.stdout + run.stderr
        (host,) = run.json()["hosts"]
        assert host["outcome"] == "applied" and host["rotation"] == "in-rotation", host
        assert fleet.sha(canary) != before
    finally:
        for worker in others:
            if worker in router_workers(fleet):
                continue
            body = json.dumps({"url": worker}).encode()
            request = urllib.request.Request(
                f"{url}/workers",
                data=body,
                method="POST",
                headers={"Content-Type": "application/json"},
            )
            urllib.request.urlopen(request, timeout=5).read()
        assert wait_until(lambda: all_in_rotation(fleet), 30)


def test_an_unreachable_router_is_refused_before_any_change(fleet: SandboxFleet) -> None:
    harmless(fleet, "harmless-two")
    text = (fleet.state / "inventories" / "sandbox.toml").read_text()
    dead = fleet.workspace / "inventories" / "deadrouter.toml"
    dead.parent.mkdir(exist_ok=True)
    dead.write_text(text.replace(router_url(fleet), "http://127.0.0.1:9"))
    before = {n: fleet.sha(n) for n in fleet.names}
    run = fleet.opspatch("apply", "harmless-two", "--hosts", str(dead), "--yes")
    assert run.code == 2, run.stdout + run.stderr
    assert "router http://127.0.0.1:9" in run.stderr and "nothing was changed" in run.stderr
    assert {n: fleet.sha(n) for n in fleet.names} == before


def test_a_worker_url_the_router_does_not_know_is_refused_naming_it_and_the_routers_list(
    fleet: SandboxFleet,
) -> None:
    text = (fleet.state / "inventories" / "sandbox.toml").read_text()
    canary = fleet.names[0]
    wrong = fleet.workspace / "inventories" / "wrongworker.toml"
    wrong.parent.mkdir(exist_ok=True)
    wrong.write_text(
        text + f'[hosts.{canary}.router]\nworker_url = "http://gpu-01.internal:30000"\n'
    )
    before = fleet.sha(canary)
    run = fleet.opspatch("apply", "harmless-two", "--hosts", f"{wrong}:{canary}", "--yes")
    assert run.code == 2, run.stdout + run.stderr
    assert "does not know worker http://gpu-01.internal:30000" in run.stderr
    assert fleet.hosts[canary].engine.url in run.stderr  # the router's own list
    assert fleet.sha(canary) == before


def test_a_router_behind_an_admin_key_is_used_with_the_key_from_the_named_variable(
    fleet: SandboxFleet,
) -> None:
    """A second, keyed router in front of the same engines: without the variable, or with a
    wrong key, the run is refused (exit 2, nothing changed); with it, the canary drains and
    comes back through that router."""
    port = free_port("127.0.0.1", set())
    prometheus = free_port("127.0.0.1", {port})
    workers = [fleet.hosts[n].engine.url for n in fleet.names]
    keyed = subprocess.Popen(
        [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
         "--port", str(port), "--prometheus-host", "127.0.0.1", "--prometheus-port",
         str(prometheus), "--control-plane-api-keys", "ops:ops:admin:s3cret",
         "--worker-urls", *workers],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=dict(os.environ, HTTPS_PROXY="http://127.0.0.1:9"),
    )  # fmt: skip
    try:
        text = (fleet.state / "inventories" / "sandbox.toml").read_text()
        inventory = fleet.workspace / "inventories" / "keyed.toml"
        inventory.parent.mkdir(exist_ok=True)
        inventory.write_text(
            text.replace(
                f'router = {{ url = "{router_url(fleet)}" }}',
                f'router = {{ url = "http://127.0.0.1:{port}", admin_key_env = "TEST_ROUTER_KEY" }}',
            )
        )
        canary = fleet.names[0]
        target = f"{inventory}:{canary}"
        harmless(fleet, "harmless-keyed")
        before = fleet.sha(canary)
        unset = fleet.opspatch("apply", "harmless-keyed", "--hosts", target, "--yes")
        assert unset.code == 2 and "$TEST_ROUTER_KEY is not set" in unset.stderr, unset.stderr
        env = dict(os.environ, **fleet.env, TEST_ROUTER_KEY="wrong")
        wrong = opspatch(
            "apply", "harmless-keyed", "--hosts", target, "--yes", cwd=fleet.workspace, env=env
        )
        assert wrong.code == 2 and "answered 401" in wrong.stderr, wrong.stderr
        assert fleet.sha(canary) == before
        env["TEST_ROUTER_KEY"] = "s3cret"
        right = opspatch(
            "apply", "harmless-keyed", "--hosts", target, "--yes", "--json",
            cwd=fleet.workspace, env=env, timeout=240,
        )  # fmt: skip
        assert right.code == 0, right.stdout + right.stderr
        (host,) = right.json()["hosts"]
        assert host["rotation"] == "in-rotation"
        assert [s for s, status in steps_of(host) if status == "ok"][-1] == "admit"
    finally:
        keyed.terminate()
        keyed.wait(timeout=20)


def _kill_when_drained(fleet: SandboxFleet, pid: int, name: str) -> None:
    """SIGKILL `pid` once the router no longer lists host `name`'s worker."""
    url = fleet.hosts[name].engine.url
    assert wait_until(lambda: url not in router_workers(fleet), 120, interval=0.05)
    os.kill(pid, signal.SIGKILL)


def test_recover_after_a_controller_killed_while_a_worker_was_drained_readmits_it(
    fleet: SandboxFleet,
) -> None:
    harmless(fleet, "harmless-three")
    canary = fleet.names[0]
    controller = fleet.spawn("apply", "harmless-three", "--hosts", "sandbox", "--yes")
    _kill_when_drained(fleet, controller.pid, canary)
    controller.wait(timeout=30)
    assert fleet.hosts[canary].engine.url not in router_workers(fleet)
    run = fleet.opspatch("recover", "--yes", "--json")
    assert run.code == 0, run.stdout + run.stderr
    hosts = {h["host"]: h for h in run.json()["hosts"]}
    assert hosts[canary]["rotation"] == "in-rotation", hosts[canary]
    assert ("admit", "ok") in steps_of(hosts[canary])
    assert all_in_rotation(fleet)


def test_recover_readmits_a_proven_host_found_out_of_rotation_only_after_its_smoke_decode(
    fleet: SandboxFleet,
) -> None:
    """The canary's newest change is proven and its server started after it was written: the
    leave-alone path. Found out of rotation, it is smoke-decoded before the router gets it back
    (and not restarted)."""
    canary = fleet.names[0]
    remove_by_hand(fleet, fleet.hosts[canary].engine.url)
    run = fleet.opspatch("recover", "--hosts", f"sandbox:{canary}", "--yes", "--json")
    assert run.code == 0, run.stdout + run.stderr
    (host,) = run.json()["hosts"]
    assert host["outcome"] == "applied" and "left alone" in host["note"], host
    assert host["rotation"] == "in-rotation", host
    done = [s for s, status in steps_of(host) if status == "ok"]
    assert "restart" not in done and done[-2:] == ["smoke", "admit"], done
    assert all_in_rotation(fleet)


def test_a_router_killed_mid_run_halts_it_and_the_report_names_the_worker_out_of_rotation(
    fleet: SandboxFleet,
) -> None:
    harmless(fleet, "harmless-four")
    canary = fleet.names[0]
    router_pid = int(fleet.opspatch("sandbox", "status", "--json").json()["router"]["pid"])
    # the admit asks a router that does not answer again until its deadline: keep it short
    book = fleet.write_playbook("short-admit", "[timeouts]\nadmit = 3\n")
    controller = fleet.spawn(
        "apply", "harmless-four", "--hosts", "sandbox", "--yes", "--json", "--playbook", str(book)
    )
    _kill_when_drained(fleet, router_pid, canary)

    def rotations() -> dict[str, dict[str, Any]]:
        said = fleet.opspatch("status", "--hosts", "sandbox", "--patch", "harmless-four", "--json")
        return {s["host"]: s for s in said.json()["status"]}

    try:
        stdout, _ = controller.communicate(timeout=240)
        report = json.loads(stdout)
        hosts = {h["host"]: h for h in report["hosts"]}
        assert controller.returncode == 1, stdout
        # finished (the router died after its drain) or restored (during it), never admitted
        assert hosts[canary]["outcome"] in ("applied", "rolled-back"), hosts[canary]
        assert hosts[canary]["rotation"] == "out-of-rotation"
        assert "out of rotation" in hosts[canary]["note"]
        assert ("admit", "failed") in steps_of(hosts[canary])
        assert report["halted"], report
        assert all(hosts[n]["outcome"] == "skipped" for n in fleet.names[1:])
        gone = rotations()[canary]
        assert gone["rotation"] is None and "rotation unknown" in gone["detail"], gone
    finally:
        # a new router (sandbox up starts it again) registers every worker it is given
        assert fleet.opspatch("sandbox", "up").code == 0
    assert wait_until(lambda: all_in_rotation(fleet), 30)
    assert {n: s["rotation"] for n, s in rotations().items()} == dict.fromkeys(
        fleet.names, "in-rotation"
    )


def test_the_same_apply_without_the_router_in_the_inventory_costs_clients_requests(
    fleet: SandboxFleet,
) -> None:
    """The before/after figure: the router still balances, but opspatch restarts the engines
    behind its back (last in the module: it opens the router's circuit breakers)."""
    harmless(fleet, "harmless-five")
    text = (fleet.state / "inventories" / "sandbox.toml").read_text()
    plain = fleet.workspace / "inventories" / "norouter.toml"
    plain.parent.mkdir(exist_ok=True)
    plain.write_text(
        "\n".join(line for line in text.splitlines() if not line.startswith("router = "))
    )
    book = fleet.write_playbook("two", TWO_AT_ONCE)
    load = Load(fleet)
    run = fleet.opspatch(
        "apply", "harmless-five", "--hosts", str(plain), "--yes", "--json", "--playbook", str(book)
    )
    report = load.stop(settle=1.0)
    assert run.code == 0, run.stdout + run.stderr
    assert all("rotation" not in h for h in run.json()["hosts"])
    assert report.failed > 0, report.to_json()
    print(f"without drain: {report.failed} of {report.sent} failed: {report.failures}")
