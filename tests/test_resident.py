"""The resident host agent (issue 44 item 2): one agent process per host for a run, over the
local transport and a real sshd on loopback, and what happens when it dies.

The agent's processes are found from outside, by a marker in the engine's environment (the
agent is started with it, as each exec was), so a test can kill exactly this test's agent: the
agent itself (between requests), the fork answering a request (mid-request), or the sshd session
carrying it (the connection lost).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from opspatch.config.inventory import parse_inventory
from opspatch.core.host import ContainerSettings, EngineSettings, Host
from opspatch.core.policy import Playbook
from opspatch.core.vocabulary import Step
from opspatch.errors import CommandTimeout, RemoteOperationError, TransportError
from opspatch.hosts.become import BecomePasswords
from opspatch.hosts.channel import AGENT_PACKAGE, RESIDENT, BootstrapEndpoint, agent_modules
from opspatch.hosts.operations import HostOperations, open_transport
from opspatch.hosts.resident import ResidentEndpoint
from opspatch.hosts.transport.base import Command, Process, Transport
from opspatch.hosts.transport.local import LocalTransport
from opspatch.runs.fleet.connect import transport_factory
from opspatch.runs.fleet.recorder import NullRecorder
from opspatch.runs.fleet.session import HostSession
from tests.fleetkit import alive, wait_until

if TYPE_CHECKING:
    from opspatch.sandbox.sshd import SshFleet
    from tests.sshfleet import HostMaker

pytestmark = pytest.mark.process

MARK = "OPSPATCH_RESIDENT_TEST"


def marked(mark: str) -> list[int]:
    """Pids of the live processes whose environment carries `mark`."""
    found = []
    needle = f"{MARK}={mark}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0") and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def end_marked(mark: str) -> None:
    """SIGKILL what is left of this test's processes, ours alone, by pid (one may end between
    `marked` and its kill: an agent whose transport just closed)."""
    for pid in marked(mark):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def agents(mark: str) -> tuple[list[int], list[int]]:
    """This test's resident agents, and the forks answering a request (an agent's children)."""
    pids = marked(mark)
    parents = [pid for pid in pids if _is_agent(pid) and parent_of(pid) not in pids]
    forks = [pid for pid in pids if parent_of(pid) in parents]
    return parents, forks


def _is_agent(pid: int) -> bool:
    try:
        return b"serve(r, load)" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def sshd_session_of(pid: int) -> int:
    """The sshd process serving the connection `pid` runs under."""
    while pid > 1:
        pid = parent_of(pid)
        if Path(f"/proc/{pid}/comm").read_text().strip() == "sshd":
            return pid
    raise AssertionError("not under an sshd")


@dataclass
class Resident:
    host: Host
    transport: Transport
    ops: HostOperations
    mark: str


@pytest.fixture(params=["local", pytest.param("ssh", marks=pytest.mark.ssh)])
def resident(
    request: pytest.FixtureRequest, make_inventory_host: HostMaker, tmp_path: Path
) -> Iterator[Resident]:
    kind: str = request.param
    fleet: SshFleet | None = request.getfixturevalue("ssh_fleet") if kind == "ssh" else None
    mark = uuid.uuid4().hex
    host = make_inventory_host(kind, fleet=fleet, state_dir=tmp_path / "state", env={MARK: mark})
    transport = open_transport(host)
    try:
        yield Resident(host, transport, HostOperations(transport, host), mark)
    finally:
        transport.close()
        end_marked(mark)  # what a failed test left


def never_ready(seconds: float) -> dict[str, Any]:
    """`wait_ready` args that poll a port nobody listens on for `seconds`: a request that runs."""
    return {
        "url": "http://127.0.0.1:9",
        "timeout": seconds,
        "pid": None,
        "pid_file": None,
        "log_file": None,
        "log_offset": None,
        "total": seconds,
        "slice": False,
        "group": None,
    }


def in_background(call: Any) -> tuple[threading.Thread, list[BaseException]]:
    raised: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, raised


def the_fork(mark: str) -> int:
    """The fork answering this test's request, once it runs."""
    assert wait_until(lambda: len(agents(mark)[1]) == 1, 60), agents(mark)
    return agents(mark)[1][0]


# ---------------------------------------------------------------------------------------------


