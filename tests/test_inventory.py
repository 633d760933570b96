"""Inventories: parsing (TOML and Ansible YAML), the merge order, selection, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opspatch.config.inventory import (
    INVENTORY_COLUMNS,
    EngineLayer,
    Inventory,
    SettingsLayer,
    inventory_show_json,
    inventory_show_table,
    load_inventory,
    merge_layers,
    parse_inventory,
    select_hosts,
)
from opspatch.config.lookup import Workspace
from opspatch.core.host import CommandRestart, JumpHost, SupervisorRestart, SystemdRestart
from opspatch.errors import SelectionError, SpecError

pytestmark = pytest.mark.pure

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "inventories"


def toml(text: str, name: str = "fleet") -> Inventory:
    return parse_inventory(text, f"/ws/inventories/{name}.toml")


def spec_error(text: str, path: str = "/ws/inventories/fleet.toml") -> SpecError:
    with pytest.raises(SpecError) as caught:
        parse_inventory(text, path)
    return caught.value


# ---------------------------------------------------------------------------------------------
# The shipped examples


def test_example_toml_inventory_resolves_every_host_with_its_merged_settings() -> None:
    inventory = load_inventory(EXAMPLES / "gpu-fleet.toml")
    assert inventory.name == "gpu-fleet"
    assert inventory.host_names == ("gpu-01", "gpu-02", "gpu-03", "gpu-04")
    gpu01 = inventory.host("gpu-01")
    assert gpu01.address == "gpu-01.fleet.example"
    assert (gpu01.user, gpu01.port, gpu01.transport) == ("ops", 22, "ssh")
    assert gpu01.jump == JumpHost("bastion.fleet.example", 22, "ops")
    assert gpu01.groups == ("east", "canary")  # outer group first, then the inner one
    assert gpu01.vars == {"region": "us-east", "zone": "e1", "rack": "a1"}
    assert gpu01.engine.python == "/opt/sglang/venv/bin/python"
    assert gpu01.engine.speculative is True
    assert gpu01.engine.env == {"SGLANG_ENABLE_SPEC_V2": "1"}
    assert gpu01.engine.restart == SystemdRestart("sglang.service")
    assert inventory.host("gpu-03").engine.restart == SupervisorRestart("sglang")
    gpu04 = inventory.host("gpu-04")
    assert gpu04.engine.log_file == "/data/log/sglang.log"  # from group west
    assert gpu04.engine.restart == CommandRestart(
        start="/home/ops/bin/start-sglang.sh",
        pid_file="/home/ops/sglang.pid",
        workdir="/home/ops",
        stop_timeout=60.0,
    )
    assert inventory.groups["east"].members == ("gpu-01", "gpu-02", "gpu-03")


def test_example_ansible_inventory_reads_into_the_same_model() -> None:
    inventory = load_inventory(EXAMPLES / "example-ansible.yml")
    gpu01 = inventory.host("gpu-01")
    assert gpu01.address == "gpu-01.fleet.example"
    assert gpu01.user == "ops"
    assert gpu01.identity_file == "~/.ssh/fleet_ed25519"
    assert gpu01.groups == ("east", "canary")
    assert gpu01.vars == {"region": "us-east", "zone": "e1", "rack": "a1"}
    assert gpu01.engine.python == "/opt/sglang/venv/bin/python"
    assert gpu01.engine.restart == SystemdRestart("sglang.service")
    gpu03 = inventory.host("gpu-03")
    assert gpu03.port == 2222
    assert gpu03.engine.restart == SupervisorRestart("sglang")
    assert gpu03.engine.env == {"SGLANG_ENABLE_SPEC_V2": "1"}


def test_examples_use_only_placeholder_addresses() -> None:
    for path in EXAMPLES.iterdir():
        if path.suffix in (".toml", ".yml", ".yaml"):
            for host in load_inventory(path).hosts:
                assert host.address.endswith(".fleet.example"), (path.name, host.address)


# ---------------------------------------------------------------------------------------------
# The merge order


def test_merge_layers_later_scalars_win_and_maps_merge_key_by_key() -> None:
    defaults = SettingsLayer(
        user="ops",
        port=22,
        vars={"a": 1, "b": 1},
        engine=EngineLayer(
            python="/d/python", env={"X": "d", "Y": "d"}, restart=SystemdRestart("d.service")
        ),
    )
    group = SettingsLayer(
        port=2222,
        vars={"b": 2},
        engine=EngineLayer(env={"Y": "g"}, restart=SupervisorRestart("g")),
    )
    host = SettingsLayer(vars={"c": 3}, engine=EngineLayer(python="/h/python"))
    merged = merge_layers([defaults, group, host])
    assert (merged.user, merged.port) == ("ops", 2222)
    assert merged.vars == {"a": 1, "b": 2, "c": 3}
    assert merged.engine.python == "/h/python"
    assert merged.engine.env == {"X": "d", "Y": "g"}
    assert merged.engine.restart == SupervisorRestart("g")  # replaced whole, never mixed
    assert defaults.vars == {"a": 1, "b": 1}  # inputs are not changed


def test_groups_merge_outermost_first_then_inner_then_ties_by_name_then_host() -> None:
    inventory = toml(
        """
        [defaults]
        vars = { v = "defaults", only_defaults = 1 }
        [hosts.h]
        address = "h.fleet.example"
        [hosts.h2]
        address = "h2.fleet.example"
        vars = { v = "host" }
        [groups.outer]
        children = ["inner"]
        vars = { v = "outer", from_outer = 1 }
        [groups.inner]
        hosts = ["h", "h2"]
        vars = { v = "inner" }
        [groups.b_sibling]
        hosts = ["h"]
        vars = { v = "b_sibling", tie = "b" }
        [groups.a_sibling]
        hosts = ["h"]
        vars = { v = "a_sibling", tie = "a" }
        """
    )
    host = inventory.host("h")
    # depth 0: a_sibling, b_sibling, outer (by name); depth 1: inner
    assert host.groups == ("a_sibling", "b_sibling", "outer", "inner")
    assert host.vars["v"] == "inner"
    assert host.vars["tie"] == "b"
    assert host.vars["from_outer"] == 1 and host.vars["only_defaults"] == 1
    assert inventory.host("h2").vars["v"] == "host"


def test_engine_settings_default_when_nobody_sets_them() -> None:
    host = toml('[hosts.h]\naddress = "h.fleet.example"\n').host("h")
    assert host.engine.url == "http://127.0.0.1:30000"
    assert host.engine.python is None and host.engine.restart is None
    assert host.state_dir == "/var/tmp/opspatch"
    assert host.transport == "ssh" and host.port is None and host.user is None


def test_relative_key_paths_are_relative_to_the_inventory_folder() -> None:
    host = toml(
        '[defaults]\nidentity_file = "keys/id"\nknown_hosts = "~/kh"\n'
        '[hosts.h]\naddress = "h.fleet.example"\n'
    ).host("h")
    assert host.identity_file == "/ws/inventories/keys/id"
    assert host.known_hosts == "~/kh"  # ~ is expanded on the controller, by the transport


def test_jump_may_name_another_host_of_the_inventory() -> None:
    inventory = toml(
        """
        [hosts.bastion]
        address = "bastion.fleet.example"
        user = "jumper"
        port = 2200
        [hosts.gpu]
        address = "gpu.fleet.example"
        jump = "bastion"
        """
    )
    assert inventory.host("gpu").jump == JumpHost(
        "bastion.fleet.example", 2200, "jumper", None, name="bastion"
    )


def test_shell_metacharacters_in_host_names_and_units_are_kept_verbatim() -> None:
    inventory = toml(
        """
        [hosts."gpu;$(touch pwned)"]
        address = "gpu.fleet.example"
        engine = { restart = { kind = "systemd", unit = "sglang'; rm -rf /;'.service" } }
        """
    )
    host = inventory.hosts[0]
    assert host.name == "gpu;$(touch pwned)"
    assert host.engine.restart == SystemdRestart("sglang'; rm -rf /;'.service")


def test_local_hosts_need_no_address() -> None:
    host = toml('[hosts.here]\ntransport = "local"\n').host("here")
    assert host.transport == "local"
    assert host.address == "localhost"


# ---------------------------------------------------------------------------------------------
# Bad input: SpecError with file, line and field


def test_malformed_toml_names_the_line() -> None:
    error = spec_error('[hosts.a]\naddress = "x"\nport = = 2\n')
    assert error.location.file == "/ws/inventories/fleet.toml"
    assert error.location.line == 3
    assert "malformed TOML" in error.message


def test_unknown_key_names_line_field_and_nearest_key() -> None:
    error = spec_error('[hosts.a]\naddress = "a.fleet.example"\nidentity = "k"\n')
    assert error.location.line == 3
    assert error.location.field == "hosts.a.identity"
    assert "unknown key 'identity'" in error.message
    assert error.hint is not None and "identity_file" in error.hint


def test_wrong_type_names_the_field() -> None:
    error = spec_error('[hosts.a]\naddress = "a.fleet.example"\nport = "22"\n')
    assert (error.location.line, error.location.field) == (3, "hosts.a.port")


def test_a_number_where_text_belongs_says_to_quote_it() -> None:
    error = spec_error('[hosts.a]\naddress = "a.fleet.example"\nuser = 1234\n')
    assert (error.location.line, error.location.field) == (3, "hosts.a.user")
    assert error.hint == 'put it in quotes: "1234"'


def test_bad_restart_kind_points_at_the_kind_and_lists_the_kinds() -> None:
    error = spec_error(
        '[hosts.a]\naddress = "a.fleet.example"\n'
        '[hosts.a.engine]\nrestart = { kind = "init.d", unit = "x" }\n'
    )
    assert error.location.line == 4
    assert error.location.field == "hosts.a.engine.restart.kind"
    assert "unknown kind 'init.d'" in error.message
    assert "'systemd', 'supervisor', 'command'" in error.message


def test_restart_missing_field_points_inside_the_inline_table() -> None:
    error = spec_error(
        '[defaults.engine]\nrestart = { kind = "supervisor" }\n[hosts.a]\naddress = "a.b"\n'
    )
    assert error.location.line == 2
    assert error.location.field == "defaults.engine.restart.program"


def test_ssh_host_without_address_is_refused_at_its_line() -> None:
    error = spec_error('[defaults]\nuser = "ops"\n\n[hosts.gpu-09]\nuser = "x"\n')
    assert error.location.line == 4
    assert "has no address" in error.message


@pytest.mark.parametrize(
    "address, problem",
    [
        ("gpu-01.fleet.example:22", "has a port in it"),
        ("ops@gpu-01.fleet.example", "not a host name"),
        ("gpu 01", "not a host name"),
        ("-oProxyCommand=x", "not a host name"),
    ],
)
def test_addresses_that_are_not_host_names_are_refused(address: str, problem: str) -> None:
    error = spec_error(f'[hosts.a]\naddress = "{address}"\n')
    assert problem in error.message
    assert error.location.line == 2


def test_unknown_host_in_group_suggests_near_names() -> None:
    error = spec_error('[hosts.gpu-01]\naddress = "a.b"\n[groups.canary]\nhosts = ["gpu-1"]\n')
    assert error.location.line == 4
    assert "unknown host 'gpu-1'" in error.message
    assert error.hint is not None and "gpu-01" in error.hint


def test_group_cycles_are_refused_and_named() -> None:
    error = spec_error(
        '[hosts.a]\naddress = "a.b"\n'
        '[groups.x]\nchildren = ["y"]\n[groups.y]\nchildren = ["z"]\n[groups.z]\nchildren = ["x"]\n'
    )
    assert "x -> y -> z -> x" in error.message


def test_group_named_like_a_host_is_ambiguous_and_refused() -> None:
    error = spec_error('[hosts.a]\naddress = "a.b"\n[groups.a]\nhosts = ["a"]\n')
    assert "same name as a host" in error.message


def test_chained_jump_hosts_are_refused_with_a_hint() -> None:
    error = spec_error(
        '[hosts.j1]\naddress = "j1.b"\n[hosts.j2]\naddress = "j2.b"\njump = "j1"\n'
        '[hosts.gpu]\naddress = "gpu.b"\njump = "j2"\n'
    )
    assert "has a jump host itself" in error.message
    assert error.location.field == "hosts.gpu.jump"


def test_relative_state_dir_is_refused() -> None:
    error = spec_error('[hosts.a]\naddress = "a.b"\nstate_dir = "var/opspatch"\n')
    assert "absolute" in error.message


def test_ansible_unknown_opspatch_variable_names_its_line() -> None:
    text = "all:\n  hosts:\n    gpu-01:\n      opspatch_engine_pyton: /x\n"
    error = spec_error(text, "/ws/inventories/fleet.yml")
    assert error.location.line == 4
    assert "opspatch_engine_pyton" in error.message
    assert error.hint is not None and "opspatch_engine_python" in error.hint


def test_ansible_bad_value_is_reported_at_the_ansible_variable() -> None:
    text = "all:\n  vars:\n    ansible_port: twenty-two\n  hosts:\n    a:\n"
    error = spec_error(text, "/ws/inventories/fleet.yml")
    assert error.location.line == 3
    assert error.location.field == "all.vars.ansible_port"


def test_ansible_host_name_is_the_address_when_ansible_host_is_absent() -> None:
    text = "all:\n  hosts:\n    gpu-01.fleet.example:\n      ansible_port: '2222'\n"
    host = parse_inventory(text, "/ws/inventories/f.yml").hosts[0]
    assert host.address == "gpu-01.fleet.example"
    assert host.port == 2222


def test_malformed_yaml_names_the_line() -> None:
    error = spec_error("all:\n  hosts: [a\n  vars: {}\n", "/ws/inventories/f.yml")
    assert error.location.line >= 2
    assert "malformed YAML" in error.message


# ---------------------------------------------------------------------------------------------
# Selection


@pytest.fixture
def fleet() -> Inventory:
    return load_inventory(EXAMPLES / "gpu-fleet.toml")


@pytest.mark.parametrize(
    "expr, expected",
    [
        ("gpu-fleet", ["gpu-01", "gpu-02", "gpu-03", "gpu-04"]),
        ("all", ["gpu-01", "gpu-02", "gpu-03", "gpu-04"]),
        ("canary", ["gpu-01"]),
        ("east", ["gpu-01", "gpu-02", "gpu-03"]),
        ("gpu-04", ["gpu-04"]),
        ("gpu-04,canary", ["gpu-04", "gpu-01"]),
        ("gpu-0[34]", ["gpu-03", "gpu-04"]),
        ("w*", ["gpu-04"]),
        ("east,gpu-02,canary", ["gpu-01", "gpu-02", "gpu-03"]),
        (" canary , west ", ["gpu-01", "gpu-04"]),
    ],
)
def test_select_hosts(fleet: Inventory, expr: str, expected: list[str]) -> None:
    assert [h.name for h in select_hosts(fleet, expr)] == expected


def test_unknown_selection_suggests_near_names(fleet: Inventory) -> None:
    with pytest.raises(SelectionError) as caught:
        select_hosts(fleet, "canari")
    assert "'canari'" in caught.value.message
    assert caught.value.hint is not None and "'canary'" in caught.value.hint
    assert caught.value.exit_code == 2


@pytest.mark.parametrize("expr", ["", "canary,,west", "nothing-*"])
def test_malformed_or_empty_selections_are_refused(fleet: Inventory, expr: str) -> None:
    with pytest.raises(SelectionError):
        select_hosts(fleet, expr)


def _write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text)
    return path


def _workspace(tmp_path: Path) -> Workspace:
    """A workspace at `tmp_path/ws` with its state directory at `tmp_path/state`."""
    return Workspace(root=tmp_path / "ws", state_dir=tmp_path / "state")


def test_resolve_hosts_over_the_search_path(tmp_path: Path) -> None:
    workspace = tmp_path / "ws" / "inventories"
    state = tmp_path / "state" / "inventories"
    _write(workspace, "prod.toml", '[hosts.p1]\naddress="p1.b"\n[groups.canary]\nhosts=["p1"]\n')
    _write(state, "sandbox.toml", '[hosts.sandbox-1]\ntransport="local"\n')
    _write(state, "prod.toml", '[hosts.shadowed]\naddress="s.b"\n')  # the workspace wins
    search = _workspace(tmp_path)
    assert [h.name for h in search.hosts("sandbox")] == ["sandbox-1"]
    assert [h.name for h in search.hosts("prod")] == ["p1"]
    assert [h.name for h in search.hosts("canary")] == ["p1"]
    assert [h.name for h in search.hosts("prod:canary,sandbox-*")] == [
        "p1",
        "sandbox-1",
    ]
    assert search.find("inventories", "prod") == workspace / "prod.toml"


@pytest.mark.parametrize(
    ("selection", "said"),
    [
        ("lab", "'lab' selects no host: inventory 'lab' ("),
        ("lab:all", "'all' selects no host: inventory 'lab' ("),
        ("spare", "'spare' selects no host: the group has no host in inventory 'lab' ("),
        ("lab:spare", "'spare' selects no host: the group has no host in inventory 'lab' ("),
        ("p1,spare", "'spare' selects no host"),  # one empty item refuses the whole selection
    ],
)
def test_a_selection_of_no_host_is_refused_naming_the_item(
    tmp_path: Path, selection: str, said: str
) -> None:
    """Before, an inventory with no hosts selected zero hosts silently (apply then reported
    `ok`, exit 0, and recorded a run), and a bare empty group was "not an inventory, host or
    group ... did you mean 'spare'?"."""
    folder = tmp_path / "ws" / "inventories"
    _write(folder, "lab.toml", "[groups.spare]\nhosts = []\n")
    _write(folder, "prod.toml", '[hosts.p1]\naddress="p1.b"\n')
    with pytest.raises(SelectionError) as caught:
        _workspace(tmp_path).hosts(selection)
    assert caught.value.message.startswith(said), caught.value.message
    assert caught.value.exit_code == 2


