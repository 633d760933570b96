"""A host's standing, judged once (`judgments.patchset.judge`), and each command that changes
hosts as a table over it (`restart`, `recover`, `rollback`: `ACTIONS`).

Pure: the judgment is given each file's place in its lineage, the server's age and the proof;
the tables are data. A standing added without a cell in every table fails here."""

from __future__ import annotations

import pytest

from opspatch.ledger.lineage import AtPostImage, AtPreImage, ChangedSince, PatchedFurther
from opspatch.ledger.lineage import Standing as Located
from opspatch.ledger.records import FileVersion
from opspatch.runs.commands import recover, restart, rollback
from opspatch.runs.judgments.patchset import (
    Action,
    ServerAge,
    Standing,
    Table,
    judge,
    members_of,
)

pytestmark = pytest.mark.pure

TABLES: dict[str, Table] = {
    "restart": restart.ACTIONS,
    "recover": recover.ACTIONS,
    "rollback": rollback.ACTIONS,
}


def _version(
    event_id: int, path: str = "/srv/a.py", before: str = "a0", after: str = "a1"
) -> FileVersion:
    return FileVersion(
        event_id=event_id,
        run_id=f"r{event_id}",
        patch_id="p",
        host="gpu-01",
        path=path,
        action="patch",
        sha256_before=before,
        sha256_after=after,
        mode=0o644,
        owner="root:root",
        size_before=1,
        pre_image_sha256=before,
        post_image_sha256=after,
        recorded_at="2026-12-04T00:00:00Z",
    )


A = _version(1)
B = _version(2, "/srv/b.py", "b0", "b1")
NEW_A, OLD_A = AtPostImage(A), AtPreImage(A)
NEW_B, OLD_B = AtPostImage(B), AtPreImage(B)
FURTHER_B = PatchedFurther(B, (_version(3, "/srv/b.py", "b1", "b2"),))


@pytest.mark.parametrize("name", sorted(TABLES))
def test_every_standing_has_an_action_in_every_table(name: str) -> None:
    table = TABLES[name]
    assert set(table) == set(Standing), f"{name}: no action for {set(Standing) - set(table)}"
    assert all(isinstance(action, Action) for action in table.values())


@pytest.mark.parametrize(
    ("located", "server", "proven", "expected"),
    [
        ((), ServerAge.NEWER, False, Standing.NOTHING_RECORDED),
        ((None,), ServerAge.NEWER, False, Standing.NOTHING_RECORDED),
        ((OLD_A,), ServerAge.NEWER, False, Standing.ALL_OLD),
        ((OLD_A, OLD_B), ServerAge.OLDER, True, Standing.ALL_OLD),
        ((NEW_A, OLD_B), ServerAge.NEWER, True, Standing.PARTLY_NEW),
        ((NEW_A,), ServerAge.OLDER, True, Standing.NEW_STALE),
        ((NEW_A, NEW_B), ServerAge.OLDER, False, Standing.NEW_STALE),
        ((NEW_A,), ServerAge.NEWER, True, Standing.NEW_PROVEN),
        ((NEW_A,), ServerAge.NEWER, False, Standing.NEW_UNPROVEN),
        ((NEW_A, NEW_B), ServerAge.NONE, True, Standing.NEW_PROVEN_NO_SERVER),
        ((NEW_A,), ServerAge.NONE, False, Standing.NEW_UNPROVEN_NO_SERVER),
        ((NEW_A, FURTHER_B), ServerAge.NEWER, True, Standing.PATCHED_FURTHER),
        ((FURTHER_B, ChangedSince(A)), ServerAge.NEWER, True, Standing.CHANGED),
        ((ChangedSince(A),), ServerAge.NONE, False, Standing.CHANGED),
    ],
)
def test_judge_reads_every_file_together(
    located: tuple[Located | None, ...], server: ServerAge, proven: bool, expected: Standing
) -> None:
    assert judge(located, server=server, proven=proven) == expected


def test_a_single_file_is_a_set_of_one() -> None:
    one = members_of([NEW_A], ["a1"])
    assert [m.is_new for m in one.members] == [True]
    both = members_of([NEW_A, OLD_B], ["a1", "b0"])
    assert str(both.state) == "partly-applied"
    assert both.describe() == "a.py new, b.py old"


def test_proven_and_a_newer_server_is_left_alone_by_every_command_that_restarts() -> None:
    # the rule, written once in the judgment: restart leaves it, recover only makes sure a
    # server answers; a rollback undoes it all the same
    assert restart.ACTIONS[Standing.NEW_PROVEN] == Action.LEAVE
    assert recover.ACTIONS[Standing.NEW_PROVEN] == Action.ENSURE_RUNNING
    assert rollback.ACTIONS[Standing.NEW_PROVEN] == Action.RESTORE


@pytest.mark.parametrize(
    ("standing", "restart_does", "recover_does", "rollback_does"),
    [
        (
            Standing.NOTHING_RECORDED,
            Action.LEAVE,
            Action.ENSURE_RUNNING,
            Action.RESTORE_FROM_BACKUP,
        ),
        (Standing.ALL_OLD, Action.LEAVE, Action.ENSURE_RUNNING, Action.LEAVE),
        (Standing.PARTLY_NEW, Action.REFUSE, Action.RESTORE, Action.RESTORE),
        (Standing.NEW_STALE, Action.PROVE_OR_UNDO, Action.PROVE_OR_UNDO, Action.RESTORE),
        (Standing.NEW_UNPROVEN, Action.LEAVE, Action.PROVE_OR_UNDO, Action.RESTORE),
        (
            Standing.NEW_PROVEN_NO_SERVER,
            Action.PROVE_OR_UNDO,
            Action.ENSURE_RUNNING,
            Action.RESTORE,
        ),
        (
            Standing.NEW_UNPROVEN_NO_SERVER,
            Action.PROVE_OR_UNDO,
            Action.PROVE_OR_UNDO,
            Action.RESTORE,
        ),
        (Standing.PATCHED_FURTHER, Action.REFUSE, Action.ATTENTION, Action.REFUSE),
        (Standing.CHANGED, Action.REFUSE, Action.ATTENTION, Action.REFUSE),
    ],
)
def test_each_command_is_a_table_over_the_standing(
    standing: Standing, restart_does: Action, recover_does: Action, rollback_does: Action
) -> None:
    assert (
        restart.ACTIONS[standing],
        recover.ACTIONS[standing],
        rollback.ACTIONS[standing],
    ) == (restart_does, recover_does, rollback_does)