def test_one_agent_answers_every_request_and_ends_with_the_transport(resident: Resident) -> None:
    assert isinstance(resident.ops.endpoint, ResidentEndpoint)
    for _ in range(3):
        resident.ops.facts(timeout=60)
    parents, forks = agents(resident.mark)
    assert len(parents) == 1 and forks == []  # each request's fork ended with its reply
    assert resident.transport.exec_count == 3  # a request is an exec, as it was
    assert resident.ops.notices == []
    resident.transport.close()
    assert wait_until(lambda: not alive(parents[0]), 30)


def test_an_agent_killed_between_requests_is_started_again_and_said(
    resident: Resident,
) -> None:
    resident.ops.facts(timeout=60)
    (first,), _ = agents(resident.mark)
    os.kill(first, signal.SIGKILL)
    assert wait_until(lambda: not alive(first), 30)
    facts = resident.ops.facts(timeout=60)  # the request it never took, sent to a new one
    assert facts.python_executable
    (second,), _ = agents(resident.mark)
    assert second != first
    (notice,) = resident.ops.notices
    assert notice.startswith("the host agent had ended (it exited with status ")
    assert notice.endswith("); started again")


def test_an_agent_that_dies_mid_request_gives_no_reply_and_the_next_request_restarts(
    resident: Resident,
) -> None:
    """The fork running the request killed: its effect is unknown, as an exec's that gave no
    reply (`agent-no-reply`, the reconcile's case); the next request gets a new agent, said."""
    ops = resident.ops
    thread, raised = in_background(
        lambda: ops.call("wait_ready", never_ready(120), timeout=180, step="ready")
    )
    os.kill(the_fork(resident.mark), signal.SIGKILL)
    thread.join(120)
    (error,) = raised
    assert isinstance(error, RemoteOperationError) and error.code == "agent-no-reply", error
    assert error.data["exit_code"] == 128 + signal.SIGKILL
    assert ops.notices == []
    ops.facts(timeout=60)
    assert ops.notices == [
        f"the host agent had ended (it exited with status {128 + signal.SIGKILL}); started again"
    ]


def test_a_request_past_its_deadline_ends_the_agent_and_the_next_starts_one_unsaid(
    resident: Resident,
) -> None:
    ops = resident.ops
    ops.facts(timeout=60)
    (agent,), _ = agents(resident.mark)
    with pytest.raises(CommandTimeout) as caught:
        ops.call("wait_ready", never_ready(120), timeout=2, step="ready")
    assert "ran past its 2s deadline" in caught.value.message
    assert "was ended" in caught.value.message
    assert wait_until(lambda: marked(resident.mark) == [], 30)  # the agent and its fork
    ops.facts(timeout=60)
    assert agents(resident.mark)[0] != [agent]
    assert ops.notices == []  # it was ended on purpose, and said so as the timeout


@pytest.mark.ssh
def test_a_connection_lost_mid_request_is_effect_unknown_then_it_connects_again(
    make_inventory_host: HostMaker, ssh_fleet: SshFleet, tmp_path: Path
) -> None:
    mark = uuid.uuid4().hex
    host = make_inventory_host("ssh", fleet=ssh_fleet, state_dir=tmp_path / "s", env={MARK: mark})
    with open_transport(host) as transport:
        ops = HostOperations(transport, host)
        thread, raised = in_background(
            lambda: ops.call("wait_ready", never_ready(30), timeout=120, step="ready")
        )
        fork = the_fork(mark)
        os.kill(sshd_session_of(fork), signal.SIGKILL)
        thread.join(120)
        (error,) = raised
        assert isinstance(error, TransportError), error
        assert "the connection was lost while the command ran" in error.message
        assert "what the command did is unknown" in error.message
        ops.facts(timeout=60)
        assert ops.notices == ["the host agent had ended (its connection was lost); started again"]
        assert transport.connect_count == 2  # type: ignore[attr-defined]
    end_marked(mark)  # the orphaned fork still polling


