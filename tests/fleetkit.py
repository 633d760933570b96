"""A sandbox fleet for end-to-end tests, driven as an operator drives it: `opspatch sandbox up`.

Each `SandboxFleet` has its own state directory (ledger, sandbox hosts, inventories) and its own
workspace folder, so tests never share hosts; `close()` runs `opspatch sandbox down --purge`.
`Sandbox` drives one bare sandbox the same way; the patch-set and inventory texts are those
more than one fleet test reads.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import pytest

from opspatch.config.inventory import load_inventory
from opspatch.core.host import Host
from opspatch.errors import OpspatchError
from opspatch.ledger.store import Ledger
from opspatch.sandbox.fleet import SandboxLayout
from opspatch.sandbox.sshd import find_sshd
from tests.clirunner import Run, opspatch

REPO = Path(__file__).resolve().parent.parent
EAGLE_RELPATH = "sglang/srt/speculative/eagle_worker_v2.py"


@dataclass
class SandboxFleet:
    root: Path
    size: int
    ssh: bool = False
    install: str = "wheel"  # or "editable": each host's engine is a git checkout <host>/sglang
    router: bool = False  # `up --router`: a real sglang-router in front of the engines
    nodes: int = 1  # above 1: `up --units size/nodes --nodes N --tp tp`, multi-node servers
    tp: int = 1  # with nodes 1: `up --tp tp`, each single server's TP ranks
    engine: str = "standin"  # `up --engine`; real SGLang's cache is tests/realkit.py's
    extra: tuple[str, ...] = ()  # more `up` options (`--live`, `--restart-seconds S`, ...)
    hosts: dict[str, Host] = field(default_factory=dict)

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def workspace(self) -> Path:
        return self.root / "workspace"

    @property
    def ledger_path(self) -> Path:
        return self.state / "ledger.sqlite3"

    @property
    def env(self) -> dict[str, str]:
        if self.engine == "standin":
            return {"OPSPATCH_STATE_DIR": str(self.state)}
        from tests.realkit import ENGINE_CACHE

        return {"OPSPATCH_STATE_DIR": str(self.state), "OPSPATCH_ENGINE_CACHE": str(ENGINE_CACHE)}

    @property
    def inventory(self) -> str:
        return "sandbox-ssh" if self.ssh else "sandbox"

    def up(self) -> SandboxFleet:
        (self.workspace / "patches").mkdir(parents=True, exist_ok=True)
        (self.workspace / "playbooks").mkdir(parents=True, exist_ok=True)
        args = ["sandbox", "up", "--install", self.install]
        if self.nodes > 1:
            units = str(self.size // self.nodes)
            args += ["--units", units, "--nodes", str(self.nodes), "--tp", str(self.tp)]
        else:
            args += ["--count", str(self.size)] + (["--tp", str(self.tp)] if self.tp > 1 else [])
        args += ["--ssh"] if self.ssh else []
        args += ["--router"] if self.router else []
        args += ["--engine", self.engine] if self.engine != "standin" else []
        try:
            run = self.opspatch(
                *args, *self.extra, timeout=240 if self.engine == "standin" else 1500
            )
            assert run.code == 0, run.stdout + run.stderr
        except BaseException:  # failed or interrupted: no fixture tears down what it started
            self.opspatch("sandbox", "down", timeout=120)  # its logs are kept to read
            raise
        inventory = load_inventory(self.state / "inventories" / f"{self.inventory}.toml")
        self.hosts = {h.name: h for h in inventory.hosts}
        return self

    def close(self) -> None:
        self.opspatch("sandbox", "down", "--purge", timeout=120)

    def opspatch(self, *args: str, timeout: float = 300) -> Run:
        return opspatch(*args, cwd=self.workspace, env=self.env, timeout=timeout)

    def spawn(self, *args: str) -> subprocess.Popen[str]:
        """`opspatch ARGS` in the background (for kill and concurrency tests)."""
        env = dict(os.environ, **self.env, COLUMNS="200")
        return subprocess.Popen(
            [sys.executable, "-m", "opspatch.cli", *args],
            cwd=self.workspace,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    # -- looking at a host directly ----------------------------------------------------------

    @property
    def names(self) -> list[str]:
        return sorted(self.hosts)

    def host_dir(self, name: str) -> Path:
        return self.state / "sandbox" / "hosts" / name

    def checkout(self, name: str) -> Path:
        """An editable host's git checkout (`<host>/sglang`, the package under `python/`)."""
        return self.host_dir(name) / "sglang"

    def file(self, name: str) -> Path:
        if self.install == "editable":
            return self.checkout(name) / "python" / EAGLE_RELPATH
        python = Path(self.hosts[name].engine.python or "")
        found = sorted(python.parent.parent.glob(f"lib/python*/site-packages/{EAGLE_RELPATH}"))
        assert found, f"no eagle_worker_v2.py under {python.parent.parent}"
        return found[0]

    def sha(self, name: str) -> str:
        return hashlib.sha256(self.file(name).read_bytes()).hexdigest()

    def pid(self, name: str) -> int | None:
        restart = self.hosts[name].engine.restart
        pid_file = Path(getattr(restart, "pid_file", ""))
        try:
            pid = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if alive(pid) else None

    def port(self, name: str) -> int:
        return int(self.hosts[name].engine.url.rsplit(":", 1)[1])

    def log(self, name: str) -> str:
        path = Path(self.hosts[name].engine.log_file or "")
        return path.read_text(errors="replace") if path.exists() else ""

    def generate(
        self, name: str, tokens: int = 16, text: str = "The capital of France is"
    ) -> dict[str, Any] | None:
        """A greedy /generate; None when the server dropped the connection (crashed)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port(name), timeout=60)
        body = json.dumps(
            {"text": text, "sampling_params": {"max_new_tokens": tokens, "temperature": 0}}
        )
        try:
            conn.request("POST", "/generate", body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            data = json.loads(response.read())
            return data if response.status == 200 else {"status": response.status, **data}
        except (ConnectionError, http.client.HTTPException, OSError):
            return None
        finally:
            conn.close()

    def write_patch(self, patch_id: str, text: str) -> Path:
        path = self.workspace / "patches" / f"{patch_id}.toml"
        path.write_text(text)
        return path

    def write_playbook(self, name: str, text: str) -> Path:
        path = self.workspace / "playbooks" / f"{name}.toml"
        path.write_text(text)
        return path


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def wait_until(predicate: Any, timeout: float = 30.0, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def copy_patch(fleet: SandboxFleet, patch_id: str) -> Path:
    target = fleet.workspace / "patches" / f"{patch_id}.toml"
    shutil.copy(REPO / "patches" / f"{patch_id}.toml", target)
    return target


class Shared(Protocol):
    def at_baseline(self) -> bool: ...

    def close(self) -> None: ...


SharedFleet = TypeVar("SharedFleet", bound=Shared)


class Slot(Generic[SharedFleet]):
    """One fleet shared by a module's tests, each test starting from the fleet's baseline: a
    test that failed or left the fleet elsewhere gets a new fleet for the next one, so a failure
    is reported once, where it happened."""

    def __init__(
        self, folders: pytest.TempPathFactory, name: str, make: Callable[[Path], SharedFleet]
    ) -> None:
        self.folders = folders
        self.name = name
        self.make = make
        self.current: SharedFleet | None = None

    def ready(self) -> SharedFleet:
        if self.current is not None and not self.current.at_baseline():
            self.current.close()
            self.current = None
        if self.current is None:
            self.current = self.make(self.folders.mktemp(self.name))
        return self.current

    def close(self) -> None:
        if self.current is not None:
            self.current.close()


@dataclass
class GuardedFleet:
    """A stand-in sandbox fleet with eagle-init-guard applied on every host (the healthy fleet a
    rollout test starts from), shared through a `Slot`."""

    fleet: SandboxFleet
    guarded: dict[str, str] = field(default_factory=dict)
    """Each host's file as the guard left it."""

    @classmethod
    def up(cls, root: Path, size: int) -> GuardedFleet:
        fleet = SandboxFleet(root, size).up()
        try:
            run = fleet.opspatch("apply", "eagle-init-guard", "--hosts", "sandbox", "--yes")
            assert run.code == 0, run.stdout + run.stderr
        except BaseException:
            fleet.close()
            raise
        return cls(fleet, {n: fleet.sha(n) for n in fleet.names})

    def at_baseline(self) -> bool:
        """Every host's file is the guard's and its server, running, was started on it, no run
        is unfinished and no host is locked (read; nothing is changed)."""
        try:
            if any(self.fleet.sha(n) != sha for n, sha in self.guarded.items()):
                return False
            states = self.fleet.hosts
            if any((Path(states[n].state_dir) / "lock.json").exists() for n in self.guarded):
                return False
            status = self.fleet.opspatch(
                "status", "--hosts", "sandbox", "--patch", "eagle-init-guard", "--json"
            )
            said = status.json()["status"] if status.code == 0 else []
            if {s["host"]: (s["state"], s["server_running"]) for s in said} != dict.fromkeys(
                self.guarded, ("applied", True)
            ):
                return False
            with Ledger.open(self.fleet.ledger_path) as ledger:
                return all(r.status not in ("running", "interrupted") for r in ledger.list_runs())
        except (OSError, ValueError, OpspatchError):
            return False

    def close(self) -> None:
        self.fleet.close()


