"""`sync` keeps a fleet's fixes true over time, on one sandbox fleet shared by the module (real
stand-in engines, the real console script, a real ledger), in the order an operator meets it:
the desired patch applied by sync; a reinstall of the same release on one host found by
`sync --check` and `drift` and restored by sync; a host added to the group patched by the next
sync; a hand edit that kept the fix is drift, not a sync difference; an engine that died is
not at goal, `recover`'s, and comes back by it; an upgrade to a release
where the patch's anchor is gone reported `needs-port` with nothing written; an upgrade to a
release that ships the fix left alone and called redundant, and its engine, started on that
release, serving. The tests run in file order and each leaves the fleet as the next expects.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opspatch.config.inventory import load_inventory
from opspatch.config.patches import load_patch
from opspatch.core.edit import detect
from opspatch.hosts.agent.processes import stop_process_tree
from opspatch.ledger.store import Ledger
from opspatch.sandbox.dist import STANDIN_FIXED_IN
from opspatch.sandbox.install import (
    dist_info_files,
    install_standin,
    standin_files,
    venv_site_packages,
)
from tests.faultkit import isolated_home
from tests.fleetkit import EAGLE_RELPATH, REPO, SandboxFleet, copy_patch

pytestmark = pytest.mark.engine

PATCH_ID = "eagle-init-guard"
FLEET_TOML = f"""\
[[patches]]
id = "{PATCH_ID}"
hosts = ["sandbox"]          # the inventory: a host added to it is covered
releases = ">=0.5.4"
"""
EAGLE = load_patch(REPO / "patches" / f"{PATCH_ID}.toml")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxFleet]:
    with isolated_home(tmp_path_factory.mktemp("sync-home")):
        sandbox = SandboxFleet(tmp_path_factory.mktemp("sync"), 2).up()
        try:
            copy_patch(sandbox, PATCH_ID)
            (sandbox.workspace / "fleet.toml").write_text(FLEET_TOML)
            yield sandbox
        finally:
            sandbox.close()


def check(fleet: SandboxFleet) -> tuple[int, list[str]]:
    run = fleet.opspatch("sync", "--check")
    assert run.code in (0, 1), run.stdout + run.stderr
    return run.code, run.stdout.splitlines()


def sync(fleet: SandboxFleet, expect: int = 0) -> dict[str, Any]:
    run = fleet.opspatch("sync", "--yes", "--json")
    assert run.code == expect, run.stdout + run.stderr
    doc: dict[str, Any] = run.json()
    return doc


def carries_patch(fleet: SandboxFleet, name: str) -> bool:
    return detect(fleet.file(name).read_bytes(), EAGLE.spec).state == "applied"


def site_packages(fleet: SandboxFleet, name: str) -> Path:
    return venv_site_packages(fleet.host_dir(name) / "venv")


def test_sync_applies_the_desired_patch_through_a_proven_sync_run(fleet: SandboxFleet) -> None:
    code, lines = check(fleet)
    assert code == 1
    assert lines == [
        f"{n}: {PATCH_ID}: apply: not on the host; sync applies it" for n in fleet.names
    ]
    doc = sync(fleet)
    (run,) = doc["runs"]
    assert run["command"] == "sync" and run["outcome"] == "ok"
    for host in run["hosts"]:
        assert host["outcome"] == "applied", host
        assert [s["status"] for s in host["steps"] if s["step"] == "smoke"] == ["ok"], host
    assert all(carries_patch(fleet, n) for n in fleet.names)
    assert {(r["host"], r["action"]) for r in doc["rows"]} == {(n, "nothing") for n in fleet.names}
    with Ledger.open(fleet.ledger_path) as ledger:
        assert ledger.get_run(run["run_id"]).summary.command == "sync"
    assert check(fleet) == (0, [f"every host is as {fleet.workspace / 'fleet.toml'} wants it"])


def test_a_reinstall_that_wiped_the_fix_is_found_and_sync_restores_it(
    fleet: SandboxFleet,
) -> None:
    install_standin(site_packages(fleet, "sandbox-02"))  # pip install --force-reinstall
    assert not carries_patch(fleet, "sandbox-02")
    code, lines = check(fleet)
    assert code == 1
    assert len(lines) == 1 and lines[0].startswith(f"sandbox-02: {PATCH_ID}: apply: "), lines
    drift = fleet.opspatch("drift", "--json")
    assert drift.code == 1, drift.stdout + drift.stderr
    assert [(d["host"], d["cause"], d["command"]) for d in drift.json()["drift"]] == [
        ("sandbox-02", "reinstalled", "opspatch sync --hosts sandbox-02")
    ]
    pid_before = fleet.pid("sandbox-01")
    doc = sync(fleet)
    (run,) = doc["runs"]
    assert [(h["host"], h["outcome"]) for h in run["hosts"]] == [("sandbox-02", "applied")]
    assert fleet.pid("sandbox-01") == pid_before  # a host already right is not touched
    assert carries_patch(fleet, "sandbox-02")
    answer = fleet.generate("sandbox-02")
    assert answer is not None and "text" in answer, answer  # it serves the fix
    assert check(fleet)[0] == 0


def test_a_host_added_to_the_group_gets_the_desired_patch_on_the_next_sync(
    fleet: SandboxFleet,
) -> None:
    up = fleet.opspatch("sandbox", "up", "--count", "3", timeout=240)
    assert up.code == 0, up.stdout + up.stderr
    inventory = load_inventory(fleet.state / "inventories" / f"{fleet.inventory}.toml")
    fleet.hosts = {h.name: h for h in inventory.hosts}
    code, lines = check(fleet)
    assert code == 1 and [line.split(":")[0] for line in lines] == ["sandbox-03"], lines
    doc = sync(fleet)
    (run,) = doc["runs"]
    assert [(h["host"], h["outcome"]) for h in run["hosts"]] == [("sandbox-03", "applied")]
    assert carries_patch(fleet, "sandbox-03")
    assert check(fleet)[0] == 0


def test_a_hand_edit_that_kept_the_fix_is_drift_but_not_a_sync_difference(
    fleet: SandboxFleet,
) -> None:
    path = fleet.file("sandbox-03")
    written, stat = path.read_bytes(), path.stat()
    path.write_bytes(written + b"# tuned by hand\n")
    try:
        drift = fleet.opspatch("drift", "--json")
        assert drift.code == 1, drift.stdout + drift.stderr
        assert [
            (d["host"], d["cause"], d["action"], d["command"]) for d in drift.json()["drift"]
        ] == [("sandbox-03", "hand-edit", "nothing", "opspatch diagnose --hosts sandbox-03")]
        assert check(fleet)[0] == 0  # the desired patch is there: nothing for sync to do
    finally:  # the bytes and the time: a file newer than its server reads as staged
        path.write_bytes(written)
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_a_host_whose_engine_is_down_is_not_at_goal_and_recover_brings_it_back(
    fleet: SandboxFleet,
) -> None:
    """The fix is on sandbox-03's disk, but its engine died: `sync --check` must not say every
    host is as desired. It names the host and `opspatch recover`; sync writes nothing there and
    records why; the recover it names starts the engine, and the check is at goal again."""
    pid = fleet.pid("sandbox-03")
    assert pid is not None
    before = fleet.sha("sandbox-03")
    stop_process_tree(pid, timeout=10)  # the engine this module's fleet started
    code, lines = check(fleet)
    assert code == 1 and len(lines) == 1, lines
    assert lines[0].startswith(
        f"sandbox-03: {PATCH_ID}: recover: the fix is there, but its server is not running: "
        "`opspatch recover --hosts sandbox-03`"
    ), lines
    doc = sync(fleet, expect=1)
    assert doc["runs"] == []
    (left,) = doc["left_alone"]
    assert [(h["host"], h["outcome"]) for h in left["hosts"]] == [("sandbox-03", "skipped")]
    assert left["hosts"][0]["reason"] == "not-serving", left
    assert fleet.sha("sandbox-03") == before
    drift = fleet.opspatch("drift", "--json")
    assert drift.code == 0 and drift.json()["drift"] == [], drift.stdout  # its file is right
    recovered = fleet.opspatch("recover", "--hosts", "sandbox-03", "--yes", timeout=240)
    assert recovered.code == 0, recovered.stdout + recovered.stderr
    assert fleet.pid("sandbox-03") not in (None, pid)
    assert check(fleet)[0] == 0
    assert fleet.sha("sandbox-03") == before


def install_release_without_the_anchor(fleet: SandboxFleet, name: str, version: str) -> None:
    """Upgrade `name` to a stand-in release whose EAGLEWorkerV2 was renamed (kept as an alias):
    the patch's scope is gone, the engine still imports. RECORD matches the new file, as a
    wheel's would."""
    packages = site_packages(fleet, name)
    install_standin(packages, version)
    files = standin_files(version)
    source = files[EAGLE_RELPATH].replace(b"class EAGLEWorkerV2(", b"class EAGLEWorkerV3(")
    files[EAGLE_RELPATH] = source + b"\nEAGLEWorkerV2 = EAGLEWorkerV3\n"
    (packages / EAGLE_RELPATH).write_bytes(files[EAGLE_RELPATH])
    for relative, data in dist_info_files(version, files).items():
        (packages / relative).write_bytes(data)


