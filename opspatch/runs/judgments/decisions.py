"""One decision table: what a command does to a host, given its goal and the host's standing."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from opspatch.core.vocabulary import Action, Command, Goal, Traits
from opspatch.runs.judgments.patchset import ALL_NEW, Standing

DECISIONS: Mapping[tuple[Goal, Standing], Action] = {
    # -- rollback: every file back at its pre-image -------------------------------------------
    # no record of it here: only from the host's own backup, the patch taken off the file alone
    (Goal.ALL_OLD, Standing.NOTHING_RECORDED): Action.RESTORE_FROM_BACKUP,
    (Goal.ALL_OLD, Standing.ALL_OLD): Action.LEAVE,
    # a set a run left partly applied is made whole: its new files go back
    (Goal.ALL_OLD, Standing.PARTLY_NEW): Action.RESTORE,
    (Goal.ALL_OLD, Standing.NEW_STALE): Action.RESTORE,
    (Goal.ALL_OLD, Standing.NEW_PROVEN): Action.RESTORE,
    (Goal.ALL_OLD, Standing.NEW_PROVEN_NO_SERVER): Action.RESTORE,
    (Goal.ALL_OLD, Standing.NEW_UNPROVEN): Action.RESTORE,
    (Goal.ALL_OLD, Standing.NEW_UNPROVEN_NO_SERVER): Action.RESTORE,
    (Goal.ALL_OLD, Standing.PATCHED_FURTHER): Action.REFUSE,
    (Goal.ALL_OLD, Standing.CHANGED): Action.REFUSE,
    # -- restart: proven where something is staged --------------------------------------------
    (Goal.PROVEN_WHERE_STAGED, Standing.NOTHING_RECORDED): Action.LEAVE,
    (Goal.PROVEN_WHERE_STAGED, Standing.ALL_OLD): Action.LEAVE,
    (Goal.PROVEN_WHERE_STAGED, Standing.PARTLY_NEW): Action.REFUSE,
    (Goal.PROVEN_WHERE_STAGED, Standing.NEW_STALE): Action.PROVE_OR_UNDO,
    # a server started after the write already runs it, proven or not: restarting proves nothing
    (Goal.PROVEN_WHERE_STAGED, Standing.NEW_PROVEN): Action.LEAVE,
    (Goal.PROVEN_WHERE_STAGED, Standing.NEW_UNPROVEN): Action.LEAVE,
    (Goal.PROVEN_WHERE_STAGED, Standing.NEW_PROVEN_NO_SERVER): Action.PROVE_OR_UNDO,
    (Goal.PROVEN_WHERE_STAGED, Standing.NEW_UNPROVEN_NO_SERVER): Action.PROVE_OR_UNDO,
    (Goal.PROVEN_WHERE_STAGED, Standing.PATCHED_FURTHER): Action.REFUSE,
    (Goal.PROVEN_WHERE_STAGED, Standing.CHANGED): Action.REFUSE,
    # -- recover: the ledger's last intent, finished or undone, never applied twice -----------
    (Goal.LAST_INTENT, Standing.NOTHING_RECORDED): Action.ENSURE_RUNNING,
    (Goal.LAST_INTENT, Standing.ALL_OLD): Action.ENSURE_RUNNING,
    # a run stopped between two swaps never proved its new code: the set is put back whole
    (Goal.LAST_INTENT, Standing.PARTLY_NEW): Action.RESTORE,
    (Goal.LAST_INTENT, Standing.NEW_STALE): Action.PROVE_OR_UNDO,
    # proven, and no server older than the change runs: make sure one answers, leave it alone
    (Goal.LAST_INTENT, Standing.NEW_PROVEN): Action.ENSURE_RUNNING,
    (Goal.LAST_INTENT, Standing.NEW_PROVEN_NO_SERVER): Action.ENSURE_RUNNING,
    (Goal.LAST_INTENT, Standing.NEW_UNPROVEN): Action.PROVE_OR_UNDO,
    (Goal.LAST_INTENT, Standing.NEW_UNPROVEN_NO_SERVER): Action.PROVE_OR_UNDO,
    (Goal.LAST_INTENT, Standing.PATCHED_FURTHER): Action.ATTENTION,
    (Goal.LAST_INTENT, Standing.CHANGED): Action.ATTENTION,
}
"""Every goal a standing decides. apply (and sync per desired patch) decide by their plan instead: a
file it changes is swapped and proven, one that carries the change left alone."""

DECIDED = frozenset(goal for goal, _ in DECISIONS)
"""The goals the table decides."""


def decide(command: Command, standing: Standing) -> Action:
    """What `command` does about a host standing `standing`: its goal's cell."""
    assert command.goal in DECIDED, f"{command} is not decided by a host's standing"
    return DECISIONS[command.goal, standing]


NODES_DIFFER: Mapping[Goal, Action] = {
    # a restart would run two versions of the code in one server: left for a person
    Goal.PROVEN_WHERE_STAGED: Action.ATTENTION,
    # the last intent was not carried out on every node: the new files go back
    Goal.LAST_INTENT: Action.RESTORE,
}
"""A group's action when some of its nodes carry the change and some do not."""


def group_action(command: Command, standings: Collection[Standing]) -> Action:
    """A group's one action from its nodes' cells: a node refused (or left for a person) decides
    it, then nodes that differ (`NODES_DIFFER`), then a restore, a proof; else the cell they share."""
    actions = [decide(command, standing) for standing in standings]
    new = sum(standing in ALL_NEW for standing in standings)
    for action in (Action.REFUSE, Action.ATTENTION):
        if action in actions:
            return action
    if 0 < new < len(actions):
        assert command.goal is not None
        return NODES_DIFFER[command.goal]
    for action in (Action.RESTORE, Action.PROVE_OR_UNDO):
        if action in actions:
            return action
    return actions[0]


def actions_of(command: Command) -> frozenset[Action]:
    """Every action `command` may take on a host: its own, and its goal's cells."""
    decided = {action for (goal, _), action in DECISIONS.items() if goal is command.goal}
    return frozenset({*command.actions, *decided})


def traits_of(command: Command) -> Traits:
    """What a run of `command` must be ready for, from the actions it may take."""
    traits = [action.traits for action in actions_of(command)]
    return Traits(
        leases=any(t.leases for t in traits),
        restarts=any(t.restarts for t in traits),
        raised=any(t.raised for t in traits),
        readmits=any(t.readmits for t in traits),
    )
