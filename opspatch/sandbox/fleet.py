"""The sandbox fleet: N stand-in SGLang hosts on this machine, started, inspected and stopped.

`opspatch sandbox up` builds hosts under `<state>/sandbox/hosts/sandbox-01..`, each a folder with
its own virtual environment and installed stand-in engine (`install.make_host_python`), its own
loopback port, log file, pid file and host-side state folder (the inventory's `state_dir`, where
the host agent keeps its lock and backups). It starts every engine through the same code a
rollout uses (`LocalTransport` -> `HostOperations` -> `EngineControl.restart` / `wait_ready` with
the `command` restart strategy), so the sandbox exercises the real restart logic, then writes the
`sandbox` inventory into `<state>/inventories/`, where `--hosts sandbox` finds it from any folder.
With `--ssh` every host also gets a private sshd on 127.0.0.2, 127.0.0.3, ... (`opspatch.sandbox.sshd`)
and a `sandbox-ssh` inventory reaching the same hosts over SSH.

Layout (everything is derived from the state directory; only ports and sshd pids are recorded):

```
<state>/sandbox/sandbox.json          the manifest: hosts, their ports, ssh endpoints
<state>/sandbox/hosts/sandbox-01/     venv/, server.log, server.pid, state/
<state>/sandbox/ssh/user/             id_ed25519 (+ .pub), known_hosts (pinned host keys)
<state>/sandbox/ssh/sandbox-01/       that host's sshd: config, host key, pid, log
<state>/inventories/sandbox.toml      transport local
<state>/inventories/sandbox-ssh.toml  transport ssh (only with --ssh)
```

Why things are the way they are:
- `up` is idempotent: a running engine (its pid-file pid alive, working in the host's folder and
  running `sglang.launch_server`) is left alone; a stopped one is started again on its recorded
  port; an installed engine is never reinstalled, so a patched file stays patched.
- Engines are recognised by pid *and* by what the process is, so a recycled pid is never
  signalled. Stopping uses the host agent's own `stop_process_tree`, the code `restart` uses.
- Ports are chosen once and recorded before anything starts; a recorded port that something
  else now holds is refused up front (exit 2, nothing started).
- One sandbox command at a time: `up` and `down` hold `<state>/sandbox/.lock`.
- A restarted sshd gets a new host key (`opspatch.sandbox.sshd` generates one per start); `up` rewrites
  the pinned known_hosts each time, so the `sandbox-ssh` inventory always verifies keys strictly.
- Linux only, like the host agent's process handling: processes are recognised through /proc.
"""

from __future__ import annotations

import contextlib
import errno
import getpass
import json
import os
import shutil
import socket
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from opspatch.config import paths
from opspatch.config.inventory import Inventory, parse_inventory
from opspatch.config.lookup import Workspace
from opspatch.config.patches import load_patch
from opspatch.core.edit import detect
from opspatch.core.host import Host
from opspatch.core.policy import Playbook, StepTimeouts
from opspatch.core.spec import LoadedPatch
from opspatch.errors import HostError, InputError, OpspatchError
from opspatch.hosts.agent.processes import stop_process_tree
from opspatch.hosts.engine import EngineControl, RestartResult
from opspatch.hosts.operations import HostOperations
from opspatch.hosts.transport.base import Command
from opspatch.hosts.transport.local import LocalTransport
from opspatch.sandbox import MAX_HOSTS
from opspatch.sandbox.install import make_host_python
from opspatch.sandbox.sshd import (
    SshdError,
    SshdServer,
    find_sshd,
    generate_keypair,
    start_sshd,
    stop_sshd,
)

DEFAULT_HOSTS = 3
"""Each engine is a torch process of a few hundred MB; more than this is a mistake, not a test."""

ENGINE_ADDRESS = "127.0.0.1"
SSH_FIRST_ADDRESS = 2  # sandbox-01's sshd listens on 127.0.0.2, sandbox-02's on 127.0.0.3, ...
SPECULATIVE_ALGORITHM = "EAGLE3"
SANDBOX_INVENTORY = "sandbox"
SANDBOX_SSH_INVENTORY = "sandbox-ssh"
CANARY_GROUP = "canary"
MANIFEST_FORMAT = 1
ENGINE_STOP_TIMEOUT = 10.0
HEALTH_TIMEOUT = 5.0

# CUDA is hidden explicitly so the incident reproduces on any machine: CUDA graph capture must
# fail for real, even where a GPU exists. Unbuffered output keeps the log current, so the log tail
# shown for a host that does not come up is complete.
ENGINE_ENV: dict[str, str] = {"CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1"}

# The stand-in is ready within seconds; the default playbook's 20 minutes suit real models only.
SANDBOX_PLAYBOOK = Playbook(
    name="sandbox", timeouts=StepTimeouts(restart=60.0, ready=120.0, smoke=60.0)
)

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


# ---------------------------------------------------------------------------------------------
# where things are (pure)


