"""Live fixes on real SGLang 0.5.23 (TP=2, EAGLE-3, the incident's build), with opspatch's own
commands, in the order an operator lives them on one server shared by the module:

- `live enable` (before the engine's first start: a fleet made ready for live fixes) writes the
  plugin into the engine's own environment; the real engine loads it through its entry point
  of group `sglang.srt.plugins` in the main process, the detokenizer and both schedulers;
- `apply eagle-init-guard --live` on the incident server: no pid changes, and the first decode
  of the server's life (the smoke) passes where it would crash, through EAGLE-3; the take went
  through the real receive path, the real `handle_rpc_request` on TP0 and TP1, and its barrier;
- a method-body fix of the real `Scheduler` shows in both ranks' logs, no restart; `rollback`
  takes it out of both ranks, no restart; `status` says each state as it is;
- `live disable` then `live enable` stage the plugin again and `opspatch restart` finishes it:
  every process of the new server answers, and the folder the old server left (real SGLang
  stopped by a signal kills its own main process) is removed.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from opspatch.config.inventory.load import load_inventory
from opspatch.core.policy import Playbook, StepTimeouts
from opspatch.hosts.agent.processes import stop_process_tree
from opspatch.hosts.engine import EngineControl
from opspatch.hosts.liveplugin import socket_paths, wire
from opspatch.hosts.operations import HostOperations, open_transport
from opspatch.hosts.transport.base import Command
from opspatch.sandbox.incident import INCIDENT_ENV, INCIDENT_SERVER_FLAGS, base_patch_path
from opspatch.sandbox.processes import free_port, is_running, proc_text
from opspatch.sandbox.real.launch import cpu_env, server_args
from tests.clirunner import Run, opspatch
from tests.realkit import real_engine
from tests.test_live_delivery import wait_for_frozen_collectors

# a real TP=2 start takes minutes on this loaded 2-core machine (the fixture's, and the restart's)
pytestmark = [pytest.mark.sglang, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parent.parent
HOST = "real-01"
ERROR = "AttributeError: 'EAGLEWorkerV2' object has no attribute 'spec_disable_batch_threshold'"
SOCKETS = {"main.sock", "detokenizer.sock", "scheduler-tp0.sock", "scheduler-tp1.sock"}
START_PLAYBOOK = Playbook(name="real", timeouts=StepTimeouts(restart=180.0, ready=1200.0))
MARK = "opspatch-test: scheduler received"
BODY_FIX = f'''
id = "scheduler-request-log-test"
summary = "Log every generate request the scheduler receives"
preserves_output = true
rationale = "a body-only change of a method every TP rank runs for every request"

[target]
module = "sglang.srt.managers.scheduler"
distribution = "sglang"
versions = "==0.5.23"
min_python = "3.10"

[[edits]]
kind = "insert"
scope = "Scheduler.handle_generate_request"
position = "start"
code = """
logger.info(f"{MARK} {{recv_req.rid}}")
"""
'''


@dataclass(frozen=True)
class RealLiveHost:
    workspace: Path
    env: dict[str, str]
    host_dir: Path
    live_dir: Path
    port: int
    enabled: Run
    """`live enable`'s run, made before the engine first started."""

    def cli(self, *args: str, timeout: float = 1500) -> Run:
        return opspatch(*args, cwd=self.workspace, env=self.env, timeout=timeout)

    @property
    def log(self) -> str:
        return (self.host_dir / "server.log").read_text(errors="replace")

    @property
    def site_packages(self) -> Path:
        return next((self.host_dir / "venv" / "lib").glob("python*/site-packages"))

    def pids(self) -> set[int]:
        """The engine's running processes: its pid file's and every one below it."""
        root = int((self.host_dir / "server.pid").read_text().strip())
        found, frontier = {root}, [root]
        while frontier:
            parent = frontier.pop()
            for entry in Path("/proc").iterdir():
                stat = proc_text(int(entry.name), "stat") if entry.name.isdigit() else None
                if stat and stat.rpartition(")")[2].split()[1] == str(parent):
                    found.add(int(entry.name))
                    frontier.append(int(entry.name))
        return {pid for pid in found if is_running(pid)}

    def server_folder(self) -> Path:
        """The socket folder of the running server (named by its main process's pid)."""
        (folder,) = [
            self.live_dir / str(pid) for pid in self.pids() if (self.live_dir / str(pid)).is_dir()
        ]
        return folder

    def generate(self, text: str, count: int = 16, rid: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "text": text,
            "sampling_params": {"max_new_tokens": count, "temperature": 0},
        }
        if rid is not None:
            body["rid"] = rid
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/generate",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=300) as reply:  # noqa: S310 - loopback
            data: dict[str, Any] = json.loads(reply.read())
        return data

    def status_rows(self) -> dict[str, dict[str, Any]]:
        status = self.cli("status", "--hosts", "real", "--json")
        assert status.code == 0, status.stdout + status.stderr
        return {row["patch"]: row for row in status.json()["status"]}


