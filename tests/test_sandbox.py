"""The sandbox fleet, as a user runs it: the real `opspatch sandbox up|status|down` console
script with its own state directory, real stand-in engine processes, real sshd servers.

Every sandbox a test builds is taken down with `sandbox down --purge` in a finally block (and any
engine that survived is killed by pid), so a failing test leaves no process behind.
"""

from __future__ import annotations

import getpass
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opspatch.config.inventory import load_inventory
from opspatch.config.lookup import Workspace
from opspatch.config.patches import load_patch
from opspatch.core.edit import Applied, apply_patch, detect
from opspatch.core.host import CommandRestart
from opspatch.core.policy import Playbook
from opspatch.hosts.engine import EngineControl
from opspatch.hosts.operations import HostOperations, open_transport
from opspatch.hosts.transport.base import Command
from opspatch.hosts.transport.local import LocalTransport
from opspatch.sandbox.fleet import engine_pid
from opspatch.sandbox.install import make_host_python
from tests.fleetkit import Sandbox, hosts_by_name, new_sandbox, require_sshd, running, wait_for
from tests.standin import http_request

EAGLE_MODULE = "sglang.srt.speculative.eagle_worker_v2"
ATTRIBUTE_ERROR = (
    "AttributeError: 'EAGLEWorkerV2' object has no attribute 'spec_disable_batch_threshold'"
)
GREEDY_16 = {"max_new_tokens": 16, "temperature": 0}

pytestmark = pytest.mark.engine


# -- helpers ------------------------------------------------------------------------------------


# -- a two-host sandbox shared by the read-only tests -------------------------------------------


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Sandbox, dict[str, Any]]]:
    with new_sandbox(tmp_path_factory.mktemp("sandbox-two")) as sandbox:
        report = sandbox.up("--count", "2")
        yield sandbox, report


def test_up_starts_every_host_and_waits_until_each_is_ready(
    two_hosts: tuple[Sandbox, dict[str, Any]],
) -> None:
    sandbox, report = two_hosts

    assert report["ok"] is True
    assert report["install"] == "wheel"  # the default shape
    assert [h["host"] for h in report["hosts"]] == ["sandbox-01", "sandbox-02"]
    assert len({h["port"] for h in report["hosts"]}) == 2
    for host in report["hosts"]:
        assert host["outcome"] == "started"
        assert running(host["pid"])
        assert host["url"] == f"http://127.0.0.1:{host['port']}"
        assert http_request("GET", host["url"] + "/health").status == 200
        host_dir = sandbox.layout.host_dir(host["host"])
        assert (host_dir / "venv" / "bin" / "python").exists()
        # the pid shown is the engine's own; the pid file holds its start command's shell
        wrapper = (host_dir / "server.pid").read_text().strip()
        stat = Path(f"/proc/{host['pid']}/stat").read_text()
        assert stat.rpartition(")")[2].split()[1] == wrapper
        assert "sglang.launch_server" in Path(f"/proc/{host['pid']}/cmdline").read_text()
        assert "The server is fired up and ready to roll!" in (host_dir / "server.log").read_text()
    assert report["ssh_inventory"] is None


def test_up_writes_the_sandbox_inventory_that_hosts_sandbox_finds_from_any_folder(
    two_hosts: tuple[Sandbox, dict[str, Any]],
) -> None:
    sandbox, report = two_hosts
    path = sandbox.state_dir / "inventories" / "sandbox.toml"
    assert report["inventory"] == str(path)

    inventory = load_inventory(path)
    assert inventory.host_names == ("sandbox-01", "sandbox-02")
    assert inventory.groups["canary"].members == ("sandbox-01",)
    for host, reported in zip(inventory.hosts, report["hosts"], strict=True):
        host_dir = sandbox.layout.host_dir(host.name)
        assert host.transport == "local"
        assert host.state_dir == str(host_dir / "state")
        assert host.engine.python == str(host_dir / "venv" / "bin" / "python")
        assert host.engine.url == reported["url"]
        assert host.engine.log_file == str(host_dir / "server.log")
        assert host.engine.speculative is True
        assert host.engine.env["CUDA_VISIBLE_DEVICES"] == ""
        restart = host.engine.restart
        assert isinstance(restart, CommandRestart)
        assert restart.pid_file == str(host_dir / "server.pid")
        assert restart.workdir == str(host_dir)
        assert f"--port {reported['port']}" in restart.start
        assert "--speculative-algorithm EAGLE3" in restart.start

    workspace = Workspace.discover(
        sandbox.cwd, environ={"OPSPATCH_STATE_DIR": str(sandbox.state_dir)}
    )
    assert [h.name for h in workspace.hosts("sandbox")] == [
        "sandbox-01",
        "sandbox-02",
    ]
    assert [h.name for h in workspace.hosts("sandbox:canary")] == ["sandbox-01"]


