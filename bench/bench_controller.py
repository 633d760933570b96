"""What the controller itself costs at fleet scale (issue 20): no engines.

1. The planner on the real `eagle_worker_v2.py` of SGLang 0.5.4, 0.5.10 and 0.5.23 (and 0.5.23's
   `managers/scheduler.py` with a benchmark patch): `core.edit.apply_patch` in-process (plan +
   validation, CPU ms) beside Python's own parse and compile of the file, then `opspatch
   --version`, `check`, `plan --file` and `apply --file --yes` as the user runs them (wall and
   CPU of the process), with the checkout byte-compiled and with no bytecode.
2. A fleet of N hosts on the scripted transport, each answering with 0.5.23's real file (the real
   host agent on a real file per host; restart, readiness and smoke scripted): wall, the
   process's CPU per host with the in-process agents' own CPU taken out, peak memory.
3. With `--ssh-hosts N`: the patch phase (`restart = never`) over N real sshds on 127.0.0.x
   (OpenSSH's sshd needed): the controller's CPU per host and where its calling threads spend it.

The wheels come from PyPI through tests/sglang_wheels.py (cached in ~/.cache/opspatch-tests).

    PYTHONPATH=$PWD python bench/bench_controller.py [--hosts 32,1000] [--repeat 5] [--out FILE]
        [--ssh-hosts 32] [--only-ssh] [--skip-commands]
"""

from __future__ import annotations

import argparse
import ast
import gc
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from opspatch.config.patches import load_patch
from opspatch.core.edit import apply_patch
from opspatch.core.policy import BatchSize, Playbook
from opspatch.hosts.transport.scripted import ScriptedTransport
from opspatch.ledger.store import Ledger
from opspatch.runs.commands.apply import apply_to_hosts
from tests.releasecases import SCHEDULER_RELPATH, release_source, scheduler_patch
from tests.scriptedkit import FakeHost
from tests.sglang_wheels import EAGLE_RELPATH, RELEASE_VERSIONS, sglang_site

REPO = Path(__file__).resolve().parent.parent


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def planner(repeat: int) -> list[dict[str, Any]]:
    guard = load_patch(REPO / "patches" / "eagle-init-guard.toml").spec
    cases = [(v, EAGLE_RELPATH, release_source(v, EAGLE_RELPATH), guard) for v in RELEASE_VERSIONS]
    cases.append(
        (
            "0.5.23",
            SCHEDULER_RELPATH,
            release_source("0.5.23", SCHEDULER_RELPATH),
            scheduler_patch(),
        )
    )
    rows = []
    for version, relpath, source, patch in cases:
        apply_patch(source, patch)  # warm: imports, first-time caches
        times = []
        for _ in range(repeat):
            started = time.process_time()
            outcome = apply_patch(source, patch)
            times.append((time.process_time() - started) * 1000)
        rows.append(
            {
                "version": version,
                "file": relpath,
                "lines": source.count(b"\n"),
                "outcome": outcome.outcome,
                "plan_cpu_ms_median": round(statistics.median(times), 1),
                "plan_cpu_ms_min": round(min(times), 1),
                **_parser_floor(source, outcome, repeat),
            }
        )
    return rows


def _parser_floor(source: bytes, outcome: Any, repeat: int) -> dict[str, float]:
    """What Python's own parser and compiler take on this file (best of `repeat`, collector
    paused as the engine pauses it): a plan parses each text it makes once and compiles the
    result once, so the plan's time less (texts x parse + compile) is the engine's own."""
    parse, compiled = [], []
    new = getattr(outcome, "new_source", source)
    for _ in range(repeat):
        gc.disable()
        try:
            started = time.process_time()
            ast.parse(source)
            parse.append(time.process_time() - started)
        finally:
            gc.enable()
        started = time.process_time()
        compile(new, "<bench>", "exec", dont_inherit=True)
        compiled.append(time.process_time() - started)
    return {
        "ast_parse_cpu_ms_min": round(min(parse) * 1000, 1),
        "compile_cpu_ms_min": round(min(compiled) * 1000, 1),
    }


