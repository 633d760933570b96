"""The scripted transport: `HostOperations` driven through a handler function, no host process.

Each test also checks what only a transport can see: the requests, their deadlines and the
exec count, so the rare paths tested this way keep the round trips the real transports have.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from opspatch.errors import (
    CommandTimeout,
    ContainerError,
    InputError,
    PreimageMismatch,
    RemoteOperationError,
    TransportError,
)
from opspatch.hosts.operations import HostOperations
from opspatch.hosts.transport.base import Transport
from opspatch.hosts.transport.scripted import (
    NoReply,
    Refusal,
    ScriptedTransport,
    agent_operation,
)
from tests.scriptedkit import scripted_host

pytestmark = pytest.mark.scripted


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


FACTS: dict[str, Any] = {
    "python_version": "3.10.12",
    "python_executable": "/opt/sglang/venv/bin/python",
    "python_implementation": "CPython",
    "hostname": "gpu-01",
    "platform": "Linux",
    "machine": "x86_64",
    "sglang_version": "0.5.23",
    "torch_version": "2.8.0",
    "gpu_names": ["NVIDIA H200"],
    "notes": [],
}


def test_inspect_is_answered_by_the_handler_in_one_exec(tmp_path: Path) -> None:
    target = tmp_path / "worker.py"
    target.write_bytes(b"A = 1\n")
    seen: list[tuple[str, dict[str, Any]]] = []

    def handler(op: str, args: dict[str, Any]) -> dict[str, Any] | Refusal:
        seen.append((op, args))
        if op == "inspect":
            return {"facts": FACTS, "resolved": None, "file": agent_operation("read", args)}
        return Refusal("unknown-operation", op)

    with ScriptedTransport(handler, host="h1") as transport:
        assert isinstance(transport, Transport)
        ops = HostOperations(transport, scripted_host(tmp_path / "state"))
        inspection = ops.inspect(path=str(target), timeout=42)
    assert transport.closed
    assert transport.exec_count == 1 and transport.ops == ["inspect"]
    assert transport.calls[0].timeout == 42
    assert seen[0][1]["path"] == str(target)
    assert inspection.facts.sglang_version == "0.5.23"
    assert inspection.facts.gpu_names == ("NVIDIA H200",)
    assert inspection.file.content == b"A = 1\n"
    assert inspection.file.sha256 == sha(b"A = 1\n")


def test_a_refusal_becomes_the_same_error_as_from_a_host(tmp_path: Path) -> None:
    def handler(op: str, args: dict[str, Any]) -> Refusal:
        return Refusal(
            "preimage-mismatch",
            "the file changed since it was read",
            {"expected": args["expected_sha256"], "actual": "f" * 64},
        )

    transport = ScriptedTransport(handler)
    ops = HostOperations(transport, scripted_host(tmp_path / "state"))
    with pytest.raises(PreimageMismatch) as caught:
        ops.swap("/srv/x.py", expected_sha256="0" * 64, new_content=b"B = 2\n", timeout=5)
    assert caught.value.code == "preimage-mismatch"
    assert caught.value.host == "h1" and caught.value.step == "swap"
    assert caught.value.data == {"expected": "0" * 64, "actual": "f" * 64}


def test_the_real_agent_refuses_a_swap_of_a_changed_file(tmp_path: Path) -> None:
    target = tmp_path / "worker.py"
    target.write_bytes(b"A = 1\n")
    transport = ScriptedTransport(agent_operation)
    ops = HostOperations(transport, scripted_host(tmp_path / "state"))
    with pytest.raises(PreimageMismatch):
        ops.swap(str(target), expected_sha256=sha(b"A = 0\n"), new_content=b"B\n", timeout=5)
    assert target.read_bytes() == b"A = 1\n"
    assert transport.exec_count == 1


def test_a_lost_swap_reply_leaves_the_write_done_and_the_error_a_transport_one(
    tmp_path: Path,
) -> None:
    target = tmp_path / "worker.py"
    target.write_bytes(b"A = 1\n")

    def handler(op: str, args: dict[str, Any]) -> dict[str, Any] | Refusal:
        answer = agent_operation(op, args)
        if op == "swap":
            raise TransportError("the connection broke while running the agent", step="exec")
        return answer

    with ScriptedTransport(handler, host="h1") as transport:
        ops = HostOperations(transport, scripted_host(tmp_path / "state"))
        with pytest.raises(TransportError) as caught:
            ops.swap(
                str(target), expected_sha256=sha(b"A = 1\n"), new_content=b"A = 2\n", timeout=5
            )
        assert caught.value.host == "h1" and caught.value.step == "swap"
        # the effect is unknown to the caller, so it reads the file: the write did happen
        assert ops.read(str(target), timeout=5).content == b"A = 2\n"
    assert transport.ops == ["swap", "read"]
    assert (tmp_path / "state" / "backups" / sha(b"A = 1\n")).read_bytes() == b"A = 1\n"


def test_a_deadline_raised_by_the_handler_reaches_the_caller_with_the_step(tmp_path: Path) -> None:
    def handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise CommandTimeout("ran past its 3s deadline", step="exec")

    ops = HostOperations(ScriptedTransport(handler, host="h1"), scripted_host(tmp_path))
    with pytest.raises(CommandTimeout) as caught:
        ops.lock(run_id="r1", timeout=3)
    assert caught.value.step == "lock" and caught.value.host == "h1"


def test_a_container_refusal_named_with_the_step_keeps_its_reason(tmp_path: Path) -> None:
    def handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise ContainerError("was recreated", step="container", reason="recreated")

    ops = HostOperations(ScriptedTransport(handler, host="h1"), scripted_host(tmp_path))
    with pytest.raises(ContainerError) as caught:
        ops.lock(run_id="r1", timeout=3)
    assert (caught.value.reason, caught.value.step, caught.value.host) == (
        "recreated",
        "lock",
        "h1",
    )


def test_an_exec_with_no_reply_is_read_by_its_exit_status(tmp_path: Path) -> None:
    missing = ScriptedTransport(
        lambda op, args: NoReply(exit_code=127, stderr="sh: 1: python: not found")
    )
    with pytest.raises(InputError) as caught:
        HostOperations(missing, scripted_host(tmp_path)).unlock(run_id="r1", timeout=3)
    assert "cannot be run on the host" in caught.value.message
    silent = ScriptedTransport(lambda op, args: NoReply(exit_code=1, stderr="Killed"))
    with pytest.raises(RemoteOperationError) as no_reply:
        HostOperations(silent, scripted_host(tmp_path)).unlock(run_id="r1", timeout=3)
    assert no_reply.value.code == "agent-no-reply"


def test_the_transport_only_speaks_to_the_agent() -> None:
    from opspatch.hosts.transport.base import Command

    transport = ScriptedTransport(agent_operation)
    with pytest.raises(ValueError, match="only answers host-agent requests"):
        transport.run(Command(("echo", "hi")), stdin=b"", timeout=1)


@pytest.mark.process
def test_the_real_transports_are_context_managers_that_close(tmp_path: Path) -> None:
    from opspatch.hosts.operations import open_transport
    from opspatch.hosts.transport.base import Command

    local = scripted_host(tmp_path)
    with open_transport(local) as transport:
        assert transport.run(Command(("true",)), timeout=10).ok
    remote = replace(local, transport="ssh", address="192.0.2.1")
    with open_transport(remote) as ssh:  # nothing is connected until the first run
        assert ssh.exec_count == 0


def test_every_operation_takes_its_deadline_from_the_caller(tmp_path: Path) -> None:
    """One timeout table (the playbook's): nothing in the hosts layer picks its own deadline."""
    transport = ScriptedTransport(lambda op, args: Refusal("scripted", op))
    ops = HostOperations(transport, scripted_host(tmp_path))
    calls = [
        lambda: ops.facts(timeout=1),
        lambda: ops.resolve("m", timeout=2),
        lambda: ops.read("/f", timeout=3),
        lambda: ops.inspect(path="/f", timeout=4),
        lambda: ops.swap("/f", expected_sha256="0", new_content=b"", timeout=5),
        lambda: ops.restore("/f", pre_sha256="0", timeout=6),
        lambda: ops.lock(run_id="r", timeout=7),
        lambda: ops.begin(path="/f", run_id="r", timeout=8),
        lambda: ops.unlock(run_id="r", timeout=9),
    ]
    for call in calls:
        with pytest.raises(RemoteOperationError):
            call()
    assert [c.timeout for c in transport.calls] == [1, 2, 3, 4, 5, 6, 7, 8, 9]


def test_a_failed_engine_step_keeps_the_engine_log_tail_and_exception(tmp_path: Path) -> None:
    from opspatch.core.policy import Playbook
    from opspatch.errors import EngineError
    from opspatch.hosts.engine import EngineControl, RestartReply

    exception = {"type": "ImportError", "message": "cannot import name 'x'", "lineno": 3}
    tail = "Traceback (most recent call last):\n  File \"/srv/a.py\", line 3, in <module>\nImportError: cannot import name 'x'"

    def handler(op: str, args: dict[str, Any]) -> Refusal:
        return Refusal(
            "engine-exited",
            "the engine (pid 42) exited before it was ready: ImportError: cannot import name 'x'",
            {"log_tail": tail, "exception": exception},
        )

    host = scripted_host(tmp_path)
    ctl = EngineControl(HostOperations(ScriptedTransport(handler), host), host, Playbook())
    with pytest.raises(EngineError) as caught:
        ctl.wait_ready(RestartReply(strategy="command", pid=42, log_offset=0))
    assert caught.value.step == "ready"
    assert caught.value.data == {"log_tail": tail, "exception": exception}
    assert "ImportError: cannot import name 'x'" in caught.value.message


@pytest.mark.process
def test_host_operations_import_no_ssh_library() -> None:
    """Paramiko and fabric load with the first SSH host, not with the hosts layer."""
    import subprocess

    code = (
        "import sys, opspatch.hosts.operations, opspatch.hosts.engine; "
        "print(sorted(m for m in ('paramiko', 'fabric') if m in sys.modules))"
    )
    repo = Path(__file__).resolve().parent.parent  # `-c` imports from the current folder first
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=repo
    )
    assert done.stdout.strip() == "[]"