def test_an_upgrade_where_the_anchor_is_gone_is_needs_port_and_nothing_is_written(
    fleet: SandboxFleet,
) -> None:
    install_release_without_the_anchor(fleet, "sandbox-01", "0.5.30")
    before = fleet.sha("sandbox-01")
    with Ledger.open(fleet.ledger_path) as ledger:
        versions_before = len(ledger.file_history("sandbox-01"))
    code, lines = check(fleet)
    assert code == 1 and len(lines) == 1, lines
    assert lines[0].startswith(f"sandbox-01: {PATCH_ID}: needs-port: the patch no longer fits "
                               "release 0.5.30")  # fmt: skip
    # which edit no longer fits, and where: where the port starts
    assert "edits[0] (insert in EAGLEWorkerV2): scope `EAGLEWorkerV2` is not defined" in lines[0]
    doc = sync(fleet, expect=1)
    assert doc["runs"] == []  # no apply anywhere: the other hosts are right
    (left,) = doc["left_alone"]
    (host,) = left["hosts"]
    assert (host["host"], host["outcome"], host["reason"]) == (
        "sandbox-01",
        "skipped",
        "not-applicable",
    ), host
    assert fleet.sha("sandbox-01") == before
    with Ledger.open(fleet.ledger_path) as ledger:
        assert len(ledger.file_history("sandbox-01")) == versions_before
        recorded = ledger.get_run(left["run_id"])
        assert recorded.summary.command == "sync"
        assert recorded.host("sandbox-01").reason == "not-applicable"
    drift = fleet.opspatch("drift", "--json").json()["drift"]
    assert [(d["host"], d["cause"]) for d in drift] == [("sandbox-01", "upgraded")]
    plan = fleet.opspatch("plan", "--fleet", "--json")
    assert plan.code == 0, plan.stdout + plan.stderr
    actions = {(r["host"], r["release"], r["action"]) for r in plan.json()["rows"]}
    assert actions == {
        ("sandbox-01", "0.5.30", "needs-port"),
        ("sandbox-02", "0.5.23", "nothing"),
        ("sandbox-03", "0.5.23", "nothing"),
    }


