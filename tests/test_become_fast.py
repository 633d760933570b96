"""`become` without users or sudoers: the inventory keys and their Ansible spelling, what sudo's
words mean, where passwords come from, and how host operations send raised execs (one exec per
operation, the password on stdin only, learned once per host). The real thing, over real SSH
and real sudo, is `tests/test_become.py`.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from opspatch.config.inventory import load_inventory, parse_inventory
from opspatch.config.inventory.ansible import parse_ansible_inventory
from opspatch.config.inventory.show import inventory_show_json, inventory_show_table
from opspatch.core.host import BecomeSettings, Host
from opspatch.errors import BecomeError, RemoteOperationError, SpecError
from opspatch.hosts.agent.dispatch import run_batch
from opspatch.hosts.agent.protocol import AgentReply, OperationReply
from opspatch.hosts.become import (
    SUDO_PROMPT,
    BecomePasswords,
    raised_users,
    sudo_refusal,
)
from opspatch.hosts.channel import decode_request, operation_call
from opspatch.hosts.operations import BOOTSTRAP, HostOperations
from opspatch.hosts.results import run_as
from opspatch.hosts.transport.base import ClosesOnExit, Command, CommandResult
from opspatch.hosts.transport.local import LocalTransport
from opspatch.hosts.transport.scripted import agent_perform

pytestmark = pytest.mark.scripted

SECRET = "correct horse battery staple"


def host_from(text: str, name: str = "gpu-01") -> Host:
    return parse_inventory(text, "inventories/fleet.toml").host(name)


# -- the inventory --------------------------------------------------------------------------------


def test_become_keys_merge_defaults_groups_hosts() -> None:
    inventory = parse_inventory(
        """
[defaults]
become = true
become_password_env = "FLEET_SUDO"
[groups.east]
hosts = ["gpu-02"]
become_user = "sglang"
[hosts.gpu-01]
address = "10.0.0.1"
[hosts.gpu-02]
address = "10.0.0.2"
[hosts.gpu-03]
address = "10.0.0.3"
become = false
""",
        "inventories/fleet.toml",
    )
    assert inventory.host("gpu-01").become == BecomeSettings(True, "root", "sudo", "FLEET_SUDO")
    assert inventory.host("gpu-02").become == BecomeSettings(True, "sglang", "sudo", "FLEET_SUDO")
    assert inventory.host("gpu-03").become.enabled is False
    table = inventory_show_table(inventory.hosts)
    column = table.columns.index("become")
    assert [row[column] for row in table.rows] == [
        "sudo -u root ($FLEET_SUDO)",
        "sudo -u sglang ($FLEET_SUDO)",
        "-",
    ]
    shown = inventory_show_json(inventory.hosts)["hosts"][1]["become"]
    assert shown == {
        "enabled": True,
        "user": "sglang",
        "method": "sudo",
        "password_env": "FLEET_SUDO",
    }


def test_the_example_inventories_show_become() -> None:
    examples = Path(__file__).resolve().parent.parent / "inventories"
    fleet = load_inventory(examples / "gpu-fleet.toml")
    expected = BecomeSettings(True, "root", "sudo", "OPSPATCH_BECOME_PASSWORD")
    assert fleet.host("gpu-01").become == expected
    assert fleet.host("gpu-04").become.enabled is False  # ops owns that engine
    ansible = load_inventory(examples / "example-ansible.yml")
    assert ansible.host("gpu-03").become == expected


def test_a_host_without_become_keys_does_not_raise() -> None:
    host = host_from('[hosts.gpu-01]\naddress = "10.0.0.1"\n')
    assert host.become == BecomeSettings()
    assert run_as(host, "swap") is None
    assert raised_users(host) == ()


@pytest.mark.parametrize("key", ["become_password", "become_pass"])
def test_a_password_in_a_toml_inventory_is_refused_at_its_line(key: str) -> None:
    text = f'[hosts.gpu-01]\naddress = "10.0.0.1"\n{key} = "{SECRET}"\n'
    with pytest.raises(SpecError) as caught:
        host_from(text)
    message = caught.value.render()
    assert (
        f"fleet.toml:3: hosts.gpu-01.{key}: a password does not belong in an inventory" in message
    )
    assert "become_password_env" in message
    assert SECRET not in message


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ('become_method = "su"', "must be one of 'sudo'"),
        ('become_user = "root; reboot"', "is not a user name"),
        ('become_password_env = "MY-PASSWORD"', "is not an environment variable name"),
        ('become = "yes"', "become"),
    ],
)
def test_bad_become_values_are_refused_with_the_field(line: str, problem: str) -> None:
    with pytest.raises(SpecError) as caught:
        host_from(f'[hosts.gpu-01]\naddress = "10.0.0.1"\n{line}\n')
    assert "fleet.toml:3" in caught.value.render()
    assert problem in caught.value.render()


ANSIBLE = """
all:
  vars:
    ansible_user: ops
    ansible_become: "yes"
    opspatch_become_password_env: FLEET_SUDO
  children:
    east:
      vars:
        ansible_become_user: sglang
        ansible_become_method: sudo
      hosts:
        gpu-01:
    west:
      hosts:
        gpu-02:
          ansible_become: false