def test_each_refusal_code_of_the_one_table_becomes_its_error(tmp_path: Path) -> None:
    from opspatch.hosts.channel import REFUSAL_ERRORS

    for code, error_type in {**REFUSAL_ERRORS, "write-failed": RemoteOperationError}.items():
        transport = ScriptedTransport(lambda op, args, code=code: Refusal(code, "no"), host="h1")
        ops = HostOperations(transport, scripted_host(tmp_path / "state"))
        with pytest.raises(error_type) as raised:
            ops.resolve("pkg.mod", timeout=5)
        assert type(raised.value) is error_type, code


def test_begin_is_one_exec_and_a_lock_refused_inspects_nothing(tmp_path: Path) -> None:
    """The transport answers the typed batch (lock, then inspect) by the agent's own rule."""
    from opspatch.errors import LockHeld

    target = tmp_path / "worker.py"
    target.write_bytes(b"A = 1\n")
    transport = ScriptedTransport(agent_operation, host="h1")
    ops = HostOperations(transport, scripted_host(tmp_path / "state"))
    ops.begin(path=str(target), run_id="r1", timeout=8)
    assert transport.execs == [("lock", "inspect")]
    with pytest.raises(LockHeld):
        ops.begin(path=str(target), run_id="r2", timeout=8)
    assert transport.execs == [("lock", "inspect"), ("lock", "inspect")]
    assert transport.ops == ["lock", "inspect", "lock"]  # the second inspect never ran
    assert [c.exec_index for c in transport.calls] == [0, 0, 1]