def test_an_upgrade_to_a_release_with_the_fix_is_left_alone_and_called_redundant(
    fleet: SandboxFleet,
) -> None:
    """sandbox-02 upgraded to the stand-in release whose own file has the fix (written
    upstream's way): status says fixed-upstream, sync writes nothing there and names the
    desired patch redundant on it (sandbox-01 is still the needs-port host of the test above)."""
    install_standin(site_packages(fleet, "sandbox-02"), STANDIN_FIXED_IN)
    before = fleet.sha("sandbox-02")
    status = fleet.opspatch("status", "--hosts", "sandbox-02", "--patch", PATCH_ID, "--json")
    assert status.code == 0, status.stdout + status.stderr
    assert [s["state"] for s in status.json()["status"]] == ["fixed-upstream"]
    code, lines = check(fleet)
    assert code == 1 and [line.split(":")[0] for line in lines] == ["sandbox-01"], lines
    doc = sync(fleet, expect=1)
    assert doc["runs"] == []
    assert doc["redundant"] == [f"sandbox-02: {PATCH_ID}"]
    assert {(r["host"], r["action"]) for r in doc["rows"] if r["host"] == "sandbox-02"} == {
        ("sandbox-02", "fixed-upstream")
    }
    assert fleet.sha("sandbox-02") == before
    plan = fleet.opspatch("plan", "--fleet")
    assert f"redundant: {PATCH_ID} on sandbox-02 (release {STANDIN_FIXED_IN} has the fix)" in (
        plan.stdout
    ), plan.stdout

    # and it is true: the engine started on that release serves, its first decode does not crash
    pid = fleet.pid("sandbox-02")
    assert pid is not None
    stop_process_tree(pid, timeout=10)  # the engine this module's fleet started, and its children
    up = fleet.opspatch("sandbox", "up", timeout=240)  # starts it again, waits until ready
    assert up.code == 0, up.stdout + up.stderr
    assert fleet.pid("sandbox-02") not in (None, pid)
    answer = fleet.generate("sandbox-02")
    assert answer is not None and "text" in answer, answer
    assert answer["meta_info"]["spec_verify_ct"] > 0, answer  # through the speculative path
    assert fleet.sha("sandbox-02") == before  # the release's own file, not opspatch's
