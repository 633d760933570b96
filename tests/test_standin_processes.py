"""The stand-in's process model is SGLang's: a main process (HTTP server, tokenizer manager), one
spawned scheduler process per TP rank of the node, a spawned detokenizer; tensor parallelism over
a real gloo group (TP=T decodes exactly what TP=1 does), multi-node servers whose nodes are
separate process trees, and SGLang's behaviour when a node is lost.

Engines are real process trees on free loopback ports (tests/standin.py), stopped by pid.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opspatch.core.host import Host
from opspatch.hosts.agent.processes import alive, stop_process_tree
from tests.enginekit import children_of, comm, tree_of
from tests.standin import (
    EngineProcess,
    StandinHost,
    free_port,
    http_request,
    launch_engine,
    make_host,
    running_engine,
)

pytestmark = pytest.mark.engine

NO_GRAPHS = ("--disable-cuda-graph",)
PROMPTS = ("Hello", "The capital city of France is", "abc xyz", "Once upon a time")
GREEDY = {"max_new_tokens": 24, "temperature": 0}
SAMPLED = {"max_new_tokens": 24, "temperature": 1.0, "sampling_seed": 7}


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")


def maps_torch(pid: int) -> bool:
    """Whether the process has torch's C++ library loaded (it imported torch)."""
    return "libtorch_cpu" in Path(f"/proc/{pid}/maps").read_text(errors="replace")


def decode_all(engine_url: str, params: dict[str, Any]) -> list[list[int]]:
    outputs = []
    for prompt in PROMPTS:
        reply = http_request(
            "POST", engine_url + "/generate", {"text": prompt, "sampling_params": params}
        )
        assert reply.status == 200, reply.body
        outputs.append(reply.json()["output_ids"])
    return outputs


def logprobs_all(engine_url: str) -> list[dict[str, Any]]:
    """Greedy logprobs and top logprobs for PROMPTS (computed from the all-reduced logits)."""
    outputs = []
    for prompt in PROMPTS:
        body = {
            "text": prompt,
            "sampling_params": GREEDY,
            "return_logprob": True,
            "top_logprobs_num": 3,
        }
        reply = http_request("POST", engine_url + "/generate", body)
        assert reply.status == 200, reply.body
        meta = reply.json()["meta_info"]
        outputs.append({key: meta[key] for key in ("output_token_logprobs", "output_top_logprobs")})
    return outputs


def port_open(port: int) -> bool:
    try:
        http_request("GET", f"http://127.0.0.1:{port}/health", timeout=5)
    except OSError:
        return False
    return True


def wait_for(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} after {timeout} s")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> StandinHost:
    return make_host(tmp_path_factory.mktemp("procs-host"))


@pytest.fixture(scope="module")
def node_hosts(tmp_path_factory: pytest.TempPathFactory) -> tuple[StandinHost, StandinHost]:
    return (
        make_host(tmp_path_factory.mktemp("node0")),
        make_host(tmp_path_factory.mktemp("node1")),
    )


@pytest.fixture(scope="module")
def tp1_outputs(host: StandinHost) -> dict[str, Any]:
    """What a TP=1 server decodes for PROMPTS: greedy with and without speculation, seeded
    sampling with speculation, greedy logprobs."""
    with running_engine(host, NO_GRAPHS, log_name="tp1.log") as engine:
        outputs: dict[str, Any] = {
            "greedy": decode_all(engine.url, GREEDY),
            "sampled": decode_all(engine.url, SAMPLED),
            "logprobs": logprobs_all(engine.url),
        }
    with running_engine(
        host, (*NO_GRAPHS, "--speculative-algorithm", "NONE"), log_name="tp1-plain.log"
    ) as engine:
        outputs["plain"] = decode_all(engine.url, GREEDY)
    return outputs