"""


def test_ansible_become_variables_map_onto_the_keys() -> None:
    inventory = parse_ansible_inventory(ANSIBLE, "inventories/fleet.yml", "fleet")
    assert inventory.host("gpu-01").become == BecomeSettings(True, "sglang", "sudo", "FLEET_SUDO")
    assert inventory.host("gpu-02").become.enabled is False


@pytest.mark.parametrize(
    "variable", ["ansible_become_password", "ansible_become_pass", "ansible_sudo_pass"]
)
def test_an_ansible_become_password_is_refused_pointing_at_the_environment(variable: str) -> None:
    text = ANSIBLE.replace("ansible_become: false", f"{variable}: {SECRET}")
    with pytest.raises(SpecError) as caught:
        parse_ansible_inventory(text, "inventories/fleet.yml", "fleet")
    message = caught.value.render()
    assert f"fleet.yml:17: all.children.west.hosts.gpu-02.{variable}" in message
    assert "a password does not belong in an inventory" in message
    assert "opspatch_become_password_env" in message
    assert SECRET not in message


def test_an_unsupported_ansible_become_method_is_refused() -> None:
    text = ANSIBLE.replace("ansible_become_method: sudo", "ansible_become_method: doas")
    with pytest.raises(SpecError) as caught:
        parse_ansible_inventory(text, "inventories/fleet.yml", "fleet")
    assert "ansible_become_method: must be one of 'sudo', got 'doas'" in caught.value.render()


# -- which operations are raised, as whom ----------------------------------------------------


FLEET = """
[defaults]
become = true
become_user = "sglang"
[defaults.engine]
python = "/opt/sglang/venv/bin/python"
[hosts.gpu-01]
address = "10.0.0.1"
engine = { restart = { kind = "systemd", unit = "sglang.service" } }
[hosts.gpu-04]
address = "10.0.0.4"
engine = { restart = { kind = "command", start = "run", pid_file = "/run/s.pid" } }
"""


def test_only_the_operations_that_change_the_host_are_raised() -> None:
    systemd = host_from(FLEET, "gpu-01")
    command = host_from(FLEET, "gpu-04")
    for operation in ("lock", "unlock", "swap", "restore"):
        assert run_as(systemd, operation) == "sglang"
    for operation in ("facts", "resolve", "read", "inspect", "wait_ready", "smoke", "whoami"):
        assert run_as(systemd, operation) is None
    assert run_as(systemd, "restart") == "root"  # a system service
    assert run_as(command, "restart") == "sglang"  # the engine's own user starts it
    assert raised_users(systemd) == ("sglang", "root")
    assert raised_users(command) == ("sglang",)


# -- what sudo says (stderr as sudo 1.9 writes it) -------------------------------------------

DENIED = (
    f"{SUDO_PROMPT}Sorry, user ops is not allowed to execute '/opt/venv/bin/python -c "
    f"{BOOTSTRAP}' as root on gpu-01.\n"
)


@pytest.mark.parametrize(
    ("exit_code", "stderr", "reason", "words"),
    [
        (1, "sudo: a password is required\n", "password-required", "sudo: a password is required"),
        (127, "sh: 1: sudo: not found\n", "sudo-missing", "sh: 1: sudo: not found"),
        (
            1,
            "sudo: sorry, you must have a tty to run sudo\n",
            "requiretty",
            "sudo: sorry, you must have a tty to run sudo",
        ),
        (
            1,
            f"{SUDO_PROMPT}Sorry, try again.\n{SUDO_PROMPT}\nsudo: no password was provided\n"
            "sudo: 2 incorrect password attempts\n",
            "password-rejected",
            "sudo: 2 incorrect password attempts",
        ),
        (
            1,
            "sudo: unknown user sglang\nsudo: error initializing audit plugin\n",
            "unknown-user",
            "sudo: unknown user sglang",
        ),
        (
            1,
            DENIED,
            "denied",
            "Sorry, user ops is not allowed to execute '/opt/venv/bin/python -c …' as root on gpu-01",
        ),
        (
            1,
            f"{SUDO_PROMPT}ops is not in the sudoers file.\n",
            "denied",
            "ops is not in the sudoers file",
        ),
        (
            1,
            "sudo: /opt/venv/bin/python: command not found\n",
            "interpreter-missing",
            "sudo: /opt/venv/bin/python: command not found",
        ),
    ],
)
def test_sudo_refusals_are_recognised_in_sudos_own_words(
    exit_code: int, stderr: str, reason: str, words: str
) -> None:
    refusal = sudo_refusal(exit_code, stderr, program_text=BOOTSTRAP)
    assert refusal is not None
    assert (refusal.reason, refusal.words) == (reason, words)


def test_a_command_that_ran_is_not_a_sudo_refusal() -> None:
    assert sudo_refusal(0, "sudo: a password is required") is None
    traceback = 'Traceback (most recent call last):\n  File "<string>"\nKeyError: x\n'
    assert sudo_refusal(1, traceback) is None
    assert sudo_refusal(1, "some warning\n") is None


# -- passwords --------------------------------------------------------------------------------


def test_the_password_comes_from_the_variable_the_inventory_names() -> None:
    host = host_from('[hosts.gpu-01]\naddress = "a"\nbecome = true\nbecome_password_env = "PW"\n')
    passwords = BecomePasswords(environ={"PW": SECRET})
    assert passwords.password_for(host, "root") == (SECRET, "$PW")
    assert SECRET not in repr(passwords)


def test_the_terminal_is_asked_once_per_run_for_every_host() -> None:
    hosts = parse_inventory(
        "[defaults]\nbecome = true\n"
        + "".join(f'[hosts.gpu-0{i}]\naddress = "a{i}"\n' for i in range(1, 6)),
        "inventories/fleet.toml",
    ).hosts
    asked: list[str] = []

    def prompt(question: str) -> str:
        asked.append(question)
        return SECRET

    passwords = BecomePasswords(environ={}, prompt=prompt)
    answers: list[str] = []
    workers = [
        threading.Thread(target=lambda h=h: answers.append(passwords.password_for(h, "root")[0]))
        for h in hosts
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert answers == [SECRET] * 5
    assert len(asked) == 1


def test_no_password_and_no_terminal_names_the_host_and_the_key() -> None:
    host = host_from('[hosts.gpu-01]\naddress = "a"\nbecome = true\n')
    with pytest.raises(BecomeError) as caught:
        BecomePasswords(environ={}).password_for(host, "root")
    assert caught.value.reason == "password-missing"
    assert caught.value.exit_code == 2
    assert "[gpu-01] sudo needs a password to run as root" in caught.value.message
    assert "set become_password_env" in (caught.value.hint or "")

    named = host_from('[hosts.gpu-01]\naddress = "a"\nbecome = true\nbecome_password_env = "PW"\n')
    with pytest.raises(BecomeError) as caught:
        BecomePasswords(environ={}).password_for(named, "root")
    assert caught.value.reason == "password-missing"
    assert "the environment variable PW is not set" in caught.value.message


def test_a_password_with_a_line_break_is_refused() -> None:
    host = host_from('[hosts.gpu-01]\naddress = "a"\nbecome = true\nbecome_password_env = "PW"\n')
    with pytest.raises(BecomeError) as caught:
        BecomePasswords(environ={"PW": "a\nb"}).password_for(host, "root")
    assert caught.value.reason == "password-malformed"  # there is one, and it cannot be sent
    assert "the sudo password from $PW contains a line break" in caught.value.message


# -- raised execs -----------------------------------------------------------------------------


class SudoHost(ClosesOnExit):
    """A host whose sudo asks for `password` (None: NOPASSWD) and whose agent runs in this
    process; every exec's argv and stdin are kept."""

    def __init__(self, password: str | None, *, unreadable: bool = False) -> None:
        self.host = "gpu-01"
        self.exec_count = 0
        self.password = password
        self.unreadable = unreadable
        self.execs: list[tuple[tuple[str, ...], bytes]] = []

    def run(self, command: Command, *, stdin: bytes = b"", timeout: float) -> CommandResult:
        self.exec_count += 1
        self.execs.append((command.argv, stdin))
        argv = command.argv
        user = None
        if argv[0] == "sudo":
            user = argv[argv.index("-u") + 1]
            if self.password is not None:
                if "-n" in argv:
                    return self._result(command, 1, b"", b"sudo: a password is required\n")
                typed, _, stdin = stdin.partition(b"\n")
                if typed.decode() != self.password:
                    return self._result(
                        command, 1, b"", b"Sorry, try again.\nsudo: 1 incorrect password attempt\n"
                    )
        request = decode_request(stdin)  # this double sees the bytes: it stands in for sudo

        def perform(op: str, args: dict[str, Any]) -> OperationReply:
            if self.unreadable and user is None and op == "inspect":
                return {"status": "refused", "code": "permission-denied", "message": "cannot read"}
            return agent_perform(op, args)

        reply: AgentReply = {
            "replies": run_batch(request["ops"], perform),
            "identity": {"user": user or "ops", "uid": 1000},  # who the agent says it ran as
        }
        return self._result(command, 0, json.dumps(reply).encode() + b"\n", b"")

    def _result(self, command: Command, code: int, out: bytes, err: bytes) -> CommandResult:
        return CommandResult(command.masked(), code, out, err, 0.0)

    def close(self) -> None:
        return None


