"""The fleet executor behind routers, simulated (issue 22 item 6): no engines, no sshd, no router.

N scripted hosts (the real host agent on a real copy of the stand-in's `eagle_worker_v2.py`
each; restart, readiness, the drain wait (idle once it settled) and smoke scripted) behind R
routers, with `max_unavailable` per router. One HTTP server plays every router's
control plane (`/r<k>/workers`) and records how many of each router's workers were out of
rotation at once. Every agent exec waits one round trip, every restart the engine's
restart time; the whole run is simulated at `--time-scale` (0.01: a 50 ms round trip is 0.5 ms,
a 120 s restart 1.2 s, and opspatch's drain settle and poll intervals are scaled alike), so the
wall is read against the wave limit: waves x per-host pipeline time, both scaled back.

The swapped text, the same on every simulated host, is compiled by the agent's check once, not
once a host (a real host compiles it on its own CPU; here about 1 ms a host of the
controller's; `--compile-each`: every host, as before).

The simulated hosts' files (the agent's copies, locks, backups) are on tmpfs (`/dev/shm`) where
there is one, as each real host writes its own disk: on the controller's disk their fsyncs and
the ledger's would wait for one journal (`--hosts-on-disk`: beside the ledger, as before).

The routers' control plane runs in a process of its own (forked before any thread starts), as
a real router uses a CPU of its own: in the controller's process its thread per connection and
its HTTP parsing took about 7 s of the controller's 23 s of CPU at 1,000 hosts
(`--routers-in-process`: there, as before). `--apart` runs the hosts' agent in processes of their own too (a pool of
`--host-processes`); on a loaded machine each exec then waits for a process to be scheduled
(docs/benchmarks.md).

The controller's CPU is reported split: `hosts_cpu_s`, the thread CPU of every simulated host's
answers (the agent's operations and the scripted engine, which a real host runs on its own CPU),
and `controller_own_cpu_s`, the rest of the controller's process (the executor, the fleet run,
the ledger, the router client, the scripted wire); `routers_process_cpu_s` is the routers'.

    PYTHONPATH=$PWD python bench/bench_rotation.py [--hosts 1000] [--routers 10] [--own-facts] [--compile-each] [--hosts-on-disk] [--routers-in-process] [--apart] [--out FILE]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import multiprocessing
import os
import platform
import resource
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import opspatch.hosts.agent.facts as agent_facts
import opspatch.hosts.agent.files as agent_files
import opspatch.runs.fleet.rotation as rotation
import tests.scriptedkit as scriptedkit
from opspatch.config.patches import load_patch
from opspatch.core.host import Host, RouterSettings
from opspatch.core.policy import BatchSize, Playbook, RotationSettings
from opspatch.hosts.transport.scripted import ScriptedTransport, agent_operation
from opspatch.ledger.store import Ledger
from opspatch.runs.commands.apply import apply_to_hosts
from tests.scriptedkit import STANDIN, FakeHost

REPO = Path(__file__).resolve().parent.parent
SHM = "/dev/shm"


class ControlPlane(ThreadingHTTPServer):
    """Every router's `/workers`, with the most workers of each router seen out of rotation at
    once."""

    daemon_threads = True
    request_queue_size = 256  # a real router accepts hundreds of connections at once

    def __init__(self, routers: int, workers_per_router: dict[int, int]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.registered: dict[int, dict[str, str]] = {k: {} for k in range(routers)}
        self.size = workers_per_router
        self.most_out: Counter[int] = Counter()
        self.next_id = 0
        self.calls = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def note_out(self, router: int) -> None:
        out = self.size[router] - len(self.registered[router])
        self.most_out[router] = max(self.most_out[router], out)


class _Handler(BaseHTTPRequestHandler):
    server: ControlPlane
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return None

    def _send(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _router(self) -> tuple[int, list[str]]:
        parts = self.path.strip("/").split("/")
        return int(parts[0][1:]), parts[1:]

    def do_GET(self) -> None:
        plane = self.server
        if self.path == "/stats":  # for the bench, when the plane runs in a process of its own
            with plane.lock:
                self._send(200, {"most_out": plane.most_out, "calls": plane.calls})
            return
        router, rest = self._router()
        with plane.lock:
            plane.calls += 1
            listed = [
                {"id": i, "url": u, "is_healthy": True} for u, i in plane.registered[router].items()
            ]
        if rest == ["workers"]:
            self._send(200, {"workers": listed, "total": len(listed)})
        else:
            self._send(404, {"error": "no job"})

    def do_POST(self) -> None:
        plane = self.server
        router, _ = self._router()
        url = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["url"]
        with plane.lock:
            plane.calls += 1
            plane.next_id += 1
            plane.registered[router][url] = f"id-{plane.next_id}"
            worker_id = plane.registered[router][url]
        self._send(202, {"worker_id": worker_id})

    def do_DELETE(self) -> None:
        plane = self.server
        router, rest = self._router()
        with plane.lock:
            plane.calls += 1
            gone = [u for u, i in plane.registered[router].items() if i == rest[-1]]
            for url in gone:
                del plane.registered[router][url]
            plane.note_out(router)
        self._send(202, {"status": "accepted"})


class SimulatedHost(FakeHost):
    """A scripted host whose every exec costs a round trip, and a restart the engine's time.

    Its `inspect` is the real agent's, less what a real host does on its own CPU and the
    simulation would do in the controller's process: the engine's server is the script's, not
    looked up in this machine's socket table (`own_facts`: both as the agent reads them)."""

    round_trip = 0.0
    restart_seconds = 0.0
    own_facts = False
    cpu = 0.0
    """Seconds of thread CPU spent answering, every simulated host together: the work a real
    host does on its own CPU (the agent's operations, the scripted engine), here the controller's."""
    cpu_lock = threading.Lock()

    def answer(self, op: str, args: dict[str, Any]) -> Any:
        started = time.thread_time()
        try:
            return self._answer(op, args)
        finally:
            spent = time.thread_time() - started
            with SimulatedHost.cpu_lock:
                SimulatedHost.cpu += spent

    def _answer(self, op: str, args: dict[str, Any]) -> Any:
        time.sleep(self.round_trip)
        if op == "inspect" and not self.own_facts:
            args = {**args, "server": None}
        if op == "restart":
            time.sleep(self.restart_seconds)
        if op == "wait_drained":  # idle at once: the wait is the settle time
            time.sleep(float(args["settle"]))
            return {"seconds": float(args["settle"]), "polls": 2, "answered": True}
        return super().answer(op, args)