def test_status_json_shows_pid_port_health_and_the_patches_each_file_carries(
    two_hosts: tuple[Sandbox, dict[str, Any]],
) -> None:
    sandbox, report = two_hosts
    status = sandbox.status()

    assert status["sandbox"] == str(sandbox.layout.root)
    assert status["install"] == "wheel"
    assert status["inventories"] == [str(sandbox.state_dir / "inventories" / "sandbox.toml")]
    started = hosts_by_name(report)
    for host in status["hosts"]:
        assert set(host) >= {"host", "running", "pid", "port", "url", "health", "patches", "ssh"}
        assert host["running"] is True
        assert host["pid"] == started[host["host"]]["pid"]
        assert host["port"] == started[host["host"]]["port"]
        assert host["health"] == {"status": 200, "detail": "ok"}
        assert host["ssh"] is None
        assert (host["install"], host["checkout"]) == ("wheel", None)
        assert not sandbox.layout.checkout(host["host"]).exists()
        patches = {p["patch"]: p for p in host["patches"]}
        # Bundled patches whose target module resolves in the host's own environment.
        assert patches["eagle-init-guard"]["state"] == "not-applied"
        assert patches["eagle-init-guard"]["file"].startswith(
            str(sandbox.layout.host_dir(host["host"]) / "venv")
        )
        assert patches["eagle-init-guard"]["file"].endswith(
            "sglang/srt/speculative/eagle_worker_v2.py"
        )


def test_status_table_names_each_host(two_hosts: tuple[Sandbox, dict[str, Any]]) -> None:
    sandbox, report = two_hosts
    result = sandbox.run("status")

    assert result.code == 0, result.stderr
    for host in report["hosts"]:
        assert host["host"] in result.stdout and str(host["pid"]) in result.stdout


def test_up_twice_leaves_running_hosts_alone(two_hosts: tuple[Sandbox, dict[str, Any]]) -> None:
    sandbox, first = two_hosts
    again = sandbox.up()  # no --hosts: the sandbox keeps its size

    assert again["ok"] is True
    assert [h["outcome"] for h in again["hosts"]] == ["already-running", "already-running"]
    assert [(h["host"], h["pid"], h["port"]) for h in again["hosts"]] == [
        (h["host"], h["pid"], h["port"]) for h in first["hosts"]
    ]
    assert all(running(h["pid"]) for h in first["hosts"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--count", "0"), "--count must be between 1 and 32 (got 0)"),
        (("--count", "99"), "--count must be between 1 and 32 (got 99)"),
        (("--count", "1"), "the sandbox has 2 hosts; `up --count 1` would not remove any"),
    ],
)
def test_a_bad_host_count_gets_one_message_and_exit_2(
    two_hosts: tuple[Sandbox, dict[str, Any]], args: tuple[str, ...], message: str
) -> None:
    sandbox, first = two_hosts
    result = sandbox.run("up", *args)

    assert result.code == 2
    assert result.stderr.startswith(f"error: {message}\n")
    assert result.stdout == ""
    assert all(running(h["pid"]) for h in first["hosts"])  # nothing was touched


def test_status_without_a_sandbox_says_so_and_exits_2(tmp_path: Path) -> None:
    sandbox = Sandbox(tmp_path / "state", tmp_path)
    result = sandbox.run("status")

    assert result.code == 2
    assert "no sandbox in" in result.stderr and "opspatch sandbox up" in result.stderr


# -- stop, start again, purge -------------------------------------------------------------------