def raised_host(tmp_path: Path, *, password_env: bool = True) -> Host:
    target = tmp_path / "target.py"
    target.write_text("x = 1\n")
    source = 'become_password_env = "PW"\n' if password_env else ""
    return host_from(
        f'[hosts.gpu-01]\naddress = "a"\nbecome = true\nbecome_user = "sglang"\n{source}'
        f"state_dir = {json.dumps(str(tmp_path / 'state'))}\n"
        f"engine = {{ python = {json.dumps(sys.executable)} }}\n"
    )


def test_a_host_that_needs_no_password_gets_one_exec_per_operation(tmp_path: Path) -> None:
    host = raised_host(tmp_path)
    transport = SudoHost(password=None)
    ops = HostOperations(transport, host, passwords=BecomePasswords(environ={"PW": SECRET}))
    ops.lock(run_id="r1", timeout=10)
    ops.read(str(tmp_path / "target.py"), timeout=10)
    ops.unlock(run_id="r1", timeout=10)
    argvs = [argv for argv, _ in transport.execs]
    assert argvs[0][:7] == ("sudo", "-H", "-n", "-u", "sglang", "--", sys.executable)
    assert argvs[1][0] == sys.executable  # the read: the login user, no sudo
    assert argvs[2][:3] == ("sudo", "-H", "-n")
    assert all(SECRET.encode() not in stdin for _, stdin in transport.execs)  # never sent
    assert ops.ran_as == ["sglang (sudo)", "ops", "sglang (sudo)"]


