"""Scripted hosts for the fast tier: each host a `ScriptedTransport` whose file operations run the
real host agent on real files in a temporary folder, while its engine (restart, readiness,
smoke) and the faults under test are scripted (as httpx's MockTransport answers requests).

`FakeHost` is one host, `Fleet` (fixture `fleet`) three of them with a real ledger; `Units`
(fixture `units`) two hosts as one unit; `RoutedFleet` the same behind a scripted router."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from opspatch.config.fleet import DesiredPatch, DesiredState
from opspatch.config.patches import load_patch
from opspatch.core.host import CommandRestart, EngineSettings, Host, RouterSettings, Unit
from opspatch.core.policy import BatchSize, JudgeSettings, Playbook, RotationSettings, StepTimeouts
from opspatch.core.remedy import recover_after_stop
from opspatch.core.spec import LoadedPatch
from opspatch.errors import Location, TransportError
from opspatch.hosts.containers import ContainerIdentity
from opspatch.hosts.transport.base import Transport
from opspatch.hosts.transport.scripted import Refusal, ScriptedTransport, agent_operation
from opspatch.ledger.store import Ledger
from opspatch.runs.commands.apply import apply_to_hosts
from opspatch.runs.commands.recover import recover_hosts, recover_run, run_chain
from opspatch.runs.report import RunReport

REPO = Path(__file__).resolve().parent.parent

STANDIN = REPO / "opspatch" / "sandbox" / "engine_src" / "sglang" / "srt" / "speculative"

MODULE = "sglang.srt.speculative.eagle_worker_v2"

Fault = Callable[[str, dict[str, Any]], "dict[str, Any] | Refusal | None"]

FAKE_PID = 4242
"""The scripted engine's pid, as its `restart` answers it and `inspect` finds it running."""


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class FakeHost:
    """One scripted host: a real file (the stand-in's eagle_worker_v2.py) and a real state
    folder, an engine that answers as scripted, and `fault`, asked first for every request.

    The engine is a state, not a process: `serving` (what `inspect` finds in place of a live
    process in the pid file, which the real agent cannot find, and whether `wait_ready`
    answers) and `started_at` (when it last started: a `restart` moves it to now, so a file
    swapped without a restart is newer than its server, `staged`, as on a real host)."""

    name: str
    root: Path
    fault: Fault | None = None
    smoke_ok: bool = True
    gone: bool = False  # every request fails: the host vanished
    serving: bool = True
    """False: the engine is down (no server found, readiness refused) until a restart."""
    started_at: float | None = None
    """When the engine started, epoch seconds (None: unknown, as for a process the agent
    cannot read the start of)."""
    requests: list[str] = field(default_factory=list)
    container: ContainerIdentity | None = None
    """The container its engine runs in, pinned by each transport's first exec (None: on the
    host itself)."""

    @classmethod
    def installed(cls, name: str, root: Path) -> FakeHost:
        """A host with the stand-in's pristine file, installed an hour ago, whose engine started
        after that install: a swap now makes the file newer than the server."""
        fake = cls(name, root)
        fake.file.parent.mkdir(parents=True)
        fake.file.write_bytes((STANDIN / "eagle_worker_v2.py").read_bytes())
        installed = time.time() - 3600
        os.utime(fake.file, (installed, installed))
        fake.started_at = installed + 1
        return fake

    def restarted(self) -> None:
        """What a restart of its engine does: it runs, started now (after every write so far)."""
        self.serving, self.started_at = True, time.time()

    @property
    def file(self) -> Path:
        return self.root / "site" / "sglang" / "srt" / "speculative" / "eagle_worker_v2.py"

    @property
    def state(self) -> Path:
        return self.root / "state"

    def host(self) -> Host:
        return Host.local(
            self.name,
            str(self.state),
            EngineSettings(
                python="/opt/sglang/bin/python",
                speculative=True,
                restart=CommandRestart(start="serve", pid_file=str(self.root / "pid")),
            ),
            inventory="scripted",
        )

    def answer(self, op: str, args: dict[str, Any]) -> dict[str, Any] | Refusal:
        self.requests.append(op)
        if self.gone:
            raise TransportError("the host does not answer", host=self.name, step="exec")
        if self.fault is not None:
            scripted = self.fault(op, args)
            if scripted is not None:
                return scripted
        return self.real(op, args)

    def real(self, op: str, args: dict[str, Any]) -> dict[str, Any] | Refusal:
        """The real agent for files and locks; a scripted engine for the rest."""
        if op == "inspect" and args.get("module") == MODULE:
            args = {**args, "module": None, "path": str(self.file)}
            answer = agent_operation(op, args)
            if isinstance(answer, dict):  # as the engine's interpreter resolves it
                answer["resolved"] = {
                    "module": MODULE,
                    "origin": str(self.file),
                    "realpath": str(self.file),
                    "is_symlink": False,
                    "is_package": False,
                    "distribution": "sglang",
                    "distribution_version": "0.5.23",
                    "record_sha256": None,
                }
                # a live process a test put in the pid file is found by the agent itself
                if answer.get("server") is None and self.serving:
                    answer["server"] = {"pid": FAKE_PID, "started_at": self.started_at}
            return answer
        if op == "restart":
            self.restarted()
            return {"strategy": "command", "pid": FAKE_PID, "log_offset": 0, "stopped": []}
        if op == "stop":  # a unit's node: stopped until its `start`
            stopped = [FAKE_PID] if self.serving else []
            self.serving = False
            return {"strategy": "command", "stopped": stopped, "log_offset": 0}
        if op == "start":
            if self.serving:
                return Refusal("engine-running", f"the engine (pid {FAKE_PID}) still runs")
            self.restarted()
            return {"strategy": "command", "pid": FAKE_PID, "log_offset": 0, "stopped": []}
        if op == "wait_ready":
            if not self.serving:
                return Refusal(
                    "engine-not-running",
                    f"the engine is not running: pid {FAKE_PID} has exited, and /health does "
                    "not answer",
                )
            return {"seconds": 0.1, "polls": 1}
        if op == "smoke":
            result = {
                "prompt": "p",
                "ok": self.smoke_ok,
                "text": "t",
                "completion_tokens": 16,
                "spec_verify_ct": 4,
                "problem": None if self.smoke_ok else "the server crashed: ValueError: boom",
            }
            failures = [] if self.smoke_ok else ["prompt 1: the server crashed: ValueError: boom"]
            return {"ok": self.smoke_ok, "results": [result], "failures": failures}
        return agent_operation(op, args)


