"""Inventory units: the hosts that form one multi-node server, in TOML and Ansible YAML; what
`inventory show` prints of them; `--hosts UNIT`; and bad units refused at their line (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opspatch.config.inventory import (
    Inventory,
    inventory_show_json,
    inventory_show_table,
    parse_inventory,
    select_hosts,
)
from opspatch.config.lookup import Workspace
from opspatch.core.host import Unit
from opspatch.errors import SelectionError, SpecError
from tests.fleetkit import FLEET

pytestmark = pytest.mark.pure


YAML_FLEET = """all:
  vars:
    ansible_connection: local
    opspatch_units:
      kimi-a:
        hosts: [a0, a1]
      kimi-b:
        hosts: [b0, b1]
        head: b1
  hosts:
    a0:
    a1:
    b0:
    b1:
    solo:
"""


def toml(text: str) -> Inventory:
    return parse_inventory(text, "/ws/inventories/fleet.toml")


def refused(text: str, path: str = "/ws/inventories/fleet.toml") -> SpecError:
    with pytest.raises(SpecError) as caught:
        parse_inventory(text, path)
    assert caught.value.exit_code == 2
    return caught.value


@pytest.mark.parametrize(("text", "path"), [(FLEET, "fleet.toml"), (YAML_FLEET, "fleet.yml")])
def test_units_group_hosts_in_rank_order_with_the_head_first(text: str, path: str) -> None:
    inventory = parse_inventory(text, f"/ws/inventories/{path}")
    assert inventory.units == {
        "kimi-a": Unit("kimi-a", ("a0", "a1")),
        # head names another host: it is rank 0, the others follow as written
        "kimi-b": Unit("kimi-b", ("b1", "b0")),
    }
    assert inventory.units["kimi-b"].head == "b1"
    assert inventory.host("b0").unit == inventory.units["kimi-b"]
    assert inventory.host("b0").unit is not None
    assert inventory.units["kimi-b"].rank_of("b0") == 1
    assert inventory.host("solo").unit is None  # a server by itself
    assert inventory.host_names == ("a0", "a1", "b0", "b1", "solo")  # file order kept


def test_an_inventory_without_units_reads_as_before() -> None:
    inventory = toml('[hosts.a]\naddress = "a.b"\n')
    assert inventory.units == {}
    assert inventory.host("a").unit is None
    table = inventory_show_table(inventory.hosts)
    assert "unit" not in table.columns and table.units == ()
    assert inventory_show_json(inventory.hosts)["units"] == []


def test_a_units_name_selects_its_hosts_head_first() -> None:
    inventory = toml(FLEET)
    assert [h.name for h in select_hosts(inventory, "kimi-b")] == ["b1", "b0"]
    assert [h.name for h in select_hosts(inventory, "kimi-*")] == ["a0", "a1", "b0", "b1"]
    assert [h.name for h in select_hosts(inventory, "kimi-a,solo")] == ["a0", "a1", "solo"]
    with pytest.raises(SelectionError) as caught:
        select_hosts(inventory, "kimi-c")
    assert "is not a host, group or unit" in caught.value.message
    assert caught.value.hint is not None and "kimi-a" in caught.value.hint


def test_a_units_name_selects_over_a_workspace(tmp_path: Path) -> None:
    folder = tmp_path / "ws" / "inventories"
    folder.mkdir(parents=True)
    (folder / "lab.toml").write_text(FLEET)
    workspace = Workspace(root=tmp_path / "ws", state_dir=tmp_path / "state")
    assert [h.name for h in workspace.hosts("kimi-a")] == ["a0", "a1"]
    assert [h.name for h in workspace.hosts("lab:kimi-b")] == ["b1", "b0"]


def test_inventory_show_names_each_hosts_unit_and_lists_the_units() -> None:
    inventory = toml(FLEET)
    hosts = select_hosts(inventory, "kimi-b,a1,solo")
    table = inventory_show_table(hosts, selection="kimi-b,a1,solo")
    assert table.columns[-1] == "unit"
    units = {row[0]: row[-1] for row in table.rows}
    assert units == {
        "b1": "kimi-b rank 0 (head)",
        "b0": "kimi-b rank 1",
        "a1": "kimi-a rank 1",
        "solo": "-",
    }
    assert table.units == (
        "unit kimi-b: 2 nodes, head b1 (ranks: b1, b0)",
        "unit kimi-a: 2 nodes, head a0 (ranks: a0, a1); not selected: a0",
    )
    document = json.loads(json.dumps(inventory_show_json(hosts)))
    assert document["hosts"][0]["unit"] == {"name": "kimi-b", "rank": 0, "head": "b1"}
    assert document["hosts"][3]["unit"] is None
    assert document["units"][1] == {
        "name": "kimi-a",
        "head": "a0",
        "nodes": 2,
        "hosts": ["a0", "a1"],
        "selected": ["a1"],
    }


# ---------------------------------------------------------------------------------------------
# bad units: one message naming file, line and field, and what to do

BASE = '[defaults]\ntransport = "local"\n[hosts.a0]\n[hosts.a1]\n[hosts.b0]\n'


def test_a_host_in_two_units_is_refused_at_its_second_listing() -> None:
    error = refused(BASE + '[units.u1]\nhosts = ["a0", "a1"]\n[units.u2]\nhosts = ["b0", "a1"]\n')
    assert str(error.location) == "/ws/inventories/fleet.toml:9: units.u2.hosts[1]"
    assert error.message.endswith("host 'a1' is in unit 'u1' and in unit 'u2'")
    assert error.hint is not None and "remove it from one of the units" in error.hint


def test_a_unit_naming_a_host_the_inventory_lacks_is_refused() -> None:
    error = refused(BASE + '[units.u1]\nhosts = ["a0", "a11"]\n')
    assert str(error.location) == "/ws/inventories/fleet.toml:7: units.u1.hosts[1]"
    assert "unit 'u1' lists host 'a11', which the inventory does not have" in error.message
    assert error.hint is not None and "'a1'" in error.hint  # the nearest name
    assert "add host 'a11' to the inventory, or remove it from the unit" in error.hint


def test_a_head_not_among_the_units_hosts_is_refused() -> None:
    error = refused(BASE + '[units.u1]\nhosts = ["a0", "a1"]\nhead = "b0"\n')
    assert str(error.location) == "/ws/inventories/fleet.toml:8: units.u1.head"
    assert "names head 'b0', which is not one of its hosts (a0, a1)" in error.message
    assert error.hint is not None and "--node-rank 0" in error.hint


def test_an_empty_unit_is_refused() -> None:
    error = refused(BASE + "[units.u1]\nhosts = []\n")
    assert str(error.location) == "/ws/inventories/fleet.toml:7: units.u1.hosts"
    assert error.message.endswith("unit 'u1' has no host")
    assert error.hint is not None and "remove the unit" in error.hint


@pytest.mark.parametrize(
    ("tail", "said"),
    [
        ('[units.u1]\nhosts = ["a0", "a0"]\n', "unit 'u1' lists host 'a0' twice"),
        ('[units.a1]\nhosts = ["a0"]\n', "unit 'a1' has the same name as a host"),
        ('[groups.g]\nhosts = ["a0"]\n[units.g]\nhosts = ["a1"]\n', "the same name as a group"),
        ('[units.all]\nhosts = ["a0"]\n', "'all' is reserved"),
        ('[units.fleet]\nhosts = ["a0"]\n', "unit 'fleet' has the inventory's own name"),
        ('[units.u1]\nhosts = ["a0"]\nnodes = 2\n', "nodes"),  # unknown key, as anywhere
    ],
)
def test_other_bad_units_are_refused(tail: str, said: str) -> None:
    assert said in refused(BASE + tail).message


def test_ansible_units_errors_name_the_yaml_line() -> None:
    text = YAML_FLEET.replace("hosts: [b0, b1]", "hosts: [b0, a1]")
    error = refused(text, "/ws/inventories/fleet.yml")
    assert error.location.line == 8
    assert error.location.field == "all.vars.opspatch_units.kimi-b.hosts[1]"
    assert "host 'a1' is in unit 'kimi-a' and in unit 'kimi-b'" in error.message


def test_ansible_units_belong_in_all_vars_only() -> None:
    text = "all:\n  children:\n    g:\n      vars:\n        opspatch_units: {}\n      hosts:\n        a:\n"
    error = refused(text, "/ws/inventories/fleet.yml")
    assert error.location.line == 5
    assert "opspatch_units can only be set in all.vars" in error.message


ROUTED = 'router = { url = "http://router:30000" }\n'


def test_a_router_on_the_head_of_a_unit_is_kept() -> None:
    text = (
        BASE.replace("[hosts.a0]\n", "[hosts.a0]\n" + ROUTED) + '[units.u1]\nhosts = ["a0", "a1"]\n'
    )
    inventory = toml(text)
    assert inventory.host("a0").router is not None
    assert inventory.host("a1").router is None


@pytest.mark.parametrize(
    ("where", "field", "line"),
    [
        ("[hosts.a1]\n", "hosts.a1.router", 5),  # on the node itself
        ("[defaults]\n", "defaults.router", 2),  # every host inherits it
    ],
)
def test_a_router_on_a_unit_node_that_is_not_its_head_is_refused_where_it_is_written(
    where: str, field: str, line: int
) -> None:
    text = BASE.replace(where, where + ROUTED) + '[units.u1]\nhosts = ["a0", "a1"]\n'
    error = refused(text)
    assert str(error.location) == f"/ws/inventories/fleet.toml:{line}: {field}"
    assert "host 'a1' is node rank 1 of unit 'u1' and has a router" in error.message
    assert "only a unit's head is a router worker" in error.message
    assert error.hint is not None and "give the router to the head 'a0' only" in error.hint


def test_a_router_from_a_group_is_refused_at_the_group() -> None:
    text = (
        BASE + '[groups.g]\nhosts = ["a0", "a1"]\n' + ROUTED + '[units.u1]\nhosts = ["a1", "a0"]\n'
    )
    error = refused(text)
    assert str(error.location) == "/ws/inventories/fleet.toml:8: groups.g.router"
    assert "host 'a0' is node rank 1 of unit 'u1'" in error.message