def test_tp2_decodes_exactly_what_tp1_decodes(
    host: StandinHost, tp1_outputs: dict[str, Any]
) -> None:
    assert tp1_outputs["greedy"] == tp1_outputs["plain"]  # greedy speculation is lossless
    with running_engine(host, (*NO_GRAPHS, "--tp-size", "2"), log_name="tp2.log") as engine:
        reply = engine.post("/generate", {"text": PROMPTS[1], "sampling_params": GREEDY})
        assert reply.json()["meta_info"]["spec_verify_ct"] > 0  # really speculative
        assert decode_all(engine.url, GREEDY) == tp1_outputs["greedy"]
        assert decode_all(engine.url, SAMPLED) == tp1_outputs["sampled"]
        assert logprobs_all(engine.url) == tp1_outputs["logprobs"]
        log = engine.log_text()
    assert "[" in log and " TP1] Load weight end" in log and " TP0] Load weight end" in log
    assert "Init torch distributed begin. backend=gloo, world_size=2" in log


def test_tp2_without_speculation_decodes_what_tp1_does(
    host: StandinHost, tp1_outputs: dict[str, Any]
) -> None:
    args = (*NO_GRAPHS, "--tp-size", "2", "--speculative-algorithm", "NONE")
    with running_engine(host, args, log_name="tp2-plain.log") as engine:
        assert decode_all(engine.url, GREEDY) == tp1_outputs["plain"]


def test_the_process_tree_is_sglangs_and_stopping_it_leaves_nothing(host: StandinHost) -> None:
    engine = launch_engine(host, (*NO_GRAPHS, "--tp-size", "2"), log_name="tree.log")
    try:
        engine.wait_ready()
        children = children_of(engine.pid)
        names = sorted(comm(pid) for pid in children)
        # multiprocessing's resource tracker is the one other child spawn brings.
        assert [n for n in names if n.startswith("sglang::")] == [
            "sglang::detoken",
            "sglang::sch_TP0",
            "sglang::sch_TP1",
        ], names
        by_name = {comm(pid): pid for pid in children}
        for pid in (by_name["sglang::sch_TP0"], by_name["sglang::detoken"]):
            assert "--multiprocessing-fork" in cmdline(pid)  # spawned, not forked
        assert maps_torch(by_name["sglang::sch_TP0"]) and maps_torch(by_name["sglang::sch_TP1"])
        assert not maps_torch(engine.pid), "the main process must not load torch"
        assert not maps_torch(by_name["sglang::detoken"]), "the detokenizer must not load torch"
        tree = tree_of(engine.pid)
        assert len(tree) >= 4
    finally:
        stopped = stop_process_tree(engine.pid, 10)  # what the command restart strategy does
    engine.popen.wait(10)
    assert set(tree) <= set(stopped) | {engine.pid}
    assert not [pid for pid in tree if alive(pid)]
    assert not port_open(engine.port)


def test_a_server_killed_outright_leaves_no_child_behind(host: StandinHost) -> None:
    engine = launch_engine(host, (*NO_GRAPHS, "--tp-size", "2"), log_name="kill9.log")
    try:
        engine.wait_ready()
        tree = tree_of(engine.pid)
        assert len(tree) >= 4  # main, two schedulers, the detokenizer
        os.kill(engine.pid, signal.SIGKILL)  # no handler runs: the children must end themselves
        engine.popen.wait(10)
        wait_for(lambda: not [pid for pid in tree if alive(pid)], 30, "every child gone")
    finally:
        engine.stop()


def test_a_command_restart_replaces_every_process_of_the_tree(
    host: StandinHost, tmp_path: Path
) -> None:
    from tests.enginekit import _stop, command_host, control

    unit_host: Host = command_host(host.python, tmp_path, extra="--tp-size 2 --disable-cuda-graph")
    ctl = control(unit_host)
    try:
        first = ctl.restart()
        ctl.wait_ready(first)
        assert first["pid"] is not None
        old_tree = tree_of(first["pid"])
        assert len(old_tree) >= 5  # the shell, main, two schedulers, the detokenizer
        second = ctl.restart()
        assert not [pid for pid in old_tree if alive(pid)]
        ctl.wait_ready(second)
        assert ctl.smoke(log_offset=second["log_offset"], pid=second["pid"]).ok
    finally:
        _stop(unit_host)


# -- two nodes, TP=2 on each ----------------------------------------------------------------


def node_args(rank: int, dist_port: int, *extra: str) -> tuple[str, ...]:
    return (
        *NO_GRAPHS,
        "--tp-size",
        "4",
        "--nnodes",
        "2",
        "--node-rank",
        str(rank),
        "--dist-init-addr",
        f"127.0.0.1:{dist_port}",
        *extra,
    )


