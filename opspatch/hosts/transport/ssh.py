"""The SSH transport: fabric for connecting, a paramiko channel we drive ourselves for each exec."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import math
import os
import re
import select
import time
from pathlib import Path
from typing import Any

import paramiko
from fabric import Config, Connection

from opspatch.core.host import Host, JumpHost
from opspatch.errors import CommandTimeout, HostKeyError, TransportError
from opspatch.hosts.transport.base import ClosesOnExit, Command, CommandResult, Process
from opspatch.hosts.transport.local import DEFAULT_MAX_OUTPUT_BYTES, CappedBuffer

ACCEPT_NEW_HOST_KEYS_FLAG = "--accept-new-host-keys"
SYSTEM_KNOWN_HOSTS = Path("/etc/ssh/ssh_known_hosts")
# Found anywhere at a line start: a login shell may print to stderr before our command starts.
_PGID_LINE = re.compile(rb"(?m)^opspatch-pgid:(\d+)\n")
_PGID_SCRIPT = 'echo "opspatch-pgid:$$" >&2; exec /bin/sh -c "$1"'
_CHUNK = 32 * 1024
_LOSS_SETTLES = 5.0  # seconds paramiko's reader may take from closing channels to ending


def host_key_fingerprint(key: paramiko.PKey) -> str:
    """The key's SHA256 fingerprint exactly as OpenSSH prints it (`SHA256:...`, no padding)."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def wrap_in_process_group(command: Command) -> str:
    """The shell line sent to the host: `command` in a new session that reports its pgid."""
    return Command(
        ("setsid", "-w", "/bin/sh", "-c", _PGID_SCRIPT, "opspatch", command.render())
    ).render()


def kill_process_group_command(pgid: int, grace_seconds: float) -> Command:
    """The command that ends a remote process group: TERM, up to `grace_seconds`, then KILL."""
    steps = max(1, int(grace_seconds * 10))
    # `kill -s SIG -- -PGID` is the spelling both dash and bash accept for a process group.
    script = (
        f"kill -s TERM -- -{pgid} 2>/dev/null; i=0; "
        f'while [ "$i" -lt {steps} ] && kill -s 0 -- -{pgid} 2>/dev/null; '
        "do sleep 0.1; i=$((i+1)); done; "
        f"kill -s KILL -- -{pgid} 2>/dev/null; exit 0"
    )
    return Command(("/bin/sh", "-c", script))


