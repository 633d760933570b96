"""Which recorded change a live file is at (`ledger/lineage.py`): table cases on file versions."""

from __future__ import annotations

import pytest

from opspatch.ledger.lineage import (
    AtPostImage,
    AtPreImage,
    ChangedSince,
    PatchedFurther,
    applied_versions,
    locate,
)
from opspatch.ledger.records import FileVersion

pytestmark = pytest.mark.pure

X0, XA, XAB, XAC, X2, OTHER = ("0" * 63 + d for d in "012345")


def version(event_id: int, run: str, patch: str, before: str, after: str, action: str = "patch"
            ) -> FileVersion:  # fmt: skip
    return FileVersion(
        event_id=event_id, run_id=run, patch_id=patch, host="h", path="/f.py", action=action,
        sha256_before=before, sha256_after=after, mode=0o644, owner="root:root", size_before=1,
        pre_image_sha256=before, post_image_sha256=after, recorded_at="t",
    )  # fmt: skip


A = version(1, "r1", "a", X0, XA)
B = version(2, "r2", "b", XA, XAB)
HISTORY = [B, A]  # newest first, as file_history gives it


def test_a_patch_under_a_later_one_is_patched_further_not_changed() -> None:
    standing = locate(HISTORY, applied_versions(HISTORY, "a"), XAB)
    assert standing == PatchedFurther(A, (B,))
    assert standing.advice() == "patched further by run r2 (b): roll b back first"
    assert locate(HISTORY, applied_versions(HISTORY, "b"), XAB) == AtPostImage(B)


def test_after_the_top_is_rolled_back_the_one_below_is_at_its_post_image() -> None:
    undo_b = version(3, "r3", "b", XAB, XA, action="restore")
    history = [undo_b, *HISTORY]
    assert locate(history, applied_versions(history, "a"), XA) == AtPostImage(A)
    assert locate(history, applied_versions(history, "b"), XA) == AtPreImage(B)


def test_a_patch_applied_twice_is_found_at_each_post_image_in_turn() -> None:
    first = version(1, "r1", "p", X0, XA)
    second = version(2, "r2", "p", XA, X2)
    history = [second, first]
    candidates = applied_versions(history, "p")
    assert candidates == [second, first]
    assert locate(history, candidates, X2) == AtPostImage(second)
    assert locate(history, candidates, XA) == AtPostImage(first)
    assert locate(history, candidates, X0) == AtPreImage(first)
    assert locate(history, [first], X2) == PatchedFurther(first, (second,))


def test_the_path_to_the_live_bytes_skips_a_branch_rolled_back_since() -> None:
    undo_b = version(3, "r3", "b", XAB, XA, action="restore")
    c = version(4, "r4", "c", XA, XAC)
    history = [c, undo_b, *HISTORY]
    assert locate(history, [A], XAC) == PatchedFurther(A, (c,))
    under_two = locate([version(3, "r3", "c", XAB, XAC), *HISTORY], [A], XAC)
    assert isinstance(under_two, PatchedFurther)
    assert under_two.advice() == (
        "patched further by run r2 (b), then run r3 (c): roll c back first"
    )


def test_bytes_no_recorded_change_leads_to_are_changed_since() -> None:
    assert locate(HISTORY, applied_versions(HISTORY, "a"), OTHER) == ChangedSince(A)
    assert locate(HISTORY, [], OTHER) is None


def test_a_run_that_restored_its_own_change_is_not_a_candidate() -> None:
    undone = version(3, "r3", "a", XAB, X0, action="restore")
    again = version(2, "r3", "a", X0, XAB)
    history = [undone, again, A]
    assert applied_versions(history, "a") == [A]
