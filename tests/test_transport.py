"""Transports over real processes: a local shell and real OpenSSH servers on loopback."""

from __future__ import annotations

import base64
import hashlib
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from opspatch.core.host import JumpHost
from opspatch.errors import CommandTimeout, HostKeyError, TransportError
from opspatch.hosts.transport.base import Command, Transport
from opspatch.hosts.transport.local import LocalTransport
from opspatch.hosts.transport.ssh import SSHTransport, error_reason, wrap_in_process_group
from opspatch.sandbox.sshd import SshFleet, generate_keypair

pytestmark = pytest.mark.process

if TYPE_CHECKING:
    from tests.sshfleet import HostMaker, Target


def process_is_gone(pid: int) -> bool:
    """True when `pid` no longer runs (a zombie waiting for its reaper counts as gone)."""
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return status.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def wait_until_gone(pids: list[int], seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if all(process_is_gone(pid) for pid in pids):
            return True
        time.sleep(0.05)
    return False


# ---------------------------------------------------------------------------------------------
# Both transports


def test_stdin_and_both_outputs_are_streamed_without_blocking(remote_target: Target) -> None:
    payload = os.urandom(3 * 1024 * 1024)
    # cat echoes 3 MiB while 2 MiB go to stderr: any transport that reads one stream at a time,
    # or sends all of stdin before reading, deadlocks here.
    command = Command(("sh", "-c", "head -c 2097152 /dev/zero >&2 & cat; wait"))
    result = remote_target.transport.run(command, stdin=payload, timeout=60)
    assert result.exit_code == 0
    assert result.stdout == payload
    assert result.stderr == b"\0" * 2097152


def test_exit_status_environment_and_streams_are_kept_apart(remote_target: Target) -> None:
    command = Command(
        ("sh", "-c", 'echo "$GREETING"; echo oops >&2; exit 7'),
        env={"GREETING": "hi there; $(touch pwned) `id`"},
    )
    result = remote_target.transport.run(command, timeout=30)
    assert result.exit_code == 7
    assert result.stdout == b"hi there; $(touch pwned) `id`\n"
    assert result.stderr == b"oops\n"
    assert not result.ok


def test_arguments_with_shell_metacharacters_arrive_verbatim(
    remote_target: Target, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    remote_home = remote_target.transport.run(
        Command(("sh", "-c", "pwd")), timeout=30
    ).stdout.strip()
    tricky = [
        "a b;$(touch pwned)'.py",
        "sglang'; touch pwned; echo '.service",
        "`touch pwned`",
        "x\ny && touch pwned",
        "$HOME * ? [a] ~ | > pwned",
    ]
    result = remote_target.transport.run(Command(("printf", "%s\\0", *tricky)), timeout=30)
    assert result.stdout.split(b"\0")[:-1] == [t.encode() for t in tricky]
    for folder in (tmp_path, Path(remote_home.decode())):
        assert not (folder / "pwned").exists()


def run_past_its_deadline(target: Target, pids: Path, script: str) -> CommandTimeout:
    """Run `script` (which first writes its pids) until its deadline ends it. The deadline counts
    from before the session is set up, so on a loaded machine it can fall before the script ran:
    then nothing was started, and the run is tried again with a longer deadline."""
    for deadline in (1.5, 6.0, 24.0, 96.0):
        pids.unlink(missing_ok=True)
        started = time.monotonic()
        with pytest.raises(CommandTimeout) as caught:
            target.transport.run(Command(("sh", "-c", script)), timeout=deadline)
        # ended by its deadline, not by the 300 s child finishing
        assert time.monotonic() - started < 300
        if pids.exists() and len(pids.read_text().split()) == 2:
            return caught.value
    pytest.fail(f"the script never started within its deadline on {target.host.name}")


def test_a_hanging_command_is_ended_with_its_whole_process_group(
    remote_target: Target, tmp_path: Path
) -> None:
    pids = tmp_path / "pids"
    script = f"echo $$ > {pids}; sleep 300 & echo $! >> {pids}; wait"
    timeout = run_past_its_deadline(remote_target, pids, script)
    assert timeout.host == remote_target.host.name
    assert timeout.exit_code == 1
    recorded = [int(line) for line in pids.read_text().split()]
    assert wait_until_gone(recorded), f"still running: {recorded}"


def test_a_command_flooding_output_is_drained_until_its_deadline(
    remote_target: Target, tmp_path: Path
) -> None:
    pids = tmp_path / "pids"
    script = f"echo $$ > {pids}; yes flood >&2 & echo $! >> {pids}; yes flood"
    run_past_its_deadline(remote_target, pids, script)
    assert wait_until_gone([int(line) for line in pids.read_text().split()])
    after = remote_target.transport.run(Command(("echo", "still usable")), timeout=30)
    assert after.stdout == b"still usable\n"


def test_transports_implement_the_protocol_and_count_execs(remote_target: Target) -> None:
    assert isinstance(remote_target.transport, Transport)
    for _ in range(3):
        remote_target.transport.run(Command(("true",)), timeout=30)
    assert remote_target.transport.exec_count == 3
    remote_target.transport.close()
    remote_target.transport.close()  # safe twice


# ---------------------------------------------------------------------------------------------
# SSH only


def openssh_fingerprint(public_line: str) -> str:
    blob = base64.b64decode(public_line.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


@pytest.mark.ssh
def test_one_connection_is_reused_for_every_command(
    make_inventory_host: HostMaker, ssh_fleet: SshFleet, tmp_path: Path
) -> None:
    host = make_inventory_host("ssh", fleet=ssh_fleet, state_dir=tmp_path / "s")
    with SSHTransport(host) as transport:
        for _ in range(4):
            assert transport.run(Command(("true",)), timeout=30).ok
        assert (transport.connect_count, transport.exec_count) == (1, 4)
        client = transport._connection.client  # type: ignore[union-attr]
        assert client.get_transport() is not None and client.get_transport().is_active()
    # leaving the `with` block closed the connection
    assert transport._connection is None
    assert client.get_transport() is None or not client.get_transport().is_active()


@pytest.mark.ssh
def test_remote_command_line_reports_its_process_group_first() -> None:
    rendered = wrap_in_process_group(Command(("echo", "a b")))
    assert rendered.startswith("setsid -w /bin/sh -c ")
    assert rendered.endswith(" opspatch 'echo '\"'\"'a b'\"'\"''")


@pytest.mark.ssh
def test_unknown_host_key_is_refused_with_its_fingerprint(
    make_inventory_host: HostMaker, ssh_fleet: SshFleet, tmp_path: Path
) -> None:
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("")
    host = make_inventory_host(
        "ssh", fleet=ssh_fleet, index=1, state_dir=tmp_path / "s", known_hosts=known_hosts
    )
    transport = SSHTransport(host)
    with pytest.raises(HostKeyError) as caught:
        transport.run(Command(("true",)), timeout=30)
    transport.close()
    server = ssh_fleet.servers[1]
    assert caught.value.fingerprint == openssh_fingerprint(server.host_public_key)
    assert caught.value.fingerprint in caught.value.message
    assert caught.value.hint is not None and "--accept-new-host-keys" in caught.value.hint
    assert caught.value.exit_code == 2
    assert known_hosts.read_text() == ""


@pytest.mark.ssh
def test_unknown_host_key_is_recorded_only_with_accept_new(
    make_inventory_host: HostMaker, ssh_fleet: SshFleet, tmp_path: Path
) -> None:
    known_hosts = tmp_path / "known_hosts"
    other = generate_keypair(tmp_path / "other", "other").public_line.rsplit(" ", 1)[0]
    known_hosts.write_text(f"other.fleet.example {other}")  # no final newline
    host = make_inventory_host(
        "ssh", fleet=ssh_fleet, index=2, state_dir=tmp_path / "s", known_hosts=known_hosts
    )
    transport = SSHTransport(host, accept_new_host_keys=True)
    try:
        assert transport.run(Command(("echo", "hi")), timeout=30).stdout == b"hi\n"
    finally:
        transport.close()
    recorded = ssh_fleet.servers[2].known_hosts_line
    assert known_hosts.read_text() == f"other.fleet.example {other}\n{recorded}\n"
    again = SSHTransport(host)  # no flag: the recorded key is now known
    try:
        assert again.run(Command(("true",)), timeout=30).ok
    finally:
        again.close()


@pytest.mark.ssh
def test_changed_host_key_is_refused_even_with_accept_new(
    make_inventory_host: HostMaker, ssh_fleet: SshFleet, tmp_path: Path
) -> None:
    impostor = generate_keypair(tmp_path / "impostor", "impostor")
    server = ssh_fleet.servers[0]
    known_hosts = tmp_path / "known_hosts"
    pinned = f"[{server.address}]:{server.port} {impostor.public_line.rsplit(' ', 1)[0]}\n"
    known_hosts.write_text(pinned)
    host = make_inventory_host(
        "ssh", fleet=ssh_fleet, state_dir=tmp_path / "s", known_hosts=known_hosts
    )
    transport = SSHTransport(host, accept_new_host_keys=True)
    with pytest.raises(HostKeyError) as caught:
        transport.run(Command(("true",)), timeout=30)
    transport.close()
    assert "CHANGED" in caught.value.message
    assert caught.value.fingerprint == openssh_fingerprint(server.host_public_key)
    assert openssh_fingerprint(impostor.public_line) in caught.value.message
    assert known_hosts.read_text() == pinned


@pytest.mark.ssh
def test_a_known_host_offering_a_key_of_another_type_is_refused(
    make_inventory_host: HostMaker, ssh_fleet: SshFleet, tmp_path: Path
) -> None:
    other = ec.generate_private_key(ec.SECP256R1()).public_key()
    blob = other.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    server = ssh_fleet.servers[1]
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"[{server.address}]:{server.port} {blob.decode()}\n")
    host = make_inventory_host(
        "ssh", fleet=ssh_fleet, index=1, state_dir=tmp_path / "s", known_hosts=known_hosts
    )
    transport = SSHTransport(host, accept_new_host_keys=True)
    with pytest.raises(HostKeyError, match="CHANGED"):
        transport.run(Command(("true",)), timeout=30)
    transport.close()


@pytest.mark.ssh
def test_user_ssh_config_and_default_known_hosts_are_honoured(
    make_inventory_host: HostMaker, ssh_fleet: SshFleet, tmp_path: Path, isolated_home: Path
) -> None:
    server = ssh_fleet.servers[0]
    ssh_dir = isolated_home / ".ssh"
    ssh_dir.mkdir(mode=0o700)
    (ssh_dir / "config").write_text(
        "Host fleet-alias\n"
        f"    HostName {server.address}\n"
        f"    Port {server.port}\n"
        f"    User {ssh_fleet.user}\n"
        f"    IdentityFile {ssh_fleet.user_key.private_key}\n"
    )
    (ssh_dir / "known_hosts").write_text(server.known_hosts_line + "\n")
    host = replace(
        make_inventory_host("ssh", fleet=ssh_fleet, state_dir=tmp_path / "s"),
        address="fleet-alias",
        port=None,
        user=None,
        identity_file=None,
        known_hosts=None,
    )
    transport = SSHTransport(host)
    try:
        assert transport.run(Command(("echo", "via config")), timeout=30).stdout == b"via config\n"
    finally:
        transport.close()


@pytest.mark.ssh
def test_jump_host_is_used_and_its_key_verified_too(
    make_inventory_host: HostMaker, ssh_fleet: SshFleet, tmp_path: Path
) -> None:
    jump_log = ssh_fleet.servers[1].log_file
    accepted_before = jump_log.read_text().count("Accepted publickey")
    host = make_inventory_host(
        "ssh", fleet=ssh_fleet, index=2, jump_index=1, state_dir=tmp_path / "s"
    )
    transport = SSHTransport(host)
    try:
        assert transport.run(Command(("echo", "through")), timeout=30).stdout == b"through\n"
    finally:
        transport.close()
    assert jump_log.read_text().count("Accepted publickey") == accepted_before + 1

    only_target = tmp_path / "known_hosts"
    only_target.write_text(ssh_fleet.servers[2].known_hosts_line + "\n")
    host = make_inventory_host(
        "ssh",
        fleet=ssh_fleet,
        index=2,
        jump_index=1,
        state_dir=tmp_path / "s",
        known_hosts=only_target,
    )
    transport = SSHTransport(host)
    with pytest.raises(HostKeyError) as caught:
        transport.run(Command(("true",)), timeout=30)
    transport.close()
    assert "jump host" in caught.value.message
    assert caught.value.fingerprint == openssh_fingerprint(ssh_fleet.servers[1].host_public_key)


@pytest.mark.ssh
def test_unreachable_host_is_a_transport_error(
    make_inventory_host: HostMaker, ssh_fleet: SshFleet, tmp_path: Path
) -> None:
    host = replace(make_inventory_host("ssh", fleet=ssh_fleet, state_dir=tmp_path / "s"), port=1)
    transport = SSHTransport(host, connect_timeout=3)
    with pytest.raises(TransportError) as caught:
        transport.run(Command(("true",)), timeout=10)
    transport.close()
    assert caught.value.step == "connect"
    assert caught.value.exit_code == 1
    assert "cannot connect" in caught.value.message


@pytest.mark.ssh
def test_an_unreachable_jump_host_is_named_not_the_target(
    make_inventory_host: HostMaker, ssh_fleet: SshFleet, tmp_path: Path
) -> None:
    host = make_inventory_host("ssh", fleet=ssh_fleet, index=0, state_dir=tmp_path / "s")
    closed = JumpHost(
        address="127.0.0.9",
        port=1,
        user=ssh_fleet.user,
        identity_file=str(ssh_fleet.user_key.private_key),
    )
    with (
        SSHTransport(replace(host, jump=closed), connect_timeout=3) as transport,
        pytest.raises(TransportError) as caught,
    ):
        transport.run(Command(("true",)), timeout=10)
    error = caught.value
    assert error.step == "connect"
    assert error.message.endswith(f"jump host {ssh_fleet.user}@127.0.0.9:1: Connection refused")
    assert ssh_fleet.servers[0].address not in error.message  # the target was never tried


@pytest.mark.ssh
def test_a_target_unreachable_from_its_jump_host_says_through_which(
    make_inventory_host: HostMaker, ssh_fleet: SshFleet, tmp_path: Path
) -> None:
    host = make_inventory_host(
        "ssh", fleet=ssh_fleet, index=2, jump_index=1, state_dir=tmp_path / "s"
    )
    with (
        SSHTransport(replace(host, port=1), connect_timeout=3) as transport,
        pytest.raises(TransportError) as caught,
    ):
        transport.run(Command(("true",)), timeout=10)
    jump = ssh_fleet.servers[1]
    assert f"cannot connect to {ssh_fleet.user}@{ssh_fleet.servers[2].address}:1 " in (
        caught.value.message
    )
    assert f"through jump host {ssh_fleet.user}@{jump.address}:{jump.port}: " in (
        caught.value.message
    )


def test_an_error_without_words_is_named_by_its_type() -> None:
    assert error_reason(EOFError()) == "EOFError"
    assert error_reason(OSError(111, "Connection refused")) == "[Errno 111] Connection refused"


def test_local_transport_reports_signals_like_a_shell() -> None:
    transport = LocalTransport("here")
    result = transport.run(Command(("sh", "-c", "kill -s KILL $$")), timeout=30)
    assert result.exit_code == 128 + 9


KILL_MY_SSHD_SESSION = (
    'p=$$; while [ "$p" -gt 1 ]; do '
    'if [ "$(cat /proc/$p/comm)" = sshd ]; then kill -KILL $p; break; fi; '
    "p=$(cut -d' ' -f4 /proc/$p/stat); done; sleep 30"
)


@pytest.mark.ssh
def test_a_connection_lost_mid_command_says_so(
    make_inventory_host: HostMaker, ssh_fleet: SshFleet, tmp_path: Path
) -> None:
    """The sshd session serving a command killed while it runs: the transport says the
    connection was lost and that what the command did is unknown (before: a result with exit
    status -1, which read as "the host agent gave no reply (exit -1): no output")."""
    host = make_inventory_host("ssh", fleet=ssh_fleet, state_dir=tmp_path / "s")
    with SSHTransport(host) as transport:
        with pytest.raises(TransportError) as caught:
            transport.run(Command(("sh", "-c", KILL_MY_SSHD_SESSION)), timeout=60)
        assert caught.value.step == "exec"
        assert "the connection was lost while the command ran" in caught.value.message
        assert "what the command did is unknown" in caught.value.message
        assert transport.run(Command(("true",)), timeout=30).ok  # and it connects again


def test_a_message_names_a_long_program_by_its_size_not_its_text() -> None:
    """Deadline and lost-connection messages quote the command: the host agent's 600-character
    `-c` program would bury what matters (which interpreter, on which host)."""
    command = Command(("/opt/venv/bin/python", "-c", "x" * 600), env={"API_TOKEN": "s3cret"})
    assert command.describe() == "env API_TOKEN='***' /opt/venv/bin/python -c '<600 characters>'"
    assert "x" * 600 in command.masked()  # what is recorded keeps the command whole
