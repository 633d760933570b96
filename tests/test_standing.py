"""A host's standing, judged once (`judgments.patchset.judge`); what each command does about it
is one table (tests/test_decisions.py).

Pure: the judgment is given each file's place in its lineage, the server's age and the proof."""

from __future__ import annotations

import pytest

from opspatch.ledger.lineage import AtPostImage, AtPreImage, ChangedSince, Located, PatchedFurther
from opspatch.ledger.records import FileVersion
from opspatch.runs.judgments.patchset import ServerAge, Standing, judge, members_of

pytestmark = pytest.mark.pure


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
    assert str(both.change().set_state) == "partly-applied"  # the word the ledger records
    assert both.describe() == "a.py new, b.py old"
