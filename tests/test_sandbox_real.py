"""`opspatch sandbox up --engine sglang`: a sandbox of real SGLang 0.5.23 on the CPU, one
EAGLE-3 server of two nodes (`--units 1 --nodes 2`: `--tp-size 2 --nnodes 2 --node-rank R
--dist-init-addr`, a scheduler per node over gloo), live and slowed by `--restart-seconds`,
driven as an operator drives it: status, the incident's build on every node (the sandbox's base
patch, recorded in the ledger), `apply eagle-init-guard` with its restart (every node's real
process tree stopped and started as one, checked by pid, the smoke decoding through EAGLE-3),
rollback, reinstall (the wheel's files and the base again), down. One server for the module:
each real start costs a minute or two here. Nothing decodes before the fix: the incident's first
decode crashes the server (tests/test_incident_real_engine.py walks that on a TP=2 server).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from opspatch.core.wheelrecord import record_sha256s
from opspatch.sandbox.incident import INCIDENT_BUILD
from opspatch.sandbox.processes import is_running, proc_text
from tests.fleetkit import SandboxFleet
from tests.realkit import real_engine

pytestmark = [pytest.mark.sglang, pytest.mark.timeout(2400)]  # real starts: minutes each

DELAY = "3"
NODES = ("sandbox-01", "sandbox-02")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxFleet]:
    real_engine()  # built where not cached; skips when the package index cannot be reached
    sandbox = SandboxFleet(
        tmp_path_factory.mktemp("real-sandbox"),
        2,
        nodes=2,
        engine="sglang",
        extra=("--live", "--restart-seconds", DELAY),
    )
    try:
        yield sandbox.up()
    finally:
        sandbox.close()


def _tree(fleet: SandboxFleet, host: str) -> list[int]:
    """The running processes of `host`'s engine: its pid file's process and every one below."""
    root = fleet.pid(host)
    assert root is not None
    found, frontier = [root], [root]
    while frontier:
        parent = frontier.pop()
        for entry in Path("/proc").iterdir():
            stat = proc_text(int(entry.name), "stat") if entry.name.isdigit() else None
            if stat and stat.rpartition(")")[2].split()[1] == str(parent):
                found.append(int(entry.name))
                frontier.append(int(entry.name))
    return [pid for pid in found if is_running(pid)]


def _trees(fleet: SandboxFleet) -> dict[str, list[int]]:
    return {host: _tree(fleet, host) for host in NODES}


def _schedulers(pids: list[int]) -> int:
    return sum("sglang::scheduler" in (proc_text(pid, "cmdline") or "") for pid in pids)


def _base_runs(fleet: SandboxFleet, host: str) -> int:
    """The ledger's runs of the sandbox's base patch on `host`."""
    listed = fleet.opspatch("ledger", "list", "--json")
    assert listed.code == 0, listed.stderr
    runs = listed.json()["runs"]
    return sum(r["patch_id"] == INCIDENT_BUILD and host in r["hosts"] for r in runs)


def test_the_sandbox_records_the_engine_and_live_and_every_node_runs_the_incidents_build(
    fleet: SandboxFleet,
) -> None:
    status = fleet.opspatch("sandbox", "status", "--json")
    assert status.code == 0, status.stderr
    report = status.json()
    assert (report["engine"], report["live"]) == ("sglang==0.5.23", True)
    (unit,) = report["units"]
    assert unit["head_serves"] and unit["tp_size"] == 2 and unit["running"] == list(NODES)
    assert all(fleet.hosts[h].live is True for h in NODES)
    for host, pids in _trees(fleet).items():
        assert _schedulers(pids) == 1, host  # one rank per node
        assert f"SGLANG_STANDIN_LOAD_S={DELAY}: waiting" in fleet.log(host)  # --restart-seconds
        assert "self.init_plain_decode_cuda_graphs()" in fleet.file(host).read_text()
        assert _base_runs(fleet, host) == 1
    assert "CUDA graph capture failed: torch.cuda.Stream requires CUDA support" in fleet.log(
        NODES[0]
    )


def test_apply_restarts_every_nodes_real_tree_and_rollback_stages_the_file_back(
    fleet: SandboxFleet,
) -> None:
    before = _trees(fleet)
    original = {h: fleet.sha(h) for h in NODES}
    applied = fleet.opspatch(
        "apply", "eagle-init-guard", "--hosts", "unit-01", "--yes", "--json", timeout=1500
    )
    assert applied.code == 0, applied.stdout + applied.stderr
    outcomes = {h["host"]: h for h in applied.json()["hosts"]}
    assert {h: o["outcome"] for h, o in outcomes.items()} == dict.fromkeys(NODES, "applied")
    assert outcomes["sandbox-01"]["smoke"]["ok"]  # the decode through the head proves both
    reply = fleet.generate("sandbox-01", 16)
    assert reply is not None and reply["meta_info"]["spec_verify_ct"] > 0
    old = [pid for pids in before.values() for pid in pids]
    assert [pid for pid in old if is_running(pid)] == []  # no scheduler or detokenizer left
    after = _trees(fleet)
    for host in NODES:
        assert _schedulers(after[host]) == 1 and fleet.sha(host) != original[host]
    back = fleet.opspatch(
        "rollback", "eagle-init-guard", "--hosts", "unit-01", "--restart", "never", "--yes"
    )
    assert back.code == 0, back.stdout + back.stderr
    assert {h: fleet.sha(h) for h in NODES} == original
    assert _trees(fleet) == after  # nothing restarted


def test_reinstall_puts_the_wheels_file_back_with_the_base(fleet: SandboxFleet) -> None:
    path = fleet.file("sandbox-02")
    (record,) = path.parents[3].glob("sglang-0.5.23.dist-info/RECORD")
    shipped = record_sha256s(record.read_text())["sglang/srt/speculative/eagle_worker_v2.py"]
    built = fleet.sha("sandbox-02")  # the incident's build
    assert built != shipped
    path.write_bytes(path.read_bytes() + b"\n# a hand edit\n")
    done = fleet.opspatch("sandbox", "reinstall", "sandbox-02", timeout=600)
    assert done.code == 0, done.stdout + done.stderr
    assert fleet.sha("sandbox-02") == built  # the wheel's file, then the base applied again
    assert _base_runs(fleet, "sandbox-02") == 2
    other = fleet.opspatch("sandbox", "reinstall", "sandbox-02", "--version", "0.5.22")
    assert other.code == 2 and "installs no other release" in other.stderr


def test_down_stops_every_process_of_the_real_server(fleet: SandboxFleet) -> None:
    pids = [pid for tree in _trees(fleet).values() for pid in tree]
    assert len(pids) >= 5, (
        pids
    )  # node 0: main, scheduler, detokenizer, ...; node 1: main, scheduler
    down = fleet.opspatch("sandbox", "down", timeout=300)
    assert down.code == 0, down.stderr
    assert [pid for pid in pids if is_running(pid)] == []
