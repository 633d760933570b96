"""Where a sandbox's things are, what its hosts are called, and how their engines are started."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from opspatch.config import paths
from opspatch.core.policy import Playbook, StepTimeouts
from opspatch.errors import InputError
from opspatch.hosts.transport.base import Command
from opspatch.sandbox import MAX_HOSTS
from opspatch.sandbox.checkout import checkout_dir
from opspatch.sandbox.install import host_venv_dir

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
REAL_ENGINE_STOP_TIMEOUT = 30.0
"""Real SGLang drains before it exits (a few seconds here); then its process group is killed."""
HEALTH_TIMEOUT = 5.0

# CUDA is hidden explicitly so the incident reproduces on any machine: CUDA graph capture must
# fail for real, even where a GPU exists. Unbuffered output keeps the log current, so the log tail
# shown for a host that does not come up is complete.
ENGINE_ENV: dict[str, str] = {"CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1"}

STANDIN_LOAD_ENV = "SGLANG_STANDIN_LOAD_S"
"""The hook that makes each engine start take that many more seconds (`up --restart-seconds`):
the stand-in reads it in its weight load (`tp_worker.py`), a real engine in opspatch's platform
plugin, in its main process (`real/engine_files/opspatch_sandbox_cpu`)."""

MAX_RESTART_SECONDS = 3600.0


def sandbox_playbook(restart_seconds: float = 0.0, real: bool = False) -> Playbook:
    """The stand-in is ready within seconds, the default playbook's 20 minutes suit real models
    only; real SGLang on this CPU is ready in one to three minutes (more while several start
    side by side); a sandbox whose starts take `restart_seconds` more waits that much longer."""
    if real:
        timeouts = StepTimeouts(restart=120.0, ready=900.0 + restart_seconds, smoke=300.0)
    else:
        timeouts = StepTimeouts(restart=60.0, ready=120.0 + restart_seconds, smoke=60.0)
    return Playbook(name="sandbox", timeouts=timeouts)


SANDBOX_PLAYBOOK = sandbox_playbook()


def check_restart_seconds(seconds: float) -> None:
    """Refuse a start delay that is negative, not a number, or over an hour.

    Raises:
        InputError: naming the value and the range.
    """
    if not 0.0 <= seconds <= MAX_RESTART_SECONDS:
        raise InputError(
            f"--restart-seconds must be between 0 and {MAX_RESTART_SECONDS:g} (got {seconds:g})",
            hint="it is how much longer each engine's start takes (weights and graph capture)",
        )


Progress = Callable[[str], None]


def quiet(_: str) -> None:
    """A progress callback that says nothing."""


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
        return host_venv_dir(self.host_dir(name)) / "bin" / "python"

    def checkout(self, name: str) -> Path:
        """Where an editable host keeps its git checkout of the engine (`<host>/sglang`)."""
        return checkout_dir(self.host_dir(name))

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


STANDIN_ARGS = ("--speculative-algorithm", SPECULATIVE_ALGORITHM)
"""The stand-in's engine arguments (a real engine's: `opspatch.sandbox.real.launch`)."""


def start_command(
    python: Path,
    port: int,
    node_args: tuple[str, ...] = (),
    engine_args: tuple[str, ...] = STANDIN_ARGS,
) -> str:
    """The engine's start command line, quoted by `Command.render` (the one place that quotes);
    `engine_args`: the engine's own (model, flags, `--tp-size`); `node_args`: a unit node's
    multi-node arguments (`UnitRecord.node_args`)."""
    argv = (
        str(python),
        "-m",
        "sglang.launch_server",
        "--host",
        ENGINE_ADDRESS,
        "--port",
        str(port),
        *engine_args,
        *node_args,
    )
    return Command(argv).render()


def check_host_count(count: int) -> None:
    """Refuse a host count outside 1..MAX_HOSTS.

    Raises:
        InputError: the count is below 1 or above MAX_HOSTS.
    """
    if not 1 <= count <= MAX_HOSTS:
        raise InputError(
            f"--count must be between 1 and {MAX_HOSTS} (got {count})",
            hint="each sandbox host runs its own engine process on this machine",
        )
