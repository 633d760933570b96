"""The incident on real SGLang 0.5.23, end to end, with opspatch's own commands.

One real host, shared by the module, in the order an operator lives it: its sglang gets the
incident's build (the sandbox's base patch set, applied by `opspatch apply` and recorded in the
ledger), its engine is started by opspatch's engine control with the incident hosts' switch on;
`/health` answers 200; `opspatch diagnose --decode` crashes it with exactly the incident's
AttributeError and names the cause from the real log and source; `opspatch apply
eagle-init-guard` (the shipped file, unchanged) restarts it, smokes it, and it decodes through
EAGLE-3. The host and its inventory are made here as `sandbox up --engine sglang` makes them.
"""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from opspatch.config.inventory.load import load_inventory
from opspatch.core.policy import Playbook, StepTimeouts
from opspatch.hosts.agent.processes import stop_process_tree
from opspatch.hosts.engine import EngineControl
from opspatch.hosts.operations import HostOperations, open_transport
from opspatch.hosts.transport.base import Command
from opspatch.sandbox.incident import (
    FORCE_GRAPHS_ENV,
    INCIDENT_ENV,
    INCIDENT_SERVER_FLAGS,
    THRESHOLD_ENV,
    base_patch_path,
)
from opspatch.sandbox.processes import free_port
from opspatch.sandbox.real.launch import cpu_env, server_args
from tests.clirunner import Run, opspatch
from tests.realkit import real_engine

# a real start is 1-3 minutes here, a crash holds its decode ~65 s: the default 300 s per
# test is too short on a loaded machine for the start, the apply's restart and two smokes
pytestmark = [pytest.mark.sglang, pytest.mark.timeout(1500)]

REPO = Path(__file__).resolve().parent.parent
HOST = "real-01"
ERROR = "AttributeError: 'EAGLEWorkerV2' object has no attribute 'spec_disable_batch_threshold'"
# A crashed real server holds the request for its crash diagnostics (5 s, then 60 s waiting for
# CUDA coredumps) before its process tree ends: give the decode that crashes it time for that.
PROMPTS = ("The capital of France is", "Once upon a time", "The quick brown fox")
PLAYBOOK = Playbook(name="real", timeouts=StepTimeouts(restart=120.0, ready=600.0, smoke=300.0))


@dataclass(frozen=True)
class IncidentHost:
    workspace: Path
    env: dict[str, str]
    url: str
    log: Path
    pid_file: Path
    inventory: Path

    def control(self) -> EngineControl:
        """The engine control a rollout builds for the host, from its inventory as it is now."""
        target = load_inventory(self.inventory).host(HOST)
        return EngineControl(HostOperations(open_transport(target), target), target, PLAYBOOK)

    def cli(self, *args: str, timeout: float = 900) -> Run:
        return opspatch(*args, cwd=self.workspace, env=self.env, timeout=timeout)

    def generate(self, text: str, count: int) -> dict[str, Any]:
        body = {"text": text, "sampling_params": {"max_new_tokens": count, "temperature": 0}}
        request = urllib.request.Request(
            self.url + "/generate",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=300) as reply:  # noqa: S310 - loopback
            data: dict[str, Any] = json.loads(reply.read())
        return data

    def health(self) -> int:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=60) as reply:  # noqa: S310
                return int(reply.status)
        except urllib.error.HTTPError as exc:
            return exc.code


