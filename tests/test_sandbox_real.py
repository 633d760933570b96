"""`opspatch sandbox up --engine sglang`: a sandbox of real SGLang 0.5.23 on the CPU, one TP=2
EAGLE-3 server (two scheduler ranks), live and slowed by `--restart-seconds`, driven as an
operator drives it: status, smoke, apply with its restart (the real process tree stopped and
started, checked by pid), rollback, reinstall, down. One server for the module: each real start
costs a minute or two here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from opspatch.sandbox.processes import is_running, proc_text
from tests.fleetkit import SandboxFleet
from tests.realkit import real_engine

pytestmark = pytest.mark.sglang

DELAY = "3"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxFleet]:
    real_engine()  # built where not cached; skips when the package index cannot be reached
    sandbox = SandboxFleet(
        tmp_path_factory.mktemp("real-sandbox"),
        1,
        engine="sglang",
        tp=2,
        extra=("--live", "--restart-seconds", DELAY),
    )
    try:
        yield sandbox.up()
    finally:
        sandbox.close()


def _tree(fleet: SandboxFleet) -> list[int]:
    """The running processes of sandbox-01's engine: its pid file's process and every one below."""
    root = fleet.pid("sandbox-01")
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


def _schedulers(pids: list[int]) -> int:
    return sum("sglang::scheduler" in (proc_text(pid, "cmdline") or "") for pid in pids)


def test_the_sandbox_records_the_engine_tp_and_live_and_serves(fleet: SandboxFleet) -> None:
    status = fleet.opspatch("sandbox", "status", "--json")
    assert status.code == 0, status.stderr
    report = status.json()
    assert (report["engine"], report["tp"], report["live"]) == ("sglang==0.5.23", 2, True)
    assert report["hosts"][0]["health"]["status"] == 200
    assert fleet.hosts["sandbox-01"].live is True
    assert _schedulers(_tree(fleet)) == 2  # TP=2: a scheduler per rank
    log = fleet.log("sandbox-01")
    assert f"SGLANG_STANDIN_LOAD_S={DELAY}: waiting" in log  # --restart-seconds, real engine
    reply = fleet.generate("sandbox-01", 16)
    assert reply is not None and reply["meta_info"]["spec_verify_ct"] > 0


def test_apply_restarts_the_real_process_tree_and_rollback_stages_the_file_back(
    fleet: SandboxFleet,
) -> None:
    before, original = _tree(fleet), fleet.sha("sandbox-01")
    applied = fleet.opspatch(
        "apply", "eagle-init-guard", "--hosts", "sandbox", "--yes", "--json", timeout=1500
    )
    assert applied.code == 0, applied.stdout + applied.stderr
    (host,) = applied.json()["hosts"]
    assert host["outcome"] == "applied" and host["smoke"]["ok"], host
    assert [pid for pid in before if is_running(pid)] == []  # no scheduler or detokenizer left
    after = _tree(fleet)
    assert _schedulers(after) == 2 and not set(after) & set(before)
    assert fleet.sha("sandbox-01") != original
    back = fleet.opspatch(
        "rollback", "eagle-init-guard", "--hosts", "sandbox", "--restart", "never", "--yes"
    )
    assert back.code == 0, back.stdout + back.stderr
    assert fleet.sha("sandbox-01") == original
    assert _tree(fleet) == after  # nothing restarted


def test_reinstall_puts_the_wheels_file_back(fleet: SandboxFleet) -> None:
    path = fleet.file("sandbox-01")
    original = hashlib.sha256(path.read_bytes()).hexdigest()
    path.write_bytes(path.read_bytes() + b"\n# a hand edit\n")
    done = fleet.opspatch("sandbox", "reinstall", "sandbox-01", timeout=600)
    assert done.code == 0, done.stdout + done.stderr
    assert hashlib.sha256(path.read_bytes()).hexdigest() == original
    other = fleet.opspatch("sandbox", "reinstall", "sandbox-01", "--version", "0.5.22")
    assert other.code == 2 and "installs no other release" in other.stderr


def test_down_stops_every_process_of_the_real_server(fleet: SandboxFleet) -> None:
    pids = _tree(fleet)
    assert len(pids) >= 4, pids
    down = fleet.opspatch("sandbox", "down", timeout=300)
    assert down.code == 0, down.stderr
    assert [pid for pid in pids if is_running(pid)] == []