def _compiled_once(check: Callable[[bytes, str], None]) -> Callable[[bytes, str], None]:
    """The agent's compile check of a swap, run once for each text that compiles: a real host
    compiles the new file on its own CPU, and every simulated host's text is the same."""
    compiled: set[bytes] = set()

    def check_once(content: bytes, filename: str) -> None:
        digest = hashlib.sha256(content).digest()
        if digest not in compiled:
            check(content, filename)  # a refusal raises: never remembered
            compiled.add(digest)

    return check_once


def _started(_: int) -> None:
    time.sleep(0.2)  # every worker of the pool forks now, before the controller's threads


def _stats(plane: ControlPlane) -> tuple[Counter[int], int]:
    with urllib.request.urlopen(f"{plane.url}/stats") as response:  # noqa: S310 - our own
        body = json.loads(response.read())
    return Counter({int(k): v for k, v in body["most_out"].items()}), int(body["calls"])


def _process_cpu(pid: int) -> float | None:
    """User and system CPU seconds of process `pid` so far (Linux `/proc`), or None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(
    hosts: int,
    routers: int,
    percent: int,
    round_trip: float,
    restart: float,
    scale: float,
    own_facts: bool = False,
    apart: bool = False,
    host_processes: int = 2,
    hosts_on_disk: bool = False,
    routers_in_process: bool = False,
    compile_each: bool = False,
) -> dict[str, Any]:
    # Long because: the simulated fleet, its routers and the playbook are set up in line, as read
    SimulatedHost.round_trip = round_trip * scale
    SimulatedHost.restart_seconds = restart * scale
    SimulatedHost.own_facts = own_facts
    SimulatedHost.cpu = 0.0
    if not own_facts:  # one host's facts (Python, package versions) stand for every host's
        known = agent_facts.collect_facts()
        agent_facts.collect_facts = lambda: dict(known)
    if not compile_each:
        setattr(agent_files, "check_compiles", _compiled_once(agent_files.check_compiles))  # noqa: B010
    rotation.DRAIN_SETTLE_SECONDS *= scale
    rotation.DRAIN_POLL_SECONDS *= scale
    rotation.ADMIT_POLL_SECONDS *= scale
    size = Counter(i % routers for i in range(hosts))
    plane = ControlPlane(routers, dict(size))
    source = (STANDIN / "eagle_worker_v2.py").read_bytes()
    patch = load_patch(REPO / "patches" / "eagle-init-guard.toml")
    fork = multiprocessing.get_context("fork")
    pool = None
    serving = None
    shm = None if hosts_on_disk or not os.access(SHM, os.W_OK) else SHM
    with tempfile.TemporaryDirectory() as scratch, tempfile.TemporaryDirectory(dir=shm) as homes:
        fakes: dict[str, SimulatedHost] = {}
        targets: list[Host] = []
        for index in range(hosts):
            fake = SimulatedHost(f"h{index + 1:04}", Path(homes) / f"h{index + 1:04}")
            fake.file.parent.mkdir(parents=True)
            fake.file.write_bytes(source)
            fakes[fake.name] = fake
            router = index % routers
            worker = f"{plane.url}/w{index}"
            plane.registered[router][worker] = f"id-start-{index}"
            targets.append(
                replace(
                    fake.host(),
                    router=RouterSettings(url=f"{plane.url}/r{router}", worker_url=worker),
                )
            )
        if routers_in_process and not apart:
            threading.Thread(target=plane.serve_forever, daemon=True).start()
        else:
            serving = fork.Process(target=plane.serve_forever, daemon=True)
            serving.start()
        if apart:
            pool = ProcessPoolExecutor(host_processes, mp_context=fork)
            list(pool.map(_started, range(host_processes)))
            workers = pool

            def operation(op: str, args: dict[str, Any]) -> Any:
                return workers.submit(agent_operation, op, args).result()

            setattr(scriptedkit, "agent_operation", operation)  # noqa: B010 - FakeHost.real's
        per_router = max(size.values())
        room = math.ceil(per_router * percent / 100)
        playbook = Playbook(
            canary=1,
            batch=BatchSize(percent=Decimal(100)),
            max_in_flight=2 * room * routers,
            max_failures=1,
            rotation=RotationSettings(max_unavailable=BatchSize(percent=Decimal(percent))),
        )

        def factory(host: Host) -> ScriptedTransport:
            return ScriptedTransport(fakes[host.name].answer, host=host.name)

        with Ledger.open(Path(scratch) / "ledger.sqlite3") as ledger:
            usage = resource.getrusage(resource.RUSAGE_SELF)
            cpu_started = usage.ru_utime + usage.ru_stime
            started, main_started = time.perf_counter(), time.thread_time()
            report = apply_to_hosts(patch, targets, playbook, factory=factory, ledger=ledger)
            wall = time.perf_counter() - started
            main_cpu = time.thread_time() - main_started  # the executor's loop: waits, halts
            usage = resource.getrusage(resource.RUSAGE_SELF)
            cpu = usage.ru_utime + usage.ru_stime - cpu_started
        most_out, calls = _stats(plane) if serving else (plane.most_out, plane.calls)
        routers_cpu = _process_cpu(serving.pid) if serving is not None and serving.pid else None
    if pool is not None:
        pool.shutdown()
        setattr(scriptedkit, "agent_operation", agent_operation)  # noqa: B010
    if serving is not None:
        serving.terminate()
    else:
        plane.shutdown()
    outcomes = Counter(str(h.outcome) for h in report.hosts)
    rotations = Counter(str(h.rotation) for h in report.hosts)
    canary = next(h for h in report.hosts if h.host == "h0001")
    pipeline = sum(s.seconds for s in canary.steps if s.step not in ("begin", "plan"))
    waves = 1 + math.ceil((per_router - (1 if routers == 1 else 0)) / room)
    return {
        "hosts": hosts,
        "hosts_own_facts": own_facts,
        "hosts_compile_each": compile_each,
        "hosts_files": "tmpfs" if shm else "the ledger's disk",
        "hosts_and_routers": f"routers in 1 process, hosts' agent in {host_processes}"
        if apart
        else "in the controller's process"
        if routers_in_process
        else "routers in 1 process, hosts in the controller's",
        "routers": routers,
        "max_unavailable": f"{percent}%",
        "room_per_router": room,
        "time_scale": scale,
        "outcomes": dict(outcomes),
        "rotation": dict(rotations),
        "most_out_of_rotation_per_router": max(most_out.values()),
        "wall_s": round(wall, 2),
        "wall_s_unscaled": round(wall / scale, 1),
        "canary_pipeline_s": round(pipeline, 3),
        "waves": waves,
        "wave_limit_s": round(waves * pipeline, 2),
        "controller_cpu_s": round(cpu, 1),
        "main_thread_cpu_s": round(main_cpu, 1),
        "hosts_cpu_s": round(SimulatedHost.cpu, 1),
        "controller_own_cpu_s": round(cpu - SimulatedHost.cpu, 1),
        "controller_own_cpu_ms_per_host": round(1000 * (cpu - SimulatedHost.cpu) / hosts, 2),
        "routers_process_cpu_s": None if routers_cpu is None else round(routers_cpu, 1),
        "wall_over_wave_limit": round(wall / (waves * pipeline), 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "router_calls": calls,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--routers", type=int, default=10)
    parser.add_argument("--percent", type=int, default=10, help="max_unavailable per router")
    parser.add_argument("--round-trip", type=float, default=0.05, help="seconds, unscaled")
    parser.add_argument("--restart", type=float, default=120.0, help="seconds, unscaled")
    parser.add_argument("--time-scale", type=float, default=0.01)
    parser.add_argument(
        "--own-facts",
        action="store_true",
        help="each host reads its facts and this machine's socket table, as the agent does",
    )
    parser.add_argument(
        "--compile-each",
        action="store_true",
        help="every host's agent compiles the swapped text (the same for all), as each real one does",
    )
    parser.add_argument(
        "--hosts-on-disk",
        action="store_true",
        help="the simulated hosts' files beside the ledger, not on tmpfs",
    )
    parser.add_argument(
        "--apart",
        action="store_true",
        help="the routers' control plane and the hosts' agent in processes of their own",
    )
    parser.add_argument(
        "--routers-in-process",
        action="store_true",
        help="the routers' control plane in the controller's process (threads), as before",
    )
    parser.add_argument("--host-processes", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    result = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "python": platform.python_version(),
        "load_before": os.getloadavg(),
        **run(
            args.hosts,
            args.routers,
            args.percent,
            args.round_trip,
            args.restart,
            args.time_scale,
            args.own_facts,
            args.apart,
            args.host_processes,
            args.hosts_on_disk,
            args.routers_in_process,
            args.compile_each,
        ),
        "load_after": os.getloadavg(),
    }
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