def test_a_password_is_learned_once_and_sent_only_on_stdin(tmp_path: Path) -> None:
    host = raised_host(tmp_path)
    transport = SudoHost(password=SECRET)
    ops = HostOperations(transport, host, passwords=BecomePasswords(environ={"PW": SECRET}))
    ops.lock(run_id="r1", timeout=10)
    ops.unlock(run_id="r1", timeout=10)
    argvs = [argv for argv, _ in transport.execs]
    assert len(argvs) == 3  # -n once (learning), then -S for each operation
    assert "-n" in argvs[0]
    assert argvs[1][:6] == ("sudo", "-H", "-S", "-k", "-p", SUDO_PROMPT)
    assert argvs[2][:3] == ("sudo", "-H", "-S")
    for _, stdin in transport.execs[1:]:
        assert stdin.startswith(SECRET.encode() + b"\n")
        assert stdin.count(SECRET.encode()) == 1
    assert not any(SECRET in " ".join(argv) for argv in argvs)


def test_a_wrong_password_is_a_refusal_before_anything_runs(tmp_path: Path) -> None:
    host = raised_host(tmp_path)
    transport = SudoHost(password=SECRET)
    ops = HostOperations(transport, host, passwords=BecomePasswords(environ={"PW": "nope"}))
    with pytest.raises(BecomeError) as caught:
        ops.lock(run_id="r1", timeout=10)
    assert caught.value.reason == "password-rejected"
    assert not (tmp_path / "state").exists()


def test_a_read_the_login_user_may_not_do_is_asked_again_raised(tmp_path: Path) -> None:
    host = raised_host(tmp_path)
    transport = SudoHost(password=None, unreadable=True)
    ops = HostOperations(transport, host)
    inspection = ops.inspect(path=str(tmp_path / "target.py"), timeout=10)
    assert inspection.file.content == b"x = 1\n"
    assert [argv[0] for argv, _ in transport.execs] == [sys.executable, "sudo"]
    assert ops.ran_as == ["ops", "sglang (sudo)"]


@pytest.mark.process
def test_sudo_not_installed_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host = raised_host(tmp_path, password_env=False)
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))  # the real /bin/sh finds no sudo
    with LocalTransport("gpu-01") as transport:
        ops = HostOperations(transport, host)
        with pytest.raises(BecomeError) as caught:
            ops.lock(run_id="r1", timeout=30)
    assert caught.value.reason == "sudo-missing"