class _VerifyingHostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Refuse unknown host keys, or record them when the operator said so.

    Paramiko calls this only for a host with no key on record; a known host whose key differs is
    refused by paramiko itself (`BadHostKeyException`), which the transport reports as changed.
    """

    def __init__(self, host: str, known_hosts: Path, accept_new: bool) -> None:
        self._host = host
        self._known_hosts = known_hosts
        self._accept_new = accept_new

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        fingerprint = host_key_fingerprint(key)
        if not self._accept_new:
            raise HostKeyError(
                f"[{self._host}] unknown host key for {hostname}: {key.get_name()} {fingerprint}",
                host=self._host,
                fingerprint=fingerprint,
                hint=(
                    "check this fingerprint with the host's administrator, then "
                    f"re-run with {ACCEPT_NEW_HOST_KEYS_FLAG} to trust it "
                    f"(it will be recorded in {self._known_hosts})"
                ),
            )
        self._known_hosts.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with open(self._known_hosts, "a+b") as handle:
            handle.seek(0, os.SEEK_END)
            if handle.tell():  # never glue our line to a last line without its newline
                handle.seek(-1, os.SEEK_END)
                needs_newline = handle.read(1) != b"\n"
            else:
                needs_newline = False
            line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
            handle.write((b"\n" if needs_newline else b"") + line.encode("ascii"))
        client.get_host_keys().add(hostname, key.get_name(), key)


class SSHTransport(ClosesOnExit):
    """Runs commands on one host over SSH; one connection per host per run, reused by every call.

    The connection opens on the first `run` (so building transports for a fleet costs nothing)
    and is reopened once if it was lost between calls. `connect_count` counts opened connections
    and `exec_count` counts `run` calls, so tests can check the round trips the design promises.
    Not thread-safe: one transport per host, used by one worker at a time.
    """

    def __init__(
        self,
        host: Host,
        *,
        accept_new_host_keys: bool = False,
        connect_timeout: float = 10.0,
        keepalive_seconds: int = 15,
        kill_grace_seconds: float = 2.0,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    ) -> None:
        self.host = host.name
        self.exec_count = 0
        self.connect_count = 0
        self._target = host
        self._accept_new = accept_new_host_keys
        self._connect_timeout = connect_timeout
        self._keepalive = keepalive_seconds
        self._kill_grace = kill_grace_seconds
        self._max_output = max_output_bytes
        self._connection: Connection | None = None
        self._processes: list[SSHProcess] = []

    # -- connecting -----------------------------------------------------------------------

    def _known_hosts_file(self, connection: Connection) -> Path:
        if self._target.known_hosts:
            return Path(self._target.known_hosts).expanduser()
        configured = connection.ssh_config.get("userknownhostsfile")
        if configured:
            first = configured.split()[0] if isinstance(configured, str) else configured[0]
            return Path(first).expanduser()
        return Path("~/.ssh/known_hosts").expanduser()

    def _verify_host_keys(self, connection: Connection, label: str) -> None:
        """Replace fabric's accept-anything policy with ours on `connection` and its gateways."""
        known_hosts = self._known_hosts_file(connection)
        client: paramiko.SSHClient = connection.client
        try:
            if not self._target.known_hosts and SYSTEM_KNOWN_HOSTS.is_file():
                client.load_system_host_keys(str(SYSTEM_KNOWN_HOSTS))
            if known_hosts.is_file():
                client.get_host_keys().load(str(known_hosts))
        except (OSError, paramiko.SSHException) as exc:
            raise TransportError(
                f"cannot read known_hosts file {known_hosts}: {exc}", host=self.host, step="connect"
            ) from None
        client.set_missing_host_key_policy(
            _VerifyingHostKeyPolicy(label, known_hosts, self._accept_new)
        )
        if isinstance(connection.gateway, Connection):
            self._verify_host_keys(connection.gateway, f"{label} via jump host")

    def _connect_kwargs(self, identity_file: str | None) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "banner_timeout": self._connect_timeout,
            "auth_timeout": self._connect_timeout,
        }
        if identity_file:
            kwargs["key_filename"] = [os.path.expanduser(identity_file)]
        return kwargs

    def _jump_connection(self, jump: JumpHost, config: Config) -> Connection:
        return Connection(
            jump.address,
            user=jump.user,
            port=jump.port,
            config=config,
            connect_kwargs=self._connect_kwargs(jump.identity_file),
            connect_timeout=math.ceil(self._connect_timeout),
        )

    def _open(self) -> Connection:
        target = self._target
        config = Config()
        gateway = self._jump_connection(target.jump, config) if target.jump else None
        connection = Connection(
            target.address,
            user=target.user,
            port=target.port,
            config=config,
            gateway=gateway,
            connect_kwargs=self._connect_kwargs(target.identity_file),
            connect_timeout=math.ceil(self._connect_timeout),
        )
        self._verify_host_keys(connection, self.host)
        target_at = f"{connection.user}@{connection.host}:{connection.port}"
        jump = connection.gateway if isinstance(connection.gateway, Connection) else None
        where = target_at
        try:
            if jump is not None:
                # The jump host first, on its own: a failure there names that hop, not the target.
                where = f"jump host {jump.user}@{jump.host}:{jump.port}"
                jump.open()
                where = f"{target_at} through jump host {jump.user}@{jump.host}:{jump.port}"
            connection.open()
        except HostKeyError:
            _close_quietly(connection)
            raise
        except paramiko.BadHostKeyException as exc:
            _close_quietly(connection)
            raise HostKeyError(
                f"[{self.host}] host key for {exc.hostname} CHANGED: known "
                f"{exc.expected_key.get_name()} {host_key_fingerprint(exc.expected_key)}, "
                f"offered {exc.key.get_name()} {host_key_fingerprint(exc.key)}; refusing to connect",
                host=self.host,
                fingerprint=host_key_fingerprint(exc.key),
                changed=True,
                hint=(
                    "this can be a man-in-the-middle attack; it is never accepted by a flag. "
                    "If the host was really reinstalled, remove the old key with "
                    f"`ssh-keygen -R '{exc.hostname}' -f {self._known_hosts_file(connection)}` "
                    "after checking the new fingerprint"
                ),
            ) from None
        except paramiko.AuthenticationException as exc:
            _close_quietly(connection)
            raise TransportError(
                f"authentication failed for {where}: {error_reason(exc)}",
                host=self.host,
                step="connect",
                hint="check user and identity_file in the inventory, or your ssh-agent",
            ) from None
        except (OSError, EOFError, paramiko.SSHException) as exc:
            _close_quietly(connection)
            prefix = "" if where.startswith("jump host") else "cannot connect to "
            raise TransportError(
                f"{prefix}{where}: {error_reason(exc)}",
                host=self.host,
                step="connect",
            ) from None
        transport = connection.transport
        assert transport is not None
        transport.set_keepalive(self._keepalive)
        self.connect_count += 1
        return connection

    def _transport(self) -> paramiko.Transport:
        connection = self._connection
        if (
            connection is None
            or connection.transport is None
            or not connection.transport.is_active()
        ):
            if connection is not None:
                _close_quietly(connection)
            self._connection = None
            connection = self._connection = self._open()
        transport: paramiko.Transport = connection.transport
        return transport

    # -- running --------------------------------------------------------------------------

    def run(self, command: Command, *, stdin: bytes = b"", timeout: float) -> CommandResult:
        """Run `command` on the host with `stdin`, draining both outputs, within `timeout`.

        The connection is opened on first use (its own connect timeout does not count against
        `timeout`).

        Raises:
            HostKeyError: the host's key is unknown (and not accepted) or changed.
            CommandTimeout: the deadline passed; the remote process group was ended.
            TransportError: the host cannot be reached, or the connection broke.
        """
        self.exec_count += 1
        transport = self._transport()
        started = time.monotonic()
        deadline = started + timeout
        try:
            channel = transport.open_session(timeout=max(1.0, min(timeout, self._connect_timeout)))
            channel.exec_command(wrap_in_process_group(command))
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise TransportError(
                f"cannot start a command: {error_reason(exc)}", host=self.host, step="exec"
            ) from None
        stdout = CappedBuffer(self._max_output)
        stderr = CappedBuffer(self._max_output)
        try:
            finished = _pump(channel, stdin, stdout, stderr, deadline)
            if not finished:
                pgid = _reported_pgid(stderr.peek())
                channel.close()
                outcome = self._end_remote_group(pgid)
                raise CommandTimeout(
                    f"`{command.describe()}` ran past its {timeout:g}s deadline; {outcome}",
                    host=self.host,
                    step="exec",
                )
            exit_code = channel.recv_exit_status()
            if exit_code == -1 and not transport.is_active():
                # No exit status because the connection itself went (sshd killed, the network
                # gone): say so, not "the command gave no reply". What it did is unknown.
                raise TransportError(
                    "the connection was lost while the command ran (no exit status came back; "
                    "what the command did is unknown)",
                    host=self.host,
                    step="exec",
                )
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise TransportError(
                f"the connection broke while running `{command.describe()}`: {error_reason(exc)}",
                host=self.host,
                step="exec",
            ) from None
        finally:
            channel.close()
        err = stderr.value()
        match = _PGID_LINE.search(err)
        self._check_setsid(exit_code, err, match)
        return CommandResult(
            command=command.masked(),
            exit_code=exit_code,
            stdout=stdout.value(),
            stderr=err[: match.start()] + err[match.end() :] if match else err,
            seconds=time.monotonic() - started,
        )

    def _check_setsid(self, exit_code: int, stderr: bytes, pgid_line: object) -> None:
        if pgid_line is None and exit_code == 127 and b"setsid" in stderr:
            raise TransportError(
                "`setsid` (util-linux) is not installed on the host",
                host=self.host,
                step="exec",
                hint="opspatch runs every command in its own process group so a deadline can end it",
            )

    def start_process(self, command: Command) -> Process:
        """`command` kept running in a session of this host's connection (`SSHProcess`), in its
        own process group, its stdin open; the connection is opened (or reopened) first.

        Raises:
            HostKeyError: the host's key is unknown (and not accepted) or changed.
            TransportError: the host cannot be reached, or the session cannot be started.
        """
        transport = self._transport()
        try:
            channel = transport.open_session(timeout=self._connect_timeout)
            channel.exec_command(wrap_in_process_group(command))
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise TransportError(
                f"cannot start a command: {error_reason(exc)}", host=self.host, step="exec"
            ) from None
        process = SSHProcess(self, transport, channel)
        self._processes.append(process)
        return process

    def _end_remote_group(self, pgid: int | None) -> str:
        """End the timed-out command's process group; says what happened, for the message."""
        if pgid is None:
            return "it had not reported its process group, so only its channel was closed"
        try:
            transport = self._transport()
            channel = transport.open_session(timeout=5.0)
            channel.exec_command(kill_process_group_command(pgid, self._kill_grace).render())
            sink = CappedBuffer(4096)
            _pump(channel, b"", sink, sink, time.monotonic() + self._kill_grace + 5.0)
            channel.close()
        except (OSError, EOFError, paramiko.SSHException, TransportError) as exc:
            return f"its process group {pgid} could not be ended ({exc}); it may still run"
        return f"its process group {pgid} was ended"

    def close(self) -> None:
        """Close the commands kept running and the connection (and the jump host's); safe to
        call twice."""
        processes, self._processes = self._processes, []
        for process in processes:
            process.close()
        connection, self._connection = self._connection, None
        if connection is not None:
            _close_quietly(connection)