@pytest.mark.ssh
def test_a_connection_dropped_between_requests_reconnects_and_restarts(
    make_inventory_host: HostMaker, ssh_fleet: SshFleet, tmp_path: Path
) -> None:
    mark = uuid.uuid4().hex
    host = make_inventory_host("ssh", fleet=ssh_fleet, state_dir=tmp_path / "s", env={MARK: mark})
    with open_transport(host) as transport:
        ops = HostOperations(transport, host)
        ops.facts(timeout=60)
        (agent,), _ = agents(mark)
        os.kill(sshd_session_of(agent), signal.SIGKILL)
        assert wait_until(lambda: not alive(agent), 30)
        # whether paramiko has read the loss yet or not: a read is sent again where it was not
        ops.facts(timeout=60)
        assert ops.notices == ["the host agent had ended (its connection was lost); started again"]


def unread_by(sshd: int) -> int:
    """Bytes come over the connection that sshd process `sshd` serves and not read yet (its TCP
    socket's receive queue)."""
    inodes = set()
    for fd in Path(f"/proc/{sshd}/fd").iterdir():
        target = os.readlink(fd)
        if target.startswith("socket:["):
            inodes.add(target.removeprefix("socket:[").removesuffix("]"))
    for table in ("tcp", "tcp6"):
        for row in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = row.split()
            if fields[9] in inodes:
                return int(fields[4].split(":")[1], 16)
    raise AssertionError(f"sshd {sshd} holds no TCP connection")


def sent_unseen(ops: HostOperations, mark: str, call: Any) -> tuple[list[Any], list[BaseException]]:
    """`call` sent on a connection that drops before the controller can tell: the sshd serving
    this test's agent is stopped (the connection stays up; what comes over it stays unread),
    `call` runs until its request is in that sshd's socket, then the sshd is killed. What
    `call` returned, and what it raised."""
    (agent,), _ = agents(mark)
    sshd = sshd_session_of(agent)
    os.kill(sshd, signal.SIGSTOP)
    returned: list[Any] = []
    try:
        unread = unread_by(sshd)
        thread, raised = in_background(lambda: returned.append(call()))
        assert wait_until(lambda: unread_by(sshd) > unread, 60)
    finally:
        os.kill(sshd, signal.SIGKILL)  # the connection drops; the agent reads the end of its input
    thread.join(120)
    return returned, raised


@pytest.mark.ssh
def test_a_read_sent_into_a_connection_dropped_unseen_is_sent_again_on_a_new_one(
    make_inventory_host: HostMaker, ssh_fleet: SshFleet, tmp_path: Path
) -> None:
    """A read changes nothing, so one lost before its receipt is sent again: once, on a new
    connection, to a new agent, said as a restart is."""
    mark = uuid.uuid4().hex
    host = make_inventory_host("ssh", fleet=ssh_fleet, state_dir=tmp_path / "s", env={MARK: mark})
    target = tmp_path / "target.py"
    target.write_text("x = 1\n")
    with open_transport(host) as transport:
        ops = HostOperations(transport, host)
        ops.facts(timeout=60)
        returned, raised = sent_unseen(ops, mark, lambda: ops.read(str(target), timeout=60))
        assert raised == []
        (read,) = returned
        assert read.content == b"x = 1\n"
        assert ops.notices == ["the host agent had ended (its connection was lost); started again"]
        assert transport.connect_count == 2  # type: ignore[attr-defined]


@pytest.mark.ssh
def test_a_change_sent_into_a_connection_dropped_unseen_is_effect_unknown_and_read_back(
    make_inventory_host: HostMaker, ssh_fleet: SshFleet, tmp_path: Path
) -> None:
    """A change that left for the host may have been taken (its receipt may be what was lost):
    it is not sent again, its effect is unknown, and the host is read back, as a run's
    reconcile does (`test_runs_scripted`'s lost swap): here it never arrived."""
    mark = uuid.uuid4().hex
    host = make_inventory_host("ssh", fleet=ssh_fleet, state_dir=tmp_path / "s", env={MARK: mark})
    target = tmp_path / "target.py"
    target.write_text("x = 1\n")
    before = hashlib.sha256(b"x = 1\n").hexdigest()
    with open_transport(host) as transport:
        ops = HostOperations(transport, host)
        ops.facts(timeout=60)
        returned, raised = sent_unseen(
            ops,
            mark,
            lambda: ops.swap(
                str(target), expected_sha256=before, new_content=b"x = 2\n", timeout=60
            ),
        )
        assert returned == []
        (error,) = raised
        assert isinstance(error, TransportError), error
        assert "the connection was lost while the command ran" in error.message
        assert "what the command did is unknown" in error.message
        assert ops.read(str(target), timeout=60).content == b"x = 1\n"
        assert ops.notices == ["the host agent had ended (its connection was lost); started again"]
        assert transport.connect_count == 2  # type: ignore[attr-defined]


