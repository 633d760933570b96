"""Where the host is the controller and its interpreter the controller's own (`apply --file`,
`rollback --file`), the host agent's operations run in the controller's process (issue 44):
no interpreter is started for them, and the lock, the compile check, the backup, the atomic
write and the ledger's record are the agent's own, as through a new interpreter.

The first test is `pure`, so `tests/tiers.py` fails it if anything starts a process; the second
runs the same apply through the bootstrap (`process`) and finds the same files, backup and
record. A request the controller should not answer itself still goes to the bootstrap, and
only a local transport with this very interpreter and no engine environment answers here
(tables).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from opspatch.config.patches import load_patch
from opspatch.core.host import AgentMode, EngineSettings, Host
from opspatch.hosts.agent.protocol import AgentRequest, OperationCall
from opspatch.hosts.become import BecomePasswords, Sudo
from opspatch.hosts.channel import (
    AgentAnswer,
    BootstrapEndpoint,
    OwnProcessEndpoint,
    is_this_interpreter,
)
from opspatch.hosts.resident import ResidentEndpoint, open_endpoint
from opspatch.hosts.transport.local import LocalTransport
from opspatch.hosts.transport.scripted import ScriptedTransport
from opspatch.ledger.store import Ledger
from opspatch.runs.commands.local_files import (
    apply_local_file,
    local_file_host,
    plan_local_file,
    rollback_local_file,
)

pytestmark = pytest.mark.pure

PATCH = """
id = "guard-value"
summary = "a default before the call that can fail"
rationale = "tests"

[target]
module = "pkg.mod"
distribution = "pkg"
versions = ">=1.0"

[[edits]]
kind = "insert"
scope = "Worker.__init__"
position = "start"
code = "self.value = 0"
"""

MODULE = b"""class Worker:
    def __init__(self):
        self.setup()
        self.value = 1
"""


@dataclass
class Applied:
    """What an apply then a rollback of `pkg/mod.py` left: the file after each, the backups
    kept, the ledger's file versions (before, after) and what the lock file says."""

    after_apply: bytes
    after_rollback: bytes
    backups: dict[str, bytes]
    versions: list[tuple[str | None, str | None]]
    lock_files: list[str] = field(default_factory=list)


def _apply_then_roll_back(tmp_path: Path, python: str) -> Applied:
    patch_file = tmp_path / "guard-value.toml"
    patch_file.write_text(PATCH, encoding="utf-8")
    target = tmp_path / "site" / "pkg" / "mod.py"
    target.parent.mkdir(parents=True)
    target.write_bytes(MODULE)
    loaded = load_patch(patch_file)
    state = tmp_path / "state"
    ledger = Ledger.open(tmp_path / "ledger.sqlite3")
    try:
        plan = plan_local_file(loaded, target, "1.0")
        report = apply_local_file(loaded, plan, python=python, ledger=ledger, state_dir=state)
        assert [h.outcome for h in report.hosts] == ["applied"], report
        after_apply = target.read_bytes()
        rollback = rollback_local_file(
            target, patch=loaded, python=python, ledger=ledger, state_dir=state
        )
        undone = rollback.run(ledger)
        assert [h.outcome for h in undone.hosts] == ["restored"], undone
        host = local_file_host(python, state, target)
        versions = [
            (v.sha256_before, v.sha256_after)
            for v in ledger.file_history(host.name, str(target.resolve()))
        ]
    finally:
        ledger.close()
    folder = Path(host.state_dir)
    return Applied(
        after_apply=after_apply,
        after_rollback=target.read_bytes(),
        backups={p.name: p.read_bytes() for p in (folder / "backups").iterdir()},
        versions=versions,
        lock_files=sorted(p.name for p in folder.iterdir() if p.name.startswith("lock")),
    )


def test_a_local_file_is_applied_and_rolled_back_in_this_process(tmp_path: Path) -> None:
    done = _apply_then_roll_back(tmp_path, sys.executable)
    assert done.after_apply == MODULE.replace(
        b"    def __init__(self):\n",
        b"    def __init__(self):\n        # opspatch:guard-value\n        self.value = 0\n",
    )
    assert done.after_rollback == MODULE
    # content-addressed: the pre-image (kept by the swap), the post-image (by the restore)
    assert sorted(done.backups.values()) == sorted([MODULE, done.after_apply])
    assert len(done.versions) == 2  # the apply's version and the rollback's
    assert done.lock_files == ["lock.guard"]  # the lock given back: only its guard is left