class SSHProcess:
    """A command kept running in one session of a host's connection (`SSHTransport.start_process`)."""

    def __init__(
        self, owner: SSHTransport, transport: paramiko.Transport, channel: paramiko.Channel
    ) -> None:
        self._owner = owner
        self._transport = transport
        self._channel = channel
        self._out = bytearray()
        self._err = bytearray()
        self._pgid: int | None = None
        self._released = False
        self._loss_awaited = False

    @property
    def ended(self) -> bool:
        channel = self._channel
        return self._released or bool(channel.closed or channel.eof_received) or self.lost

    @property
    def lost(self) -> bool:
        if not self._transport.is_active():
            return True
        channel = self._channel
        if self._released or not channel.closed or channel.recv_exit_status() >= 0:
            return False
        # Closed with no exit status: sshd says a command's status before it closes its channel
        # (`setsid -w` reports the agent's), so the connection went. Paramiko closes its
        # channels a moment before it marks the connection inactive: wait for that, so the
        # connection is opened again for what follows.
        if not self._loss_awaited:
            self._loss_awaited = True
            self._transport.join(_LOSS_SETTLES)
        return True

    def _drain(self) -> bool:
        """Take the output that arrived; whether there was any."""
        took = False
        while self._channel.recv_ready():
            self._out += self._channel.recv(_CHUNK)
            took = True
        while self._channel.recv_stderr_ready():
            data = self._channel.recv_stderr(_CHUNK)
            if len(self._err) < self._owner._max_output:
                self._err += data[: self._owner._max_output - len(self._err)]
            took = True
        if self._pgid is None:
            match = _PGID_LINE.search(self._err)
            if match is not None:
                self._pgid = int(match.group(1))
                del self._err[match.start() : match.end()]
        return took

    def send(self, data: bytes, *, deadline: float) -> int | None:
        self._owner.exec_count += 1
        offset = 0
        wake = self._channel.fileno()
        while offset < len(data) and not self.ended:
            self._drain()
            if self._channel.send_ready():
                try:
                    # counted once paramiko took a whole packet: sshd cannot read part of one
                    offset += self._channel.send(data[offset : offset + _CHUNK])
                except (OSError, EOFError):
                    break  # it ended, or its connection went: `read_line` tells which
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            select.select([wake], [], [], min(remaining, 0.05))
        return offset

    def read_line(self, *, deadline: float) -> bytes | None:
        wake = self._channel.fileno()
        while True:
            self._drain()
            end = self._out.find(b"\n")
            if end >= 0:
                line = bytes(self._out[: end + 1])
                del self._out[: end + 1]
                return line
            if self.ended and not self._channel.recv_ready():
                rest = bytes(self._out)
                self._out.clear()
                return rest
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            select.select([wake], [], [], min(remaining, 0.2))

    def exit_status(self, *, deadline: float) -> int | None:
        channel = self._channel
        while not channel.exit_status_ready() and not self.lost and not self._released:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            channel.status_event.wait(min(remaining, 0.2))
        if not channel.exit_status_ready():
            return None
        code = channel.recv_exit_status()
        self._drain()
        self._owner._check_setsid(code, bytes(self._err), self._pgid)
        return code if code >= 0 else None

    def take_stderr(self) -> bytes:
        self._drain()
        taken = bytes(self._err)
        self._err.clear()
        return taken

    def end(self) -> str:
        self._drain()
        self.close()
        if self.lost:
            return "the connection to it was lost; it may still run"
        return self._owner._end_remote_group(self._pgid)

    def close(self) -> None:
        """End its input (an agent then exits) and release the channel at once: waiting for
        its exit here would cost each host a round trip at the end of a run, one host after
        the other; safe to call twice."""
        if self._released:
            return
        self._released = True
        with contextlib.suppress(Exception):
            self._channel.shutdown_write()
        with contextlib.suppress(Exception):
            self._channel.close()
        with contextlib.suppress(ValueError):
            self._owner._processes.remove(self)


