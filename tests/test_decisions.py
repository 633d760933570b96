"""One decision table, tested as data: a command is a goal, and `(goal, Standing) -> Action`
says what it does to a host (`runs.judgments.decisions`), one row per case; an action carries
its traits, and what a run of a command needs (leases, routers, re-admission) follows from its
actions, for every command of the one list (`core.vocabulary.Command`).

Pure. A standing or a goal added without its cells, or an action without its traits, fails here."""

from __future__ import annotations

import pytest

from opspatch.core.vocabulary import Action, Command, Goal, Traits
from opspatch.runs.judgments.decisions import DECIDED, DECISIONS, actions_of, decide, traits_of
from opspatch.runs.judgments.patchset import Standing

pytestmark = pytest.mark.pure

S = Standing
A = Action

ROWS = [
    # rollback: every file back at its pre-image
    (Goal.ALL_OLD, S.NOTHING_RECORDED, A.RESTORE_FROM_BACKUP),
    (Goal.ALL_OLD, S.ALL_OLD, A.LEAVE),
    (Goal.ALL_OLD, S.PARTLY_NEW, A.RESTORE),
    (Goal.ALL_OLD, S.NEW_STALE, A.RESTORE),
    (Goal.ALL_OLD, S.NEW_PROVEN, A.RESTORE),
    (Goal.ALL_OLD, S.NEW_PROVEN_NO_SERVER, A.RESTORE),
    (Goal.ALL_OLD, S.NEW_UNPROVEN, A.RESTORE),
    (Goal.ALL_OLD, S.NEW_UNPROVEN_NO_SERVER, A.RESTORE),
    (Goal.ALL_OLD, S.PATCHED_FURTHER, A.REFUSE),
    (Goal.ALL_OLD, S.CHANGED, A.REFUSE),
    # restart: proven where something is staged
    (Goal.PROVEN_WHERE_STAGED, S.NOTHING_RECORDED, A.LEAVE),
    (Goal.PROVEN_WHERE_STAGED, S.ALL_OLD, A.LEAVE),
    (Goal.PROVEN_WHERE_STAGED, S.PARTLY_NEW, A.REFUSE),
    (Goal.PROVEN_WHERE_STAGED, S.NEW_STALE, A.PROVE_OR_UNDO),
    (Goal.PROVEN_WHERE_STAGED, S.NEW_PROVEN, A.LEAVE),
    (Goal.PROVEN_WHERE_STAGED, S.NEW_PROVEN_NO_SERVER, A.PROVE_OR_UNDO),
    (Goal.PROVEN_WHERE_STAGED, S.NEW_UNPROVEN, A.LEAVE),
    (Goal.PROVEN_WHERE_STAGED, S.NEW_UNPROVEN_NO_SERVER, A.PROVE_OR_UNDO),
    (Goal.PROVEN_WHERE_STAGED, S.PATCHED_FURTHER, A.REFUSE),
    (Goal.PROVEN_WHERE_STAGED, S.CHANGED, A.REFUSE),
    # recover: the ledger's last intent, finished or undone
    (Goal.LAST_INTENT, S.NOTHING_RECORDED, A.ENSURE_RUNNING),
    (Goal.LAST_INTENT, S.ALL_OLD, A.ENSURE_RUNNING),
    (Goal.LAST_INTENT, S.PARTLY_NEW, A.RESTORE),
    (Goal.LAST_INTENT, S.NEW_STALE, A.PROVE_OR_UNDO),
    (Goal.LAST_INTENT, S.NEW_PROVEN, A.ENSURE_RUNNING),
    (Goal.LAST_INTENT, S.NEW_PROVEN_NO_SERVER, A.ENSURE_RUNNING),
    (Goal.LAST_INTENT, S.NEW_UNPROVEN, A.PROVE_OR_UNDO),
    (Goal.LAST_INTENT, S.NEW_UNPROVEN_NO_SERVER, A.PROVE_OR_UNDO),
    (Goal.LAST_INTENT, S.PATCHED_FURTHER, A.ATTENTION),
    (Goal.LAST_INTENT, S.CHANGED, A.ATTENTION),
]