@dataclass(frozen=True)
class SandboxLayout:
    """Every path of one sandbox, derived from the controller's state directory."""

    state_dir: Path

    @classmethod
    def default(cls) -> SandboxLayout:
        """The sandbox of the current user (`OPSPATCH_STATE_DIR` / XDG state directory)."""
        return cls(paths.state_dir())

    @property
    def root(self) -> Path:
        return self.state_dir / "sandbox"

    @property
    def manifest(self) -> Path:
        return self.root / "sandbox.json"

    @property
    def lock_file(self) -> Path:
        return self.root / ".lock"

    @property
    def hosts_dir(self) -> Path:
        return self.root / "hosts"

    @property
    def ssh_dir(self) -> Path:
        return self.root / "ssh"

    @property
    def user_key(self) -> Path:
        return self.ssh_dir / "user" / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.ssh_dir / "user" / "known_hosts"

    @property
    def inventories_dir(self) -> Path:
        return self.state_dir / "inventories"

    @property
    def inventory(self) -> Path:
        return self.inventories_dir / f"{SANDBOX_INVENTORY}.toml"

    @property
    def ssh_inventory(self) -> Path:
        return self.inventories_dir / f"{SANDBOX_SSH_INVENTORY}.toml"

    def host_dir(self, name: str) -> Path:
        return self.hosts_dir / name

    def python(self, name: str) -> Path:
        return self.host_dir(name) / "venv" / "bin" / "python"

    def log_file(self, name: str) -> Path:
        return self.host_dir(name) / "server.log"

    def pid_file(self, name: str) -> Path:
        return self.host_dir(name) / "server.pid"

    def host_state_dir(self, name: str) -> Path:
        return self.host_dir(name) / "state"

    def sshd_dir(self, name: str) -> Path:
        return self.ssh_dir / name


def host_name(index: int) -> str:
    """`sandbox-01` for index 0."""
    return f"sandbox-{index + 1:02d}"


def ssh_address(index: int) -> str:
    """The loopback address of host `index`'s sshd: 127.0.0.2 for index 0."""
    return f"127.0.0.{index + SSH_FIRST_ADDRESS}"


def engine_url(port: int) -> str:
    return f"http://{ENGINE_ADDRESS}:{port}"


def start_command(python: Path, port: int) -> str:
    """The engine's start command line, quoted by `Command.render` (the one place that quotes)."""
    argv = (
        str(python),
        "-m",
        "sglang.launch_server",
        "--host",
        ENGINE_ADDRESS,
        "--port",
        str(port),
        "--speculative-algorithm",
        SPECULATIVE_ALGORITHM,
    )
    return Command(argv).render()


def check_host_count(count: int) -> None:
    """Refuse a host count outside 1..MAX_HOSTS.

    Raises:
        InputError: the count is below 1 or above MAX_HOSTS.
    """
    if not 1 <= count <= MAX_HOSTS:
        raise InputError(
            f"--hosts must be between 1 and {MAX_HOSTS} (got {count})",
            hint="each sandbox host runs its own engine process on this machine",
        )


# ---------------------------------------------------------------------------------------------
# the manifest


@dataclass(frozen=True)
class SshEndpoint:
    """A sandbox host's private sshd: where it listens, its pid and its pinned host key."""

    address: str
    port: int | None = None
    pid: int | None = None
    host_public_key: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "address": self.address,
            "port": self.port,
            "pid": self.pid,
            "host_public_key": self.host_public_key,
        }


@dataclass(frozen=True)
class HostRecord:
    """What the manifest remembers about one host: its name, engine port and sshd."""

    name: str
    port: int
    ssh: SshEndpoint | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "port": self.port,
            "ssh": self.ssh.to_json() if self.ssh else None,
        }


@dataclass(frozen=True)
class Manifest:
    """`sandbox.json`: the hosts in order and the SSH login user (None: no `--ssh`)."""

    hosts: tuple[HostRecord, ...] = ()
    ssh_user: str | None = None

    @property
    def ssh(self) -> bool:
        return self.ssh_user is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "format": MANIFEST_FORMAT,
            "engine_address": ENGINE_ADDRESS,
            "ssh_user": self.ssh_user,
            "hosts": [record.to_json() for record in self.hosts],
        }

    @classmethod
    def from_json(cls, data: Any, path: Path) -> Manifest:
        """Parse a manifest document.

        Raises:
            InputError: the document is not a manifest this version wrote.
        """
        try:
            if data.get("format") != MANIFEST_FORMAT:
                raise ValueError(f"unknown format {data.get('format')!r}")
            hosts = []
            for entry in data["hosts"]:
                ssh = entry.get("ssh")
                hosts.append(
                    HostRecord(
                        name=str(entry["name"]),
                        port=int(entry["port"]),
                        ssh=None
                        if ssh is None
                        else SshEndpoint(
                            address=str(ssh["address"]),
                            port=None if ssh.get("port") is None else int(ssh["port"]),
                            pid=None if ssh.get("pid") is None else int(ssh["pid"]),
                            host_public_key=ssh.get("host_public_key"),
                        ),
                    )
                )
            user = data.get("ssh_user")
            return cls(tuple(hosts), None if user is None else str(user))
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise InputError(
                f"{path}: not a sandbox manifest ({type(exc).__name__}: {exc})",
                hint="opspatch sandbox down --purge removes the sandbox so `up` can start afresh",
            ) from None


