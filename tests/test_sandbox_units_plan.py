"""`sandbox up --units U --nodes N --tp T`, planned (pure): the units over the hosts, each node's
multi-node arguments, the inventories declaring the units, shapes refused, and a unit's status
read from its nodes'."""

from __future__ import annotations

from pathlib import Path

import pytest

from opspatch.config.inventory import parse_inventory
from opspatch.core.host import CommandRestart, Unit
from opspatch.errors import InputError
from opspatch.sandbox.layout import SandboxLayout
from opspatch.sandbox.manifest import (
    HostRecord,
    Manifest,
    UnitRecord,
    render_inventory,
    save_manifest,
)
from opspatch.sandbox.reinstall import sandbox_reinstall
from opspatch.sandbox.status import HostStatus, unit_statuses
from opspatch.sandbox.units import UnitShape, partly_running, planned_units

pytestmark = pytest.mark.pure

LAYOUT = SandboxLayout(Path("/state"))


def manifest_of(units: tuple[UnitRecord, ...]) -> Manifest:
    hosts = tuple(HostRecord(h, 30000 + i) for i, h in enumerate(h for u in units for h in u.hosts))
    return Manifest(hosts, units=units)


def test_units_take_the_hosts_in_order_head_first() -> None:
    units = planned_units(None, UnitShape(2, 3, tp=2), None)
    assert units == (
        UnitRecord("unit-01", ("sandbox-01", "sandbox-02", "sandbox-03"), 0, 2),
        UnitRecord("unit-02", ("sandbox-04", "sandbox-05", "sandbox-06"), 0, 2),
    )
    assert units[1].head == "sandbox-04" and units[1].tp_size == 6


def test_every_node_gets_the_same_arguments_but_its_rank() -> None:
    unit = UnitRecord("unit-01", ("sandbox-01", "sandbox-02"), 41000, tp=2)
    assert unit.node_args("sandbox-02") == (
        "--tp-size",
        "4",
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--dist-init-addr",
        "127.0.0.1:41000",
    )
    assert unit.node_args("sandbox-01")[5] == "0"


def test_the_inventories_declare_the_units_and_start_each_node_with_its_rank() -> None:
    unit = UnitRecord("unit-01", ("sandbox-01", "sandbox-02"), 41000)
    manifest = manifest_of((unit,))
    inventory = parse_inventory(
        render_inventory(LAYOUT, manifest, over_ssh=False), "/state/inventories/sandbox.toml"
    )
    assert inventory.units == {"unit-01": Unit("unit-01", ("sandbox-01", "sandbox-02"))}
    restart = inventory.host("sandbox-02").engine.restart
    assert isinstance(restart, CommandRestart)
    assert restart.start.endswith(
        "--tp-size 2 --nnodes 2 --node-rank 1 --dist-init-addr 127.0.0.1:41000"
    )
    # the canary is the first server: every node of the first unit
    assert inventory.groups["canary"].members == ("sandbox-01", "sandbox-02")


def test_a_sandbox_without_units_renders_as_before() -> None:
    manifest = Manifest((HostRecord("sandbox-01", 30000), HostRecord("sandbox-02", 30001)))
    text = render_inventory(LAYOUT, manifest, over_ssh=False)
    assert "[units." not in text and "--nnodes" not in text
    assert parse_inventory(text, "/s/sandbox.toml").groups["canary"].members == ("sandbox-01",)


def test_a_manifest_keeps_its_units() -> None:
    manifest = manifest_of((UnitRecord("unit-01", ("sandbox-01", "sandbox-02"), 41000, 2),))
    assert Manifest.from_json(manifest.to_json(), Path("/m")) == manifest
    older = manifest.to_json()
    del older["units"]  # a manifest written before units were recorded
    assert Manifest.from_json(older, Path("/m")).units == ()


@pytest.mark.parametrize(
    ("current", "shape", "count", "said"),
    [
        (None, UnitShape(1, 2), 2, "--count does not go with --units"),
        (None, UnitShape(0, 2), None, "--units must be at least 1"),
        (None, UnitShape(1, 2, tp=0), None, "--tp must be at least 1"),
        (None, UnitShape(9, 4), None, "is 36 hosts; a sandbox holds at most 32"),
        (
            Manifest((HostRecord("sandbox-01", 1),)),
            UnitShape(1, 2),
            None,
            "the sandbox is 1 single-node host; `up --units 1 --nodes 2 --tp 1` would not",
        ),
        (
            manifest_of((UnitRecord("unit-01", ("sandbox-01", "sandbox-02"), 4),)),
            UnitShape(1, 3),
            None,
            "the sandbox is --units 1 --nodes 2 --tp 1; `up --units 1 --nodes 3 --tp 1`",
        ),
        (
            manifest_of((UnitRecord("unit-01", ("sandbox-01", "sandbox-02"), 4),)),
            None,
            3,
            "(2 hosts); `up --count 3` would not reshape it",
        ),
    ],
)
def test_shapes_that_do_not_fit_are_refused(
    current: Manifest | None, shape: UnitShape | None, count: int | None, said: str
) -> None:
    with pytest.raises(InputError) as caught:
        planned_units(current, shape, count)
    assert said in caught.value.message
    assert caught.value.exit_code == 2


def test_an_existing_unit_sandbox_keeps_its_units_and_ports() -> None:
    units = (UnitRecord("unit-01", ("sandbox-01", "sandbox-02"), 41000),)
    assert planned_units(manifest_of(units), None, None) == units
    assert planned_units(manifest_of(units), UnitShape(1, 2), None) == units


def test_a_unit_partly_running_is_started_whole() -> None:
    units = (
        UnitRecord("unit-01", ("sandbox-01", "sandbox-02")),
        UnitRecord("unit-02", ("sandbox-03", "sandbox-04")),
        UnitRecord("unit-03", ("sandbox-05", "sandbox-06")),
    )
    running = {"sandbox-01", "sandbox-02", "sandbox-04"}
    assert partly_running(units, running) == [units[1]]


def node(name: str, pid: int | None, health: int | None) -> HostStatus:
    return HostStatus(name, 1, "u", pid, health, "", (), None, None, "log")


def test_a_unit_serves_only_when_its_head_does() -> None:
    unit = UnitRecord("unit-01", ("sandbox-01", "sandbox-02"), 41000)
    serving = unit_statuses([unit], [node("sandbox-01", 10, 200), node("sandbox-02", 11, 200)])
    assert serving[0].head_serves and serving[0].running == ("sandbox-01", "sandbox-02")
    # the other node's dummy /health answers 200 whatever the head does: it proves nothing
    lost = unit_statuses([unit], [node("sandbox-01", None, None), node("sandbox-02", 11, 200)])
    assert not lost[0].head_serves and lost[0].running == ("sandbox-02",)
    assert lost[0].to_json()["dist_init_addr"] == "127.0.0.1:41000"


def test_a_units_node_is_not_reinstalled_with_a_restart_of_its_own(tmp_path: Path) -> None:
    layout = SandboxLayout(tmp_path)
    save_manifest(layout, manifest_of((UnitRecord("unit-01", ("sandbox-01", "sandbox-02"), 4),)))
    with pytest.raises(InputError) as caught:
        sandbox_reinstall(layout, "sandbox-02", restart=True)
    assert caught.value.message == (
        "sandbox host sandbox-02 is a node of unit-01 (sandbox-01, sandbox-02): restarted alone "
        "it could not rejoin its server; nothing was changed"
    )
    assert caught.value.hint is not None and "restart the unit as one" in caught.value.hint
    assert not layout.host_dir("sandbox-02").exists()
