"""The golden-pair check every edit-engine test shares: apply gives the expected bytes, applying
again is already-applied with the bytes unchanged, and the record reverses to the exact
pre-image (the unpatched file plans as not applied)."""

from __future__ import annotations

from opspatch.core.edit import AlreadyApplied, Applied, apply_patch, detect, reverse
from opspatch.core.spec import PatchSpec


def assert_golden(before: bytes, patch: PatchSpec, expected: bytes) -> Applied:
    """Apply `patch` to `before`, expecting `expected`; re-apply and reverse it (see module)."""
    assert detect(before, patch).state == "not-applied"
    outcome = apply_patch(before, patch)
    assert isinstance(outcome, Applied), outcome
    assert outcome.new_source == expected, outcome.new_source.decode()
    again = apply_patch(outcome.new_source, patch)
    assert isinstance(again, AlreadyApplied), again
    assert detect(outcome.new_source, patch).state == "applied"
    assert reverse(outcome) == before
    return outcome