def test_bare_names_do_not_reach_bundled_examples(tmp_path: Path) -> None:
    """Refused, and the refusal says how to name it (it said nothing to do before)."""
    _write(tmp_path / "ws" / "inventories", "prod.toml", '[hosts.p1]\naddress="p1.b"\n')
    with pytest.raises(SelectionError) as caught:
        _workspace(tmp_path).hosts("canary")
    assert caught.value.hint is not None and "name it gpu-fleet:canary" in caught.value.hint
    named = _workspace(tmp_path).hosts("gpu-fleet:canary")
    assert [h.name for h in named] == ["gpu-01"]


def test_a_name_found_nowhere_says_where_it_looked_and_what_there_is(tmp_path: Path) -> None:
    _write(tmp_path / "ws" / "inventories", "prod.toml", '[hosts.p1]\naddress="p1.b"\n')
    with pytest.raises(SelectionError) as caught:
        _workspace(tmp_path).hosts("zzzz")
    assert f"(looked in {tmp_path / 'ws' / 'inventories'}, " in caught.value.message
    hint = caught.value.hint
    assert hint is not None and hint.startswith("known inventories: ") and "prod" in hint, hint
    assert caught.value.exit_code == 2


def test_ambiguous_bare_names_ask_for_the_inventory(tmp_path: Path) -> None:
    folder = tmp_path / "ws" / "inventories"
    _write(folder, "a.toml", '[hosts.x1]\naddress="x.b"\n[groups.canary]\nhosts=["x1"]\n')
    _write(folder, "b.toml", '[hosts.y1]\naddress="y.b"\n[groups.canary]\nhosts=["y1"]\n')
    with pytest.raises(SelectionError) as caught:
        _workspace(tmp_path).hosts("canary")
    assert "several inventories" in caught.value.message
    assert caught.value.hint is not None and "a:canary" in caught.value.hint