class DroppedLink:
    """An agent's process whose connection drops, once `drop` is said, as the next request is
    sent and before the controller can tell (as paramiko reads a loss a moment late): that
    request goes nowhere, and `send` says all of it left (`left`) or none of it did."""

    def __init__(self, process: Process) -> None:
        self._process = process
        self._left: bool | None = None
        self._gone = False

    def drop(self, *, left: bool) -> None:
        self._left = left

    @property
    def ended(self) -> bool:
        return self._gone or self._process.ended

    @property
    def lost(self) -> bool:
        return self._gone

    def send(self, data: bytes, *, deadline: float) -> int | None:
        if self._left is None:
            return self._process.send(data, deadline=deadline)
        self._gone = True
        self._process.close()  # the agent reads the end of its input, as when its sshd dies
        return len(data) if self._left else 0

    def read_line(self, *, deadline: float) -> bytes | None:
        return b"" if self._gone else self._process.read_line(deadline=deadline)

    def exit_status(self, *, deadline: float) -> int | None:
        return None if self._gone else self._process.exit_status(deadline=deadline)

    def take_stderr(self) -> bytes:
        return b"" if self._gone else self._process.take_stderr()

    def end(self) -> str:
        return self._process.end()

    def close(self) -> None:
        self._process.close()


class DroppingTransport(LocalTransport):
    """The local transport, each agent it starts behind a `DroppedLink` (`links`, in order)."""

    def __init__(self, host: str) -> None:
        super().__init__(host)
        self.links: list[DroppedLink] = []

    def start_process(self, command: Command) -> Process:
        self.links.append(DroppedLink(super().start_process(command)))
        return self.links[-1]


LOST = "the host agent had ended (its connection was lost); started again"


@pytest.mark.parametrize(
    ("operation", "left", "sent_again"),
    [
        ("read", True, True),  # a read changes nothing
        ("lock", False, True),  # none of the change reached the host
        ("lock", True, False),  # the change may have: effect unknown
    ],
)
def test_a_request_sent_into_a_connection_dropped_unseen_is_sent_again_where_that_is_safe(
    make_inventory_host: HostMaker, tmp_path: Path, operation: str, left: bool, sent_again: bool
) -> None:
    mark = uuid.uuid4().hex
    host = make_inventory_host("local", state_dir=tmp_path / "s", env={MARK: mark})
    with DroppingTransport(host.name) as transport:
        ops = HostOperations(transport, host)
        assert isinstance(ops.endpoint, ResidentEndpoint)
        ops.facts(timeout=60)
        transport.links[-1].drop(left=left)
        calls: dict[str, Callable[[], object]] = {
            "read": lambda: ops.read(__file__, timeout=60),
            "lock": lambda: ops.lock(run_id="r1", timeout=60),
        }
        call = calls[operation]
        if sent_again:
            call()
            assert ops.notices == [LOST]
        else:
            with pytest.raises(TransportError, match="what the command did is unknown"):
                call()
            assert ops.notices == []
            ops.facts(timeout=60)  # the reconcile's read: the next request says the restart
            assert ops.notices == [LOST]
        assert len(transport.links) == 2


def test_per_exec_is_the_inventory_switch_and_keeps_nothing_running(
    make_inventory_host: HostMaker, tmp_path: Path
) -> None:
    mark = uuid.uuid4().hex
    host = make_inventory_host("local", state_dir=tmp_path / "s", env={MARK: mark})
    with open_transport(replace(host, agent="per-exec")) as transport:
        ops = HostOperations(transport, replace(host, agent="per-exec"))
        assert isinstance(ops.endpoint, BootstrapEndpoint)
        ops.facts(timeout=60)
        assert marked(mark) == []


# ---------------------------------------------------------------------------------------------
# The agent's side: each request in a fork of its own