@dataclass
class Fleet:
    hosts: list[FakeHost]
    ledger: Ledger
    patch: LoadedPatch
    transports: dict[str, ScriptedTransport] = field(default_factory=dict)

    def factory(self, host: Host) -> Transport:
        fake = next(h for h in self.hosts if h.name == host.name)
        self.transports[host.name] = ScriptedTransport(
            fake.answer, host=host.name, pins=fake.container
        )
        return self.transports[host.name]

    def apply(self, playbook: Playbook | None = None) -> RunReport:
        return apply_to_hosts(
            self.patch,
            [h.host() for h in self.hosts],
            playbook or Playbook(canary=0, batch=BatchSize(count=10), max_failures=1),
            factory=self.factory,
            ledger=self.ledger,
        )

    def outcomes(self, report: RunReport) -> dict[str, str]:
        return {h.host: str(h.outcome) for h in report.hosts}

    def recover(self, *hosts: FakeHost, run: str | None = None) -> RunReport:
        """`recover --hosts HOSTS`, or with `run` `recover --run RUN` (its whole chain) there,
        under the default playbook."""
        if run is not None:
            return recover_run(
                ledger=self.ledger,
                chain=run_chain(self.ledger, run),
                hosts=[h.host() for h in hosts],
                factory=self.factory,
                playbook=Playbook(),
                patch=self.patch,
            )
        return recover_hosts(
            ledger=self.ledger,
            hosts=[h.host() for h in hosts],
            factory=self.factory,
            playbook=Playbook(),
            patch=self.patch,
        )


