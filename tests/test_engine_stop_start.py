"""The engine stopped and started as two operations (`stop`, `start`), and readiness that checks a
multi-node server's head holds its whole group: the primitives a server of several nodes is
restarted with (every node stopped, then all started, readiness on the head), never one node
restarted alone.

The scripted tests check what the controller sends and reads; the process tests run the real
agent over the local transport against a throwaway process tree (`sleep`s under a shell started
by a pid-file command, no engine) and against a loopback HTTP server answering as a head would.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opspatch.config.inventory import parse_inventory
from opspatch.core.host import ContainerSettings, Host
from opspatch.core.policy import Playbook
from opspatch.errors import EngineError, RemoteOperationError
from opspatch.hosts.agent.engine import op_wait_ready
from opspatch.hosts.agent.facts import running_server
from opspatch.hosts.agent.processes import (
    alive,
    boot_epoch,
    process_identity,
    process_start_epoch,
    read_pid_file,
    stop_process_tree,
)
from opspatch.hosts.agent.protocol import OpFailure
from opspatch.hosts.engine import EngineControl, ServerGroup
from opspatch.hosts.operations import HostOperations
from opspatch.hosts.results import run_as
from opspatch.hosts.transport.base import Command, CommandResult
from opspatch.hosts.transport.container import ContainerTransport
from opspatch.hosts.transport.local import LocalTransport
from opspatch.hosts.transport.scripted import Refusal, ScriptedTransport
from tests.fleetkit import wait_until
from tests.standin import free_port

TREE = "sleep 300 & sleep 300 & wait"
"""A start command whose pid (the shell's) has two children: a process tree, no engine."""


def command_host(work: Path, start: str = TREE, *, become: bool = False) -> Host:
    port = free_port()
    extra = 'become = true\nbecome_user = "sglang"\n' if become else ""
    text = textwrap.dedent(
        f"""
        [defaults]
        transport = "local"
        state_dir = "{work}/state"
        [defaults.engine]
        python = "{sys.executable}"
        url = "http://127.0.0.1:{port}"
        log_file = "{work}/server.log"
        restart = {{ kind = "command", start = {json.dumps(start)}, pid_file = "{work}/server.pid", workdir = "{work}", stop_timeout = 1 }}
        [hosts.h1]
        address = "127.0.0.1"
        """
    )
    return parse_inventory(text + extra, str(work / "inv.toml"), name="test").hosts[0]


# -- scripted: what the controller sends and reads ------------------------------------------------


@pytest.mark.scripted
def test_stop_and_start_are_two_operations_read_as_their_records(tmp_path: Path) -> None:
    host = command_host(tmp_path)

    def handler(op: str, args: dict[str, Any]) -> dict[str, Any] | Refusal:
        if op == "stop":
            return {"strategy": "command", "stopped": [41, 42], "log_offset": 7}
        if op == "start":
            return {"strategy": "command", "pid": 43, "log_offset": 9}
        return Refusal("unknown-operation", op)

    transport = ScriptedTransport(handler, host="h1")
    ctl = EngineControl(HostOperations(transport, host), host, Playbook())
    assert ctl.stop() == {"strategy": "command", "stopped": [41, 42], "log_offset": 7}
    assert ctl.start() == {"strategy": "command", "pid": 43, "log_offset": 9}
    assert transport.ops == ["stop", "start"]
    stop, start = transport.calls
    assert stop.args["restart"]["kind"] == "command" and "env" not in stop.args
    assert stop.args["log_file"] == start.args["log_file"] == f"{tmp_path}/server.log"
    assert start.args["restart"]["start"] == TREE and start.args["env"] == {}


@pytest.mark.scripted
def test_a_start_refused_while_the_engine_runs_is_an_engine_error(tmp_path: Path) -> None:
    host = command_host(tmp_path)
    transport = ScriptedTransport(lambda op, args: Refusal("engine-running", "it runs"), host="h1")
    ctl = EngineControl(HostOperations(transport, host), host, Playbook())
    with pytest.raises(EngineError) as caught:
        ctl.start()
    assert caught.value.step == "start" and caught.value.host == "h1"
    assert isinstance(caught.value.__cause__, RemoteOperationError)
    assert caught.value.__cause__.code == "engine-running"


@pytest.mark.scripted
def test_stop_and_start_run_raised_as_the_user_who_restarts(tmp_path: Path) -> None:
    host = command_host(tmp_path, become=True)
    assert run_as(host, "stop") == run_as(host, "start") == run_as(host, "restart") == "sglang"
    assert run_as(command_host(tmp_path), "stop") is None


@pytest.mark.scripted
def test_wait_ready_sends_the_group_only_when_asked(tmp_path: Path) -> None:
    host = command_host(tmp_path)
    transport = ScriptedTransport(lambda op, args: {"seconds": 0.5, "polls": 2}, host="h1")
    ctl = EngineControl(HostOperations(transport, host), host, Playbook())
    ctl.wait_ready(timeout=5)
    ctl.wait_ready(timeout=5, group=ServerGroup(nnodes=2, tp_size=4))
    plain, grouped = (call.args for call in transport.calls)
    assert plain["group"] is None
    assert grouped["group"] == {"nnodes": 2, "tp_size": 4}
    same = ("url", "pid", "pid_file", "log_file", "log_offset", "total", "slice")
    assert [grouped[key] for key in same] == [plain[key] for key in same]


# -- process: the real agent over the local transport, on a throwaway process tree -----------------


def tree_of(root: int) -> list[int]:
    """`root` and its descendants, from /proc by parent pid."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                raw = Path(f"/proc/{entry}/stat").read_text(errors="replace")
                children.setdefault(int(raw[raw.rfind(")") + 2 :].split()[1]), []).append(
                    int(entry)
                )
    tree, queue = [], [root]
    while queue:
        pid = queue.pop()
        tree.append(pid)
        queue.extend(children.get(pid, []))
    return tree


def wait_for_tree(root: int, size: int) -> list[int]:
    """The tree of `root` once it has `size` processes (a shell starts its children at once)."""
    for _ in range(100):
        tree = tree_of(root)
        if len(tree) >= size:
            return tree
        threading.Event().wait(0.05)
    raise AssertionError(f"the tree of {root} never had {size} processes: {tree_of(root)}")


@contextlib.contextmanager
def local_control(host: Host) -> Iterator[EngineControl]:
    try:
        yield EngineControl(HostOperations(LocalTransport(host.name), host), host, Playbook())
    finally:
        pid_file = getattr(host.engine.restart, "pid_file", "")
        pid = read_pid_file(pid_file)
        if pid is not None and alive(pid):
            stop_process_tree(pid, 2)


def start_tree(ctl: EngineControl) -> tuple[int, list[int]]:
    """Start the command host's engine: its pid and its tree (the shell and its two sleeps)."""
    pid = ctl.start()["pid"]
    assert pid is not None
    return pid, wait_for_tree(pid, 3)


def stops_it_all(ctl: EngineControl, tree: list[int]) -> None:
    """Stop answers with the whole tree stopped, and only once it is gone."""
    assert set(tree) <= set(ctl.stop()["stopped"])
    assert not [pid for pid in tree if alive(pid)]


@pytest.mark.process
def test_stop_ends_the_whole_tree_and_start_starts_it_again(tmp_path: Path) -> None:
    host = command_host(tmp_path)
    with local_control(host) as ctl:
        first = ctl.start()
        assert first["strategy"] == "command" and first["pid"] is not None
        tree = wait_for_tree(first["pid"], 3)  # the shell and its two sleeps
        with pytest.raises(EngineError) as caught:
            ctl.start()  # a second engine beside the first: refused
        assert isinstance(caught.value.__cause__, RemoteOperationError)
        assert caught.value.__cause__.code == "engine-running"
        assert all(alive(pid) for pid in tree)

        stopped = ctl.stop()
        assert set(tree) <= set(stopped["stopped"])
        assert not [pid for pid in tree if alive(pid)]  # gone when stop answers
        assert ctl.stop()["stopped"] == []  # nothing runs: nothing to stop

        second = ctl.start()
        assert second["pid"] is not None and second["pid"] != first["pid"] and alive(second["pid"])
        assert read_pid_file(f"{tmp_path}/server.pid") == second["pid"]


@pytest.mark.process
def test_stop_kills_what_ignores_sigterm_after_the_stop_timeout(tmp_path: Path) -> None:
    host = command_host(tmp_path, f"trap '' TERM; {TREE}")  # the shell and its sleeps ignore TERM
    with local_control(host) as ctl:
        stops_it_all(ctl, start_tree(ctl)[1])


@pytest.mark.process
def test_restart_stays_stop_then_start_in_one(tmp_path: Path) -> None:
    host = command_host(tmp_path)
    with local_control(host) as ctl:
        first = ctl.restart()
        assert first["pid"] is not None
        tree = wait_for_tree(first["pid"], 3)
        second = ctl.restart()
        assert set(tree) <= set(second["stopped"]) and not [p for p in tree if alive(p)]
        assert second["pid"] is not None and alive(second["pid"])


@pytest.mark.process
def test_stop_finds_its_engine_after_the_wall_clock_jumped_forward(tmp_path: Path) -> None:
    # A paused VM's clock steps forward on resume: the engine then reads as started long after
    # its pid file was written. Stop must still know it (it said "stopped none running", and a
    # restart changed nothing while the old server kept serving).
    host = command_host(tmp_path)
    with local_control(host) as ctl:
        _, tree = start_tree(ctl)
        hour_ago = os.stat(tmp_path / "server.pid").st_mtime - 3600
        os.utime(tmp_path / "server.pid", (hour_ago, hour_ago))
        stops_it_all(ctl, tree)


@pytest.mark.process
def test_a_pid_file_whose_process_is_not_the_one_it_was_written_for_stops_nothing(
    tmp_path: Path,
) -> None:
    host = command_host(tmp_path)
    with local_control(host) as ctl:
        stops_it_all(ctl, start_tree(ctl)[1])
    # a later process reusing the number: the identity recorded beside the pid file differs
    bystander = subprocess.Popen(["sleep", "300"])
    try:
        (tmp_path / "server.pid").write_text(f"{bystander.pid}\n")
        boot, _, ticks = str(process_identity(bystander.pid)).partition("/")
        earlier = f"{bystander.pid} {boot}/{int(ticks) - 1} {boot_epoch():.0f}\n"
        (tmp_path / "server.pid.identity").write_text(earlier)
        with local_control(host) as ctl:
            assert ctl.stop()["stopped"] == []
            assert bystander.poll() is None  # left running
    finally:
        bystander.kill()
        bystander.wait()


@pytest.mark.process
def test_the_servers_start_is_read_by_the_boot_epoch_recorded_when_it_started(
    tmp_path: Path,
) -> None:
    # status calls a server older than its file `staged`: after the clock stepped forward an
    # hour, /proc's btime moved with it and the server read as started after a file patched
    # half an hour ago: running the new code. The epoch recorded at its start did not move.
    host = command_host(tmp_path)
    with local_control(host) as ctl:
        started, tree = start_tree(ctl)
        record = tmp_path / "server.pid.identity"
        pid, identity, boot = record.read_text().split()
        assert pid == str(started) and float(boot) == boot_epoch()
        record.write_text(f"{pid} {identity} {float(boot) - 3600:.0f}\n")  # the step since

        server = running_server({"pid_file": str(tmp_path / "server.pid"), "url": None})
        assert server is not None and server["started_at"] is not None
        on_proc = process_start_epoch(started)
        assert on_proc is not None and abs(server["started_at"] - (on_proc - 3600)) < 1
        patched = time.time() - 1800
        assert server["started_at"] < patched - 2  # older than the file: staged, not running
        stops_it_all(ctl, tree)  # and still known as the pid file's own


@pytest.mark.process
def test_ready_after_a_start_refuses_a_server_that_was_already_running() -> None:
    # the loopback server runs in this test's process: the "engine just started" is another one
    other = subprocess.Popen(["sleep", "300"])
    try:
        with answering(HEAD) as url:
            request = {"url": url, "timeout": 5, "pid": other.pid, "group": None}
            with pytest.raises(OpFailure) as caught:
                op_wait_ready(request)  # type: ignore[arg-type]
            assert caught.value.code == "stale-server"
            assert f"pid {os.getpid()}" in caught.value.message
            # the server started is the one answering: ready
            assert op_wait_ready({**request, "pid": os.getpid()})["polls"] == 1  # type: ignore[typeddict-item]
    finally:
        other.kill()
        other.wait()


# -- process: the group check against a loopback server answering as a head (or not) -------------


class _Server(http.server.ThreadingHTTPServer):
    info: dict[str, Any] | None  # /server_info's answer; None: 404, as a non-head node


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
        info = self.server.info
        if self.path == "/health" or (self.path == "/server_info" and info is not None):
            body = json.dumps(info).encode() if self.path == "/server_info" else b""
            self.send_response(200)
        else:
            body = b""
            self.send_response(404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def answering(info: dict[str, Any] | None) -> Iterator[str]:
    server = _Server(("127.0.0.1", 0), _Handler)
    server.info = info
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


HEAD = {"nnodes": 2, "tp_size": 4, "node_rank": 0, "dist_init_addr": "10.0.0.1:5000"}


def ready(url: str, group: dict[str, int] | None) -> dict[str, Any]:
    return dict(op_wait_ready({"url": url, "timeout": 5, "pid": None, "group": group}))  # type: ignore[typeddict-item]


@pytest.mark.process
def test_the_head_of_the_group_asked_for_is_ready() -> None:
    with answering(HEAD) as url:
        assert ready(url, {"nnodes": 2, "tp_size": 4})["polls"] == 1


@pytest.mark.parametrize(
    ("info", "said"),
    [
        (None, "has no /server_info (404)"),  # a non-head node's dummy /health
        ({**HEAD, "node_rank": 1}, "node_rank=1"),
        ({**HEAD, "nnodes": 1, "tp_size": 1}, "nnodes=1, tp_size=1"),  # one node started alone
    ],
)
@pytest.mark.process
def test_a_server_that_is_not_that_groups_head_fails_at_once(
    info: dict[str, Any] | None, said: str
) -> None:
    with answering(info) as url:
        with pytest.raises(OpFailure) as caught:
            ready(url, {"nnodes": 2, "tp_size": 4})
        assert caught.value.code == "group-mismatch" and said in caught.value.message
        assert "not the head of 2 node(s) with tp_size 4" in caught.value.message
        # not asked: /health alone, as before
        assert ready(url, None)["polls"] == 1


# -- pure: a container is stopped and started by its runtime, from outside it ---------------------


class FakeRuntime:
    """The host's transport as a container runtime that only inspects, stops and starts (the
    commands it ran recorded; the container's state follows them)."""

    host = "gpu-01"

    def __init__(self) -> None:
        self.argvs: list[tuple[str, ...]] = []
        self.running = True

    def run(self, command: Command, *, stdin: bytes = b"", timeout: float) -> CommandResult:
        self.argvs.append(command.argv)
        verb = command.argv[1]
        if verb in ("stop", "start"):
            self.running = verb == "start"
            return CommandResult(command.render(), 0, b"", b"", 0.1)
        state = {"Running": self.running, "Status": "running" if self.running else "exited"}
        doc = [{"Id": "f00d" * 16, "Created": "2026-12-02", "Image": "engine:1", "State": state}]
        return CommandResult(command.render(), 0, json.dumps(doc).encode(), b"", 0.1)

    def close(self) -> None:
        pass


@pytest.mark.pure
def test_a_container_is_stopped_and_started_by_its_runtime_by_id() -> None:
    runtime = FakeRuntime()
    transport = ContainerTransport(runtime, ContainerSettings(runtime="podman", name="sglang-0"))
    stopped = transport.stop(2.4, timeout=30)
    assert not stopped.running and stopped.status == "exited"
    started = transport.start(timeout=30)
    assert started.running and started.id == "f00d" * 16
    inspect = ("podman", "container", "inspect", "sglang-0")
    assert runtime.argvs == [
        inspect,  # pinned
        ("podman", "stop", "--time", "2", "f00d" * 16),
        inspect,
        ("podman", "start", "f00d" * 16),
        inspect,
    ]


@pytest.mark.pure
def test_a_stopped_container_not_pinned_yet_is_started_by_the_id_its_name_stands_for() -> None:
    runtime = FakeRuntime()
    runtime.running = False
    transport = ContainerTransport(runtime, ContainerSettings(runtime="docker", name="sglang-1"))
    assert transport.start(timeout=30).running
    assert runtime.argvs[1] == ("docker", "start", "f00d" * 16)
    assert transport.identity is not None and transport.identity.running


class LocalRuntime(FakeRuntime):
    """`FakeRuntime` whose container is this machine: an exec in it runs here (the real agent
    answers over the local transport)."""

    def __init__(self) -> None:
        super().__init__()
        self.local = LocalTransport(self.host)

    def run(self, command: Command, *, stdin: bytes = b"", timeout: float) -> CommandResult:
        if command.argv[1] != "exec":
            return super().run(command, stdin=stdin, timeout=timeout)
        self.argvs.append(command.argv[:2])
        inside = command.argv[command.argv.index("f00d" * 16) + 1 :]
        return self.local.run(Command(inside, env=dict(command.env)), stdin=stdin, timeout=timeout)


@pytest.mark.process
def test_a_container_engine_is_stopped_and_started_by_its_runtime_its_log_read_from_the_stop(
    tmp_path: Path,
) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"the engine's earlier life\n")
    text = textwrap.dedent(
        f"""
        [defaults]
        transport = "local"
        state_dir = "{tmp_path}/state"
        container = {{ runtime = "podman", name = "sglang-0" }}
        [defaults.engine]
        python = "{sys.executable}"
        log_file = "{log}"
        restart = {{ kind = "container", stop_timeout = 5 }}
        [hosts.gpu-01]
        """
    )
    host = parse_inventory(text, str(tmp_path / "inv.toml"), name="test").hosts[0]
    runtime = LocalRuntime()
    transport = ContainerTransport(runtime, ContainerSettings(runtime="podman", name="sglang-0"))
    ctl = EngineControl(HostOperations(transport, host), host, Playbook())

    stopped = ctl.stop()
    assert stopped["strategy"] == "container" and stopped["log_offset"] == log.stat().st_size
    assert "stopped" in stopped["detail"] and not runtime.running
    started = ctl.start(stopped=stopped)
    assert started["log_offset"] == stopped["log_offset"] and runtime.running
    assert "started" in started["detail"]
    inspect = ("podman", "container", "inspect", "sglang-0")
    assert runtime.argvs == [
        inspect,  # pinned, then the agent noted the log's size inside
        ("podman", "exec"),
        ("podman", "stop", "--time", "5", "f00d" * 16),
        inspect,
        ("podman", "start", "f00d" * 16),
        inspect,
    ]


# -- process: systemd and supervisor run their own stop and start ---------------------------------

FAKE_SYSTEMCTL = """#!/bin/sh
echo "$@" >> "{work}/systemctl.calls"
case "$1" in
  stop) echo inactive > "{work}/state" ;;
  start) echo active > "{work}/state" ;;
  is-active) cat "{work}/state"; [ "$(cat "{work}/state")" = active ] ;;
  show) if [ "$(cat "{work}/state")" = active ]; then echo 4242; else echo 0; fi ;;
esac
"""
"""A `systemctl` that keeps one unit's state in a file and records how it was called."""


def service_host(work: Path, restart: str) -> Host:
    text = textwrap.dedent(
        f"""
        [hosts.h1]
        address = "127.0.0.1"
        transport = "local"
        state_dir = "{work}/state-dir"
        [hosts.h1.engine]
        python = "{sys.executable}"
        restart = {restart}
        """
    )
    return parse_inventory(text, str(work / "inv.toml"), name="t").hosts[0]


@pytest.mark.process
def test_systemd_stops_and_starts_the_unit_and_refuses_a_start_while_it_is_active(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "systemctl"
    fake.write_text(FAKE_SYSTEMCTL.format(work=tmp_path))
    fake.chmod(0o755)
    (tmp_path / "state").write_text("active\n")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    host = service_host(tmp_path, '{ kind = "systemd", unit = "sglang.service" }')
    with local_control(host) as ctl:
        with pytest.raises(EngineError) as caught:
            ctl.start()
        assert isinstance(caught.value.__cause__, RemoteOperationError)
        assert caught.value.__cause__.code == "engine-running"
        stopped = ctl.stop()
        assert stopped["stopped"] == [4242] and stopped["detail"] == "inactive"
        started = ctl.start()
        assert started["pid"] == 4242 and started["detail"] == "active"
    calls = (tmp_path / "systemctl.calls").read_text().splitlines()
    assert calls == [
        "is-active sglang.service",  # the refused start
        "show -p MainPID --value sglang.service",
        "stop sglang.service",
        "is-active sglang.service",
        "is-active sglang.service",
        "start sglang.service",
        "is-active sglang.service",
        "show -p MainPID --value sglang.service",
    ]


@pytest.mark.skipif(
    shutil.which("supervisord") is None,
    reason="supervisor is not installed (pip install supervisor)",
)
@pytest.mark.process
def test_supervisor_stops_and_starts_the_program_through_a_real_supervisord(
    tmp_path: Path,
) -> None:
    config = tmp_path / "supervisord.conf"
    config.write_text(
        textwrap.dedent(
            f"""
            [unix_http_server]
            file={tmp_path}/supervisor.sock
            [supervisord]
            logfile={tmp_path}/supervisord.log
            pidfile={tmp_path}/supervisord.pid
            [rpcinterface:supervisor]
            supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface
            [supervisorctl]
            serverurl=unix://{tmp_path}/supervisor.sock
            [program:engine]
            command=sleep 300
            autostart=false
            startsecs=1
            """
        )
    )
    subprocess.run(["supervisord", "-c", str(config)], check=True)
    try:
        assert wait_until(lambda: (tmp_path / "supervisor.sock").exists(), 20)
        host = service_host(
            tmp_path, f'{{ kind = "supervisor", program = "engine", config = "{config}" }}'
        )
        ctl = EngineControl(HostOperations(LocalTransport(host.name), host), host, Playbook())
        assert ctl.stop()["stopped"] == []  # not running yet: nothing to stop
        started = ctl.start()
        assert started["pid"] is not None and alive(started["pid"])
        with pytest.raises(EngineError) as caught:
            ctl.start()
        assert isinstance(caught.value.__cause__, RemoteOperationError)
        assert caught.value.__cause__.code == "engine-running"
        assert ctl.stop()["stopped"] == [started["pid"]] and not alive(started["pid"])
    finally:
        subprocess.run(["supervisorctl", "-c", str(config), "shutdown"], capture_output=True)