PROBE = """
import os, sys
from opspatch.hosts.agent.protocol import operation

@operation("probe")
def op_probe(args):
    if args.get("exit") is not None:
        os._exit(args["exit"])
    seen = {"env": os.environ.get("PROBE_ENV"), "leak": os.environ.get("PROBE_LEAK"),
            "cwd": os.getcwd(), "leaked_path": "/leak" in sys.path, "pid": os.getpid(),
            "parent": os.getppid(), "prefix": sys.pycache_prefix}
    os.environ["PROBE_LEAK"] = "1"
    sys.path.insert(0, "/leak")
    return seen
"""


def probe_line(
    seq: int,
    *,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
    exit: int | None = None,
    modules: bool = False,
) -> bytes:
    """A request line running `probe`; the first (`modules`) carries the agent modules it needs
    and the probe's own, `dispatch` last, as a first request does."""
    line: dict[str, Any] = {
        "ops": [{"op": "probe", "args": {"exit": exit}, "gate": False}],
        "cwd": cwd,
        "seq": seq,
    }
    if env is not None:
        line["env"] = env
    if modules:
        sources = dict(agent_modules())
        names = [f"{AGENT_PACKAGE}.{name}" for name in ("protocol", "fsutil")]
        pairs = [[name, sources[name]] for name in names]
        pairs.append([f"{AGENT_PACKAGE}.probe", PROBE])
        pairs.append([f"{AGENT_PACKAGE}.dispatch", sources[f"{AGENT_PACKAGE}.dispatch"]])
        line["agent"] = base64.b64encode(zlib.compress(json.dumps(pairs).encode())).decode()
    return json.dumps(line).encode() + b"\n"


