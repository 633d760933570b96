"""A host for the `become` tests, built by hand on this machine, as an unprivileged fleet is.

- an unprivileged **login user** (with a password, for the sudo rules that ask for one) who
  reaches the host over a real OpenSSH sshd on 127.0.0.7 with a generated key;
- a **service user** who owns the engine's virtual environment and runs the engine;
- the stand-in SGLang engine installed in that virtual environment (a wheel-shaped install, the
  target file with mode 0664), started by the service user through opspatch itself;
- **sudoers rules** in `/etc/sudoers.d/`, each checked with `visudo -cf` before it is installed,
  switched by the tests (`BecomeHost.sudoers(...)`).

The engine needs torch, which lives in the controller's environment; when that is not readable
by other users (pyenv under a 0700 /root), its site-packages folder is shared through hard links
(no copy, no change to the original files) and the virtual environment is made with a system
interpreter of the same Python version.

Everything created (users, their homes, the sudoers file, the sshd, the engine, the folder) is
removed by `teardown`, which the fixture runs whatever happened.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from opspatch.config.inventory import load_inventory
from opspatch.core.host import Host
from opspatch.hosts.engine import EngineControl
from opspatch.hosts.operations import HostOperations, open_transport
from opspatch.sandbox.install import controller_torch_dir, install_standin, venv_site_packages
from opspatch.sandbox.layout import ENGINE_ENV, SANDBOX_PLAYBOOK, start_command
from opspatch.sandbox.sshd import (
    KeyPair,
    SshdServer,
    find_sshd,
    free_port,
    generate_keypair,
    start_sshd,
    stop_sshd,
    write_known_hosts,
)
from tests.clirunner import Run, opspatch
from tests.fleetkit import EAGLE_RELPATH, alive

SUDOERS_DIR = Path("/etc/sudoers.d")
SSH_ADDRESS = "127.0.0.7"
PASSWORD_ENV = "OPSPATCH_TEST_BECOME_PASSWORD"
FILE_MODE = 0o664
TOOLS = ("sudo", "visudo", "useradd", "userdel", "chpasswd")


def become_unavailable() -> str | None:
    """Why these tests cannot run here (they create users and sudoers rules), or None."""
    if sys.platform != "linux":
        return "the become tests need Linux"
    if os.geteuid() != 0:
        return "the become tests create users and sudoers rules: they run as root (CI does)"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"not installed: {', '.join(missing)} (apt-get install sudo passwd)"
    if find_sshd() is None:
        return "OpenSSH sshd is not installed (apt-get install openssh-server)"
    if shared_interpreter() is None:
        return "no Python interpreter of the controller's version that other users can run"
    return None


def _readable_by_all(path: Path) -> bool:
    """Whether any user can read `path` (it is world-readable and every folder above it is
    world-searchable)."""
    path = path.resolve()
    if not path.stat().st_mode & stat.S_IROTH:
        return False
    return all(folder.stat().st_mode & stat.S_IXOTH for folder in path.parents)


def shared_interpreter() -> Path | None:
    """An interpreter of the controller's Python version that other users can run: the
    controller's own when it is reachable, else a system one (torch's compiled modules need the
    same version)."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (
        Path(sys.executable),
        Path("/usr/bin") / version,
        Path("/usr/local/bin") / version,
    ):
        if (
            candidate.exists()
            and _readable_by_all(candidate)
            and _readable_by_all(candidate.resolve())
        ):
            return candidate
    return None


