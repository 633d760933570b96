"""The fault switch of tests/faultkit.py fires at an operation inside a batch, not at the exec.

The wrapper is run here as a local host's engine interpreter (the real bootstrap and agent under
it, resident or one exec per request), so a fault keyed on `inspect` inside `begin`'s batch (lock, then inspect) is seen to fire
after the lock ran and before the inspection, as tests/test_faults.py relies on over SSH.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from opspatch.core.host import AgentMode, EngineSettings, Host
from opspatch.errors import RemoteOperationError
from opspatch.hosts.operations import HostOperations
from opspatch.hosts.transport.local import LocalTransport
from tests.faultkit import arm_switch, install_wrapper

pytestmark = pytest.mark.process


@pytest.fixture(params=["resident", "per-exec"])
def agent_mode(request: pytest.FixtureRequest) -> AgentMode:
    """The wrapper speaks both: the resident agent's lines and one exec per request."""
    mode: AgentMode = request.param
    return mode


def wrapped_host(tmp_path: Path, agent: AgentMode) -> Host:
    control = tmp_path / "fault"
    control.mkdir()
    host = Host.local(
        "wrapped",
        str(tmp_path / "state"),
        EngineSettings(python=str(install_wrapper(control, sys.executable))),
        inventory="test",
    )
    return replace(host, agent=agent)


def test_a_fault_before_inspect_fires_inside_begin_after_the_lock(
    tmp_path: Path, agent_mode: AgentMode
) -> None:
    host = wrapped_host(tmp_path, agent_mode)
    control = tmp_path / "fault"
    target = tmp_path / "worker.py"
    target.write_bytes(b"A = 1\n")
    arm_switch(control, "inspect", at="before", then="drop")
    (control / "release").touch()  # the hold lets go at once; the drop then ends the exec
    with LocalTransport("wrapped") as transport:
        with pytest.raises(RemoteOperationError) as caught:
            HostOperations(transport, host).begin(path=str(target), run_id="r1", timeout=60)
        assert transport.exec_count == 1
    assert caught.value.code == "agent-no-reply"
    assert json.loads((control / "reached.json").read_text())["op"] == "inspect"
    assert (tmp_path / "state" / "lock.json").exists()  # the lock, before the fault, ran


def test_a_fault_after_the_lock_lets_the_rest_of_begin_run_once_released(
    tmp_path: Path, agent_mode: AgentMode
) -> None:
    host = wrapped_host(tmp_path, agent_mode)
    control = tmp_path / "fault"
    target = tmp_path / "worker.py"
    target.write_bytes(b"A = 1\n")
    arm_switch(control, "lock", at="after")
    (control / "release").touch()
    with LocalTransport("wrapped") as transport:
        lock, inspection = HostOperations(transport, host).begin(
            path=str(target), run_id="r1", timeout=60
        )
    assert json.loads((control / "reached.json").read_text())["op"] == "lock"
    assert lock["holder"].get("run_id") == "r1" and inspection.file.content == b"A = 1\n"
    assert not (control / "fault.json").exists()  # claimed once


def test_a_fault_on_an_operation_the_batch_never_reaches_stays_armed(
    tmp_path: Path, agent_mode: AgentMode
) -> None:
    """`begin` refused at its lock never inspects: a fault on `inspect` waits for the next
    request that does (recover's second begin, which takes the lock over)."""
    from opspatch.errors import LockHeld

    host = wrapped_host(tmp_path, agent_mode)
    control = tmp_path / "fault"
    target = tmp_path / "worker.py"
    target.write_bytes(b"A = 1\n")
    with LocalTransport("wrapped") as transport:
        ops = HostOperations(transport, host)
        ops.lock(run_id="other", timeout=60)
        arm_switch(control, "inspect", at="after")
        (control / "release").touch()
        with pytest.raises(LockHeld):
            ops.begin(path=str(target), run_id="r1", timeout=60)
        assert (control / "fault.json").exists() and not (control / "reached.json").exists()
        ops.begin(path=str(target), run_id="r1", takeover_run="other", timeout=60)
    assert json.loads((control / "reached.json").read_text())["op"] == "inspect"