@pytest.mark.process
def test_through_a_new_interpreter_the_same_is_done(tmp_path: Path) -> None:
    """The bootstrap's path, taken for an interpreter that is not this very file (a link to
    it), leaves the same files, backup and record."""
    (tmp_path / "here").mkdir()
    (tmp_path / "there").mkdir()
    link = tmp_path / "python"
    link.symlink_to(sys.executable)
    assert not is_this_interpreter(str(link))
    here = _apply_then_roll_back(tmp_path / "here", sys.executable)
    there = _apply_then_roll_back(tmp_path / "there", str(link))
    assert there == here


# ---------------------------------------------------------------------------------------------
# who answers


class _Bootstrap(BootstrapEndpoint):
    """The bootstrap, recording what it was sent instead of starting an interpreter."""

    def __init__(self) -> None:
        self.sent: list[list[str]] = []

    def answer(self, request: AgentRequest, *, as_user: str | None, timeout: float) -> AgentAnswer:
        self.sent.append([call["op"] for call in request["ops"]])
        return AgentAnswer(reply={"replies": [], "identity": None})


def _call(op: str, **args: Any) -> OperationCall:
    return OperationCall(op=op, args=args, gate=False)


ROUTES = [  # (calls, as_user, cwd) -> answered here?
    ([_call("whoami")], None, None, True),
    ([_call("read", path="{file}")], None, None, True),
    ([_call("facts"), _call("whoami")], None, None, True),
    ([_call("inspect", module="pkg.mod", path=None)], None, None, False),  # the import path
    ([_call("resolve", module="pkg.mod")], None, None, False),
    ([_call("whoami"), _call("restart", strategy="command")], None, None, False),  # one process
    ([_call("wait_ready", url="http://127.0.0.1:1")], None, None, False),
    ([_call("no-such-operation")], None, None, False),
    ([_call("whoami")], "svc", None, False),  # sudo: another user's process
    ([_call("whoami")], None, "/srv/engine", False),  # the engine's folder
]


@pytest.mark.parametrize(("calls", "as_user", "cwd", "here"), ROUTES)
def test_what_the_controller_answers_itself(
    calls: list[OperationCall], as_user: str | None, cwd: str | None, here: bool, tmp_path: Path
) -> None:
    (tmp_path / "f").write_text("x = 1\n", encoding="utf-8")
    for call in calls:
        call["args"] = {
            k: (v.format(file=tmp_path / "f") if isinstance(v, str) else v)
            for k, v in call["args"].items()
        }
    bootstrap = _Bootstrap()
    answer = OwnProcessEndpoint(bootstrap).answer(
        AgentRequest(ops=calls, cwd=cwd), as_user=as_user, timeout=5
    )
    assert (bootstrap.sent == []) == here
    if here:
        assert answer.reply is not None
        assert [r["status"] for r in answer.reply["replies"]] == ["done"] * len(calls)
        assert answer.reply["identity"] == {
            "user": answer.reply["identity"]["user"],
            "uid": os.geteuid(),
        }


def _host(python: str | None, env: dict[str, str] | None = None) -> Host:
    return Host.local("local:test", "/tmp/state", EngineSettings(python=python, env=env or {}))


ENDPOINTS = [  # (transport, engine python, engine env, agent) -> who answers, and its fallback
    ("local", sys.executable, {}, "resident", OwnProcessEndpoint, ResidentEndpoint),
    ("local", sys.executable, {}, "per-exec", OwnProcessEndpoint, BootstrapEndpoint),
    (
        "local",
        os.path.basename(sys.executable) + "-not-this",
        {},
        "resident",
        ResidentEndpoint,
        None,
    ),
    ("local", "/opt/engine/venv/bin/python", {}, "per-exec", BootstrapEndpoint, None),
    ("local", sys.executable, {"CUDA_VISIBLE_DEVICES": "0"}, "resident", ResidentEndpoint, None),
    ("scripted", sys.executable, {}, "resident", ScriptedTransport, None),  # answers itself
]


@pytest.mark.parametrize(("transport", "python", "env", "agent", "answers", "then"), ENDPOINTS)
def test_who_answers_a_hosts_agent_requests(
    transport: str,
    python: str,
    env: dict[str, str],
    agent: AgentMode,
    answers: type,
    then: type | None,
) -> None:
    host = replace(_host(python, env), agent=agent)
    opened = (
        LocalTransport(host.name)
        if transport == "local"
        else ScriptedTransport(lambda op, args: {}, host=host.name)
    )
    endpoint = open_endpoint(opened, host, Sudo(host, BecomePasswords()))
    assert type(endpoint) is answers
    if then is not None:
        assert isinstance(endpoint, OwnProcessEndpoint)
        assert type(endpoint.fallback) is then
