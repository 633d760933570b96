"""A server of two nodes (the stand-in: SGLang's process model, a real gloo group, TP=1 on each
node) restarted as one through the agent's `stop` and `start` operations over the local
transport: both nodes stopped, then started head first, readiness on the head with its group
checked, a smoke decode through the head. And why a unit is never restarted one node at a time:
the non-head node stopped and started alone leaves a head that never becomes ready again.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from opspatch.config.inventory import parse_inventory
from opspatch.core.host import Host
from opspatch.core.policy import Playbook
from opspatch.errors import EngineError, RemoteOperationError
from opspatch.hosts.agent.processes import alive, read_pid_file, stop_process_tree
from opspatch.hosts.engine import EngineControl, ServerGroup
from opspatch.hosts.operations import HostOperations
from opspatch.hosts.transport.local import LocalTransport
from tests.standin import StandinHost, free_port, http_request, make_host

pytestmark = pytest.mark.engine

GROUP = ServerGroup(nnodes=2, tp_size=2)
READY = 180.0


def node(standin: StandinHost, rank: int, dist_port: int, name: str) -> Host:
    """Node `rank` of the unit as an inventory host: the same command on both nodes but for
    `--node-rank` (and each node's own port), started by the command strategy."""
    work = standin.host_dir / name
    port = free_port()
    start = (
        f"{standin.python} -m sglang.launch_server --port {port} --disable-cuda-graph "
        f"--speculative-algorithm NONE --tp-size {GROUP.tp_size} --nnodes {GROUP.nnodes} "
        f"--node-rank {rank} --dist-init-addr 127.0.0.1:{dist_port} "
        "--dist-timeout 30"
    )
    text = textwrap.dedent(
        f"""
        [defaults]
        transport = "local"
        state_dir = "{work}/state"
        [defaults.engine]
        python = "{standin.python}"
        url = "http://127.0.0.1:{port}"
        log_file = "{work}/server.log"
        speculative = false
        env = {{ CUDA_VISIBLE_DEVICES = "", HOME = "{standin.host_dir}" }}
        restart = {{ kind = "command", start = {json.dumps(start)}, pid_file = "{work}/server.pid", workdir = "{standin.host_dir}", stop_timeout = 5 }}
        [hosts.node{rank}]
        address = "127.0.0.1"
        """
    )
    return parse_inventory(text, str(work / "inv.toml"), name="unit").hosts[0]


@pytest.fixture(scope="module")
def standins(tmp_path_factory: pytest.TempPathFactory) -> tuple[StandinHost, StandinHost]:
    return (
        make_host(tmp_path_factory.mktemp("unit-node0")),
        make_host(tmp_path_factory.mktemp("unit-node1")),
    )


@pytest.fixture()
def unit(
    standins: tuple[StandinHost, StandinHost], request: pytest.FixtureRequest
) -> Iterator[tuple[EngineControl, EngineControl]]:
    """The unit's two nodes (head first), started head first through the agent and ready with
    their group; every process of both stopped by pid at the end."""
    dist_port = free_port()
    hosts = [node(standins[rank], rank, dist_port, request.node.name) for rank in (0, 1)]
    controls = [
        EngineControl(HostOperations(LocalTransport(host.name), host), host, Playbook())
        for host in hosts
    ]
    try:
        for control in controls:
            control.start()
        controls[0].wait_ready(timeout=READY, group=GROUP)
        yield controls[0], controls[1]
    finally:
        for host in hosts:
            pid = read_pid_file(getattr(host.engine.restart, "pid_file", ""))
            if pid is not None and alive(pid):
                stop_process_tree(pid, 5)


def log_of(control: EngineControl) -> str:
    return Path(str(control.host.engine.log_file)).read_text(errors="replace")


def test_a_unit_stopped_on_every_node_then_started_head_first_serves_again(
    unit: tuple[EngineControl, EngineControl],
) -> None:
    head, other = unit
    assert "TP group ready: 2 ranks on 2 node(s) joined" in log_of(head)
    # the other node answers /health (a dummy) but is no head: the group check says so
    with pytest.raises(EngineError) as caught:
        other.wait_ready(timeout=30, group=GROUP)
    assert isinstance(caught.value.__cause__, RemoteOperationError)
    assert caught.value.__cause__.code == "group-mismatch"

    stopped = [head.stop(), other.stop()]  # the head first, as SGLang's shutdown goes
    for result in stopped:
        assert result["strategy"] == "command"
        assert not [pid for pid in result["stopped"] if alive(pid)]
    assert stopped[0]["stopped"]  # the head ran; the other node may have ended with it

    started = head.start()
    other.start()
    ready = head.wait_ready(started, timeout=READY, group=GROUP)
    assert ready.polls >= 1
    smoke = head.smoke(log_offset=started["log_offset"], pid=started["pid"])
    assert smoke.ok, smoke.summary()
    info = http_request("GET", f"{head.host.engine.url}/server_info").json()
    assert "--nnodes 2 --node-rank 0" in info["launch_command"]


def test_the_other_node_restarted_alone_leaves_a_head_that_never_becomes_ready(
    unit: tuple[EngineControl, EngineControl],
) -> None:
    head, other = unit
    assert other.stop()["stopped"]
    other.start()  # the same command again, alone: nobody to rejoin
    with pytest.raises(EngineError) as caught:
        head.wait_ready(timeout=READY, group=GROUP)
    cause = caught.value.__cause__
    assert isinstance(cause, RemoteOperationError)
    assert cause.code in ("engine-not-running", "engine-exited", "not-ready"), cause
