"""Stand-in engines as real processes, for the engine tier: their process trees (from /proc, by
parent pid, never by name), the live plugin's sockets in a running server, a stand-in host with
the plugin installed, and local hosts for the agent under another Python."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from opspatch.config.inventory import load_inventory, parse_inventory
from opspatch.core.host import EngineSettings, Host
from opspatch.core.policy import Playbook
from opspatch.hosts import livedist
from opspatch.hosts.agent.processes import stop_process_tree
from opspatch.hosts.engine import EngineControl
from opspatch.hosts.liveplugin import socket_paths, wire
from opspatch.hosts.operations import HostOperations, open_transport
from opspatch.hosts.transport.base import Command
from opspatch.hosts.transport.local import LocalTransport
from opspatch.sandbox.layout import ENGINE_ENV
from tests.clirunner import Run, opspatch
from tests.fleetkit import alive
from tests.standin import EngineProcess, StandinHost, free_port, http_request, make_host


def children_of(pid: int) -> list[int]:
    """Direct children of `pid`, from /proc (by parent pid, never by name)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                raw = Path(f"/proc/{entry}/stat").read_text(errors="replace")
                if int(raw[raw.rfind(")") + 2 :].split()[1]) == pid:
                    found.append(int(entry))
    return found


def tree_of(pid: int) -> list[int]:
    tree, queue = [], [pid]
    while queue:
        current = queue.pop()
        tree.append(current)
        queue.extend(children_of(current))
    return tree


def comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def sockets_of(live_dir: Path, engine: EngineProcess) -> dict[str, Path]:
    folder = live_dir / str(engine.pid)
    return {path.name: path for path in sorted(folder.glob("*.sock"))}


def wait_for_sockets(live_dir: Path, engine: EngineProcess, names: set[str]) -> dict[str, Path]:
    """The server's sockets once all of `names` listen (a scheduler's opens as its Scheduler is
    built, the detokenizer's as its manager is)."""
    deadline = time.monotonic() + 120
    while True:
        found = sockets_of(live_dir, engine)
        if names <= set(found):
            return found
        assert engine.popen.poll() is None, f"the engine exited:\n{engine.log_text()}"
        assert time.monotonic() < deadline, f"only {sorted(found)}:\n{engine.log_text()}"
        time.sleep(0.05)


def wait_for_frozen_collectors(sockets: dict[str, Path]) -> dict[str, int]:
    """Each process's `gc.get_freeze_count()` once every one froze its collector, as SGLang's
    processes do after the warm-up (the schedulers and the detokenizer a moment after the
    main process, passed on by `/freeze_gc`)."""
    deadline = time.monotonic() + 60
    while True:
        frozen = {
            name: wire.ask(str(path), {"op": "ping"})["gc_frozen"] for name, path in sockets.items()
        }
        if all(frozen.values()) or time.monotonic() > deadline:
            return frozen
        time.sleep(0.1)


ALL_SOCKETS = {"main.sock", "scheduler-tp0.sock", "scheduler-tp1.sock", "detokenizer.sock"}


TP2 = ("--tp-size", "2")


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> StandinHost:
    made = make_host(tmp_path_factory.mktemp("live-apply"))
    for relative, data in livedist.live_distribution("0.1.0", livedist.plugin_sources()).items():
        target = made.site_packages / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return made


@pytest.fixture
def live_dir() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="ol", dir="/tmp"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def inventory_host(host: StandinHost, engine: EngineProcess, live_dir: Path) -> Host:
    return Host(
        **{
            **vars(
                Host.local(
                    "gpu-01",
                    str(host.host_dir / "state"),
                    EngineSettings(
                        python=str(host.python),
                        url=engine.url,
                        log_file=str(engine.log_path),
                        env={socket_paths.LIVE_DIR_ENV: str(live_dir)},
                    ),
                )
            ),
            "live": True,
        }
    )


HOST = "live:gpu-01"

DECODE = {"text": "Hello", "sampling_params": {"max_new_tokens": 8, "temperature": 0}}

PLAYBOOK = Playbook(canary=0)