def run(*argv: str, input: str | None = None) -> None:
    done = subprocess.run(
        argv, input=input, capture_output=True, text=True, check=False, timeout=60
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")


def chown_tree(top: Path, user: str) -> None:
    """Give `top` and everything below it to `user` (links themselves, never what they point to)."""
    uid, gid = _ids(user)
    os.lchown(top, uid, gid)
    for folder, names, files in os.walk(top):
        for name in names + files:
            os.lchown(os.path.join(folder, name), uid, gid)


def _ids(user: str) -> tuple[int, int]:
    import pwd

    entry = pwd.getpwnam(user)
    return entry.pw_uid, entry.pw_gid


@dataclass
class BecomeHost:
    """The host of the become tests and the controller's side of it (workspace, state, key)."""

    root: Path
    login: str
    service: str
    password: str = field(repr=False)
    created_users: list[str] = field(default_factory=list)
    sudoers_file: Path | None = None
    sshd: SshdServer | None = None
    key: KeyPair | None = None
    port: int = 0

    # -- where things are ------------------------------------------------------------------------

    @property
    def host_dir(self) -> Path:
        """The engine's folder: virtual environment, log, pid file, the host-side state."""
        return self.root / "engine"

    @property
    def python(self) -> Path:
        return self.host_dir / "venv" / "bin" / "python"

    @property
    def file(self) -> Path:
        return venv_site_packages(self.host_dir / "venv") / EAGLE_RELPATH

    @property
    def log_file(self) -> Path:
        return self.host_dir / "server.log"

    @property
    def pid_file(self) -> Path:
        return self.host_dir / "server.pid"

    @property
    def controller(self) -> Path:
        return self.root / "controller"

    @property
    def workspace(self) -> Path:
        return self.controller / "workspace"

    @property
    def state(self) -> Path:
        return self.controller / "state"

    @property
    def ledger(self) -> Path:
        return self.state / "ledger.sqlite3"

    @property
    def login_state(self) -> Path:
        """The host-side state folder of the host without become (the login user's own)."""
        return self.root / "login-state"

    # -- looking at the host ---------------------------------------------------------------------

    def sha(self) -> str:
        return hashlib.sha256(self.file.read_bytes()).hexdigest()

    def owner_and_mode(self) -> tuple[str, str, int]:
        import grp
        import pwd

        info = self.file.stat()
        return (
            pwd.getpwuid(info.st_uid).pw_name,
            grp.getgrgid(info.st_gid).gr_name,
            stat.S_IMODE(info.st_mode),
        )

    def engine_pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if alive(pid) else None

    def process_user(self, pid: int) -> int:
        """The effective uid of a running process."""
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[2])
        raise AssertionError(f"no Uid line for pid {pid}")

    # -- sudoers ---------------------------------------------------------------------------------

    def sudoers(self, text: str) -> None:
        """Install `text` as this test's sudoers rules (checked with `visudo -cf` first)."""
        assert self.sudoers_file is not None
        with tempfile.NamedTemporaryFile("w", suffix=".sudoers", delete=False) as draft:
            draft.write(text)
        try:
            run("visudo", "-cf", draft.name)
            os.chmod(draft.name, 0o440)
            shutil.move(draft.name, self.sudoers_file)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(draft.name)

    def rules_nopasswd_all(self) -> str:
        return f"{self.login} ALL=(ALL) NOPASSWD: ALL\n"

    def rules_limited(self) -> str:
        """NOPASSWD for the agent's interpreter as the service user and for systemctl and
        supervisorctl as root, nothing else."""
        return (
            f"{self.login} ALL=({self.service}) NOPASSWD: {self.python}\n"
            f"{self.login} ALL=(root) NOPASSWD: /usr/bin/systemctl, /usr/bin/supervisorctl\n"
        )

    def rules_password(self) -> str:
        return f"{self.login} ALL=(ALL) ALL\n"

    def rules_requiretty(self) -> str:
        return f"Defaults:{self.login} requiretty\n{self.login} ALL=(ALL) NOPASSWD: ALL\n"

    # -- the controller --------------------------------------------------------------------------

    def opspatch(self, *args: str, env: dict[str, str] | None = None, timeout: float = 300) -> Run:
        """The real console script as the operator (root here: the controller) runs it."""
        return opspatch(*args, cwd=self.workspace, env=self.env(env), timeout=timeout)

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        environment = {"OPSPATCH_STATE_DIR": str(self.state)}
        environment.update(extra or {})
        return environment

    def inventory_host(self, name: str) -> Host:
        return load_inventory(self.workspace / "inventories" / "become.toml").host(name)

    def inventory_text(self) -> str:
        assert self.key is not None and self.sshd is not None
        restart = (
            f'{{ kind = "command", start = {json.dumps(start_command(self.python, self.port))}, '
            f"pid_file = {json.dumps(str(self.pid_file))}, "
            f"workdir = {json.dumps(str(self.host_dir))}, stop_timeout = 10 }}"
        )
        env = ", ".join(f"{k} = {json.dumps(v)}" for k, v in ENGINE_ENV.items())
        address = f'address = "{SSH_ADDRESS}"'
        return "\n".join(
            [
                "[defaults]",
                'transport = "ssh"',
                f"user = {json.dumps(self.login)}",
                f"port = {self.sshd.port}",
                f"identity_file = {json.dumps(str(self.key.private_key))}",
                f"known_hosts = {json.dumps(str(self.controller / 'known_hosts'))}",
                f'become_password_env = "{PASSWORD_ENV}"',
                "[defaults.engine]",
                f"python = {json.dumps(str(self.python))}",
                f'url = "http://127.0.0.1:{self.port}"',
                f"log_file = {json.dumps(str(self.log_file))}",
                "speculative = true",
                f"env = {{ {env} }}",
                f"restart = {restart}",
                "",
                "[hosts.svc-host]  # become the service user, who owns the engine",
                address,
                "become = true",
                f"become_user = {json.dumps(self.service)}",
                f"state_dir = {json.dumps(str(self.host_dir / 'state'))}",
                "",
                "[hosts.plain-host]  # the same engine without become",
                address,
                f"state_dir = {json.dumps(str(self.login_state))}",
                "",
                "[hosts.systemd-host]  # the same, as if restarted by systemd: restarts as root",
                address,
                "become = true",
                f"become_user = {json.dumps(self.service)}",
                f"state_dir = {json.dumps(str(self.host_dir / 'state'))}",
                'engine = { restart = { kind = "systemd", unit = "sglang.service" } }',
                "",
                "[hosts.root-host]  # the same engine, become root (the default become_user)",
                address,
                "become = true",
                f"state_dir = {json.dumps(str(self.root / 'root-state'))}",
                "",
            ]
        )


