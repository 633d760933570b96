"""One malformed inventory in the workspace blocks no command on the others (issue 42, item 18:
every bare `--hosts NAME` searched every inventory and stopped at the first that did not load).
It is still refused where it is named, and named where a selection found nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from opspatch.config.lookup import Workspace
from opspatch.errors import SelectionError, SpecError

pytestmark = pytest.mark.pure


@pytest.fixture
def workspace(tmp_path: Path) -> Workspace:
    inventories = tmp_path / "ws" / "inventories"
    inventories.mkdir(parents=True)
    (inventories / "good.toml").write_text(
        '[hosts.alpha]\ntransport = "local"\n[groups.canary]\nhosts = ["alpha"]\n'
    )
    (inventories / "broken.toml").write_text("this is = = not toml\n")
    return Workspace(root=tmp_path / "ws", state_dir=tmp_path / "state")


@pytest.mark.parametrize("selection", ["alpha", "canary", "alph*", "good", "good:alpha"])
def test_a_selection_found_in_a_readable_inventory_is_not_blocked(
    workspace: Workspace, selection: str
) -> None:
    assert [h.name for h in workspace.hosts(selection)] == ["alpha"]


def test_the_malformed_inventory_is_refused_where_it_is_named(workspace: Workspace) -> None:
    for selection in ("broken", "broken:all"):
        with pytest.raises(SpecError) as caught:
            workspace.hosts(selection)
        assert "broken.toml:1: malformed TOML" in str(caught.value)


def test_a_name_found_nowhere_names_the_inventory_not_searched(workspace: Workspace) -> None:
    with pytest.raises(SelectionError) as caught:
        workspace.hosts("beta")
    said = caught.value.message
    assert (
        "'beta' is not an inventory, host, group or unit of any inventory that could be read"
        in said
    )
    assert "not searched: " in said and "broken.toml:1: malformed TOML" in said, said
    assert caught.value.exit_code == 2