def finding_its_server(fake: FakeHost, answer: Fault | None = None) -> Fault:
    """`answer` for every other operation (None: the host's own), and `fake`'s inspections by path
    (restart's, rollback's, recover's) finding its running server too, as the agent finds a live
    process in the pid file."""

    def served(op: str, args: dict[str, Any]) -> dict[str, Any] | Refusal | None:
        if op != "inspect":
            return None if answer is None else answer(op, args)
        found = fake.real(op, args)
        if isinstance(found, dict) and found.get("server") is None and fake.serving:
            found["server"] = {"pid": FAKE_PID, "started_at": fake.started_at}
        return found

    return served


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    patch = load_patch(REPO / "patches" / "eagle-init-guard.toml")
    hosts = [FakeHost.installed(f"h{index + 1}", tmp_path / f"h{index + 1}") for index in range(3)]
    ledger = Ledger.open(tmp_path / "ledger.sqlite3")
    try:
        yield Fleet(hosts, ledger, patch)
    finally:
        ledger.close()


PRISTINE = sha((STANDIN / "eagle_worker_v2.py").read_bytes())

MARK = """
id = "module-mark"
summary = "a second desired patch"
rationale = "test: a sync of two patches"
[target]
module = "sglang.srt.speculative.eagle_worker_v2"
[[edits]]
kind = "insert"
scope = "<module>"
position = "end"
code = "_OPSPATCH_MARK = 1"
"""


def mark_patch(folder: Path) -> LoadedPatch:
    """A second patch of the same file as eagle-init-guard, for a fleet file that wants two."""
    (folder / "module-mark.toml").write_text(MARK)
    return load_patch(folder / "module-mark.toml")


def desired_everywhere(fleet: Fleet, *patches: LoadedPatch) -> DesiredState:
    """A fleet file that wants each of `patches` (in that order) on every host of `fleet`."""
    hosts = {h.name: h.host() for h in fleet.hosts}
    return DesiredState(
        "fleet.toml",
        tuple(
            DesiredPatch(p, tuple(hosts), "", Location("fleet.toml", 1 + 3 * i, f"patches[{i}]"))
            for i, p in enumerate(patches)
        ),
        hosts,
    )