def _inventory(
    host_dir: Path, python: Path, port: int, argv: list[str], env: dict[str, str]
) -> str:
    """The inventory of one real incident host: what the sandbox writes for its hosts."""
    values = ", ".join(f"{name} = {json.dumps(value)}" for name, value in env.items())
    start = Command(tuple(argv)).render()
    restart = (
        f'{{ kind = "command", start = {json.dumps(start)}, '
        f"pid_file = {json.dumps(str(host_dir / 'server.pid'))}, "
        f"workdir = {json.dumps(str(host_dir))}, stop_timeout = 90 }}"
    )
    return "\n".join(
        [
            'description = "one real SGLang 0.5.23 host running the incident\'s build"',
            "[defaults]",
            'transport = "local"',
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
def incident(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IncidentHost]:
    engine = real_engine()
    root = tmp_path_factory.mktemp("incident")
    host_dir = root / HOST
    python = engine.host_python(host_dir)
    port = free_port("127.0.0.1", set())
    argv = [str(python), "-m", "sglang.launch_server", "--host", "127.0.0.1", "--port", str(port)]
    argv += [*server_args(engine.models.target, engine.models.draft), *INCIDENT_SERVER_FLAGS]
    engine_env = {"CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1", **cpu_env(1)}
    engine_env.update(INCIDENT_ENV)
    workspace = root / "workspace"
    (workspace / "inventories").mkdir(parents=True)
    shutil.copytree(REPO / "patches", workspace / "patches")
    (workspace / "inventories" / "real.toml").write_text(
        _inventory(host_dir, python, port, argv, engine_env)
    )
    host = IncidentHost(
        workspace,
        {"OPSPATCH_STATE_DIR": str(root / "state")},
        f"http://127.0.0.1:{port}",
        host_dir / "server.log",
        host_dir / "server.pid",
        workspace / "inventories" / "real.toml",
    )
    # the base: the incident's build, applied by opspatch before the engine first starts
    built = host.cli("apply", str(base_patch_path()), "--hosts", "real", "--restart", "never",
                     "--yes", "--json")  # fmt: skip
    assert built.code == 0, built.stdout + built.stderr
    control = host.control()
    try:
        control.wait_ready(control.start(step="start"))
        yield host
    finally:
        pid = host.pid_file.read_text().strip() if host.pid_file.exists() else ""
        if pid.isdigit():
            stop_process_tree(int(pid), 60.0)


def test_the_base_is_the_incident_build_recorded_in_the_ledger(incident: IncidentHost) -> None:
    listed = incident.cli("ledger", "list", "--json")
    assert listed.code == 0, listed.stderr
    (run,) = listed.json()["runs"]
    assert (run["command"], run["patch_id"], run["outcome"]) == (
        "apply",
        "incident-eagle-spec-disable",
        "ok",
    )
    assert run["hosts"] == [HOST]
    site = next((incident.log.parent / "venv" / "lib").glob("python*/site-packages"))
    eagle = (site / "sglang/srt/speculative/eagle_worker_v2.py").read_text()
    assert "self.init_plain_decode_cuda_graphs()" in eagle
    assert "spec_disable_batch_threshold: int = 0" not in eagle  # not fixed yet


def test_healthy_then_the_first_decode_crashes_and_diagnose_names_the_cause(
    incident: IncidentHost,
) -> None:
    assert incident.health() == 200
    diagnosed = incident.cli("diagnose", "--hosts", "real", "--decode", "--json")
    assert diagnosed.code == 1, diagnosed.stdout + diagnosed.stderr
    (host,) = diagnosed.json()["hosts"]
    assert host["status"] == "healthy-but-crashing"
    log = incident.log.read_text()
    # exactly the incident's exception, raised where the decode path reads the threshold
    assert f"\n{ERROR}\n" in log
    assert "Scheduler hit an exception: Traceback (most recent call last):" in log
    assert "CUDA graph capture failed: torch.cuda.Stream requires CUDA support" in log
    assert "Dynamic speculation disable: threshold=" not in log
    (report,) = [e for e in host["exceptions"] if f"{e['type']}: {e['message']}" == ERROR]
    assert report["context"] == "Scheduler hit an exception"
    assert report["frame"].endswith("in should_disable_speculation")
    assert [f["patch"] for f in report["fixed_by"]] == ["eagle-init-guard"]
    cause = report["missing_attribute"]["likely_cause"]
    assert cause.startswith("EAGLEWorkerV2.__init__ stopped between line ")
    assert "`self.init_plain_decode_cuda_graphs()`" in cause
    assert "was swallowed by a caller and the half-built object was used" in cause
    files = {m["module"]: m for m in host["files"]}
    assert files["sglang.srt.speculative.eagle_worker_v2"]["state"] == "patched-by-opspatch"
    assert files["sglang.srt.speculative.eagle_worker_v2"]["patch"] == "incident-eagle-spec-disable"


def test_eagle_init_guard_unchanged_fixes_it_and_eagle3_decodes(incident: IncidentHost) -> None:
    shipped = (REPO / "patches" / "eagle-init-guard.toml").read_bytes()
    assert (incident.workspace / "patches" / "eagle-init-guard.toml").read_bytes() == shipped
    applied = incident.cli("apply", "eagle-init-guard", "--hosts", "real", "--yes", "--json")
    assert applied.code == 0, applied.stdout + applied.stderr
    (host,) = applied.json()["hosts"]
    assert host["outcome"] == "applied"
    reply = incident.generate("The capital of France is", 16)
    meta = reply["meta_info"]
    assert meta["completion_tokens"] == 16
    assert meta["spec_verify_ct"] > 0
    # the graph set-up still fails on this machine: the fix makes the half-built worker safe
    since_fix = incident.log.read_text().rsplit("server_args=", 1)[1]
    assert "CUDA graph capture failed: torch.cuda.Stream requires CUDA support" in since_fix
    assert ERROR not in since_fix
    # and diagnose says so
    diagnosed = incident.cli("diagnose", "--hosts", "real", "--decode", "--json")
    assert diagnosed.code == 0, diagnosed.stdout + diagnosed.stderr
    (host,) = diagnosed.json()["hosts"]
    assert host["status"] == "clean"
    assert host["decode"]["ok"] is True


def test_where_the_graph_set_up_works_large_batches_decode_without_drafting(
    incident: IncidentHost,
) -> None:
    # the feature itself, on a host of the incident's build whose CUDA graph set-up works (the
    # switch off), with a threshold of 1: a decode batch of three is not drafted
    text = incident.inventory.read_text()
    for name, value in ((FORCE_GRAPHS_ENV, "0"), (THRESHOLD_ENV, "1")):
        text = text.replace(f'{name} = "{INCIDENT_ENV[name]}"', f'{name} = "{value}"')
    incident.inventory.write_text(text)
    control = incident.control()
    control.wait_ready(control.restart())
    since_restart = incident.log.read_text().rsplit("server_args=", 1)[1]
    assert "Dynamic speculation disable: threshold=1" in since_restart
    assert "CUDA graph capture failed" not in since_restart
    alone = incident.generate("Once upon a time", 16)["meta_info"]
    assert alone["spec_verify_ct"] > 0
    with ThreadPoolExecutor(3) as pool:
        replies = list(pool.map(lambda p: incident.generate(p, 16), PROMPTS))
    assert [r["meta_info"]["completion_tokens"] for r in replies] == [16, 16, 16]
    since_restart = incident.log.read_text().rsplit("server_args=", 1)[1]
    assert "threshold 1: speculation off" in since_restart
    assert "Switch adaptive runtime state: steps 2 -> 0, draft_tokens 3 -> 1" in since_restart
    assert ERROR not in since_restart