def error_reason(exc: BaseException) -> str:
    """What an exception says, or its type's name when it says nothing (an `EOFError()` from a
    closed channel, say), so no message ends in an empty reason. Paramiko's "[Errno None]
    Unable to connect to port P on A" is replaced by what each address answered (`Connection
    refused`)."""
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError) and exc.errors:
        answers = sorted(
            {
                getattr(error, "strerror", None) or error_reason(error)
                for error in exc.errors.values()
            }
        )
        return "; ".join(answers)
    return str(exc).strip() or type(exc).__name__


def _close_quietly(connection: Connection) -> None:
    """Close a connection even if it failed half-way (fabric only closes fully open ones)."""
    with contextlib.suppress(Exception):
        connection.client.close()
    with contextlib.suppress(Exception):
        connection.close()
    if isinstance(connection.gateway, Connection):
        _close_quietly(connection.gateway)


def _reported_pgid(stderr_head: bytes) -> int | None:
    match = _PGID_LINE.search(stderr_head)
    return int(match.group(1)) if match else None


def _pump(
    channel: paramiko.Channel,
    stdin: bytes,
    stdout: CappedBuffer,
    stderr: CappedBuffer,
    deadline: float,
) -> bool:
    """Send stdin and drain both outputs until the command exits; False if the deadline passed.

    Stdin is sent as the window allows, interleaved with reading, so neither side can block the
    other; then the write side is shut so the command sees end-of-file.
    """
    offset = 0
    sending = bool(stdin)
    if not sending:
        channel.shutdown_write()
    wake = channel.fileno()  # readable when output or EOF arrives (paramiko's pipe)
    while True:
        progressed = False
        while channel.recv_ready():
            stdout.add(channel.recv(_CHUNK))
            progressed = True
        while channel.recv_stderr_ready():
            stderr.add(channel.recv_stderr(_CHUNK))
            progressed = True
        if sending and channel.send_ready():
            try:
                offset += channel.send(stdin[offset : offset + _CHUNK])
            except OSError:
                offset = len(stdin)  # the command exited without reading all of it
            if offset >= len(stdin):
                sending = False
                with contextlib.suppress(OSError):
                    channel.shutdown_write()
            progressed = True
        if channel.closed or (channel.exit_status_ready() and channel.eof_received):
            # Output sent before the exit status and EOF is already buffered: take the rest.
            while channel.recv_ready():
                stdout.add(channel.recv(_CHUNK))
            while channel.recv_stderr_ready():
                stderr.add(channel.recv_stderr(_CHUNK))
            return True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        if progressed:
            continue
        if channel.eof_received:
            # All output is in; only the exit status is still to come (no pipe event for it).
            channel.status_event.wait(min(remaining, 0.2))
        else:
            select.select([wake], [], [], min(remaining, 0.05 if sending else 0.2))