class Notices:
    """A `Progress` that keeps the notices (what the operator must see now)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def run_started(self, run_id: str, summary: str) -> None:
        return None

    def update(self, host: str, step: str, status: str) -> None:
        return None

    def notice(self, text: str) -> None:
        self.lines.append(text)

    def after_stop(self, run_id: str | None) -> str | None:
        return recover_after_stop(run_id)


UNIT = Unit("u1", ("h1", "h2"))

ALWAYS = Playbook(canary=0, batch=BatchSize(count=10), max_failures=1)


@dataclass
class Units:
    fakes: dict[str, FakeHost]
    ledger: Ledger
    patch: LoadedPatch

    def factory(self, host: Host) -> Transport:
        return ScriptedTransport(self.fakes[host.name].answer, host=host.name)

    def hosts(self, *names: str) -> list[Host]:
        """The hosts as the inventory gives them: h1 and h2 are the nodes of unit u1."""
        chosen = []
        for name in names:
            host = self.fakes[name].host()
            chosen.append(replace(host, unit=UNIT) if name in UNIT.hosts else host)
        return chosen

    def apply(self, *names: str, playbook: Playbook = ALWAYS) -> RunReport:
        return apply_to_hosts(
            self.patch, self.hosts(*names), playbook, factory=self.factory, ledger=self.ledger
        )

    def files(self) -> dict[str, str]:
        return {name: sha(fake.file.read_bytes()) for name, fake in self.fakes.items()}

    def requests(self) -> dict[str, list[str]]:
        return {name: list(fake.requests) for name, fake in self.fakes.items()}


@pytest.fixture
def units(tmp_path: Path) -> Iterator[Units]:
    patch = load_patch(REPO / "patches" / "eagle-init-guard.toml")
    fakes = {name: FakeHost.installed(name, tmp_path / name) for name in ("h1", "h2", "h3")}
    ledger = Ledger.open(tmp_path / "ledger.sqlite3")
    try:
        yield Units(fakes, ledger, patch)
    finally:
        ledger.close()


@dataclass
class RouterState:
    """What the fake router holds: registered workers by URL (id, healthy), whether a worker
    it is asked to add turns healthy, why it gave up every registration job (None: the jobs are
    still processing), and every control-plane call in order."""

    workers: dict[str, tuple[str, bool]] = field(default_factory=dict)
    adds_turn_healthy: bool = True
    jobs_fail: str | None = None
    down: bool = False  # every call answered 503, as a dying router's port might
    calls: list[str] = field(default_factory=list)
    next_id: int = 0


class FakeRouter(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.state = RouterState()
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: FakeRouter
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return None

    def _send(self, status: int, body: Any) -> None:
        if self.server.state.down:
            status, body = 503, {"error": "the router is gone"}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        state = self.server.state
        with self.server.lock:
            state.calls.append(f"GET {self.path}")
            listed = [{"id": i, "url": u, "is_healthy": ok} for u, (i, ok) in state.workers.items()]
        if self.path == "/workers":
            self._send(200, {"workers": listed, "total": len(listed)})
        elif state.jobs_fail is not None:
            self._send(200, {"job_status": {"status": "failed", "message": state.jobs_fail}})
        else:
            self._send(200, {"job_status": {"status": "processing"}})

    def do_POST(self) -> None:
        state = self.server.state
        url = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["url"]
        with self.server.lock:
            state.calls.append(f"POST /workers {url}")
            state.next_id += 1
            worker_id = f"id-{state.next_id}"
            state.workers[url] = (worker_id, state.adds_turn_healthy)
        self._send(202, {"worker_id": worker_id})

    def do_DELETE(self) -> None:
        state = self.server.state
        with self.server.lock:
            state.calls.append(f"DELETE {self.path}")
            gone = [u for u, (i, _) in state.workers.items() if self.path.endswith(i)]
            for url in gone:
                del state.workers[url]
        self._send(202, {"status": "accepted"})


def worker_url(name: str) -> str:
    """The worker as the router knows it: not the engine URL the host itself uses."""
    return f"http://{name}.internal:30000"


@dataclass
class RoutedFleet:
    router: FakeRouter
    fakes: dict[str, FakeHost]
    ledger: Ledger
    drain_reads: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    router_dies_at_restart: bool = False

    def hosts(self, *names: str) -> list[Host]:
        peers = tuple(worker_url(n) for n in self.fakes)
        return [
            replace(
                self.fakes[n].host(),
                router=RouterSettings(url=self.router.url, worker_url=worker_url(n), peers=peers),
            )
            for n in names or self.fakes
        ]

    def factory(self, host: Host) -> ScriptedTransport:
        fake = self.fakes[host.name]

        def answer(op: str, args: dict[str, Any]) -> Any:
            if op == "wait_drained":  # read on the host; the engine is idle
                self.drain_reads.append((host.name, args))
                return {"seconds": 0.5, "polls": 6, "answered": True}
            if op == "restart" and self.router_dies_at_restart:
                self.router.state.down = True
            return fake.answer(op, args)

        return ScriptedTransport(answer, host=host.name)

    def recover(self, *names: str) -> RunReport:
        """`recover --hosts NAMES` of the routed patch, under the routed playbook."""
        return recover_hosts(
            ledger=self.ledger,
            hosts=self.hosts(*names),
            factory=self.factory,
            playbook=book(),
            patch=PATCH,
        )

    def register(self, *names: str, healthy: bool = True) -> None:
        for name in names:
            self.router.state.workers[worker_url(name)] = (f"start-{name}", healthy)


PATCH = load_patch(REPO / "patches" / "eagle-init-guard.toml")

ONE = BatchSize(count=1)


def book(
    max_unavailable: BatchSize = ONE, *, fleet_down: bool = False, admit: float = 5
) -> Playbook:
    return Playbook(
        canary=1,
        batch=BatchSize(percent=Decimal(100)),
        max_failures=1,
        timeouts=replace(StepTimeouts(), admit=admit),
        rotation=RotationSettings(max_unavailable, fleet_down),
    )


JUDGED = replace(ALWAYS, canary=1, judge=JudgeSettings(count=9))

PROMPTS = 9

TOKENS = 32


def sample(index: int, *, changed: bool = False, problem: str | None = None) -> dict[str, Any]:
    """One prompt's decode (the agent's `DecodeSample`): fixed greedy ids with a top-3 after
    each; `changed`: the first prompt's 5th token turned into one outside either top-k."""
    ids = [(index * 7 + position) % 60 for position in range(TOKENS)]
    if changed and index == 0:
        ids[4] = (ids[4] + 30) % 60
    if problem is not None:
        return {
            "prompt": f"prompt {index}", "problem": problem, "refused": "refused" in problem,
            "text": None, "output_ids": None, "top_ids": None, "top_logprobs": None,
            "token_logprobs": None, "token_texts": None, "completion_tokens": None, "spec_verify_ct": None, "seconds": None,
            "first_token_seconds": None, "server_seconds": None,
        }  # fmt: skip
    return {
        "prompt": f"prompt {index}", "problem": None, "refused": False, "text": "x" * TOKENS,
        "output_ids": ids, "top_ids": [[i, (i + 1) % 60, (i + 2) % 60] for i in ids],
        "top_logprobs": [[-0.1, -2.5, -3.0] for _ in ids], "token_logprobs": [-0.1] * TOKENS,
        "token_texts": None, "completion_tokens": TOKENS, "spec_verify_ct": 12,
        "seconds": 0.2 + index / 100, "first_token_seconds": 0.02,
        "server_seconds": 0.19 + index / 100,
    }  # fmt: skip


