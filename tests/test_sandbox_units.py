"""`opspatch sandbox up --units 1 --nodes 2` as a user runs it (the real console script, real
stand-in engine process trees and sshds): each node its own host and process tree joined in one
TP group, the inventories declaring the unit, `status` showing it, a unit that lost a node
started again as one, and `down` leaving nothing behind."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opspatch.config.inventory import load_inventory
from opspatch.core.host import CommandRestart, Unit
from opspatch.hosts.agent.processes import stop_process_tree
from opspatch.sandbox.fleet import engine_pid, load_manifest
from opspatch.sandbox.up import engine_controls
from tests.fleetkit import (
    Sandbox,
    _tree,
    hosts_by_name,
    new_sandbox,
    require_sshd,
    running,
    wait_for,
)
from tests.standin import http_request

pytestmark = [pytest.mark.engine, pytest.mark.ssh]

NODES = ("sandbox-01", "sandbox-02")


def comms(pid: int) -> list[str]:
    names = []
    for member in _tree(pid):
        try:
            names.append(Path(f"/proc/{member}/comm").read_text().strip())
        except OSError:
            continue
    return sorted(n for n in names if n.startswith("sglang::"))


@pytest.fixture(scope="module")
def unit_sandbox(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Sandbox, dict[str, Any]]]:
    require_sshd()
    with new_sandbox(tmp_path_factory.mktemp("sandbox-unit")) as sandbox:
        yield sandbox, sandbox.up("--units", "1", "--nodes", "2", "--ssh")


def test_up_starts_each_node_as_its_own_tree_joined_in_one_server(
    unit_sandbox: tuple[Sandbox, dict[str, Any]],
) -> None:
    sandbox, report = unit_sandbox
    hosts = hosts_by_name(report)
    assert [h["outcome"] for h in hosts.values()] == ["started", "started"]
    (unit,) = report["units"]
    assert unit["name"] == "unit-01" and unit["hosts"] == list(NODES) and unit["tp"] == 1
    head, other = (hosts[name] for name in NODES)
    # one scheduler per node, ranks over both nodes; the detokenizer on the head only
    assert comms(head["pid"]) == ["sglang::detoken", "sglang::sch_TP0"]
    assert comms(other["pid"]) == ["sglang::sch_TP1"]
    # the head serves the API (no decode here: the sandbox's engines carry the incident)
    assert http_request("GET", head["url"] + "/server_info").status == 200
    # the other node serves only SGLang's dummy health endpoint
    assert http_request("GET", other["url"] + "/health").status == 200
    assert http_request("GET", other["url"] + "/server_info").status == 404


def test_both_inventories_declare_the_unit_and_start_each_node_with_its_rank(
    unit_sandbox: tuple[Sandbox, dict[str, Any]],
) -> None:
    sandbox, report = unit_sandbox
    dist_port = report["units"][0]["dist_port"]
    for name in ("sandbox", "sandbox-ssh"):
        inventory = load_inventory(sandbox.state_dir / "inventories" / f"{name}.toml")
        assert inventory.units == {"unit-01": Unit("unit-01", NODES)}
        for rank, node in enumerate(NODES):
            restart = inventory.host(node).engine.restart
            assert isinstance(restart, CommandRestart)
            assert restart.start.endswith(
                f"--tp-size 2 --nnodes 2 --node-rank {rank} --dist-init-addr 127.0.0.1:{dist_port}"
            )
    assert sandbox.inventory_host("sandbox-02", "sandbox-ssh").transport == "ssh"


def test_status_shows_the_unit_its_head_and_that_the_head_serves(
    unit_sandbox: tuple[Sandbox, dict[str, Any]],
) -> None:
    sandbox, report = unit_sandbox
    (unit,) = sandbox.status()["units"]
    assert unit["head"] == "sandbox-01" and unit["nodes"] == list(NODES)
    assert unit["running"] == list(NODES) and unit["head_serves"] is True
    table = sandbox.run("status")
    assert table.code == 0, table.stderr
    assert "unit-01: head sandbox-01 serves; nodes sandbox-01, sandbox-02 (2/2 running)" in (
        table.stdout
    )
    assert "unit-01 rank 0 (head)" in table.stdout


def test_a_unit_partly_running_is_started_again_as_one_and_down_stops_it(
    unit_sandbox: tuple[Sandbox, dict[str, Any]],
) -> None:
    sandbox, report = unit_sandbox
    layout = sandbox.layout
    head, lost = engine_pid(layout, "sandbox-01"), engine_pid(layout, "sandbox-02")
    assert head is not None and lost is not None
    stop_process_tree(lost, 10)  # the other node's engine, alone: the head loses its group
    assert wait_for(lambda: not running(head), 60)
    # the head started alone, as a lone restart would: it waits for a group that never comes
    manifest = load_manifest(layout)
    assert manifest is not None
    engine_controls(layout, manifest)["sandbox-01"].restart(step="start")
    assert engine_pid(layout, "sandbox-01") is not None
    run = sandbox.run("up", "--json")  # keeps the sandbox's units: no flag needed
    assert run.code == 0, run.stderr
    assert "unit-01: sandbox-02 not running; stopping the others, to start the unit as one" in (
        run.stderr
    )
    again = run.json()
    assert [h["outcome"] for h in again["hosts"]] == ["started", "started"]
    assert sandbox.status()["units"][0]["head_serves"] is True
    trees = [_tree(h["pid"]) for h in again["hosts"]]
    sandbox.run("down")
    assert not [pid for tree in trees for pid in tree if running(pid)]
    (unit,) = sandbox.status()["units"]
    assert unit["running"] == [] and unit["head_serves"] is False
