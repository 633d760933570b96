"""Scripted hosts for the fast tier: each host a `ScriptedTransport` whose file operations run the
real host agent on real files in a temporary folder, while its engine (restart, readiness,
smoke) and the faults under test are scripted (as httpx's MockTransport answers requests).

`FakeHost` is one host, `Fleet` (fixture `fleet`) three of them with a real ledger; `Units`
(fixture `units`) two hosts as one unit; `RoutedFleet` the same behind a scripted router."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from opspatch.config.fleet import DesiredPatch, DesiredState
from opspatch.config.patches import load_patch
from opspatch.core.host import CommandRestart, EngineSettings, Host
from opspatch.core.policy import BatchSize, Playbook
from opspatch.core.spec import LoadedPatch
from opspatch.errors import Location, TransportError
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
        self.transports[host.name] = ScriptedTransport(fake.answer, host=host.name)
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