def _child(argv: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    code = subprocess.run(argv, env=env, capture_output=True, check=False).returncode
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall * 1000, cpu * 1000, code


def _purge_bytecode() -> None:
    for folder in (REPO / "opspatch").rglob("__pycache__"):
        shutil.rmtree(folder)


def commands(repeat: int) -> list[dict[str, Any]]:
    """`--version`, `check`, `plan --file` and `apply --file --yes` as processes, twice: with the
    checkout byte-compiled (as pip installs it) and with no bytecode for opspatch at all (this
    environment sets PYTHONDONTWRITEBYTECODE, so an editable checkout compiles every module of
    opspatch on every command; bench/findings.md)."""
    rows = []
    cli = [sys.executable, "-m", "opspatch.cli"]
    cases = [("--version", ""), ("check", "")]
    cases += [(command, version) for version in RELEASE_VERSIONS for command in ("plan", "apply")]
    for bytecode in ("compiled", "none"):
        if bytecode == "compiled":
            subprocess.run(
                [sys.executable, "-m", "compileall", "-q", str(REPO / "opspatch")], check=True
            )
        else:
            _purge_bytecode()
        for command, version in cases:
            site = sglang_site(version or "0.5.23")
            walls, cpus = [], []
            for run in range(repeat + 1):  # the first run is not counted (cold caches)
                with tempfile.TemporaryDirectory() as scratch:
                    copy = Path(scratch) / "site"
                    shutil.copytree(site, copy)
                    env = {
                        **os.environ,
                        "OPSPATCH_STATE_DIR": str(Path(scratch) / "state"),
                        "PYTHONDONTWRITEBYTECODE": "1",
                    }
                    argv = [*cli, command]
                    if command in ("plan", "apply"):
                        argv += ["eagle-init-guard", "--file", str(copy / EAGLE_RELPATH)]
                    wall, cpu, code = _child(argv + (["--yes"] if command == "apply" else []), env)
                    assert code == 0, (command, code)
                    if run:
                        walls.append(wall)
                        cpus.append(cpu)
            rows.append(
                {
                    "version": version or None,
                    "bytecode": bytecode,
                    "command": f"opspatch {command}"
                    + (" eagle-init-guard --file" if command in ("plan", "apply") else ""),
                    "wall_ms_median": round(statistics.median(walls)),
                    "wall_ms_min": round(min(walls)),
                    "cpu_ms_median": round(statistics.median(cpus)),
                    "cpu_ms_min": round(min(cpus)),
                }
            )
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "opspatch")], check=True)
    return rows


class TimedHost(FakeHost):
    """A scripted host that keeps the CPU its in-process agent spends (the host's share)."""

    agent_cpu = 0.0
    _lock = threading.Lock()

    def real(self, op: str, args: dict[str, Any]) -> Any:
        started = time.thread_time()
        try:
            return super().real(op, args)
        finally:
            with TimedHost._lock:
                TimedHost.agent_cpu += time.thread_time() - started