@contextlib.contextmanager
def two_nodes(
    hosts: tuple[StandinHost, StandinHost], *extra: str, name: str, dist_port: int = 0
) -> Iterator[tuple[EngineProcess, EngineProcess]]:
    dist_port = dist_port or free_port()
    head = launch_engine(hosts[0], node_args(0, dist_port, *extra), log_name=f"{name}-0.log")
    other: EngineProcess | None = None
    try:
        # The head waits in the group's rendezvous: its port stays closed, it is not ready.
        head.wait_for_log("Init torch distributed begin", timeout=120)
        time.sleep(2)
        assert not port_open(head.port)
        assert "Uvicorn running" not in head.log_text()
        other = launch_engine(hosts[1], node_args(1, dist_port, *extra), log_name=f"{name}-1.log")
        head.wait_ready(timeout=120)
        other.wait_for_log("Dummy health check server running", timeout=60)
        yield head, other
    finally:
        for engine in (other, head):
            if engine is not None:
                stop_process_tree(engine.pid, 10)
                engine.stop()


def test_two_nodes_decode_through_the_head_exactly_as_one(
    node_hosts: tuple[StandinHost, StandinHost], tp1_outputs: dict[str, list[list[int]]]
) -> None:
    with two_nodes(node_hosts, name="decode") as (head, other):
        assert decode_all(head.url, GREEDY) == tp1_outputs["greedy"]
        assert head.get("/health").status == 200
        # The other node serves only SGLang's dummy health endpoint.
        assert other.get("/health").status == 200
        assert other.post("/generate", {"text": "x"}).status == 404
        assert other.get("/server_info").status == 404
        names = sorted(comm(pid) for pid in children_of(other.pid))
        assert [n for n in names if n.startswith("sglang::")] == [
            "sglang::sch_TP2",
            "sglang::sch_TP3",
        ]
        assert " TP3] Load weight end" in other.log_text()
        assert "TP group ready: 4 ranks on 2 node(s) joined" in head.log_text()


def test_losing_a_node_ends_the_head_and_a_node_restarted_alone_never_serves(
    node_hosts: tuple[StandinHost, StandinHost],
) -> None:
    timeouts = ("--dist-timeout", "10", "--watchdog-timeout", "5")
    dist_port = free_port()
    with two_nodes(node_hosts, *timeouts, name="lose", dist_port=dist_port) as (head, other):
        stop_process_tree(other.pid, 10)  # the other node's engine stopped alone
        assert head.wait_exit(timeout=60) != 0
        assert "Scheduler hit an exception" in head.log_text()
        # Started again alone, with the same command: nobody to join, it never serves.
        again = launch_engine(
            node_hosts[1], node_args(1, dist_port, *timeouts), log_name="again.log"
        )
        try:
            again_status = again.wait_exit(timeout=120)
            assert again_status != 0
            assert "Dummy health check server running" not in again.log_text()
            assert not port_open(again.port)
            assert not port_open(head.port)
        finally:
            again.stop()


def test_a_silently_lost_node_ends_the_head_through_the_watchdog(
    node_hosts: tuple[StandinHost, StandinHost],
) -> None:
    # The collective timeout is long: the watchdog is what ends the head.
    with two_nodes(
        node_hosts, "--dist-timeout", "600", "--watchdog-timeout", "4", name="silent"
    ) as (head, other):
        frozen = tree_of(other.pid)
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)  # the node hangs, alive, its sockets open
        try:
            errors: list[BaseException] = []

            def decode() -> None:
                try:
                    head.post(
                        "/generate", {"text": "Hello", "sampling_params": GREEDY}, timeout=120
                    )
                except BaseException as error:  # noqa: BLE001 - the dropped connection expected
                    errors.append(error)

            client = threading.Thread(target=decode)
            client.start()
            assert head.wait_exit(timeout=120) != 0
            client.join(30)
            assert errors and isinstance(errors[0], ConnectionError)
            assert "Scheduler watchdog timeout (self.watchdog_timeout=4" in head.log_text()
            assert "SIGQUIT received" in head.log_text()
        finally:
            for pid in frozen:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