def build(root: Path) -> BecomeHost:
    """Create the users, the engine's environment, the sshd and the workspace; start the engine
    as the service user (through opspatch, with a NOPASSWD rule for the start)."""
    suffix = secrets.token_hex(3)
    host = BecomeHost(
        root=root,
        login=f"opsb-login-{suffix}",
        service=f"opsb-svc-{suffix}",
        password=f"Pw-{secrets.token_hex(10)}",
    )
    root.chmod(0o755)
    host.sudoers_file = SUDOERS_DIR / f"opspatch-test-{suffix}"
    for user, shell in ((host.login, "/bin/sh"), (host.service, "/bin/sh")):
        run(
            "useradd",
            "--create-home",
            "--home-dir",
            str(root / f"home-{user}"),
            "--shell",
            shell,
            user,
        )
        host.created_users.append(user)
    # sshd (without PAM) refuses a locked account; sudo checks this password
    run("chpasswd", input=f"{host.login}:{host.password}\n")
    _engine_environment(host)
    host.login_state.mkdir()
    chown_tree(host.login_state, host.login)
    _sshd(host)
    (host.workspace / "inventories").mkdir(parents=True)
    (host.workspace / "patches").mkdir()
    playbooks = host.workspace / "playbooks"
    playbooks.mkdir()
    (playbooks / "become.toml").write_text(
        'name = "become"\ncanary = 0\nbatch = "all"\n[timeouts]\nrestart = 120\nready = 300\n'
        "smoke = 120\nrestore_ready = 300\n"
    )
    (host.workspace / "inventories" / "become.toml").write_text(host.inventory_text())
    host.sudoers(host.rules_nopasswd_all())
    _start_engine(host)
    return host


def _engine_environment(host: BecomeHost) -> None:
    """The service user's virtual environment with the stand-in engine, torch reachable."""
    python = shared_interpreter()
    assert python is not None
    host.host_dir.mkdir()
    done = subprocess.run(
        [str(python), "-m", "venv", "--without-pip", str(host.host_dir / "venv")],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if done.returncode != 0:
        raise RuntimeError(f"venv: {done.stderr}")
    site_packages = venv_site_packages(host.host_dir / "venv")
    torch_parent = controller_torch_dir()
    if not _readable_by_all(torch_parent / "torch"):
        shared = host.root / "shared-site-packages"
        run("cp", "-al", str(torch_parent), str(shared))  # hard links: no copy, same files
        torch_parent = shared
    (site_packages / "_opspatch_test_torch.pth").write_text(f"{torch_parent}\n")
    install_standin(site_packages)
    host.port = free_port("127.0.0.1")
    chown_tree(host.host_dir, host.service)
    host.file.chmod(FILE_MODE)


def _sshd(host: BecomeHost) -> None:
    host.controller.mkdir(mode=0o700)
    host.key = generate_keypair(host.controller / "id_ed25519", "opspatch-become-test")
    workdir = host.root / "sshd"  # the login user reads authorized_keys here: 0755
    host.sshd = start_sshd(workdir, address=SSH_ADDRESS, authorized_keys=[host.key.public_line])
    write_known_hosts(host.controller / "known_hosts", [host.sshd])


def _start_engine(host: BecomeHost) -> None:
    target = host.inventory_host("svc-host")
    with open_transport(target) as transport:
        engine = EngineControl(HostOperations(transport, target), target, SANDBOX_PLAYBOOK)
        restart = engine.restart(step="start")
        engine.wait_ready(restart, timeout=300)


def teardown(host: BecomeHost) -> None:
    """Remove everything `build` created, whatever state it got to (each part on its own)."""
    if host.sudoers_file is not None:
        with contextlib.suppress(FileNotFoundError):
            host.sudoers_file.unlink()
    pid = host.engine_pid()
    if pid is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(os.getpgid(pid), signal.SIGKILL)  # the engine leads its own session
        deadline = time.monotonic() + 10
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
    if host.sshd is not None:
        stop_sshd(host.sshd)
    for user in host.created_users:
        subprocess.run(["userdel", "--force", user], capture_output=True, check=False, timeout=60)
    shutil.rmtree(host.root, ignore_errors=True)