def test_unknown_inventory_suggests_near_names(tmp_path: Path) -> None:
    _write(tmp_path / "ws" / "inventories", "gpu-fleet.toml", '[hosts.x1]\naddress="x.b"\n')
    with pytest.raises(SelectionError) as caught:
        _workspace(tmp_path).hosts("gpu-flet:all")
    assert caught.value.hint is not None and "gpu-fleet" in caught.value.hint


def test_a_missing_inventory_path_is_named_as_a_file(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "fleet.toml"
    with pytest.raises(SelectionError, match=f"{missing}: no such inventory file"):
        _workspace(tmp_path).hosts(f"{missing}:canary")


def test_same_host_name_from_two_inventories_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "ws" / "inventories"
    _write(folder, "a.toml", '[hosts.x]\naddress="x.b"\n')
    _write(folder, "b.toml", '[hosts.x]\naddress="y.b"\n')
    with pytest.raises(SelectionError, match="both inventory"):
        _workspace(tmp_path).hosts("a,b")


def test_one_folder_prefers_toml_then_yml_then_yaml(tmp_path: Path) -> None:
    folder = tmp_path / "ws" / "inventories"
    _write(folder, "fleet.yaml", "all:\n  hosts:\n    from-yaml: {}\n")
    _write(folder, "fleet.yml", "all:\n  hosts:\n    from-yml: {}\n")
    assert [h.name for h in _workspace(tmp_path).hosts("fleet")] == ["from-yml"]
    _write(folder, "fleet.toml", '[hosts.from-toml]\naddress = "t.b"\n')
    assert [h.name for h in _workspace(tmp_path).hosts("fleet")] == ["from-toml"]
    assert _workspace(tmp_path).find("inventories", str(folder / "fleet.yaml")).suffix == ".yaml"


# ---------------------------------------------------------------------------------------------
# inventory show


def test_inventory_show_table_and_json(fleet: Inventory) -> None:
    hosts = select_hosts(fleet, "canary,west")
    table = inventory_show_table(hosts, selection="canary,west")
    assert table.columns == INVENTORY_COLUMNS
    assert table.title == "2 hosts selected by 'canary,west'"
    row = dict(zip(table.columns, table.rows[0], strict=True))
    assert row["host"] == "gpu-01"
    assert row["jump"] == "ops@bastion.fleet.example:22"
    assert row["restart"] == "systemd unit sglang.service"
    document = inventory_show_json(hosts, selection="canary,west")
    assert document["inventories"] == ["gpu-fleet"]
    assert document["hosts"][1]["engine"]["restart"]["kind"] == "command"
    assert document["hosts"][0]["groups"] == ["east", "canary"]


def test_workspace_lookup_order_workspace_then_state_dir_then_examples_by_name(
    tmp_path: Path,
) -> None:
    workspace = Workspace(root=tmp_path / "ws", state_dir=tmp_path / "state")
    _write(tmp_path / "ws" / "inventories", "prod.toml", '[hosts.p1]\naddress="p1.b"\n')
    _write(tmp_path / "state" / "inventories", "sandbox.toml", '[hosts.sb-1]\ntransport="local"\n')
    assert [h.name for h in workspace.hosts("sandbox,p1")] == ["sb-1", "p1"]
    assert [h.name for h in workspace.hosts("gpu-fleet:canary")] == ["gpu-01"]
    with pytest.raises(SelectionError):
        workspace.hosts("canary")  # a group of the bundled example only


def test_inventory_show_json_is_serialisable_with_toml_dates() -> None:
    inventory = toml('[hosts.a]\naddress = "a.b"\nvars = { since = 2024-05-01, at = 07:30:00 }\n')
    document = inventory_show_json(inventory.hosts)
    assert json.loads(json.dumps(document))["hosts"][0]["vars"] == {
        "since": "2024-05-01",
        "at": "07:30:00",
    }


# ---------------------------------------------------------------------------------------------
# live = true: off unless a level says so


def test_live_is_off_by_default_and_merges_like_any_scalar() -> None:
    inventory = toml(
        '[defaults]\nlive = true\n[groups.g]\nhosts = ["a"]\nlive = false\n'
        '[hosts.a]\naddress = "a.fleet.example"\n[hosts.b]\naddress = "b.fleet.example"\n'
        '[hosts.c]\naddress = "c.fleet.example"\nlive = false\n'
    )
    assert [(h.name, h.live) for h in inventory.hosts] == [("a", False), ("b", True), ("c", False)]
    assert toml('[hosts.a]\naddress = "a.fleet.example"\n').host("a").live is False


def test_live_that_is_not_a_boolean_is_refused_at_its_line() -> None:
    error = spec_error('[hosts.a]\naddress = "a.fleet.example"\nlive = "yes"\n')
    assert (error.location.line, error.location.field) == (3, "hosts.a.live")
    assert "true or false" in error.message


def test_ansible_opspatch_live_is_the_live_key() -> None:
    text = "all:\n  vars:\n    opspatch_live: true\n  hosts:\n    a:\n"
    assert parse_inventory(text, "/ws/inventories/f.yml").hosts[0].live is True


# ---------------------------------------------------------------------------------------------
# agent = "resident" | "per-exec": how the host agent runs (issue 44)


def test_the_agent_is_resident_by_default_and_per_exec_where_a_level_says_so() -> None:
    inventory = toml(
        '[groups.g]\nhosts = ["a"]\nagent = "per-exec"\n'
        '[hosts.a]\naddress = "a.fleet.example"\n[hosts.b]\naddress = "b.fleet.example"\n'
    )
    assert [(h.name, h.agent) for h in inventory.hosts] == [("a", "per-exec"), ("b", "resident")]
    assert inventory_show_json(inventory.hosts)["hosts"][0]["agent"] == "per-exec"


def test_an_agent_mode_that_is_not_one_is_refused_at_its_line() -> None:
    error = spec_error('[hosts.a]\naddress = "a.fleet.example"\nagent = "forked"\n')
    assert (error.location.line, error.location.field) == (3, "hosts.a.agent")
    assert "'resident'" in error.message and "'per-exec'" in error.message, error.message


def test_ansible_opspatch_agent_is_the_agent_key() -> None:
    text = "all:\n  vars:\n    opspatch_agent: per-exec\n  hosts:\n    a:\n"
    assert parse_inventory(text, "/ws/inventories/f.yml").hosts[0].agent == "per-exec"
