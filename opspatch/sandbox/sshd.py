"""A private OpenSSH server on a loopback address, for the test fleet and `sandbox up --ssh`."""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/local/sbin/sshd", "/sbin/sshd")


class SshdError(RuntimeError):
    """The private sshd could not be started (missing binary, bad config, port taken)."""


@dataclass(frozen=True)
class KeyPair:
    """An ed25519 key pair on disk: the private key file (mode 0600) and its public line."""

    private_key: Path
    public_line: str


@dataclass(frozen=True)
class SshdServer:
    """One running private sshd."""

    address: str
    port: int
    pid: int
    workdir: Path
    host_public_key: str
    log_file: Path

    @property
    def known_hosts_line(self) -> str:
        """The `known_hosts` line pinning this server's host key."""
        host = self.address if self.port == 22 else f"[{self.address}]:{self.port}"
        return f"{host} {self.host_public_key}"


@dataclass(frozen=True)
class SshFleet:
    """Several private sshd servers sharing one user key and one pinned known_hosts file."""

    servers: tuple[SshdServer, ...]
    user: str
    user_key: KeyPair
    known_hosts: Path


def find_sshd() -> str | None:
    """The path of the OpenSSH server binary, or None when it is not installed."""
    for candidate in SSHD_CANDIDATES:
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("sshd")


def generate_keypair(path: Path, comment: str) -> KeyPair:
    """Write a new ed25519 private key (OpenSSH format, mode 0600) and `path.pub`."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(private)
    public_line = f"{public.decode()} {comment}"
    path.with_name(path.name + ".pub").write_text(public_line + "\n")
    return KeyPair(private_key=path, public_line=public_line)


def free_port(address: str) -> int:
    """A TCP port free on `address` right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((address, 0))
        port: int = probe.getsockname()[1]
        return port


def _config_text(
    address: str, port: int, host_key: Path, authorized_keys: Path, pid_file: Path
) -> str:
    # StrictModes no: the test folders live under /tmp with whatever modes pytest gives them.
    # UsePAM no and no passwords: the generated key is the only way in.
    return "\n".join(
        [
            f"ListenAddress {address}:{port}",
            f"HostKey {host_key}",
            f"PidFile {pid_file}",
            f"AuthorizedKeysFile {authorized_keys}",
            "AuthenticationMethods publickey",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "PermitRootLogin prohibit-password",
            "StrictModes no",
            "UseDNS no",
            "X11Forwarding no",
            "AllowTcpForwarding yes",
            "PrintMotd no",
            "MaxSessions 32",
            "MaxStartups 64:30:128",
            "LogLevel INFO",
            "",
        ]
    )


def _wait_for_banner(
    address: str, port: int, process: subprocess.Popen[bytes], timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SshdError(f"sshd exited with status {process.returncode}")
        try:
            with socket.create_connection((address, port), timeout=0.5) as probe:
                if probe.recv(64).startswith(b"SSH-"):
                    return
        except OSError:
            time.sleep(0.05)
    raise SshdError(f"sshd did not answer on {address}:{port} within {timeout:g}s")


def start_sshd(
    workdir: Path,
    *,
    address: str,
    authorized_keys: Sequence[str],
    port: int | None = None,
    sshd_path: str | None = None,
    ready_timeout: float = 10.0,
) -> SshdServer:
    """Start a private `sshd -D` on `address` (a free port unless `port` is given).

    Only the keys in `authorized_keys` (public key lines) may log in, as the user running this.

    Raises:
        SshdError: sshd is not installed, or it did not start (its log is quoted).
    """
    binary = sshd_path or find_sshd()
    if binary is None:
        raise SshdError("OpenSSH sshd is not installed (apt-get install openssh-server)")
    workdir.mkdir(parents=True, exist_ok=True)
    host_key = generate_keypair(workdir / "ssh_host_ed25519_key", f"opspatch-host@{address}")
    authorized = workdir / "authorized_keys"
    authorized.write_text("".join(line.strip() + "\n" for line in authorized_keys))
    if os.geteuid() == 0:
        # sshd running as root needs its privilege-separation folder (normally made by systemd).
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    attempts = 1 if port is not None else 3  # a free port can be taken between probe and bind
    last_error = ""
    for _ in range(attempts):
        chosen = port if port is not None else free_port(address)
        config = workdir / "sshd_config"
        config.write_text(
            _config_text(address, chosen, host_key.private_key, authorized, workdir / "sshd.pid")
        )
        log_file = workdir / "sshd.log"
        with open(log_file, "ab") as log:
            process = subprocess.Popen(
                [binary, "-D", "-e", "-f", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        try:
            _wait_for_banner(address, chosen, process, ready_timeout)
        except SshdError as exc:
            _stop_process(process.pid)
            last_error = f"{exc}; log: {log_file.read_text(errors='replace')[-2000:]}"
            continue
        public = host_key.public_line.rsplit(" ", 1)[0]
        return SshdServer(address, chosen, process.pid, workdir, public, log_file)
    raise SshdError(f"sshd on {address} did not start: {last_error}")


def _is_gone(pid: int) -> bool:
    try:
        reaped, _ = os.waitpid(pid, os.WNOHANG)
        return reaped == pid
    except ChildProcessError:  # not our child (or already reaped): look for it instead
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False


def _stop_process(pid: int, timeout: float = 5.0) -> None:
    """TERM `pid`, wait up to `timeout`, then KILL it."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _is_gone(pid):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not _is_gone(pid):
        time.sleep(0.05)


def _is_our_sshd(server: SshdServer) -> bool:
    """Whether `server.pid` still runs this server's config (a recycled pid must not be killed)."""
    try:
        cmdline = Path(f"/proc/{server.pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return False
    except OSError:
        return True  # no /proc to ask (not Linux): trust the pid we recorded
    return str(server.workdir / "sshd_config").encode() in cmdline


def stop_sshd(server: SshdServer, *, timeout: float = 5.0) -> None:
    """Stop one private sshd by its pid (TERM, then KILL after `timeout`); safe to call twice.

    The pid is only signalled while it still runs this server's config file.
    """
    if _is_our_sshd(server):
        _stop_process(server.pid, timeout)
    else:
        _is_gone(server.pid)  # reap it if it is our exited child


def write_known_hosts(path: Path, servers: Sequence[SshdServer]) -> Path:
    """Write a known_hosts file pinning exactly these servers' host keys."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(server.known_hosts_line + "\n" for server in servers))
    return path


def start_ssh_fleet(
    workdir: Path, addresses: Sequence[str], *, sshd_path: str | None = None
) -> SshFleet:
    """Start one private sshd per address with a shared user key and a pinned known_hosts.

    Raises:
        SshdError: a server did not start (the ones already started are stopped first).
    """
    user_key = generate_keypair(workdir / "user" / "id_ed25519", "opspatch-fleet-user")
    servers: list[SshdServer] = []
    try:
        for address in addresses:
            servers.append(
                start_sshd(
                    workdir / f"sshd-{address}",
                    address=address,
                    authorized_keys=[user_key.public_line],
                    sshd_path=sshd_path,
                )
            )
    except BaseException:
        for server in servers:
            stop_sshd(server)
        raise
    known_hosts = write_known_hosts(workdir / "user" / "known_hosts", servers)
    return SshFleet(tuple(servers), getpass.getuser(), user_key, known_hosts)


def stop_ssh_fleet(fleet: SshFleet) -> None:
    """Stop every server of the fleet by pid."""
    for server in fleet.servers:
        stop_sshd(server)