class Sandbox:
    """One sandbox under its own state directory, driven through the real console script."""

    def __init__(self, state_dir: Path, cwd: Path) -> None:
        self.state_dir = state_dir
        self.cwd = cwd  # an empty folder: commands run "from any directory"
        self.layout = SandboxLayout(state_dir)
        self.seen_pids: set[int] = set()

    def run(self, *args: str) -> Run:
        result = opspatch(
            "sandbox",
            *args,
            cwd=self.cwd,
            env={"OPSPATCH_STATE_DIR": str(self.state_dir)},
            timeout=240,
        )
        if result.code == 0 and "--json" in args and result.stdout.strip():
            for host in result.json().get("hosts", []):
                if host.get("pid"):
                    self.seen_pids.add(int(host["pid"]))
        return result

    def up(self, *args: str) -> dict[str, Any]:
        result = self.run("up", "--json", *args)
        assert result.code == 0, result.stdout + result.stderr
        report: dict[str, Any] = result.json()
        return report

    def status(self) -> dict[str, Any]:
        result = self.run("status", "--json")
        assert result.code == 0, result.stdout + result.stderr
        report: dict[str, Any] = result.json()
        return report

    def inventory_host(self, name: str, inventory: str = "sandbox") -> Any:
        return load_inventory(self.state_dir / "inventories" / f"{inventory}.toml").host(name)

    def tear_down(self) -> None:
        """`down --purge`, then a safety net: kill by pid any engine process that survived."""
        try:
            self.run("down", "--purge")
        finally:
            for pid in self.seen_pids:
                for member in _tree(pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(member, signal.SIGKILL)


def _tree(root: int) -> list[int]:
    found = [root] if running(root) else []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                if int(stat[stat.rfind(")") + 2 :].split()[1]) == root:
                    found.extend(_tree(int(entry.name)))
    return found


def running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].split()[0] not in ("Z", "X")


