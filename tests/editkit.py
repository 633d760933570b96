"""The golden-pair check every edit-engine test shares: apply gives the expected bytes, applying
again is already-applied with the bytes unchanged, the record reverses to the exact pre-image
(the unpatched file plans as not applied), and `unapply` (no record) gives the pre-image back
where the edit kinds allow it and refuses where they do not."""

from __future__ import annotations

from opspatch.core.edit import (
    AlreadyApplied,
    Applied,
    NotApplicable,
    apply_patch,
    detect,
    reverse,
    unapply,
)
from opspatch.core.kinds import KINDS
from opspatch.core.spec import PatchSpec

UNDONE_FROM_TEXT = frozenset(kind for kind, model in KINDS.items() if model.undone_from_text)
"""The edit kinds `unapply` removes from the patched text alone (each kind says so); the others
are undone from the recorded pre-image."""


def assert_golden(before: bytes, patch: PatchSpec, expected: bytes) -> Applied:
    """Apply `patch` to `before`, expecting `expected`; re-apply, reverse and unapply it (see
    module)."""
    assert detect(before, patch).state == "not-applied"
    outcome = apply_patch(before, patch)
    assert isinstance(outcome, Applied), getattr(outcome, "reason", outcome)
    assert outcome.new_source == expected, "\n" + outcome.new_source.decode("utf-8", "replace")
    again = apply_patch(outcome.new_source, patch)
    assert isinstance(again, AlreadyApplied), again
    assert detect(outcome.new_source, patch).state == "applied"
    assert reverse(outcome) == before
    undone = unapply(outcome.new_source, patch)
    if all(edit.kind in UNDONE_FROM_TEXT for edit in patch.edits):
        assert not isinstance(undone, NotApplicable), undone.reason
        assert undone.old_source == before
    else:
        assert isinstance(undone, NotApplicable), undone
    return outcome