def fleet(n: int, scratch: Path) -> dict[str, Any]:
    patch = load_patch(REPO / "patches" / "eagle-init-guard.toml")
    source = release_source("0.5.23", EAGLE_RELPATH)
    hosts = []
    for index in range(n):
        fake = TimedHost(f"h{index + 1:04}", scratch / f"h{index + 1:04}")
        fake.file.parent.mkdir(parents=True)
        fake.file.write_bytes(source)
        hosts.append(fake)

    def factory(host: Any) -> ScriptedTransport:
        fake = next(h for h in hosts if h.name == host.name)
        return ScriptedTransport(fake.answer, host=host.name)

    TimedHost.agent_cpu = 0.0
    playbook = Playbook(canary=1, batch=BatchSize(count=32), max_failures=1)
    with Ledger.open(scratch / "ledger.sqlite3") as ledger:
        wall_started, cpu_started = time.perf_counter(), _cpu()
        report = apply_to_hosts(
            patch, [h.host() for h in hosts], playbook, factory=factory, ledger=ledger
        )
        wall, cpu = time.perf_counter() - wall_started, _cpu() - cpu_started
    outcomes = {str(h.outcome) for h in report.hosts}
    assert outcomes == {"applied"}, outcomes
    controller = cpu - TimedHost.agent_cpu
    return {
        "hosts": n,
        "wall_s": round(wall, 2),
        "process_cpu_s": round(cpu, 2),
        "agents_cpu_s": round(TimedHost.agent_cpu, 2),
        "controller_cpu_ms_per_host": round(controller / n * 1000, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "ledger_mb": round((scratch / "ledger.sqlite3").stat().st_size / 2**20, 1),
    }


def _host_site(site: Path, into: Path) -> Path:
    """The parts of a release's site-packages the agent reads to resolve and patch the module:
    its dist-info, the module and the packages on its path (not the whole wheel, 32 times)."""
    (dist_info,) = site.glob("sglang-*.dist-info")
    shutil.copytree(dist_info, into / dist_info.name)
    parts = Path(EAGLE_RELPATH).parts
    for depth in range(1, len(parts)):
        package = Path(*parts[:depth]) / "__init__.py"
        (into / package).parent.mkdir(parents=True, exist_ok=True)
        if (site / package).exists():
            shutil.copyfile(site / package, into / package)
        else:  # the test cache keeps no __init__ files; an installed sglang has them
            (into / package).write_bytes(b"")
    shutil.copyfile(site / EAGLE_RELPATH, into / EAGLE_RELPATH)
    return into


class _Spent:
    """CPU the controller's own thread spends in a function (thread time), by label."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._lock = threading.Lock()

    def wrap(self, owner: Any, name: str, label: str) -> None:
        inner = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.thread_time()
            try:
                return inner(*args, **kwargs)
            finally:
                with self._lock:
                    self.seconds[label] = (
                        self.seconds.get(label, 0.0) + time.thread_time() - started
                    )

        setattr(owner, name, timed)


def ssh_fleet(n: int, scratch: Path) -> dict[str, Any]:
    """The patch phase (begin + swap, `restart = never`) on N real sshds on 127.0.0.x, each
    host's agent run by this Python on its own copy of 0.5.23's file: the controller's CPU per
    host (this process: paramiko's threads included; sshd and the agents are other processes),
    and the thread time of the parts that can be told apart."""
    from opspatch.core.vocabulary import RestartPolicy
    from opspatch.hosts import channel
    from opspatch.hosts.operations import open_transport
    from opspatch.hosts.transport import ssh
    from opspatch.ledger import store
    from opspatch.runs.fleet import pipeline
    from opspatch.sandbox.sshd import start_ssh_fleet, stop_ssh_fleet
    from tests.sshfleet import inventory_host

    site = sglang_site("0.5.23")
    fleet_dir = scratch / "sshd"
    fleet_dir.mkdir()
    fleet = start_ssh_fleet(fleet_dir, [f"127.0.0.{index + 2}" for index in range(n)])
    try:
        hosts = []
        for index in range(n):
            home = scratch / f"h{index + 1:02}"
            host_site = _host_site(site, home / "site")
            hosts.append(
                inventory_host(
                    "ssh",
                    state_dir=home / "state",
                    fleet=fleet,
                    index=index,
                    name=f"h{index + 1:02}",
                    env={"PYTHONPATH": str(host_site)},
                )
            )
        spent = _Spent()
        spent.wrap(ssh.SSHTransport, "_open", "SSH connect (handshake, auth; this thread)")
        spent.wrap(channel, "encode_request", "agent request (payload, JSON)")
        spent.wrap(channel, "parse_reply", "agent reply (JSON)")
        spent.wrap(pipeline, "apply_patch", "plan (once per pre-image)")
        for method in ("record_step", "record_host_outcome", "record_file_version", "begin_run"):
            if hasattr(store.Ledger, method):
                spent.wrap(store.Ledger, method, "ledger writes")
        patch = load_patch(REPO / "patches" / "eagle-init-guard.toml")
        playbook = Playbook(
            canary=1, batch=BatchSize(count=32), max_failures=1, restart=RestartPolicy.NEVER
        )
        with Ledger.open(scratch / "ledger.sqlite3") as ledger:
            wall_started, cpu_started = time.perf_counter(), _cpu()
            report = apply_to_hosts(
                patch, hosts, playbook, factory=lambda h: open_transport(h), ledger=ledger
            )
            wall, cpu = time.perf_counter() - wall_started, _cpu() - cpu_started
    finally:
        stop_ssh_fleet(fleet)
    outcomes = {str(h.outcome) for h in report.hosts}
    assert outcomes == {"staged"}, [(h.host, h.outcome, h.note, h.steps) for h in report.hosts]
    return {
        "hosts": n,
        "transport": "ssh",
        "wall_s": round(wall, 2),
        "controller_cpu_s": round(cpu, 2),
        "controller_cpu_ms_per_host": round(cpu / n * 1000, 1),
        "thread_time_ms_per_host": {
            label: round(seconds / n * 1000, 1) for label, seconds in spent.seconds.items()
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="32,1000", help="fleet sizes, comma-separated")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--skip-commands", action="store_true")
    parser.add_argument("--ssh-hosts", default="", help="fleet sizes over real sshds, e.g. 32")
    parser.add_argument("--only-ssh", action="store_true", help="only the --ssh-hosts fleets")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    args = parser.parse_args()
    result: dict[str, Any] = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "python": platform.python_version(),
        "load_before": os.getloadavg(),
    }
    if not args.only_ssh:
        result["planner"] = planner(args.repeat)
        print(json.dumps(result["planner"], indent=1))
        if not args.skip_commands:
            result["commands"] = commands(args.repeat)
            print(json.dumps(result["commands"], indent=1))
        result["fleet"] = []
        for n in [int(x) for x in args.hosts.split(",") if x]:
            with tempfile.TemporaryDirectory() as scratch:
                row = fleet(n, Path(scratch))
            print(json.dumps(row))
            result["fleet"].append(row)
    result["ssh_fleet"] = []
    for n in [int(x) for x in args.ssh_hosts.split(",") if x]:
        with tempfile.TemporaryDirectory() as scratch:
            row = ssh_fleet(n, Path(scratch))
        print(json.dumps(row))
        result["ssh_fleet"].append(row)
    result["load_after"] = os.getloadavg()
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