def load_manifest(layout: SandboxLayout) -> Manifest | None:
    """The recorded sandbox, or None when there is none.

    Raises:
        InputError: the manifest exists but cannot be read as one.
    """
    try:
        text = layout.manifest.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise InputError(
            f"{layout.manifest}: not JSON ({exc})",
            hint="opspatch sandbox down --purge removes the sandbox so `up` can start afresh",
        ) from None
    return Manifest.from_json(data, layout.manifest)


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise


def save_manifest(layout: SandboxLayout, manifest: Manifest) -> None:
    _write_atomically(layout.manifest, json.dumps(manifest.to_json(), indent=2) + "\n")


# ---------------------------------------------------------------------------------------------
# the inventories (pure)


def _toml_string(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def render_inventory(layout: SandboxLayout, manifest: Manifest, *, over_ssh: bool) -> str:
    """The `sandbox` (local) or `sandbox-ssh` inventory text for the recorded hosts.

    Both describe the same hosts with the same engine settings and host-side state folder (so the
    host lock is shared whichever way a host is reached); only how they are reached differs.
    """
    kind = "SSH to a private sshd per host" if over_ssh else "local transport"
    lines = [
        "# Written by `opspatch sandbox up`; rewritten by every `up` (edits here are lost).",
        f"# {len(manifest.hosts)} stand-in SGLang engine(s), each in its own folder of the sandbox.",
        f"description = {_toml_string(f'opspatch sandbox: local stand-in SGLang hosts ({kind})')}",
        "",
        "[defaults]",
    ]
    if over_ssh:
        lines += [
            'transport = "ssh"',
            f"user = {_toml_string(manifest.ssh_user or getpass.getuser())}",
            f"identity_file = {_toml_string(str(layout.user_key))}",
            f"known_hosts = {_toml_string(str(layout.known_hosts))}",
        ]
    else:
        lines.append('transport = "local"')
    env = ", ".join(f"{name} = {_toml_string(value)}" for name, value in ENGINE_ENV.items())
    lines += ["", "[defaults.engine]", "speculative = true", f"env = {{ {env} }}"]
    for record in manifest.hosts:
        name = record.name
        restart = (
            f'{{ kind = "command", start = {_toml_string(start_command(layout.python(name), record.port))}, '
            f"pid_file = {_toml_string(str(layout.pid_file(name)))}, "
            f"workdir = {_toml_string(str(layout.host_dir(name)))}, "
            f"stop_timeout = {int(ENGINE_STOP_TIMEOUT)} }}"
        )
        lines += ["", f"[hosts.{name}]"]
        if over_ssh:
            if record.ssh is None or record.ssh.port is None:
                raise InputError(f"{name} has no sshd recorded; run `opspatch sandbox up --ssh`")
            lines += [
                f"address = {_toml_string(record.ssh.address)}",
                f"port = {record.ssh.port}",
            ]
        lines += [
            f"state_dir = {_toml_string(str(layout.host_state_dir(name)))}",
            f"[hosts.{name}.engine]",
            f"python = {_toml_string(str(layout.python(name)))}",
            f"url = {_toml_string(engine_url(record.port))}",
            f"log_file = {_toml_string(str(layout.log_file(name)))}",
            f"restart = {restart}",
        ]
    if manifest.hosts:
        lines += [
            "",
            f"[groups.{CANARY_GROUP}]",
            f"hosts = [{_toml_string(manifest.hosts[0].name)}]",
        ]
    return "\n".join(lines) + "\n"


def sandbox_inventory(layout: SandboxLayout, manifest: Manifest, *, over_ssh: bool) -> Inventory:
    """The rendered inventory, parsed by the real inventory parser (what `--hosts` will see)."""
    path = layout.ssh_inventory if over_ssh else layout.inventory
    return parse_inventory(render_inventory(layout, manifest, over_ssh=over_ssh), str(path))


# ---------------------------------------------------------------------------------------------
# processes: recognising ours


def _proc_text(pid: int, name: str) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/{name}").read_bytes()
    except OSError:
        return None
    return raw.replace(b"\0", b" ").decode("utf-8", errors="replace")


def _running(pid: int) -> bool:
    """Whether `pid` runs (a zombie, exited but not reaped, does not count)."""
    stat = _proc_text(pid, "stat")
    if stat is None:
        return False
    state = stat[stat.rfind(")") + 2 :].split(" ", 1)[0]
    return state not in ("Z", "X")


def _read_pid(pid_file: Path) -> int | None:
    try:
        text = pid_file.read_text(encoding="utf-8").strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return int(text) if text.isdigit() else None


def engine_pid(layout: SandboxLayout, name: str) -> int | None:
    """The pid of host `name`'s running engine, or None.

    The pid file's pid counts only while it runs `sglang.launch_server` in the host's folder:
    a pid recycled by an unrelated process is never taken for the engine.
    """
    pid = _read_pid(layout.pid_file(name))
    if pid is None or not _running(pid):
        return None
    cmdline = _proc_text(pid, "cmdline") or ""
    try:
        cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return None
    if "sglang.launch_server" not in cmdline or cwd != layout.host_dir(name).resolve():
        return None
    return pid


def sshd_pid(layout: SandboxLayout, record: HostRecord) -> int | None:
    """The pid of host `record`'s sshd if it still runs this sandbox's config, else None."""
    if record.ssh is None or record.ssh.pid is None or not _running(record.ssh.pid):
        return None
    config = str(layout.sshd_dir(record.name) / "sshd_config")
    return record.ssh.pid if config in (_proc_text(record.ssh.pid, "cmdline") or "") else None


def _port_taken(address: str, port: int) -> bool:
    """Whether a server could not listen on `address:port` now (another process listens)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # As servers bind: connections of a stopped engine lingering in TIME_WAIT do not count.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((address, port))
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                raise InputError(
                    f"address {address} cannot be used on this machine ({exc.strerror})",
                    hint="the sandbox needs the loopback range 127.0.0.0/8",
                ) from None
            return True
    return False


def _free_port(address: str, avoid: set[int]) -> int:
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((address, 0))
            port = int(probe.getsockname()[1])
        if port not in avoid:
            return port
    raise InputError(f"no free TCP port found on {address}")


# ---------------------------------------------------------------------------------------------
# one sandbox command at a time


@contextlib.contextmanager
def _sandbox_lock(layout: SandboxLayout) -> Iterator[None]:
    import fcntl

    layout.root.mkdir(parents=True, exist_ok=True)
    with open(layout.lock_file, "a+", encoding="utf-8") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            raise InputError(
                f"another `opspatch sandbox` command is working on {layout.root} (pid {holder})",
                hint="wait for it to finish, then run this again",
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                handle.truncate(0)
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


# ---------------------------------------------------------------------------------------------
# up


HostUpOutcome = Literal["started", "already-running", "failed"]


@dataclass(frozen=True)
class HostUp:
    """What `up` did to one host. `error` says why it failed (with the log's tail)."""

    host: str
    outcome: HostUpOutcome
    port: int
    url: str
    pid: int | None
    ready_seconds: float | None = None
    ssh: SshEndpoint | None = None
    ssh_outcome: Literal["started", "already-running"] | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "outcome": self.outcome,
            "pid": self.pid,
            "port": self.port,
            "url": self.url,
            "ready_seconds": self.ready_seconds,
            "ssh": None
            if self.ssh is None
            else {
                "address": self.ssh.address,
                "port": self.ssh.port,
                "pid": self.ssh.pid,
                "outcome": self.ssh_outcome,
            },
            "error": self.error,
        }


@dataclass(frozen=True)
class UpReport:
    """Every host's outcome and the inventories written (None when a host failed)."""

    root: Path
    hosts: tuple[HostUp, ...]
    inventory: Path | None
    ssh_inventory: Path | None

    @property
    def ok(self) -> bool:
        return all(h.outcome != "failed" for h in self.hosts)

    def to_json(self) -> dict[str, Any]:
        return {
            "sandbox": str(self.root),
            "ok": self.ok,
            "inventory": None if self.inventory is None else str(self.inventory),
            "ssh_inventory": None if self.ssh_inventory is None else str(self.ssh_inventory),
            "hosts": [h.to_json() for h in self.hosts],
        }


def _planned_manifest(
    current: Manifest | None, count: int | None, want_ssh: bool
) -> tuple[Manifest, set[str]]:
    """The manifest `up` will work to, and the names of hosts it adds (ports not yet chosen: 0).

    Raises:
        InputError: a count outside 1..MAX_HOSTS, or fewer hosts than the sandbox has.
    """
    existing = current.hosts if current else ()
    wanted = count if count is not None else (len(existing) or DEFAULT_HOSTS)
    check_host_count(wanted)
    if wanted < len(existing):
        raise InputError(
            f"the sandbox has {len(existing)} hosts; `up --hosts {wanted}` would not remove any",
            hint="run `opspatch sandbox down --purge` first to build a smaller sandbox",
        )
    ssh_user = (current.ssh_user if current else None) or (getpass.getuser() if want_ssh else None)
    records = list(existing)
    added = set()
    for index in range(len(existing), wanted):
        records.append(HostRecord(name=host_name(index), port=0))
        added.add(host_name(index))
    if ssh_user is not None:
        records = [
            record if record.ssh else replace(record, ssh=SshEndpoint(address=ssh_address(index)))
            for index, record in enumerate(records)
        ]
    return Manifest(tuple(records), ssh_user), added


def _choose_ports(manifest: Manifest) -> Manifest:
    """Give hosts without a port (0) a free loopback port, distinct from every recorded one."""
    taken = {record.port for record in manifest.hosts if record.port}
    chosen = []
    for record in manifest.hosts:
        if not record.port:
            record = replace(record, port=_free_port(ENGINE_ADDRESS, taken))
            taken.add(record.port)
        chosen.append(record)
    return replace(manifest, hosts=tuple(chosen))


def _refuse_taken_ports(layout: SandboxLayout, manifest: Manifest, running: set[str]) -> None:
    """Every stopped host's recorded engine and ssh ports must be free before anything starts.

    Raises:
        InputError: a port (or address) is held by another process; names host and port.
    """
    for record in manifest.hosts:
        if record.name not in running and _port_taken(ENGINE_ADDRESS, record.port):
            raise InputError(
                f"{record.name}: port {ENGINE_ADDRESS}:{record.port} is in use by another "
                "process; nothing was started",
                hint="stop that process, or `opspatch sandbox down --purge` and `up` again "
                "to choose new ports",
            )
        ssh = record.ssh
        if (
            ssh is not None
            and ssh.port is not None
            and sshd_pid(layout, record) is None
            and _port_taken(ssh.address, ssh.port)
        ):
            raise InputError(
                f"{record.name}: ssh port {ssh.address}:{ssh.port} is in use by another "
                "process; nothing was started",
                hint="stop that process, or `opspatch sandbox down --purge` and `up` again",
            )


def _drop_stale_pid_file(layout: SandboxLayout, name: str) -> None:
    """Remove a pid file whose pid is not this host's engine (it exited; the pid may since have
    been given to an unrelated process, which the restart's stop step must never signal)."""
    if engine_pid(layout, name) is None:
        with contextlib.suppress(FileNotFoundError):
            layout.pid_file(name).unlink()


def _log_tail(path: Path, lines: int = 12) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _failure_text(error: HostError, log_file: Path) -> str:
    """Why a host did not come up: the failed step, the reason, and the tail of its log."""
    text = f"{error.step}: {error.detail}" if error.step else error.detail
    tail = _log_tail(log_file)
    return text + (f"\n  log ({log_file}):\n{tail}" if tail else "")


def _ensure_user_key(layout: SandboxLayout) -> str:
    """The sandbox user's public key line, generating the key pair on first use."""
    public = layout.user_key.with_name(layout.user_key.name + ".pub")
    if layout.user_key.exists() and public.exists():
        return public.read_text(encoding="utf-8").strip()
    return generate_keypair(layout.user_key, "opspatch-sandbox-user").public_line


def _start_sshd_for(layout: SandboxLayout, record: HostRecord, public_key_line: str) -> SshEndpoint:
    assert record.ssh is not None
    try:
        server = start_sshd(
            layout.sshd_dir(record.name),
            address=record.ssh.address,
            authorized_keys=[public_key_line],
            port=record.ssh.port,
        )
    except SshdError as exc:
        raise HostError(str(exc), host=record.name, step="sshd") from None
    return SshEndpoint(record.ssh.address, server.port, server.pid, server.host_public_key)


def _write_known_hosts(layout: SandboxLayout, manifest: Manifest) -> None:
    lines = []
    for record in manifest.hosts:
        ssh = record.ssh
        if ssh and ssh.port and ssh.host_public_key:
            lines.append(f"[{ssh.address}]:{ssh.port} {ssh.host_public_key}\n")
    _write_atomically(layout.known_hosts, "".join(lines))


def sandbox_up(
    layout: SandboxLayout,
    *,
    hosts: int | None = None,
    ssh: bool = False,
    progress: Progress = _quiet,
) -> UpReport:
    """Create missing hosts, start stopped engines (and sshds), wait until all are ready, and
    write the sandbox inventories.

    `hosts` None keeps the sandbox's size (3 for a new one); more hosts than it has adds hosts.
    `ssh` also gives every host a private sshd (and stays on for later `up`s).
    A host whose engine does not come up is reported `failed` with its log's tail; the others are
    still started, and the inventories are written only when every host is ready.

    Raises:
        InputError: a bad host count, fewer hosts than the sandbox has, a recorded port or
            address held by another process, sshd not installed, another sandbox command running.
        HostError: a private sshd did not start (the ones started are recorded for `down`).
    """
    if hosts is not None:
        check_host_count(hosts)
    with _sandbox_lock(layout):
        current = load_manifest(layout)
        manifest, added = _planned_manifest(current, hosts, ssh)
        if manifest.ssh and find_sshd() is None:
            raise InputError(
                "`--ssh` needs OpenSSH's sshd, which is not installed",
                hint="apt-get install openssh-server (or run `opspatch sandbox up` without --ssh)",
            )
        manifest = _choose_ports(manifest)
        running = {r.name for r in manifest.hosts if engine_pid(layout, r.name) is not None}
        _refuse_taken_ports(layout, manifest, running)
        save_manifest(layout, manifest)  # ports are kept from here on, whatever happens next
        if manifest.ssh:
            manifest = _bring_up_sshds(layout, manifest, progress)

        controls = _engine_controls(layout, manifest)
        restarts, failed = _start_engines(layout, manifest, controls, running, added, progress)
        outcomes = failed | _await_engines(layout, manifest, controls, restarts, failed, progress)
        results = tuple(
            replace(outcomes[r.name], ssh=r.ssh, ssh_outcome=_sshd_outcome(current, r))
            for r in manifest.hosts
        )
        if any(h.outcome == "failed" for h in results):
            return UpReport(layout.root, results, None, None)
        _write_atomically(layout.inventory, render_inventory(layout, manifest, over_ssh=False))
        if not manifest.ssh:
            return UpReport(layout.root, results, layout.inventory, None)
        _write_atomically(layout.ssh_inventory, render_inventory(layout, manifest, over_ssh=True))
        return UpReport(layout.root, results, layout.inventory, layout.ssh_inventory)


def _engine_controls(layout: SandboxLayout, manifest: Manifest) -> dict[str, EngineControl]:
    """Engine control per host, built from the `sandbox` inventory exactly as a rollout builds
    it: local transport, host operations under the host's interpreter, the command strategy."""
    inventory = sandbox_inventory(layout, manifest, over_ssh=False)
    controls = {}
    for record in manifest.hosts:
        host = inventory.host(record.name)
        ops = HostOperations(LocalTransport(host.name), host)
        controls[record.name] = EngineControl(ops, host, SANDBOX_PLAYBOOK)
    return controls


def _start_engines(
    layout: SandboxLayout,
    manifest: Manifest,
    controls: dict[str, EngineControl],
    running: set[str],
    added: set[str],
    progress: Progress,
) -> tuple[dict[str, RestartResult], dict[str, HostUp]]:
    """Make each stopped host's environment (kept when it exists) and start its engine; all
    start before any is waited for, so they boot side by side. Returns the restarts and the
    hosts that failed to start."""
    restarts: dict[str, RestartResult] = {}
    failed: dict[str, HostUp] = {}
    for record in manifest.hosts:
        if record.name in running:
            progress(f"{record.name}: already running")
            continue
        verb = "creating" if record.name in added else "preparing"
        progress(f"{record.name}: {verb} its environment in {layout.host_dir(record.name)}")
        try:
            make_host_python(layout.host_dir(record.name))
            layout.host_state_dir(record.name).mkdir(parents=True, exist_ok=True)
            progress(f"{record.name}: starting the engine on {engine_url(record.port)}")
            _drop_stale_pid_file(layout, record.name)
            restarts[record.name] = controls[record.name].restart(step="start")
        except HostError as exc:
            error = _failure_text(exc, layout.log_file(record.name))
            failed[record.name] = _host_up(record, "failed", None, error=error)
    return restarts, failed


def _await_engines(
    layout: SandboxLayout,
    manifest: Manifest,
    controls: dict[str, EngineControl],
    restarts: dict[str, RestartResult],
    failed: dict[str, HostUp],
    progress: Progress,
) -> dict[str, HostUp]:
    """Wait until every host that did not fail to start answers /health (the readiness check
    a rollout uses, failing fast when a started engine exits)."""
    outcomes: dict[str, HostUp] = {}
    for record in manifest.hosts:
        if record.name in failed:
            continue
        restart = restarts.get(record.name)
        try:
            readiness = controls[record.name].wait_ready(restart)
        except HostError as exc:
            error = _failure_text(exc, layout.log_file(record.name))
            pid = restart.pid if restart else None
            outcomes[record.name] = _host_up(record, "failed", pid, error=error)
            continue
        outcome: HostUpOutcome = "already-running" if restart is None else "started"
        pid = engine_pid(layout, record.name)
        progress(f"{record.name}: ready ({outcome}, pid {pid})")
        outcomes[record.name] = _host_up(record, outcome, pid, ready=readiness.seconds)
    return outcomes


def _sshd_outcome(
    previous: Manifest | None, record: HostRecord
) -> Literal["started", "already-running"] | None:
    if record.ssh is None:
        return None
    before = next((r for r in previous.hosts if r.name == record.name), None) if previous else None
    same = before is not None and before.ssh is not None and before.ssh.pid == record.ssh.pid
    return "already-running" if same else "started"


def _host_up(
    record: HostRecord,
    outcome: HostUpOutcome,
    pid: int | None,
    *,
    ready: float | None = None,
    error: str | None = None,
) -> HostUp:
    return HostUp(
        host=record.name,
        outcome=outcome,
        port=record.port,
        url=engine_url(record.port),
        pid=pid,
        ready_seconds=ready,
        error=error,
    )


def _bring_up_sshds(layout: SandboxLayout, manifest: Manifest, progress: Progress) -> Manifest:
    """Start every host's sshd that is not running; record each in the manifest as it starts."""
    public_key = _ensure_user_key(layout)
    records = list(manifest.hosts)
    for index, record in enumerate(records):
        if sshd_pid(layout, record) is not None:
            continue
        assert record.ssh is not None
        progress(f"{record.name}: starting sshd on {record.ssh.address}")
        records[index] = replace(record, ssh=_start_sshd_for(layout, record, public_key))
        manifest = replace(manifest, hosts=tuple(records))
        save_manifest(layout, manifest)  # `down` can stop it even if a later one fails
    _write_known_hosts(layout, manifest)
    return manifest


# ---------------------------------------------------------------------------------------------
# status


@dataclass(frozen=True)
class PatchState:
    """Whether a host's copy of a patch's target file carries the patch (`detect`)."""

    patch: str
    state: str  # applied | not-applied | partial | unknown
    file: str
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"patch": self.patch, "state": self.state, "file": self.file, "reason": self.reason}


