"""What the operator reads when a run cannot proceed (issue 11's papercuts), through the real
console script: each message says what is true, once."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest

from opspatch.ledger import Ledger
from opspatch.sandbox.sshd import SshFleet
from tests.clirunner import opspatch

pytestmark = pytest.mark.process

REPO = Path(__file__).resolve().parent.parent
EAGLE = "sglang/srt/speculative/eagle_worker_v2.py"


def _workspace(tmp_path: Path, inventory: str) -> Path:
    workspace = tmp_path / "ws"
    (workspace / "inventories").mkdir(parents=True)
    (workspace / "inventories" / "fleet.toml").write_text(inventory)
    return workspace


def _closed_port(address: str) -> int:
    """A port on `address` that nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


@pytest.mark.ssh
def test_plan_on_a_host_with_an_unknown_key_says_the_host_could_not_be_reached_safely(
    ssh_fleet: SshFleet, tmp_path: Path
) -> None:
    server = ssh_fleet.servers[0]
    empty_known_hosts = tmp_path / "known_hosts"
    empty_known_hosts.write_text("")
    workspace = _workspace(
        tmp_path,
        f"""
[hosts.gpu-01]
address = "{server.address}"
port = {server.port}
user = {json.dumps(ssh_fleet.user)}
identity_file = {json.dumps(str(ssh_fleet.user_key.private_key))}
known_hosts = {json.dumps(str(empty_known_hosts))}
state_dir = {json.dumps(str(tmp_path / "host-state"))}
engine = {{ python = {json.dumps(sys.executable)} }}
""",
    )
    run = opspatch("plan", "eagle-init-guard", "--hosts", "fleet", "--json", cwd=workspace)
    assert run.code == 2, run.stdout + run.stderr
    doc = run.json()
    assert "does not fit" not in doc["halted"]
    assert "--accept-new-host-keys" in doc["halted"]
    (host,) = doc["hosts"]
    assert (host["outcome"], host["reason"]) == ("skipped", "host-key-unknown")
    assert "unknown host key" in host["error"] and "SHA256:" in host["error"]
    assert empty_known_hosts.read_text() == ""  # nothing was recorded without the flag


def test_a_dry_run_prints_a_host_error_once(tmp_path: Path) -> None:
    port = _closed_port("127.0.0.1")
    workspace = _workspace(
        tmp_path,
        f"""
[hosts.gpu-01]
address = "127.0.0.1"
port = {port}
known_hosts = {json.dumps(str(tmp_path / "known_hosts"))}
engine = {{ python = "/usr/bin/python3" }}
""",
    )
    run = opspatch("apply", "eagle-init-guard", "--hosts", "fleet", "--dry-run", cwd=workspace)
    assert run.code != 0
    heading = "== gpu-01: failed"
    assert heading in run.stdout, run.stdout
    section = run.stdout.split(heading, 1)[1]
    reason = f"127.0.0.1:{port}"
    assert section.count(reason) == 1, run.stdout


def test_ledger_list_on_an_empty_ledger_says_so_and_where(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.sqlite3"
    Ledger.open(ledger).close()
    run = opspatch("--ledger", str(ledger), "ledger", "list", cwd=tmp_path)
    assert run.code == 0, run.stderr
    assert run.stdout.strip() == f"no runs yet in the ledger {ledger}"


def test_reading_a_ledger_that_is_not_there_says_so_and_creates_none(tmp_path: Path) -> None:
    """Before, `ledger list`, `show` and `verify` created a new, empty ledger where there was
    none (`verify` then said `ok`), whether it was never made or had been deleted."""
    ledger = tmp_path / "state" / "ledger.sqlite3"
    listed = opspatch("--ledger", str(ledger), "ledger", "list", cwd=tmp_path)
    assert listed.code == 0, listed.stderr
    assert listed.stdout.strip() == f"there is no ledger at {ledger}: nothing was recorded there"
    for reading in (("ledger", "verify"), ("ledger", "show", "20261206T000000Z-abcdef")):
        run = opspatch("--ledger", str(ledger), *reading, cwd=tmp_path)
        assert run.code == 2, run.stdout + run.stderr
        assert f"there is no ledger at {ledger}: nothing was recorded there" in run.stderr
    assert not ledger.parent.exists()


def test_a_local_file_is_one_host_name_whether_applied_or_already_applied(
    tmp_path: Path,
) -> None:
    from opspatch.sandbox.install import install_standin

    site = tmp_path / "site-packages"
    site.mkdir()
    install_standin(site)
    target = site / EAGLE
    ledger = tmp_path / "ledger.sqlite3"
    args = ("--ledger", str(ledger), "apply", "eagle-init-guard", "--file", str(target))
    first = opspatch(*args, "--yes", "--json", cwd=tmp_path)
    assert first.code == 0, first.stdout + first.stderr
    again = opspatch(*args, "--yes", "--json", cwd=tmp_path)
    assert again.code == 0, again.stdout + again.stderr
    (applied,) = first.json()["hosts"]
    (already,) = again.json()["hosts"]
    assert applied["outcome"] == "applied"
    assert already["outcome"] == "already-applied"
    assert applied["host"] == already["host"] == f"local:{socket.gethostname()}"