@dataclass
class LiveHost:
    """The stand-in host, its inventory entry in a workspace, and the controller's state."""

    standin: StandinHost
    root: Path
    live_dir: Path
    port: int
    args: tuple[str, ...] = ()
    """More arguments of the engine's start (`--disable-cuda-graph`: a healthy server)."""

    @property
    def workspace(self) -> Path:
        return self.root / "workspace"

    @property
    def pid_file(self) -> Path:
        return self.standin.host_dir / "server.pid"

    def opspatch(self, *args: str) -> Run:
        return opspatch(
            *args, cwd=self.workspace, env={"OPSPATCH_STATE_DIR": str(self.root / "state")}
        )

    def engine(self) -> EngineControl:
        host = load_inventory(self.workspace / "inventories" / "live.toml").host("gpu-01")
        return EngineControl(HostOperations(open_transport(host), host), host, PLAYBOOK)

    def restart(self) -> None:
        """The engine restarted by the inventory's restart command, as opspatch restarts it."""
        control = self.engine()
        control.wait_ready(control.restart(step="start"), timeout=300)

    def pid(self) -> int:
        pid = int(self.pid_file.read_text().strip())
        assert alive(pid), pid
        return pid

    def pids(self) -> set[int]:
        return set(tree_of(self.pid()))

    def log(self) -> str:
        return (self.standin.host_dir / "server.log").read_text(errors="replace")

    def decode(self) -> int:
        return http_request("POST", f"http://127.0.0.1:{self.port}/generate", DECODE).status

    def inventory(self) -> str:
        python = self.standin.python
        start = Command(
            (
                str(python),
                "-m",
                "sglang.launch_server",
                "--port",
                str(self.port),
                "--tp-size",
                "2",
                *self.args,
            )
        ).render()
        env = {**ENGINE_ENV, "HOME": str(self.standin.host_dir)}
        env[socket_paths.LIVE_DIR_ENV] = str(self.live_dir)
        return "\n".join(
            [
                "[hosts.gpu-01]",
                'transport = "local"',
                "live = true",
                f"state_dir = {json.dumps(str(self.standin.host_dir / 'state'))}",
                "[hosts.gpu-01.engine]",
                f"python = {json.dumps(str(python))}",
                f'url = "http://127.0.0.1:{self.port}"',
                f"log_file = {json.dumps(str(self.standin.host_dir / 'server.log'))}",
                "env = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items()) + " }",
                f'restart = {{ kind = "command", start = {json.dumps(start)}, '
                f"pid_file = {json.dumps(str(self.pid_file))}, "
                f"workdir = {json.dumps(str(self.standin.host_dir))}, stop_timeout = 10 }}",
                "",
            ]
        )


@contextlib.contextmanager
def running_live_host(
    root: Path, *, plugin: bool = True, args: tuple[str, ...] = ()
) -> Iterator[LiveHost]:
    """The stand-in host in a workspace's inventory, its engine started the inventory's way
    (with `args`; `plugin`: opspatch's plugin installed first), stopped at the end."""
    standin = make_host(root / "host")
    if plugin:
        for relative, data in livedist.live_distribution(
            "0.1.0", livedist.plugin_sources()
        ).items():
            target = standin.site_packages / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    live_dir = Path(tempfile.mkdtemp(prefix="ol", dir="/tmp"))  # a socket path has 107 bytes
    made = LiveHost(standin, root, live_dir, free_port(), args)
    (made.workspace / "inventories").mkdir(parents=True)
    (made.workspace / "patches").mkdir()
    (made.workspace / "inventories" / "live.toml").write_text(made.inventory())
    try:
        made.restart()
        yield made
    finally:
        made.engine().stop()
        shutil.rmtree(live_dir, ignore_errors=True)


def command_host(python: Path, work: Path, *, extra: str = "", algorithm: str = "EAGLE3") -> Host:
    port = free_port()
    start = f"{python} -m sglang.launch_server --port {port} --speculative-algorithm {algorithm} {extra}"
    text = textwrap.dedent(
        f"""
        [defaults]
        transport = "local"
        state_dir = "{work}/state"
        [defaults.engine]
        python = "{python}"
        url = "http://127.0.0.1:{port}"
        log_file = "{work}/server.log"
        speculative = {"true" if algorithm != "NONE" else "false"}
        env = {{ CUDA_VISIBLE_DEVICES = "" }}
        restart = {{ kind = "command", start = "{start}", pid_file = "{work}/server.pid", workdir = "{work}", stop_timeout = 5 }}
        [hosts.h1]
        address = "127.0.0.1"
        """
    )
    return parse_inventory(text, str(work / "inv.toml"), name="test").hosts[0]


def control(host: Host, **playbook: object) -> EngineControl:
    return EngineControl(
        HostOperations(LocalTransport(host.name), host), host, Playbook(**playbook)
    )  # type: ignore[arg-type]


def _stop(host: Host) -> None:
    """End the engine's whole process tree (the pid file names the shell that started it)."""
    restart = host.engine.restart
    pid_file = Path(getattr(restart, "pid_file", ""))
    if pid_file.exists():
        pid = int(pid_file.read_text())
        if alive(pid):
            stop_process_tree(pid, timeout=5)


PYTHON_38_CANDIDATES = (
    "/root/.pyenv/versions/3.8.18/bin/python3.8",
    os.path.expanduser("~/.pyenv/versions/3.8.18/bin/python3.8"),
    shutil.which("python3.8"),
)


def python_38() -> str | None:
    """A real Python 3.8 (a pyenv shim is not one: it needs its own configuration)."""
    found = (p for p in PYTHON_38_CANDIDATES if p and "/shims/" not in p)
    return next((p for p in found if os.access(p, os.X_OK)), None)


def host_on(python: str, state_dir: Path) -> Host:
    return Host.local("py38", str(state_dir), EngineSettings(python=python), inventory="test")
