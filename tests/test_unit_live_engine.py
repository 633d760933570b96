"""`apply --live` over a unit, on the stand-in's real two-node server (TP=2 on each node, one
gloo group of four ranks) over sshd, opspatch's plugin enabled on both nodes and loaded: the
incident's unit gets eagle-init-guard live through the head's entry rank, whose broadcast
reaches the other node's ranks (each taking its own node's copy of the file); every rank on
both nodes reads the fix back, the first decode passes and no pid changed on either node. A
rank on the other node that refuses a take: every rank reverted, the files restored on both
nodes, both `rolled-back`, still no restart.

The refusing rank is a fault written into the other node's installed fix runtime: TP rank 3
refuses every take while a marker file lies beside the runtime.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opspatch.hosts import livedist
from opspatch.hosts.agent.live import base_dir
from opspatch.hosts.liveplugin import wire
from tests.enginekit import tree_of
from tests.fleetkit import SandboxFleet
from tests.patchkit import _test_patch
from tests.unitkit import HEAD, NODE, two_node_unit

pytestmark = [pytest.mark.engine, pytest.mark.ssh]

UNIT = "sandbox-ssh:unit-01"
THRESHOLD = "EAGLEWorkerV2.spec_disable_batch_threshold"
DEFINITIONS = [(THRESHOLD, "class-attribute"), ("EAGLEWorkerV2.__init__", "method")]
RANKS = {HEAD: ("scheduler-tp0", "scheduler-tp1"), NODE: ("scheduler-tp2", "scheduler-tp3")}
MARKER = "refuse-take"
TAKE = "def take(request: dict[str, Any]) -> dict[str, Any]:\n"


def refusing_runtime() -> bytes:
    """The real runtime with a fault: TP rank 3 refuses every take while MARKER exists."""
    real = livedist.plugin_sources()["opspatch_live/fixes.py"].decode()
    assert TAKE in real
    return real.replace(
        TAKE,
        TAKE + "    from . import boundary\n"
        f"    marker = os.path.join(os.path.dirname(__file__), {MARKER!r})\n"
        "    if boundary.STATE.rank == 3 and os.path.exists(marker):\n"
        '        return _refused(TAKE_FAILED, "this rank was told to refuse")\n',
        1,
    ).encode()


def site_packages(fleet: SandboxFleet, name: str) -> Path:
    return fleet.file(name).parents[3]  # sglang/srt/speculative/eagle_worker_v2.py


def say_live(fleet: SandboxFleet) -> None:
    """`live = true` in both sandbox inventories (`sandbox up` rewrites them)."""
    for inventory in ("sandbox", "sandbox-ssh"):
        path = fleet.state / "inventories" / f"{inventory}.toml"
        text = path.read_text()
        if "\nlive = true\n" not in text:
            path.write_text(text.replace("[defaults]\n", "[defaults]\nlive = true\n", 1))


@pytest.fixture(scope="module")
def unit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxFleet]:
    """The unit with the plugin enabled on both nodes (the fault on the other node's rank 3,
    off), restarted by the sandbox so that every process loads it."""
    with two_node_unit(tmp_path_factory) as fleet:
        say_live(fleet)
        enabled = fleet.opspatch("live", "enable", "--hosts", UNIT, "--yes", "--json")
        assert enabled.code == 0, enabled.stdout + enabled.stderr
        (site_packages(fleet, NODE) / "opspatch_live" / "fixes.py").write_bytes(refusing_runtime())
        down = fleet.opspatch("sandbox", "down", timeout=120)
        assert down.code == 0, down.stdout + down.stderr
        fleet.up()
        say_live(fleet)
        yield fleet


def sockets(fleet: SandboxFleet, name: str) -> dict[str, Path]:
    """The node's engine's live sockets, by process (`scheduler-tp2`)."""
    pid = fleet.pid(name)
    assert pid is not None, name
    tree = {str(p) for p in tree_of(pid)}
    base = Path(base_dir({}, os.getuid()))  # the engine's environment names none
    (folder,) = [f for f in base.iterdir() if f.name in tree]
    return {p.name.removesuffix(".sock"): p for p in folder.glob("*.sock")}


def held(fleet: SandboxFleet, name: str) -> dict[str, list[dict[str, Any]]]:
    """What each scheduler rank of the node holds, read from its own socket."""
    found = sockets(fleet, name)
    return {rank: wire.ask(str(found[rank]), {"op": "list"})["took"] for rank in RANKS[name]}


def outcomes(doc: dict[str, Any]) -> dict[str, str]:
    return {h["host"]: h["outcome"] for h in doc["hosts"]}


def steps(doc: dict[str, Any]) -> dict[str, list[str]]:
    return {h["host"]: [s["step"] for s in h["steps"]] for h in doc["hosts"]}


def details(doc: dict[str, Any], host: str, step: str) -> list[str]:
    found = next(h for h in doc["hosts"] if h["host"] == host)
    return [s["detail"] or "" for s in found["steps"] if s["step"] == step]


def test_the_incidents_unit_is_fixed_live_on_every_rank_of_both_nodes(unit: SandboxFleet) -> None:
    pre = {n: unit.sha(n) for n in (HEAD, NODE)}
    pids = {n: set(tree_of(unit.pid(n) or 0)) for n in (HEAD, NODE)}
    run = unit.opspatch(
        "apply", "eagle-init-guard", "--hosts", UNIT, "--live", "--yes", "--json", timeout=600
    )
    assert run.code == 0, run.stdout + run.stderr
    doc = run.json()
    assert outcomes(doc) == {HEAD: "applied", NODE: "applied"}
    done = steps(doc)
    for name in (HEAD, NODE):
        assert not {"stop", "start", "restart", "drain"} & set(done[name]), done[name]
        assert done[name][-3:] == ["live", "live-readback", "smoke"], done[name]
    took = details(doc, HEAD, "live")[-1]
    assert all(f"scheduler-tp{r}" in took for r in range(4)), took  # the broadcast reached all
    for name in (HEAD, NODE):
        readback = details(doc, name, "live-readback")[-1]
        assert all(rank in readback for rank in RANKS[name]), readback
    assert {n: set(tree_of(unit.pid(n) or 0)) for n in (HEAD, NODE)} == pids  # no pid changed
    assert unit.sha(HEAD) == unit.sha(NODE) != pre[HEAD]  # the next restart keeps it
    for name in (HEAD, NODE):
        for rank, entries in held(unit, name).items():
            assert [(e["name"], e["kind"]) for e in entries] == DEFINITIONS, (name, rank)
            assert entries[0]["value"] == "0" and entries[1]["code_sha256"], entries
    out = unit.generate(HEAD, tokens=8)  # the decode that crashed the incident's server
    assert out is not None and "text" in out, out
    status = unit.opspatch("status", "--hosts", UNIT, "--patch", "eagle-init-guard", "--json")
    assert status.code == 0, status.stdout + status.stderr
    assert {s["state"] for s in status.json()["status"]} == {"applied"}


def test_a_rank_on_the_other_node_that_refuses_reverts_every_rank_on_both_nodes(
    unit: SandboxFleet,
) -> None:
    unit.write_patch("harmless", _test_patch("harmless", "_OPSPATCH_TEST_MARK = 1", "harmless"))
    pre = {n: unit.sha(n) for n in (HEAD, NODE)}
    pids = {n: set(tree_of(unit.pid(n) or 0)) for n in (HEAD, NODE)}
    marker = site_packages(unit, NODE) / "opspatch_live" / MARKER
    marker.touch()
    try:
        run = unit.opspatch(
            "apply", "harmless", "--hosts", UNIT, "--live", "--yes", "--json", timeout=600
        )
    finally:
        marker.unlink()
    assert run.code == 1, run.stdout + run.stderr
    doc = run.json()
    assert outcomes(doc) == {HEAD: "rolled-back", NODE: "rolled-back"}
    errors = {h["host"]: h["error"] for h in doc["hosts"]}
    assert errors[HEAD] == errors[NODE], errors  # one cause, said the same on both nodes
    assert "scheduler-tp3" in errors[HEAD] and "told to refuse" in errors[HEAD], errors
    done = steps(doc)
    for name in (HEAD, NODE):
        assert not {"stop", "start", "restart-after-restore"} & set(done[name]), done[name]
        assert done[name][-3:] == ["live-revert", "live-readback", "restore"], done[name]
    assert {n: unit.sha(n) for n in (HEAD, NODE)} == pre  # byte for byte, on both nodes
    assert {n: set(tree_of(unit.pid(n) or 0)) for n in (HEAD, NODE)} == pids
    for name in (HEAD, NODE):  # every rank reverted; the fix before it still held
        for rank, entries in held(unit, name).items():
            assert {e["fix_id"] for e in entries} == {"eagle-init-guard"}, (name, rank, entries)
    out = unit.generate(HEAD, tokens=8)
    assert out is not None and "text" in out, out