def wait_for(condition: Callable[[], bool], timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


@contextlib.contextmanager
def new_sandbox(tmp_path: Path) -> Iterator[Sandbox]:
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    sandbox = Sandbox(tmp_path / "state", cwd)
    try:
        yield sandbox
    finally:
        sandbox.tear_down()


def require_sshd() -> None:
    if find_sshd() is None:
        pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)")


def hosts_by_name(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {host["host"]: host for host in report["hosts"]}


SET_ID = "two-modules"

EAGLE = "sglang.srt.speculative.eagle_worker_v2"

SCHEDULER = "sglang.srt.managers.scheduler"

HEADER = f'''
id = "{SET_ID}"
summary = "one fix in two modules"
rationale = "tests of patch sets"
'''

TARGET_A = f'''
[[targets]]
module = "{EAGLE}"
versions = ">=0.5.4"
[[targets.edits]]
kind = "insert"
scope = "<module>"
position = "end"
code = "_OPSPATCH_SET_A = 1"
'''

TARGET_B = f'''
[[targets]]
module = "{SCHEDULER}"
[[targets.edits]]
kind = "insert"
scope = "<module>"
position = "end"
code = "_OPSPATCH_SET_B = 2"
'''


INVENTORY = """\
[defaults]
transport = "local"
[defaults.engine]
python = "/usr/bin/python3"
url = "http://127.0.0.1:30000"
restart = { kind = "command", start = "/bin/true", pid_file = "/tmp/x.pid" }
[hosts.gpu-01]
[hosts.gpu-02]
[groups.canary]
hosts = ["gpu-01"]
"""


FLEET = """
[defaults]
transport = "local"
[hosts.a0]
[hosts.a1]
[hosts.b0]
[hosts.b1]
[hosts.solo]
[groups.east]
hosts = ["a1", "b0"]
[units.kimi-a]
hosts = ["a0", "a1"]
[units.kimi-b]
hosts = ["b0", "b1"]
head = "b1"
"""
