"""A sandbox fleet for end-to-end tests, driven as an operator drives it: `opspatch sandbox up`.

Each `SandboxFleet` has its own state directory (ledger, sandbox hosts, inventories) and its own
workspace folder, so tests never share hosts; `close()` runs `opspatch sandbox down --purge`.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opspatch.config.inventory import load_inventory
from opspatch.core.host import Host
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
        run = self.opspatch(*args, *self.extra, timeout=240 if self.engine == "standin" else 1500)
        assert run.code == 0, run.stdout + run.stderr
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
