"""`opspatch inventory show` on an inventory with units, and a bad unit refused through the
console script: one message naming file, line and field, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.clirunner import opspatch
from tests.fleetkit import FLEET

pytestmark = pytest.mark.process


def workspace(tmp_path: Path, text: str) -> Path:
    folder = tmp_path / "inventories"
    folder.mkdir()
    (folder / "lab.toml").write_text(text)
    return tmp_path


def test_inventory_show_prints_the_units(tmp_path: Path) -> None:
    run = opspatch("inventory", "show", "kimi-b,solo", cwd=workspace(tmp_path, FLEET))
    assert run.code == 0, run.stderr
    assert "kimi-b rank 0 (head)" in run.stdout
    assert "unit kimi-b: 2 nodes, head b1 (ranks: b1, b0)" in run.stdout
    document = opspatch("inventory", "show", "lab", "--json", cwd=tmp_path).json()
    assert [u["name"] for u in document["units"]] == ["kimi-a", "kimi-b"]


def test_a_host_in_two_units_is_refused_with_exit_2(tmp_path: Path) -> None:
    text = FLEET.replace('hosts = ["b0", "b1"]', 'hosts = ["b0", "a1"]')
    run = opspatch("inventory", "show", "lab", cwd=workspace(tmp_path, text))
    assert run.code == 2, (run.stdout, run.stderr)
    assert "lab.toml:14: units.kimi-b.hosts[1]: host 'a1' is in unit 'kimi-a' and in unit " in (
        run.stderr
    )
    assert "remove it from one of the units" in run.stderr
    assert run.stdout == ""


def test_a_restart_and_an_apply_of_one_node_of_a_unit_are_refused_with_exit_2(
    tmp_path: Path,
) -> None:
    """Through the console script, before any host is reached (the hosts are local and have no
    engine): the refusal names the unit, its nodes and the whole unit's command; the ledger
    records no run."""
    folder = workspace(tmp_path, FLEET)
    (folder / "patches").mkdir()
    patch = Path(__file__).resolve().parent.parent / "patches" / "eagle-init-guard.toml"
    (folder / "patches" / patch.name).write_text(patch.read_text())
    env = {"OPSPATCH_STATE_DIR": str(tmp_path / "state")}

    run = opspatch("restart", "--hosts", "b0", "--yes", cwd=folder, env=env)
    assert run.code == 2, (run.stdout, run.stderr)
    assert "unit kimi-b is b1 (head), b0, and the selection leaves out b1" in run.stderr
    assert "select every node of the unit: `opspatch restart --hosts kimi-b`" in run.stderr

    run = opspatch("apply", "eagle-init-guard", "--hosts", "a1", "--yes", cwd=folder, env=env)
    assert run.code == 2, (run.stdout, run.stderr)
    assert "unit kimi-a is a0 (head), a1, and the selection leaves out a0" in run.stderr
    assert "`opspatch apply eagle-init-guard --hosts kimi-a`" in run.stderr
    assert opspatch("ledger", "list", "--json", cwd=folder, env=env).json() == {"runs": []}