@dataclass
class Servers:
    """What the head's `measure` answers: `old` before the swap, `new` after it."""

    units: Units
    old: list[dict[str, Any]]
    new: list[dict[str, Any]]
    asked: list[str] = field(default_factory=list)

    def answer(self, node: str, op: str) -> dict[str, Any] | None:
        if op != "measure":
            return None
        self.asked.append(node)
        patched = sha(self.units.fakes[node].file.read_bytes()) != PRISTINE
        return {"samples": self.new if patched else self.old, "spec_accept_length": None}


def judged_unit(units: Units, *, old: str | None = None, changed: bool = False) -> Servers:
    """Every node's `measure` scripted; `old`: the old server's problem on every prompt."""
    servers = Servers(
        units,
        old=[sample(i, problem=old) for i in range(PROMPTS)],
        new=[sample(i, changed=changed) for i in range(PROMPTS)],
    )
    for name in ("h1", "h2", "h3"):
        units.fakes[name].fault = lambda op, args, node=name: servers.answer(node, op)
    return servers


def files(units: Units) -> dict[str, str]:
    return {n: sha(units.fakes[n].file.read_bytes()) for n in ("h1", "h2")}


def scripted_host(state_dir: Path, name: str = "h1") -> Host:
    """A host the scripted transport answers for (no transport of its own is opened)."""
    return Host.local(name, str(state_dir), EngineSettings(python=sys.executable), inventory="test")