def test_each_request_runs_in_a_fork_that_leaks_nothing_into_the_next(tmp_path: Path) -> None:
    """A raised request's environment, its folder, and what its operations change in the
    process stay with it: the next request starts from the agent as it was."""
    lines = probe_line(1, cwd=str(tmp_path), env={"PROBE_ENV": "1"}, modules=True)
    lines += probe_line(2)
    done = subprocess.run(
        [sys.executable, "-c", RESIDENT],
        input=lines,
        capture_output=True,
        timeout=60,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr
    said = [json.loads(line) for line in done.stdout.splitlines()]
    assert said[0] == {"taken": 1} and said[2] == {"taken": 2}
    first, second = (said[i]["replies"][0]["result"] for i in (1, 3))
    assert (first["env"], first["cwd"], first["leak"]) == ("1", str(tmp_path), None)
    assert (second["env"], second["cwd"], second["leak"]) == (None, "/", None)
    assert not second["leaked_path"]
    assert first["pid"] != second["pid"] and first["parent"] == second["parent"]


def test_a_fork_that_ends_without_its_reply_ends_the_agent_with_its_status() -> None:
    lines = probe_line(1, modules=True, exit=7) + probe_line(2)
    done = subprocess.run(
        [sys.executable, "-c", RESIDENT], input=lines, capture_output=True, timeout=60
    )
    assert done.returncode == 7
    assert [json.loads(line) for line in done.stdout.splitlines()] == [{"taken": 1}]


def test_an_engine_in_a_container_keeps_one_exec_per_request(tmp_path: Path) -> None:
    """A container restart would end an agent living inside it; its transport keeps no process
    running (and its own `start` starts the container, not a command)."""
    host = Host.local(
        "boxed",
        str(tmp_path),
        EngineSettings(python="/usr/bin/python3"),
        container=ContainerSettings(runtime="podman", name="sglang-0"),
    )
    with open_transport(host) as transport:
        assert HostOperations(transport, host).endpoint.__class__ is BootstrapEndpoint


class Notices:
    """A run's progress that keeps the notices it was told (the CLI prints them)."""

    def __init__(self) -> None:
        self.said: list[str] = []

    def run_started(self, run_id: str, summary: str) -> None:
        return None

    def update(self, host: str, step: Step, status: str) -> None:
        return None

    def notice(self, text: str) -> None:
        self.said.append(text)


def test_a_restart_is_said_in_the_step_that_met_it_and_as_a_progress_notice(
    make_inventory_host: HostMaker, tmp_path: Path
) -> None:
    mark = uuid.uuid4().hex
    host = make_inventory_host("local", state_dir=tmp_path / "s", env={MARK: mark})
    progress = Notices()
    session = HostSession(
        host, transport_factory(), Playbook(), recorder=NullRecorder(), progress=progress
    )
    with session:
        with session.step(Step.INSPECT):
            session.ops.facts(timeout=60)
        (agent,), _ = agents(mark)
        os.kill(agent, signal.SIGKILL)
        assert wait_until(lambda: not alive(agent), 30)
        with session.step(Step.INSPECT) as note:
            session.ops.facts(timeout=60)
            note["detail"] = "read"
    said = f"the host agent had ended (it exited with status {128 + signal.SIGKILL}"
    first, second = (step.detail for step in session.steps)
    assert first == "" and second.startswith(f"read; {said}"), second
    assert second.endswith("; started again")
    assert progress.said == [f"{host.name}: {second.removeprefix('read; ')}"]


# ---------------------------------------------------------------------------------------------
# A raised user is a process of its own: one resident agent per (host, user)

FAKE_SUDO = """#!/bin/sh
# sudo's stand-in: [-H] [-n | -S -k -p PROMPT] -u USER -- PROGRAM...; a password when the file
# `password` beside it says one is needed, read as sudo reads it (one line); each start logged
# with the pid the program then runs as
mode=n
while [ "$1" != "--" ]; do
  case "$1" in
    -S) mode=S ;;
    -p) shift ;;
    -u) shift; user=$1 ;;
  esac
  shift
done
shift
here=$(dirname "$0")
if [ -f "$here/password" ]; then
  if [ "$mode" = n ]; then echo "sudo: a password is required" >&2; exit 1; fi
  printf '%s' "[opspatch] sudo password: " >&2
  IFS= read -r got || exit 1
  if [ "$got" != "$(cat "$here/password")" ]; then echo "sudo: 1 incorrect password attempt" >&2; exit 1; fi
fi
echo "$user $$" >> "$here/started"
exec "$@"
"""


def fake_sudo(folder: Path, password: str | None) -> Path:
    folder.mkdir()
    (folder / "sudo").write_text(FAKE_SUDO)
    (folder / "sudo").chmod(0o755)
    if password is not None:
        (folder / "password").write_text(password)
    return folder


@pytest.mark.parametrize("password", [None, "s3cret"])
def test_each_raised_user_gets_one_agent_for_the_run_through_one_sudo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, password: str | None
) -> None:
    """The lock's user and root (a systemd restart's) are two agents, each started by sudo
    once, whatever number of raised requests follow; a password is sent once per agent."""
    bin_folder = fake_sudo(tmp_path / "bin", password)
    monkeypatch.setenv("PATH", f"{bin_folder}:{os.environ['PATH']}")
    mark = uuid.uuid4().hex
    host = parse_inventory(
        '[hosts.gpu-01]\ntransport = "local"\nbecome = true\nbecome_user = "sglang"\n'
        'become_password_env = "PW"\n'
        f"state_dir = {json.dumps(str(tmp_path / 'state'))}\n"
        f"engine = {{ python = {json.dumps(sys.executable)}, env = {{ {MARK} = {json.dumps(mark)} }}, "
        'restart = { kind = "systemd", unit = "sglang.service" } }\n',
        str(tmp_path / "fleet.toml"),
    ).host("gpu-01")
    passwords = BecomePasswords(environ={"PW": password or "unused"})
    with open_transport(host) as transport:
        ops = HostOperations(transport, host, passwords=passwords)
        for run in ("r1", "r2", "r3"):
            ops.lock(run_id=run, timeout=60)
            ops.unlock(run_id=run, timeout=60)
        ops.probe_raised("root", timeout=60, step="begin")
        ops.probe_raised("root", timeout=60, step="begin")
        ops.facts(timeout=60)  # the login user's own agent
        started = [line.split() for line in (bin_folder / "started").read_text().splitlines()]
        assert [user for user, _ in started] == ["sglang", "root"]
        assert all(alive(int(pid)) and _is_agent(int(pid)) for _, pid in started)
        assert len(agents(mark)[0]) == 1  # the login user's: started with the engine's env
    assert ops.ran_as.count("root (sudo)") == 8 and ops.notices == []