def systemd_host(tmp_path: Path) -> Host:
    """A raised host whose engine is a systemd unit: its restart runs as root, not as the
    become user who owns the lock."""
    (tmp_path / "target.py").write_text("x = 1\n")
    return host_from(
        f'[hosts.gpu-01]\naddress = "a"\nbecome = true\nbecome_user = "sglang"\n'
        f"state_dir = {json.dumps(str(tmp_path / 'state'))}\n"
        f"engine = {{ python = {json.dumps(sys.executable)}, "
        'restart = { kind = "systemd", unit = "sglang.service" } }\n'
    )


def test_begin_with_become_locks_raised_probes_root_and_inspects_as_the_login(
    tmp_path: Path,
) -> None:
    host = raised_host(tmp_path)
    systemd = systemd_host(tmp_path)
    assert host.engine.restart is None
    transport = SudoHost(password=None)
    ops = HostOperations(transport, systemd)
    lock, inspection = ops.begin(path=str(tmp_path / "target.py"), run_id="r1", timeout=10)
    assert lock["holder"].get("run_id") == "r1"
    assert inspection.file.content == b"x = 1\n"
    argvs = [argv for argv, _ in transport.execs]
    assert [(argv[0], argv[argv.index("-u") + 1] if "-u" in argv else None) for argv in argvs] == [
        ("sudo", "sglang"),  # the lock: the state folder belongs to the become user
        ("sudo", "root"),  # the probe: a systemd restart will need root; proven now
        (sys.executable, None),  # the inspection: the login user
    ]
    assert ops.ran_as == ["sglang (sudo)", "root (sudo)", "ops"]


# -- the host lock as a fence, with become --------------------------------------------------


def exec_users(transport: SudoHost) -> list[str | None]:
    """Who each exec ran as: the sudo target, or None for the login user."""
    return [
        argv[argv.index("-u") + 1] if argv[0] == "sudo" else None for argv, _ in transport.execs
    ]


def test_a_run_whose_lock_was_taken_over_changes_nothing_as_any_user(tmp_path: Path) -> None:
    host = systemd_host(tmp_path)
    transport = SudoHost(password=None)
    ops = HostOperations(transport, host, lock_grace=0.1)
    ops.lock(run_id="r1", ttl_seconds=0.2, timeout=10)  # then another run takes it over
    time.sleep(0.5)
    HostOperations(SudoHost(password=None), host).lock(run_id="r2", timeout=30)
    transport.execs.clear()

    # a read as the login user changes nothing: sent as it is, not fenced
    assert ops.read(str(tmp_path / "target.py"), timeout=10).content == b"x = 1\n"
    # a change as the lock's user: the re-assertion leads the same exec and stops it
    with pytest.raises(RemoteOperationError) as swap:
        ops.call_batch_as([operation_call("swap", {})], as_user="sglang", timeout=10, step="swap")
    # a change as root: the lock's user re-asserts it in an exec of its own, the restart unsent
    with pytest.raises(RemoteOperationError) as restart:
        ops.call_as("restart", {}, as_user="root", timeout=10, step="restart")
    assert swap.value.code == restart.value.code == "lock-lost"
    assert exec_users(transport) == [None, "sglang", "sglang"]
    lock = json.loads((tmp_path / "state" / "lock.json").read_text())
    assert lock["run_id"] == "r2"  # the other run's lock, untouched


def test_a_root_change_re_asserts_the_lock_only_when_it_might_lapse_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = agent_perform

    def no_systemd(op: str, args: dict[str, Any]) -> OperationReply:
        if op == "restart":  # this double has no systemd: the restart itself is not the point
            return {"status": "done", "result": {"ok": True}}
        return real(op, args)

    monkeypatch.setattr(sys.modules[__name__], "agent_perform", no_systemd)
    host = systemd_host(tmp_path)
    transport = SudoHost(password=None)
    ops = HostOperations(transport, host, lock_grace=60)
    ops.lock(run_id="r1", ttl_seconds=70, timeout=10)  # holds for 70 s from now
    transport.execs.clear()

    ops.call_as("restart", {}, as_user="root", timeout=5, step="restart")
    assert exec_users(transport) == ["root"]  # the lock holds past this deadline: no extra exec
    ops.call_as("restart", {}, as_user="root", timeout=600, step="restart")
    assert exec_users(transport) == ["root", "sglang", "root"]  # re-asserted first, as sglang
    lock = json.loads((tmp_path / "state" / "lock.json").read_text())
    assert lock["run_id"] == "r1" and lock["expires_at"] > time.time() + 600