@dataclass(frozen=True)
class HostStatus:
    """One sandbox host as it is now."""

    host: str
    port: int
    url: str
    pid: int | None
    health: int | None
    health_detail: str
    patches: tuple[PatchState, ...]
    ssh: SshEndpoint | None
    ssh_running: bool | None
    log_file: str
    notes: tuple[str, ...] = ()

    @property
    def running(self) -> bool:
        return self.pid is not None

    @property
    def carries(self) -> tuple[str, ...]:
        return tuple(p.patch for p in self.patches if p.state == "applied")

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "running": self.running,
            "pid": self.pid,
            "port": self.port,
            "url": self.url,
            "health": {"status": self.health, "detail": self.health_detail},
            "patches": [p.to_json() for p in self.patches],
            "ssh": None
            if self.ssh is None
            else {
                "address": self.ssh.address,
                "port": self.ssh.port,
                "pid": self.ssh.pid if self.ssh_running else None,
                "running": self.ssh_running,
            },
            "log_file": self.log_file,
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class StatusReport:
    root: Path
    hosts: tuple[HostStatus, ...]
    inventories: tuple[Path, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        return {
            "sandbox": str(self.root),
            "inventories": [str(p) for p in self.inventories],
            "hosts": [h.to_json() for h in self.hosts],
            "notes": list(self.notes),
        }


def health_of(url: str, timeout: float = HEALTH_TIMEOUT) -> tuple[int | None, str]:
    """`GET <url>/health` from here (the engines listen on this machine's loopback)."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=timeout) as reply:  # noqa: S310 - our loopback URL
            return int(reply.status), "ok"
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.reason if isinstance(exc.reason, str) else str(exc.reason)
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return None, f"no answer ({reason})"


def _workspace_patches(workspace: Workspace) -> tuple[list[LoadedPatch], list[str]]:
    loaded, notes = [], []
    for name, path in sorted(workspace.available("patches").items()):
        try:
            loaded.append(load_patch(path))
        except OpspatchError as exc:
            notes.append(f"patch {name} skipped: {exc.render()}")
    return loaded, notes


def _patch_states(host: Host, patches: Sequence[LoadedPatch]) -> tuple[list[PatchState], list[str]]:
    """Detect each patch whose target module resolves under the host's interpreter (and whose
    versions include the host's sglang) in the file that interpreter imports: one exec per
    target module, through the same host operations a rollout uses."""
    ops = HostOperations(LocalTransport(host.name), host)
    by_module: dict[str, list[LoadedPatch]] = {}
    for patch in patches:
        by_module.setdefault(patch.spec.target.module, []).append(patch)
    states: list[PatchState] = []
    notes: list[str] = []
    for module, group in by_module.items():
        try:
            seen = ops.inspect(module, timeout=StepTimeouts().inspect)
        except OpspatchError as exc:
            notes.append(f"{module}: {exc.detail if isinstance(exc, HostError) else exc.message}")
            continue
        if seen.module is None:
            continue
        version = seen.module.distribution_version or seen.facts.sglang_version
        for patch in group:
            if patch.spec.target.mismatch(seen.module.origin, version):
                continue
            found = detect(seen.file.content, patch.spec)
            states.append(PatchState(patch.spec.id, found.state, seen.file.path, found.reason))
    return sorted(states, key=lambda s: s.patch), notes


def sandbox_status(layout: SandboxLayout, workspace: Workspace) -> StatusReport:
    """Each host's engine pid, port, /health answer, patches its file carries, and its sshd.

    Patches are the workspace's and the bundled ones (`Workspace.available("patches")`).

    Raises:
        InputError: there is no sandbox, or its manifest is unreadable.
    """
    manifest = load_manifest(layout)
    if manifest is None:
        raise InputError(
            f"no sandbox in {layout.root}", hint="create one with `opspatch sandbox up`"
        )
    inventory = sandbox_inventory(layout, manifest, over_ssh=False)
    patches, notes = _workspace_patches(workspace)
    statuses = []
    for record in manifest.hosts:
        pid = engine_pid(layout, record.name)
        health, detail = (
            health_of(engine_url(record.port)) if pid is not None else (None, "not running")
        )
        host_notes: list[str] = []
        states: list[PatchState] = []
        if layout.python(record.name).exists():
            states, host_notes = _patch_states(inventory.host(record.name), patches)
        else:
            host_notes.append("no environment yet (run `opspatch sandbox up`)")
        statuses.append(
            HostStatus(
                host=record.name,
                port=record.port,
                url=engine_url(record.port),
                pid=pid,
                health=health,
                health_detail=detail,
                patches=tuple(states),
                ssh=record.ssh,
                ssh_running=None if record.ssh is None else sshd_pid(layout, record) is not None,
                log_file=str(layout.log_file(record.name)),
                notes=tuple(host_notes),
            )
        )
    written = tuple(p for p in (layout.inventory, layout.ssh_inventory) if p.exists())
    return StatusReport(layout.root, tuple(statuses), written, tuple(notes))


# ---------------------------------------------------------------------------------------------
# down


@dataclass(frozen=True)
class HostDown:
    """What `down` did to one host: the engine pids it stopped and whether it stopped an sshd."""

    host: str
    stopped: tuple[int, ...]
    sshd_stopped: int | None

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "stopped": list(self.stopped), "sshd_stopped": self.sshd_stopped}


@dataclass(frozen=True)
class DownReport:
    root: Path
    hosts: tuple[HostDown, ...]
    removed: tuple[Path, ...]
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "sandbox": str(self.root),
            "hosts": [h.to_json() for h in self.hosts],
            "removed": [str(p) for p in self.removed],
            "notes": list(self.notes),
        }


def _host_names_on_disk(layout: SandboxLayout) -> list[str]:
    if not layout.hosts_dir.is_dir():
        return []
    return sorted(p.name for p in layout.hosts_dir.iterdir() if p.is_dir())


def sandbox_down(
    layout: SandboxLayout, *, purge: bool = False, progress: Progress = _quiet
) -> DownReport:
    """Stop every sandbox engine (its process tree, by the pid in its pid file) and sshd (by the
    pid recorded for it); remove nothing unless `purge`, which also removes the host folders,
    the ssh folder, the manifest and the sandbox inventories.

    Hosts are taken from the manifest and from the host folders on disk, so an unreadable
    manifest still lets `down --purge` stop every engine and clean up.

    Raises:
        InputError: another sandbox command is running.
    """
    if not layout.root.exists():
        cleaned = _purge_inventories(layout) if purge else ()
        return DownReport(layout.root, (), cleaned, ("there is no sandbox here",))
    notes: list[str] = []
    with _sandbox_lock(layout):
        try:
            manifest = load_manifest(layout) or Manifest()
        except InputError as exc:
            if not purge:
                raise
            notes.append(f"manifest ignored: {exc.message}")
            manifest = Manifest()
        records = {record.name: record for record in manifest.hosts}
        names = list(records) + [n for n in _host_names_on_disk(layout) if n not in records]
        results = []
        for name in names:
            stopped: tuple[int, ...] = ()
            pid = engine_pid(layout, name)
            if pid is not None:
                progress(f"{name}: stopping the engine (pid {pid})")
                # The host agent's own stop logic, the one `restart` uses: TERM the tree, wait,
                # KILL what is left.
                stopped = tuple(stop_process_tree(pid, ENGINE_STOP_TIMEOUT))
            sshd_stopped = _stop_host_sshd(layout, records.get(name), progress)
            results.append(HostDown(name, stopped, sshd_stopped))
        removed: tuple[Path, ...] = ()
        if purge:
            removed = _purge(layout)
    if purge:
        with contextlib.suppress(OSError):
            layout.lock_file.unlink()
            layout.root.rmdir()
    return DownReport(layout.root, tuple(results), removed, tuple(notes))


def _stop_host_sshd(
    layout: SandboxLayout, record: HostRecord | None, progress: Progress
) -> int | None:
    if record is None or record.ssh is None:
        return None
    pid = sshd_pid(layout, record)
    if pid is None:
        return None
    progress(f"{record.name}: stopping sshd (pid {pid})")
    ssh = record.ssh
    stop_sshd(
        SshdServer(
            address=ssh.address,
            port=ssh.port or 0,
            pid=pid,
            workdir=layout.sshd_dir(record.name),
            host_public_key=ssh.host_public_key or "",
            log_file=layout.sshd_dir(record.name) / "sshd.log",
        )
    )
    return pid


def _purge_inventories(layout: SandboxLayout) -> tuple[Path, ...]:
    removed = []
    for path in (layout.inventory, layout.ssh_inventory):
        if path.exists():
            path.unlink()
            removed.append(path)
    return tuple(removed)


def _purge(layout: SandboxLayout) -> tuple[Path, ...]:
    removed = []
    for directory in (layout.hosts_dir, layout.ssh_dir):
        if directory.exists():
            shutil.rmtree(directory)
            removed.append(directory)
    if layout.manifest.exists():
        layout.manifest.unlink()
        removed.append(layout.manifest)
    return tuple(removed) + _purge_inventories(layout)