def _inventory(host_dir: Path, python: Path, port: int, live_dir: Path) -> str:
    """One real TP=2 incident host with `live = true`, as the sandbox writes its hosts."""
    argv = [str(python), "-m", "sglang.launch_server", "--host", "127.0.0.1", "--port", str(port)]
    engine = real_engine()
    argv += [*server_args(engine.models.target, engine.models.draft, tp=2), *INCIDENT_SERVER_FLAGS]
    env = {"CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1", **cpu_env(2), **INCIDENT_ENV}
    env[socket_paths.LIVE_DIR_ENV] = str(live_dir)
    values = ", ".join(f"{name} = {json.dumps(value)}" for name, value in env.items())
    restart = (
        f'{{ kind = "command", start = {json.dumps(Command(tuple(argv)).render())}, '
        f"pid_file = {json.dumps(str(host_dir / 'server.pid'))}, "
        f"workdir = {json.dumps(str(host_dir))}, stop_timeout = 90 }}"
    )
    return "\n".join(
        [
            'description = "one real SGLang 0.5.23 TP=2 host running the incident\'s build, live"',
            "[defaults]",
            'transport = "local"',
            "live = true",
            "[defaults.engine]",
            "speculative = true",
            f"env = {{ {values} }}",
            f"[hosts.{HOST}]",
            f"state_dir = {json.dumps(str(host_dir / 'state'))}",
            f"[hosts.{HOST}.engine]",
            f"python = {json.dumps(str(python))}",
            f'url = "http://127.0.0.1:{port}"',
            f"log_file = {json.dumps(str(host_dir / 'server.log'))}",
            f"restart = {restart}",
            "",
        ]
    )


@pytest.fixture(scope="module")
def live_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealLiveHost]:
    engine = real_engine()  # skips when the package index cannot be reached to build it
    root = tmp_path_factory.mktemp("live-real")
    host_dir = root / HOST
    python = engine.host_python(host_dir)
    port = free_port("127.0.0.1", set())
    live_dir = Path(tempfile.mkdtemp(prefix="ol", dir="/tmp"))  # a socket path has 107 bytes
    workspace = root / "workspace"
    (workspace / "inventories").mkdir(parents=True)
    shutil.copytree(REPO / "patches", workspace / "patches")
    (workspace / "patches" / "scheduler-request-log-test.toml").write_text(BODY_FIX)
    (workspace / "inventories" / "real.toml").write_text(
        _inventory(host_dir, python, port, live_dir)
    )
    env = {"OPSPATCH_STATE_DIR": str(root / "state")}

    def cli(*args: str) -> Run:
        return opspatch(*args, cwd=workspace, env=env, timeout=600)

    # the incident's build, then the plugin, both before the engine first starts
    built = cli("apply", str(base_patch_path()), "--hosts", "real", "--restart", "never", "--yes")
    assert built.code == 0, built.stdout + built.stderr
    enabled = cli("live", "enable", "--hosts", "real", "--yes", "--json")
    target = load_inventory(workspace / "inventories" / "real.toml").host(HOST)
    control = EngineControl(HostOperations(open_transport(target), target), target, START_PLAYBOOK)
    made = RealLiveHost(workspace, env, host_dir, live_dir, port, enabled)
    try:
        control.wait_ready(control.start(step="start"))
        yield made
    finally:
        pid_file = host_dir / "server.pid"
        pid = pid_file.read_text().strip() if pid_file.exists() else ""
        if pid.isdigit():
            stop_process_tree(int(pid), 60.0)
        shutil.rmtree(live_dir, ignore_errors=True)