def test_down_keeps_everything_and_up_restarts_on_the_same_port_with_the_patched_file(
    tmp_path: Path,
) -> None:
    with new_sandbox(tmp_path) as sandbox:
        first = sandbox.up("--count", "1")["hosts"][0]
        host = sandbox.inventory_host("sandbox-01")
        target = Path(
            HostOperations(LocalTransport(host.name), host).resolve(EAGLE_MODULE, timeout=60)[
                "origin"
            ]
        )
        outcome = apply_patch(target.read_bytes(), load_patch(guard_patch_path(sandbox)).spec)
        assert isinstance(outcome, Applied)
        target.write_bytes(outcome.new_source)

        wrapper = parent_pid(first["pid"])  # the pid file's /bin/sh, whose child is the engine
        down = sandbox.run("down", "--json")
        assert down.code == 0, down.stderr
        assert down.json()["hosts"][0]["stopped"][0] == wrapper
        # named by the pid `up` and `status` show, the engine's own (before, the wrapper's)
        assert down.json()["hosts"][0]["pid"] == first["pid"]
        assert f"sandbox-01: stopping the engine (pid {first['pid']})" in down.stderr
        assert down.json()["removed"] == []
        assert not running(first["pid"])
        assert sandbox.layout.host_dir("sandbox-01").is_dir()
        assert (sandbox.state_dir / "inventories" / "sandbox.toml").is_file()
        stopped = sandbox.status()["hosts"][0]
        assert stopped["running"] is False and stopped["health"]["status"] is None

        again = sandbox.up()["hosts"][0]
        assert again["outcome"] == "started"
        assert again["port"] == first["port"]
        assert again["pid"] != first["pid"] and running(again["pid"])
        assert target.read_bytes() == outcome.new_source  # never reinstalled
        assert http_request("GET", again["url"] + "/health").status == 200

        table = sandbox.run("down")
        assert table.code == 0, table.stderr
        assert f"sandbox-01: engine (pid {again['pid']}) stopped, its process tree: pids " in (
            table.stdout
        )
        assert not running(again["pid"])
        purge = sandbox.run("down", "--purge", "--json")
        assert purge.code == 0, purge.stderr
        assert not sandbox.layout.root.exists()
        assert not (sandbox.state_dir / "inventories" / "sandbox.toml").exists()
        assert str(sandbox.layout.hosts_dir) in purge.json()["removed"]


def test_a_recorded_port_held_by_another_process_is_refused_before_anything_starts(
    tmp_path: Path,
) -> None:
    with new_sandbox(tmp_path) as sandbox:
        port = sandbox.up("--count", "1")["hosts"][0]["port"]
        assert sandbox.run("down").code == 0
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
            squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            squatter.bind(("127.0.0.1", port))
            squatter.listen()
            result = sandbox.run("up")

            assert result.code == 2
            assert f"sandbox-01: port 127.0.0.1:{port} is in use by another process" in (
                result.stderr
            )
            assert engine_pid(sandbox.layout, "sandbox-01") is None


def test_a_host_that_does_not_come_up_is_reported_failed_with_its_log_and_up_exits_1(
    tmp_path: Path,
) -> None:
    with new_sandbox(tmp_path) as sandbox:
        # A host folder made beforehand is kept by `up` (never reinstalled): break its engine.
        host_dir = sandbox.layout.host_dir("sandbox-01")
        make_host_python(host_dir)
        broken = next(host_dir.glob("venv/lib/python3*/site-packages")) / (
            EAGLE_MODULE.replace(".", "/") + ".py"
        )
        broken.write_text(broken.read_text() + "raise RuntimeError('broken on purpose')\n")

        result = sandbox.run("up", "--count", "1", "--json")

        assert result.code == 1, result.stderr
        host = result.json()["hosts"][0]
        assert host["outcome"] == "failed"
        assert host["error"].startswith("ready: the engine (pid ")
        assert "RuntimeError: broken on purpose" in host["error"]
        assert result.json()["inventory"] is None
        assert not (sandbox.state_dir / "inventories" / "sandbox.toml").exists()


# -- the incident, through the sandbox ----------------------------------------------------------


def guard_patch_path(sandbox: Sandbox) -> Path:
    return Workspace(sandbox.cwd, sandbox.state_dir).find("patches", "eagle-init-guard")


def test_incident_on_a_sandbox_host_is_fixed_by_eagle_init_guard_and_a_restart(
    tmp_path: Path,
) -> None:
    with new_sandbox(tmp_path) as sandbox:
        started = sandbox.up("--count", "1")["hosts"][0]
        url, log_file = started["url"], sandbox.layout.log_file("sandbox-01")

        # A fresh host reports healthy...
        assert http_request("GET", url + "/health").status == 200
        # ...and its first real decode crashes the server, as in the incident.
        with pytest.raises(ConnectionError):
            http_request("POST", url + "/generate", {"text": "Hello", "sampling_params": GREEDY_16})
        assert wait_for(lambda: not running(started["pid"]))
        log = log_file.read_text()
        assert "Scheduler hit an exception: Traceback (most recent call last):" in log
        assert ATTRIBUTE_ERROR in log

        # The fix with the patch engine, on the file the host's interpreter imports.
        host = sandbox.inventory_host("sandbox-01")
        ops = HostOperations(LocalTransport(host.name), host)
        target = Path(ops.resolve(EAGLE_MODULE, timeout=60)["origin"])
        spec = load_patch(guard_patch_path(sandbox)).spec
        outcome = apply_patch(target.read_bytes(), spec)
        assert isinstance(outcome, Applied), outcome
        target.write_bytes(outcome.new_source)
        assert detect(target.read_bytes(), spec).state == "applied"

        # Restart through the same engine control a rollout uses.
        control = EngineControl(ops, host, Playbook())
        restart = control.restart()
        control.wait_ready(restart)
        sandbox.seen_pids.add(int(restart["pid"] or 0))
        for _ in range(2):
            reply = http_request(
                "POST", url + "/generate", {"text": "Hello", "sampling_params": GREEDY_16}
            )
            assert reply.status == 200, reply.body
            meta = reply.json()["meta_info"]
            assert meta["completion_tokens"] == 16
            assert meta["spec_verify_ct"] > 0
        smoke = control.smoke(log_offset=restart["log_offset"])
        assert smoke.ok, smoke.failures

        carried = {p["patch"]: p["state"] for p in sandbox.status()["hosts"][0]["patches"]}
        assert carried["eagle-init-guard"] == "applied"


