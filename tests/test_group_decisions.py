"""A node group's one action, tested as data: its nodes' cells of the decision table combined
(`runs.judgments.decisions.group_action`), one row per case. A node refused decides the group;
nodes that differ are each goal's `NODES_DIFFER`; then a restore, a proof; else the cell they
share."""

from __future__ import annotations

import pytest

from opspatch.core.vocabulary import Action, Command
from opspatch.runs.judgments.decisions import group_action
from opspatch.runs.judgments.patchset import Standing

pytestmark = pytest.mark.pure

S = Standing
A = Action

ROWS = [
    # restart: proven where something is staged
    (Command.RESTART, [S.NEW_STALE], A.PROVE_OR_UNDO),
    (Command.RESTART, [S.NEW_STALE, S.NEW_PROVEN], A.PROVE_OR_UNDO),
    (Command.RESTART, [S.NEW_PROVEN, S.NEW_UNPROVEN], A.LEAVE),
    (Command.RESTART, [S.ALL_OLD, S.NOTHING_RECORDED], A.LEAVE),
    (Command.RESTART, [S.NEW_STALE, S.ALL_OLD], A.ATTENTION),  # a unit would run two codes
    (Command.RESTART, [S.CHANGED, S.ALL_OLD], A.REFUSE),
    (Command.RESTART, [S.NEW_STALE, S.PARTLY_NEW], A.REFUSE),
    # recover: the ledger's last intent
    (Command.RECOVER, [S.NEW_PROVEN, S.NEW_PROVEN_NO_SERVER], A.ENSURE_RUNNING),
    (Command.RECOVER, [S.NEW_PROVEN, S.NEW_UNPROVEN], A.PROVE_OR_UNDO),
    (Command.RECOVER, [S.NEW_STALE], A.PROVE_OR_UNDO),
    (Command.RECOVER, [S.ALL_OLD, S.NOTHING_RECORDED], A.ENSURE_RUNNING),
    (Command.RECOVER, [S.NEW_PROVEN, S.ALL_OLD], A.RESTORE),  # differing nodes: put back
    (Command.RECOVER, [S.PARTLY_NEW, S.ALL_OLD], A.RESTORE),
    (Command.RECOVER, [S.PARTLY_NEW, S.NEW_STALE], A.RESTORE),
    (Command.RECOVER, [S.CHANGED, S.NEW_STALE], A.ATTENTION),
    (Command.RECOVER, [S.PATCHED_FURTHER, S.ALL_OLD], A.ATTENTION),
]


@pytest.mark.parametrize(("command", "standings", "action"), ROWS, ids=lambda v: str(v))
def test_a_group_takes_one_action(
    command: Command, standings: list[Standing], action: Action
) -> None:
    assert group_action(command, standings) == action