def _ranks_logged(log: str, text: str) -> set[str]:
    """The TP ranks whose log lines (`[time TP<r>] ...`) contain `text`."""
    return set(re.findall(r"^\[[0-9: -]+ (TP\d+)\] .*" + re.escape(text), log, re.MULTILINE))


def test_enable_installs_the_plugin_that_every_process_loads_through_sglang_plugins(
    live_host: RealLiveHost,
) -> None:
    enabled = live_host.enabled
    assert enabled.code == 0, enabled.stdout + enabled.stderr
    (host,) = enabled.json()["hosts"]
    assert host["outcome"] == "staged", host
    site = live_host.site_packages
    (dist_info,) = site.glob("opspatch_live-*.dist-info")
    assert (
        "[sglang.srt.plugins]\nopspatch_live = opspatch_live.plugin:load"
        in (dist_info / "entry_points.txt").read_text()
    )
    assert (site / "opspatch_live" / "boundary.py").is_file()
    assert not (site / "opspatch_live.pth").exists()

    folder = live_host.server_folder()
    sockets = {path.name: path for path in folder.glob("*.sock")}
    assert set(sockets) == SOCKETS
    pings = {name: wire.ask(str(path), {"op": "ping"}) for name, path in sockets.items()}
    assert {reply["start"] for reply in pings.values()} == {"entry-point"}
    processes = {name: reply["process"] for name, reply in pings.items()}
    assert processes["main.sock"]["pid"] == int(folder.name)
    assert (processes["scheduler-tp0.sock"]["rank"], processes["scheduler-tp1.sock"]["rank"]) == (
        0,
        1,
    )
    # each socket answered by its own process of the server: the real main, the detokenizer
    # and the two scheduler ranks (named by SGLang's setproctitle)
    assert {p["pid"] for p in processes.values()} <= live_host.pids()
    assert "sglang::detokenizer" in (
        proc_text(processes["detokenizer.sock"]["pid"], "cmdline") or ""
    )
    for rank in (0, 1):
        pid = processes[f"scheduler-tp{rank}.sock"]["pid"]
        assert f"sglang::scheduler_TP{rank}" in (proc_text(pid, "cmdline") or "")
    assert _ranks_logged(live_host.log, "opspatch live: listening on") == {"TP0", "TP1"}
    # SGLang froze the collector of every process after its (skipped) warm-up: the objects built
    # at start are hidden from gc.get_objects() (the stand-in does the same)
    assert all(wait_for_frozen_collectors(sockets).values())


def test_eagle_init_guard_live_on_the_incident_server_first_decode_passes_no_pid_changed(
    live_host: RealLiveHost,
) -> None:
    log = live_host.log
    assert "CUDA graph capture failed: torch.cuda.Stream requires CUDA support" in log
    # no decode yet (/health_generate's one token is a prefill): the smoke is the first
    assert '"POST /generate' not in log and ERROR not in log
    pids = live_host.pids()

    applied = live_host.cli(
        "apply", "eagle-init-guard", "--hosts", "real", "--live", "--yes", "--json"
    )

    assert applied.code == 0, applied.stdout + applied.stderr + live_host.log[-3000:]
    (host,) = applied.json()["hosts"]
    assert host["outcome"] == "applied" and host["smoke"]["ok"], host
    steps = [step["step"] for step in host["steps"]]
    assert "restart" not in steps and steps[-2:] == ["live", "smoke"], steps
    assert live_host.pids() == pids  # no process of the engine restarted
    reply = live_host.generate("The capital of France is")
    assert reply["meta_info"]["completion_tokens"] == 16
    assert reply["meta_info"]["spec_verify_ct"] > 0  # decoded through EAGLE-3
    log = live_host.log
    assert ERROR not in log
    # the take rode the real receive path into the real handle_rpc_request on both ranks, whose
    # barrier it passed (the entry rank answers only after it)
    assert _ranks_logged(
        log,
        "handle_rpc_request: opspatch_live, param: {'request': {'op': 'take', 'fix_id': 'eagle-init-guard'",
    ) == {"TP0", "TP1"}
    row = live_host.status_rows()["eagle-init-guard"]
    assert row["state"] == "applied", row
    assert {(h["process"], h["pid"] in pids) for h in row["live"]} == {
        ("scheduler-tp0", True),
        ("scheduler-tp1", True),
    }