# -- over SSH -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ssh_sandbox(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Sandbox, dict[str, Any]]]:
    require_sshd()
    with new_sandbox(tmp_path_factory.mktemp("sandbox-ssh")) as sandbox:
        yield sandbox, sandbox.up("--count", "1", "--ssh")


@pytest.mark.ssh
def test_up_ssh_writes_the_sandbox_ssh_inventory_with_pinned_keys(
    ssh_sandbox: tuple[Sandbox, dict[str, Any]],
) -> None:
    sandbox, report = ssh_sandbox
    ssh = report["hosts"][0]["ssh"]
    assert ssh["address"] == "127.0.0.2" and ssh["outcome"] == "started" and running(ssh["pid"])
    assert report["ssh_inventory"] == str(sandbox.state_dir / "inventories" / "sandbox-ssh.toml")

    host = sandbox.inventory_host("sandbox-01", "sandbox-ssh")
    local = sandbox.inventory_host("sandbox-01")
    assert host.transport == "ssh"
    assert (host.address, host.port, host.user) == ("127.0.0.2", ssh["port"], getpass.getuser())
    assert host.engine == local.engine and host.state_dir == local.state_dir
    known_hosts = Path(host.known_hosts or "").read_text()
    assert known_hosts.startswith(f"[127.0.0.2]:{ssh['port']} ssh-ed25519 ")

    status = sandbox.status()["hosts"][0]["ssh"]
    assert status == {
        "address": "127.0.0.2",
        "port": ssh["port"],
        "pid": ssh["pid"],
        "running": True,
    }


@pytest.mark.ssh
def test_openssh_client_reaches_a_sandbox_host_with_the_written_settings(
    ssh_sandbox: tuple[Sandbox, dict[str, Any]],
) -> None:
    sandbox, report = ssh_sandbox
    host = sandbox.inventory_host("sandbox-01", "sandbox-ssh")
    command = [
        "ssh",
        "-F",
        "none",
        "-i",
        str(host.identity_file),
        "-o",
        f"UserKnownHostsFile={host.known_hosts}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-p",
        str(host.port),
        f"{host.user}@{host.address}",
        "true",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr


@pytest.mark.ssh
def test_ssh_transport_from_the_sandbox_ssh_inventory_runs_commands_on_the_host(
    ssh_sandbox: tuple[Sandbox, dict[str, Any]],
) -> None:
    sandbox, report = ssh_sandbox
    host = sandbox.inventory_host("sandbox-01", "sandbox-ssh")
    transport = open_transport(host)
    try:
        pid_file = sandbox.layout.pid_file("sandbox-01")
        result = transport.run(Command(("cat", str(pid_file))), timeout=60)
        assert result.exit_code == 0, result.stderr
        # the pid file names the start command's /bin/sh; the status names the engine, its child
        assert result.stdout.decode().strip() == str(parent_pid(report["hosts"][0]["pid"]))
        resolved = HostOperations(transport, host).resolve(EAGLE_MODULE, timeout=60)
        assert resolved["origin"].startswith(str(sandbox.layout.host_dir("sandbox-01")))
    finally:
        transport.close()


@pytest.mark.ssh
def test_up_ssh_twice_keeps_the_sshd_and_down_stops_it(tmp_path: Path) -> None:
    require_sshd()
    with new_sandbox(tmp_path) as sandbox:
        first = sandbox.up("--count", "1", "--ssh")["hosts"][0]["ssh"]
        again = sandbox.up()["hosts"][0]["ssh"]  # --ssh stays on once given
        assert again["outcome"] == "already-running"
        assert (again["pid"], again["port"]) == (first["pid"], first["port"])

        down = sandbox.run("down", "--json")
        assert down.code == 0, down.stderr
        assert down.json()["hosts"][0]["sshd_stopped"] == first["pid"]
        assert not running(first["pid"])


def parent_pid(pid: int) -> int:
    """The parent of a running process (from /proc)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])