@pytest.mark.parametrize(("goal", "standing", "action"), ROWS, ids=lambda v: str(v))
def test_the_table_row_by_row(goal: Goal, standing: Standing, action: Action) -> None:
    assert DECISIONS[goal, standing] == action


def test_every_decided_goal_has_an_action_for_every_standing() -> None:
    assert set(DECISIONS) == {(goal, standing) for goal in DECIDED for standing in Standing}
    assert len(ROWS) == len(DECISIONS)


@pytest.mark.parametrize(
    ("command", "goal"),
    [
        (Command.APPLY, Goal.NEW_AND_PROVEN),
        (Command.SYNC, Goal.NEW_AND_PROVEN),
        (Command.ROLLBACK, Goal.ALL_OLD),
        (Command.RESTART, Goal.PROVEN_WHERE_STAGED),
        (Command.RECOVER, Goal.LAST_INTENT),
    ],
)
def test_a_command_that_changes_hosts_is_a_goal(command: Command, goal: Goal) -> None:
    assert command.goal is goal


def test_a_command_decided_by_the_table_looks_its_goal_up() -> None:
    assert decide(Command.RESTART, S.NEW_PROVEN) == A.LEAVE
    assert decide(Command.RECOVER, S.NEW_PROVEN) == A.ENSURE_RUNNING
    assert decide(Command.ROLLBACK, S.NEW_PROVEN) == A.RESTORE


NOTHING = Traits()
CHANGES = Traits(leases=True, restarts=True, raised=True)
WRITES = Traits(leases=True, raised=True)


@pytest.mark.parametrize(
    ("action", "traits"),
    [
        (A.LEAVE, NOTHING),
        (A.REFUSE, NOTHING),
        (A.ATTENTION, NOTHING),
        (A.ENSURE_RUNNING, Traits(leases=True, restarts=True, raised=True, readmits=True)),
        (A.PROVE_OR_UNDO, CHANGES),
        (A.RESTORE, CHANGES),
        (A.RESTORE_FROM_BACKUP, CHANGES),
        (A.APPLY, CHANGES),
        (A.STAGE, WRITES),
        (A.TAKE_LIVE, WRITES),
        (A.INSTALL_PLUGIN, WRITES),
        (A.REMOVE_PLUGIN, WRITES),
        (A.UNLOCK, Traits(raised=True)),
    ],
)
def test_an_action_carries_its_traits(action: Action, traits: Traits) -> None:
    assert action.traits == traits


LEASES = {
    Command.APPLY,
    Command.SYNC,
    Command.ROLLBACK,
    Command.RESTART,
    Command.RECOVER,
    Command.LIVE_ENABLE,
    Command.LIVE_DISABLE,
}
"""The commands that change hosts' files or engines: their runs hold the hosts' leases (`unlock`
changes a lock only; `bake` no host of the fleet; `adopt` records a hand edit)."""
RESTARTS = {Command.APPLY, Command.SYNC, Command.ROLLBACK, Command.RESTART, Command.RECOVER}
"""The commands that restart engines, and so drain and admit behind a router."""
READMITS = {Command.RECOVER}
"""The command that puts back into rotation a worker a crashed run left out."""


@pytest.mark.parametrize("command", list(Command), ids=str)
def test_what_a_run_needs_follows_from_its_commands_actions(command: Command) -> None:
    traits = traits_of(command)
    assert (traits.leases, traits.restarts, traits.readmits) == (
        command in LEASES,
        command in RESTARTS,
        command in READMITS,
    )


@pytest.mark.parametrize("command", list(Command), ids=str)
def test_a_command_has_a_cli_spelling_and_actions_only_where_it_changes_hosts(
    command: Command,
) -> None:
    assert command.cli.replace(" ", "-") == command.value
    assert bool(actions_of(command)) == (command in LEASES or command == Command.UNLOCK)