def test_a_method_body_fix_in_the_real_scheduler_shows_in_both_ranks_logs_with_no_restart(
    live_host: RealLiveHost,
) -> None:
    pids = live_host.pids()
    applied = live_host.cli(
        "apply", "scheduler-request-log-test", "--hosts", "real", "--live", "--yes", "--json"
    )
    assert applied.code == 0, applied.stdout + applied.stderr
    (host,) = applied.json()["hosts"]
    assert host["outcome"] == "applied", host
    rid = uuid.uuid4().hex
    assert live_host.generate("def fibonacci(n):", 8, rid=rid)["meta_info"]["id"] == rid
    assert _ranks_logged(live_host.log, f"{MARK} {rid}") == {"TP0", "TP1"}
    assert live_host.pids() == pids
    row = live_host.status_rows()["scheduler-request-log-test"]
    assert row["state"] == "applied", row
    # the main process imported scheduler.py too (it spawns the ranks from it): it holds the
    # fix, where nothing calls it
    assert {h["process"] for h in row["live"]} == {"main", "scheduler-tp0", "scheduler-tp1"}


def test_rollback_takes_the_fix_out_of_both_ranks_with_no_restart(
    live_host: RealLiveHost,
) -> None:
    pids = live_host.pids()
    back = live_host.cli(
        "rollback", "scheduler-request-log-test", "--hosts", "real", "--restart", "never",
        "--yes", "--json",
    )  # fmt: skip
    assert back.code == 0, back.stdout + back.stderr
    (host,) = back.json()["hosts"]
    assert "live-revert" in [step["step"] for step in host["steps"]], host
    assert "reverted in every process of the engine" in host["note"], host
    rid = uuid.uuid4().hex
    assert live_host.generate("def fibonacci(n):", 8, rid=rid)["meta_info"]["id"] == rid
    assert f"{MARK} {rid}" not in live_host.log
    assert live_host.pids() == pids
    rows = live_host.status_rows()
    assert rows["scheduler-request-log-test"]["state"] == "not-applied"
    assert "live" not in rows["scheduler-request-log-test"]
    assert rows["eagle-init-guard"]["state"] == "applied"  # the other fix is still held


def test_restart_finishes_a_staged_plugin_and_the_old_servers_folder_is_removed(
    live_host: RealLiveHost,
) -> None:
    old_pids, old_folder = live_host.pids(), live_host.server_folder()
    disabled = live_host.cli("live", "disable", "--hosts", "real", "--yes", "--json")
    assert disabled.code == 0, disabled.stdout + disabled.stderr
    assert disabled.json()["hosts"][0]["outcome"] == "staged-back"
    enabled = live_host.cli("live", "enable", "--hosts", "real", "--yes", "--json")
    assert enabled.code == 0, enabled.stdout + enabled.stderr
    assert enabled.json()["hosts"][0]["outcome"] == "staged"

    restarted = live_host.cli("restart", "--hosts", "real", "--yes", "--json")

    assert restarted.code == 0, restarted.stdout + restarted.stderr + live_host.log[-3000:]
    (host,) = restarted.json()["hosts"]
    steps = [step["step"] for step in host["steps"]]
    assert {"restart", "ready", "smoke", "live"} <= set(steps), host
    assert not {pid for pid in old_pids if is_running(pid)}  # no scheduler or detokenizer left
    folder = live_host.server_folder()
    assert {path.name for path in folder.glob("*.sock")} == SOCKETS
    assert {wire.ask(str(path), {"op": "ping"})["start"] for path in folder.glob("*.sock")} == {
        "entry-point"
    }
    # the old main process killed itself (SGLang's kill_process_tree): the new one removed its folder
    assert not old_folder.exists()
    assert live_host.generate("The capital of France is")["meta_info"]["spec_verify_ct"] > 0
    assert live_host.status_rows()["eagle-init-guard"]["state"] == "applied"
