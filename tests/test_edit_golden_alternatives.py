"""Golden pairs for per-release alternatives (issue 19): an edit may carry alternatives, tried
in order; the one that fit is in the plan (`matched`, each edit record's `variant`), and
re-application and unapply find it in place."""

from __future__ import annotations

import pytest

from opspatch.core.edit import (
    AlreadyApplied,
    Applied,
    NotApplicable,
    apply_patch,
    detect,
    unapply,
)
from opspatch.errors import SpecError
from tests.editkit import assert_golden
from tests.patchkit import make_patch, src

pytestmark = pytest.mark.pure

# The third operand of the condition was renamed between two releases.
OLD_RELEASE = src(
    """
    class S:
        def step(self):
            if self.free <= 0 and self.chunked is not None and self.dynamic:
                return None
            return self.chunked
    """
)
NEW_RELEASE = OLD_RELEASE.replace(b"self.dynamic", b"self.enable_dynamic_chunking")

RENAMED = """
[[edits]]
kind = "replace"
scope = "S.step"
select = { test_of = "if", containing = "self.dynamic" }
code = "self.chunked is not None and self.dynamic"

[[edits.alternatives]]
name = "sglang >= 0.5.10"
select = { test_of = "if", containing = "self.enable_dynamic_chunking" }
code = "self.chunked is not None and self.enable_dynamic_chunking"
"""


@pytest.mark.parametrize(
    ("before", "variant", "matched", "new_test"),
    [
        (OLD_RELEASE, 0, "edits[0]: as written", b"self.chunked is not None and self.dynamic"),
        (
            NEW_RELEASE,
            1,
            "edits[0]: alternatives[0] (sglang >= 0.5.10)",
            b"self.chunked is not None and self.enable_dynamic_chunking",
        ),
    ],
    ids=["as-written", "alternative"],
)
def test_the_first_alternative_that_fits_is_applied_and_recorded(
    before: bytes, variant: int, matched: str, new_test: bytes
) -> None:
    patch = make_patch(RENAMED)
    old_line = next(line for line in before.splitlines(keepends=True) if b" if " in line)
    expected = before.replace(
        old_line, b"        # opspatch:t-patch\n        if " + new_test + b":\n"
    )
    outcome = assert_golden(before, patch, expected)
    assert outcome.edits[0].variant == variant
    assert outcome.matched == (matched,)
    again = apply_patch(outcome.new_source, patch)
    assert isinstance(again, AlreadyApplied)
    assert again.matched == (matched,)
    assert again.reason.endswith(f"; {matched}")
    assert detect(outcome.new_source, patch).edits[0].variant == variant


def test_when_no_alternative_fits_each_says_what_it_found() -> None:
    neither = OLD_RELEASE.replace(b"self.dynamic", b"self.other")
    outcome = apply_patch(neither, make_patch(RENAMED))
    assert isinstance(outcome, NotApplicable)
    assert outcome.field == "edits[0]"
    assert outcome.reason == "none of its 2 variants fits"
    assert [c.split(":")[0] for c in outcome.candidates] == [
        "as written",
        "alternatives[0] (sglang >= 0.5.10)",
    ]
    assert "containing `self.dynamic`" in outcome.candidates[0]


def test_an_insert_alternative_is_unapplied_from_the_text_in_the_variant_that_fit() -> None:
    patch = make_patch(
        """
[[edits]]
kind = "insert"
scope = "S.step"
position = "before"
anchor = { matches = "return self.chunked" }
code = "self.dynamic = False"

[[edits.alternatives]]
anchor = { matches = "return self.enable_dynamic_chunking" }
code = "self.enable_dynamic_chunking = False"
"""
    )
    before = NEW_RELEASE.replace(b"return self.chunked\n", b"return self.enable_dynamic_chunking\n")
    expected = before.replace(
        b"        return self.enable_dynamic_chunking\n",
        b"        # opspatch:t-patch\n"
        b"        self.enable_dynamic_chunking = False\n"
        b"        return self.enable_dynamic_chunking\n",
    )
    outcome = assert_golden(before, patch, expected)
    assert outcome.matched == ("edits[0]: alternatives[0]",)
    undone = unapply(outcome.new_source, patch)
    assert not isinstance(undone, NotApplicable), undone.reason
    assert undone.old_source == before


def test_an_alternative_may_change_only_the_selector() -> None:
    patch = make_patch(
        """
[[edits]]
kind = "replace"
scope = "S.step"
select = { expression = "self.dynamic" }
code = "False"

[[edits.alternatives]]
select = { expression = "self.enable_dynamic_chunking" }
"""
    )
    outcome = apply_patch(NEW_RELEASE, patch)
    assert isinstance(outcome, Applied), outcome
    assert b"self.chunked is not None and False:" in outcome.new_source
    assert outcome.edits[0].variant == 1


def test_an_alternative_that_is_not_a_valid_edit_is_refused_at_load_time_at_its_line() -> None:
    with pytest.raises(SpecError) as caught:
        make_patch(
            RENAMED.replace(
                'code = "self.chunked is not None and self.enable', 'code = "x = (self.enable'
            )
        )
    message = str(caught.value)
    assert "edits[0].alternatives" in message
    assert "alternatives[0]" in message
    assert "must be an expression" in message


def test_an_alternative_with_an_unknown_key_is_refused() -> None:
    with pytest.raises(SpecError, match="unknown key 'kind'"):
        make_patch(RENAMED.replace('name = "sglang >= 0.5.10"', 'kind = "insert"'))


def test_more_than_sixteen_alternatives_are_refused_at_load_time() -> None:
    many = "".join(
        f'\n[[edits.alternatives]]\nselect = {{ expression = "self.v{n}" }}\n' for n in range(17)
    )
    with pytest.raises(SpecError, match="edits\\[0\\].alternatives"):
        make_patch(RENAMED.split("\n[[edits.alternatives]]")[0] + many)


def test_a_re_application_names_the_alternative_whose_selector_finds_the_new_code() -> None:
    """Both variants write the same code; the one as written reads applied only because its
    old code is absent, the alternative's selector finds the new code: that one is named."""
    patch = make_patch(
        """
[[edits]]
kind = "replace"
scope = "S.step"
select = { assigns = "self.missing" }
code = "self.dynamic = False"

[[edits.alternatives]]
select = { assigns = "self.dynamic" }
"""
    )
    before = OLD_RELEASE.replace(b"        return self.chunked\n", b"        self.dynamic = True\n")
    outcome = assert_golden(
        before,
        patch,
        before.replace(
            b"        self.dynamic = True\n",
            b"        # opspatch:t-patch\n        self.dynamic = False\n",
        ),
    )
    again = apply_patch(outcome.new_source, patch)
    assert isinstance(again, AlreadyApplied)
    assert again.matched == ("edits[0]: alternatives[0]",)


def test_check_releases_says_which_alternative_fit_each_release() -> None:
    from opspatch.analysis.portability import evaluate_release

    patch = make_patch(RENAMED)
    old = evaluate_release(patch, "0.5.9", OLD_RELEASE)
    new = evaluate_release(patch, "0.5.10", NEW_RELEASE)
    assert old.ok and new.ok
    assert old.to_json()["matched"] == ["edits[0]: as written"]
    assert new.to_json()["matched"] == ["edits[0]: alternatives[0] (sglang >= 0.5.10)"]
