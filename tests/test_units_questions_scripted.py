"""Questions and plans over units, and the names hints give a patch (issue 42, item 16).

`tests/scriptedkit.py`'s hosts: unit u1 (h1 the head, h2), and h3 by itself. A unit's other
nodes serve only a dummy `/health` (a decode gets HTTP 404): `smoke` over an inventory or a unit
decoded on them and failed a healthy unit. `plan` of one node said "h1: not inspected" instead
of naming the unit; a patch given by its path got hints naming its id, which the workspace may
not find.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from opspatch.analysis.provenance import Provenance
from opspatch.cli import docgen
from opspatch.config.patches import load_patch
from opspatch.errors import EXIT_BAD_INPUT, UnitRefused
from opspatch.runs.commands.apply import apply_to_hosts
from opspatch.runs.commands.releasecache import release_coverage
from opspatch.runs.commands.smoke import smoke_hosts
from tests.scriptedkit import ALWAYS, REPO, Units, units

pytestmark = pytest.mark.scripted

__all__ = ["units"]  # the fixture, used by name


def dummy_health_only(units: Units, node: str) -> None:
    """`node` answers a decode as a non-head node does: no /generate (HTTP 404)."""
    units.fakes[node].smoke_ok = False


def test_smoke_of_a_unit_and_a_host_decodes_on_the_heads_only(units: Units) -> None:
    dummy_health_only(units, "h2")
    report = smoke_hosts(units.hosts("h1", "h2", "h3"), ALWAYS, factory=units.factory)
    assert [(h.host, h.unit, h.ok) for h in report.hosts] == [
        ("h1", "u1", True),
        ("h3", None, True),
    ]
    assert report.exit_code == 0
    assert "smoke" not in units.fakes["h2"].requests
    assert report.to_json()["hosts"][0]["unit"] == "u1"


def test_smoke_of_a_node_without_its_head_is_refused_naming_the_head(units: Units) -> None:
    with pytest.raises(UnitRefused) as refused:
        smoke_hosts(units.hosts("h2", "h3"), ALWAYS, factory=units.factory)
    assert refused.value.exit_code == EXIT_BAD_INPUT
    assert refused.value.message.startswith("smoke: h2 is u1 rank 1, whose head is h1: ")
    assert refused.value.hint == "smoke the unit: `opspatch smoke --hosts u1`"
    assert units.requests() == {"h1": [], "h2": [], "h3": []}


def test_a_plan_of_one_node_is_refused_naming_its_unit(units: Units) -> None:
    with pytest.raises(UnitRefused) as refused:
        apply_to_hosts(
            units.patch, units.hosts("h2"), ALWAYS, factory=units.factory, ledger=None, dry_run=True
        )
    said = refused.value.message
    assert said.startswith("an apply of eagle-init-guard would change part of a multi-node ")
    assert "unit u1 is h1 (head), h2, and the selection leaves out h1" in said, said
    assert "not inspected" not in said
    assert refused.value.hint == (
        "select every node of the unit: `opspatch plan eagle-init-guard --hosts u1`"
    )
    assert units.requests() == {"h1": [], "h2": [], "h3": []}


def test_a_plan_of_the_whole_unit_plans_every_node(units: Units) -> None:
    report = apply_to_hosts(
        units.patch,
        units.hosts("h1", "h2"),
        ALWAYS,
        factory=units.factory,
        ledger=None,
        dry_run=True,
    )
    assert [(h.host, h.outcome) for h in report.hosts] == [
        ("h1", "would-apply"),
        ("h2", "would-apply"),
    ]


@pytest.mark.pure
def test_the_hosts_option_says_it_takes_a_unit() -> None:
    said = [line for line in docgen.render_reference().splitlines() if "--hosts TARGET" in line]
    assert said and all("Inventory, group, unit, host, comma list or glob" in s for s in said)


@pytest.mark.pure
def test_a_patch_given_by_its_path_is_named_by_its_path_in_hints(tmp_path: Path) -> None:
    text = (REPO / "patches" / "eagle-init-guard.toml").read_text()
    path = tmp_path / "fixes" / "my-fix.toml"
    path.parent.mkdir()
    path.write_text(text.replace('id = "eagle-init-guard"', 'id = "my-fix"'))
    by_path = load_patch(path, named_by_id=False)
    assert by_path.reference == str(path)
    assert load_patch(REPO / "patches" / "eagle-init-guard.toml").reference == "eagle-init-guard"
    forwarded = Provenance.of(by_path.spec, by_path.reference).warning or ""
    assert f"`opspatch export {path} --release VERSION --format git`" in forwarded
    coverage = release_coverage(by_path.parts, tmp_path / "cache", reference=by_path.reference)
    assert f"run `opspatch check {path} --releases`" in (coverage.warning or "")
    assert "my-fix --" not in forwarded + (coverage.warning or "")


def test_a_plan_of_one_node_by_path_names_the_path(units: Units, tmp_path: Path) -> None:
    path = tmp_path / "guard.toml"
    path.write_text((REPO / "patches" / "eagle-init-guard.toml").read_text())
    with pytest.raises(UnitRefused) as refused:
        apply_to_hosts(
            load_patch(path, named_by_id=False),
            units.hosts("h2"),
            ALWAYS,
            factory=units.factory,
            ledger=None,
            dry_run=True,
        )
    assert refused.value.hint == f"select every node of the unit: `opspatch plan {path} --hosts u1`"
