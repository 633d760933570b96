"""The one named-file lookup (`Workspace`) and what it tells an operator, through the real
console script where the message is the point (issue 11)."""

from __future__ import annotations

from pathlib import Path

import pytest

from opspatch.config.lookup import Workspace
from opspatch.errors import InputError, SelectionError
from tests.clirunner import opspatch

pytestmark = pytest.mark.pure


@pytest.mark.process
def test_an_unknown_patch_is_named_in_the_singular(tmp_path: Path) -> None:
    run = opspatch("apply", "nonexistent-patch", "--file", "x.py", cwd=tmp_path)
    assert run.code == 2
    assert "no patch named 'nonexistent-patch'" in run.stderr
    assert "no patche " not in run.stderr


@pytest.mark.parametrize(
    ("kind", "singular"),
    [("patches", "patch"), ("playbooks", "playbook"), ("inventories", "inventory")],
)
def test_every_kind_is_named_in_the_singular(tmp_path: Path, kind: str, singular: str) -> None:
    with pytest.raises(InputError) as caught:
        Workspace(tmp_path, tmp_path / "state").find(kind, "nothing-like-it")
    assert caught.value.message.startswith(f"no {singular} named 'nothing-like-it'")


@pytest.mark.process
@pytest.mark.parametrize(
    ("selection", "command"),
    [
        ("sandbox", "opspatch sandbox up`"),
        ("sandbox-ssh", "opspatch sandbox up --ssh`"),
        ("sandbox:canary", "opspatch sandbox up`"),
    ],
)
def test_selecting_a_sandbox_that_is_not_there_says_how_to_make_one(
    tmp_path: Path, selection: str, command: str
) -> None:
    run = opspatch("status", "--hosts", selection, cwd=tmp_path)
    assert run.code == 2
    assert "sandbox" in run.stderr and command in run.stderr, run.stderr


def test_other_unknown_names_get_no_sandbox_hint(tmp_path: Path) -> None:
    with pytest.raises(SelectionError) as caught:
        Workspace(tmp_path, tmp_path / "state").hosts("sandbx")
    assert "sandbox up" not in (caught.value.hint or "")


def test_patches_playbooks_and_inventories_resolve_by_name_and_by_path(tmp_path: Path) -> None:
    workspace = Workspace(tmp_path, tmp_path / "state")
    assert workspace.load_patch("eagle-init-guard").spec.id == "eagle-init-guard"
    guard = workspace.find("patches", "eagle-init-guard")
    assert workspace.load_patch(str(guard)).path == str(guard)
    assert workspace.load_playbook("incident").name == "incident"
    assert workspace.load_inventory("gpu-fleet").name == "gpu-fleet"
    assert workspace.load_inventory("example-ansible").host("gpu-01").user == "ops"


def test_the_state_directory_holds_inventories_only(tmp_path: Path) -> None:
    state = tmp_path / "state"
    for kind in ("inventories", "patches", "playbooks"):
        (state / kind).mkdir(parents=True)
    (state / "inventories" / "mine.yaml").write_text("all:\n  hosts:\n    h1: {}\n")
    (state / "playbooks" / "hidden.toml").write_text("canary = 0\n")
    workspace = Workspace(tmp_path / "ws", state)
    assert [h.name for h in workspace.hosts("mine")] == ["h1"]
    with pytest.raises(InputError, match="no playbook named 'hidden'"):
        workspace.load_playbook("hidden")
