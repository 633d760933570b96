"""`restart` and `rollback` take a whole unit as one, over sshd, on the stand-in's real gloo group
(2 nodes, TP=2 on each): a change staged on both nodes (`apply --restart never`) is restarted
into as one server and proven through the head; then rolled back on both nodes, the unit
restarted as one, and the head's decode tells the truth about the restored code (the
incident: it crashes the unpatched engine, so both nodes are `restored-not-serving`).

One fleet for the module; the tests run in order, each from where the one before left it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fleetkit import SandboxFleet
from tests.unitkit import HEAD, NODE, two_node_unit

pytestmark = [pytest.mark.engine, pytest.mark.ssh]

UNIT = "sandbox-ssh:unit-01"


@pytest.fixture(scope="module")
def unit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxFleet]:
    with two_node_unit(tmp_path_factory) as fleet:
        yield fleet


def outcomes(doc: dict) -> dict[str, str]:  # type: ignore[type-arg]
    return {h["host"]: h["outcome"] for h in doc["hosts"]}


def steps(doc: dict) -> dict[str, list[str]]:  # type: ignore[type-arg]
    return {h["host"]: [s["step"] for s in h["steps"]] for h in doc["hosts"]}


def test_a_restart_of_a_staged_unit_restarts_and_proves_it_as_one(unit: SandboxFleet) -> None:
    pristine = unit.sha(HEAD)
    staged = unit.opspatch(
        "apply", "eagle-init-guard", "--hosts", UNIT, "--restart", "never", "--yes", "--json"
    )
    assert staged.code == 0, staged.stdout + staged.stderr
    assert outcomes(staged.json()) == {HEAD: "staged", NODE: "staged"}
    assert unit.sha(HEAD) == unit.sha(NODE) != pristine
    pids = {n: unit.pid(n) for n in (HEAD, NODE)}

    run = unit.opspatch("restart", "--hosts", UNIT, "--yes", "--json", timeout=600)
    assert run.code == 0, run.stdout + run.stderr
    doc = run.json()
    assert outcomes(doc) == {HEAD: "applied", NODE: "applied"}
    done = steps(doc)
    assert done[HEAD][-4:] == ["stop", "start", "ready", "smoke"]
    assert done[NODE][-3:] == ["stop", "start", "smoke"]  # proven through the head's decode
    assert all(unit.pid(n) not in (None, pids[n]) for n in (HEAD, NODE))  # both restarted
    out = unit.generate(HEAD, tokens=8)
    assert out is not None and "text" in out  # the patched unit serves


def test_a_rollback_of_the_unit_restores_both_nodes_and_restarts_it_as_one(
    unit: SandboxFleet,
) -> None:
    pids = {n: unit.pid(n) for n in (HEAD, NODE)}
    run = unit.opspatch(
        "rollback", "eagle-init-guard", "--hosts", UNIT, "--yes", "--json", timeout=600
    )
    assert run.code == 1, run.stdout + run.stderr  # the restored code is the incident's
    doc = run.json()
    assert outcomes(doc) == {HEAD: "restored-not-serving", NODE: "restored-not-serving"}
    assert unit.sha(HEAD) == unit.sha(NODE)
    done = steps(doc)
    assert done[HEAD][-5:] == ["restore", "stop", "start", "ready", "smoke"]
    assert done[NODE][-3:] == ["restore", "stop", "start"]  # the head's decode failed: not proven
    assert all(unit.pid(n) != pids[n] for n in (HEAD, NODE))  # both restarted, as one
    node = next(h for h in doc["hosts"] if h["host"] == NODE)
    assert "opspatch apply eagle-init-guard --hosts unit-01" in node["error"]
