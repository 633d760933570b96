"""Golden pairs for where an edit is recognised as applied (issue 19): at the place its selector
or anchor chose, not anywhere in its scope.

Each case applies, re-applies (already applied, bytes unchanged) and reverses to the exact
pre-image; the unpatched file must plan as applicable.
"""

from __future__ import annotations

import pytest

from opspatch.core.edit import (
    AlreadyApplied,
    Applied,
    NotApplicable,
    apply_patch,
    detect,
    reverse,
    unapply,
)
from tests.editkit import assert_golden
from tests.patchkit import make_patch, src

pytestmark = pytest.mark.pure

# ---------------------------------------------------------------------------------------------
# replace with which = "first" / "last" (issue 19, bug 1)

STEP = src(
    """
    class S:
        def step(self):
            if self.free <= 0 and self.chunked is not None:
                return None
            if self.chunked is not None and self.dynamic:
                return len(self.chunked.prefix)
    """
)


def _replace_expression(which: str) -> str:
    return f"""
[[edits]]
kind = "replace"
scope = "S.step"
select = {{ expression = "self.chunked is not None", which = "{which}" }}
code = "self.chunked is None"
"""


@pytest.mark.parametrize(
    ("which", "expected"),
    [
        (
            "first",
            STEP.replace(
                b"        if self.free <= 0 and self.chunked is not None:\n",
                b"        # opspatch:t-patch\n"
                b"        if self.free <= 0 and self.chunked is None:\n",
            ),
        ),
        (
            "last",
            STEP.replace(
                b"        if self.chunked is not None and self.dynamic:\n",
                b"        # opspatch:t-patch\n        if self.chunked is None and self.dynamic:\n",
            ),
        ),
    ],
    ids=["first", "last"],
)
def test_replace_first_or_last_expression_applies_once_and_only_once(
    which: str, expected: bytes
) -> None:
    assert_golden(STEP, make_patch(_replace_expression(which)), expected)


LIMITS = src(
    """
    def clamp(x):
        x = max(x, 0)
        y = 1
        x = max(x, 0)
        return x
    """
)


@pytest.mark.parametrize(("which", "line"), [("first", 2), ("last", 4)])
def test_replace_first_or_last_statement_applies_once_and_only_once(which: str, line: int) -> None:
    patch = make_patch(
        f"""
[[edits]]
kind = "replace"
scope = "clamp"
select = {{ assigns = "x", which = "{which}" }}
code = "x = min(max(x, 0), 9)"
"""
    )
    outcome = apply_patch(LIMITS, patch)
    assert isinstance(outcome, Applied), outcome
    lines = outcome.new_source.decode().splitlines()
    assert lines[line - 1 : line + 1] == ["    # opspatch:t-patch", "    x = min(max(x, 0), 9)"]
    again = apply_patch(outcome.new_source, patch)
    assert isinstance(again, AlreadyApplied), again
    assert reverse(outcome) == LIMITS


# ---------------------------------------------------------------------------------------------
# insert recognised at its anchor (issue 19, bug 3)

LOOP = src(
    """
    def run(batches):
        for batch in batches:
            batch.positions.add_(1)
            out = batch.forward()
            batch.hidden = out.hidden
        return batches
    """
)

MOVE_AFTER_HIDDEN = """
[[edits]]
kind = "insert"
scope = "run"
position = "after"
anchor = { assigns = "batch.hidden" }
code = "batch.positions.add_(1)"
"""


def test_insert_is_not_recognised_where_its_code_already_stands_elsewhere_in_the_scope() -> None:
    expected = LOOP.replace(
        b"        batch.hidden = out.hidden\n",
        b"        batch.hidden = out.hidden\n"
        b"        # opspatch:t-patch\n"
        b"        batch.positions.add_(1)\n",
    )
    assert_golden(LOOP, make_patch(MOVE_AFTER_HIDDEN), expected)


def test_insert_before_is_recognised_only_just_before_its_anchor() -> None:
    patch = make_patch(
        """
[[edits]]
kind = "insert"
scope = "run"
position = "before"
anchor = { calls = "batch.forward" }
code = "batch.hidden = out.hidden"
"""
    )
    assert detect(LOOP, patch).state == "not-applied"
    outcome = apply_patch(LOOP, patch)
    assert isinstance(outcome, Applied), outcome
    assert isinstance(apply_patch(outcome.new_source, patch), AlreadyApplied)
    undone = unapply(outcome.new_source, patch)
    assert not isinstance(undone, NotApplicable), undone.reason
    assert undone.old_source == LOOP


def test_two_inserts_after_one_anchor_are_both_recognised() -> None:
    patch = make_patch(
        """
[[edits]]
kind = "insert"
scope = "run"
position = "after"
anchor = { assigns = "out" }
code = "a = 1"

[[edits]]
kind = "insert"
scope = "run"
position = "after"
anchor = { assigns = "out" }
code = "b = 2"
"""
    )
    outcome = apply_patch(LOOP, patch)
    assert isinstance(outcome, Applied), outcome
    assert detect(outcome.new_source, patch).state == "applied"
    assert isinstance(apply_patch(outcome.new_source, patch), AlreadyApplied)
    undone = unapply(outcome.new_source, patch)
    assert not isinstance(undone, NotApplicable), undone.reason
    assert undone.old_source == LOOP


# ---------------------------------------------------------------------------------------------
# how an already-applied patch was recognised (issue 19)


def test_an_applied_diff_says_it_was_recognised_by_reverse_apply() -> None:
    from tests.editkit import DIFF_BEFORE, DIFF_PATCH

    patch = make_patch(DIFF_PATCH)
    outcome = apply_patch(DIFF_BEFORE, patch)
    assert isinstance(outcome, Applied)
    again = apply_patch(outcome.new_source, patch)
    assert isinstance(again, AlreadyApplied)
    assert again.reason == "all 1 edit(s) already present (recognised by reverse apply)"


def test_an_applied_replace_says_it_was_recognised_by_syntax_tree() -> None:
    patch = make_patch(_replace_expression("first"))
    outcome = apply_patch(STEP, patch)
    assert isinstance(outcome, Applied)
    again = apply_patch(outcome.new_source, patch)
    assert isinstance(again, AlreadyApplied)
    assert again.reason == "all 1 edit(s) already present (recognised by syntax tree)"


# ---------------------------------------------------------------------------------------------
# replace with which = "all" (issue 19)


def test_replace_all_expressions_marks_each_statement_once() -> None:
    before = src(
        """
        def f(self):
            if self.chunked is not None and self.chunked is not None:
                return 1
            while self.chunked is not None:
                pass
        """
    )
    expected = src(
        """
        def f(self):
            # opspatch:t-patch
            if self.chunked is None and self.chunked is None:
                return 1
            # opspatch:t-patch
            while self.chunked is None:
                pass
        """
    )
    assert_golden(
        before,
        make_patch(
            """
[[edits]]
kind = "replace"
scope = "f"
select = { expression = "self.chunked is not None", which = "all" }
code = "self.chunked is None"
"""
        ),
        expected,
    )


def test_replace_all_statements() -> None:
    expected = src(
        """
        def clamp(x):
            # opspatch:t-patch
            x = min(max(x, 0), 9)
            y = 1
            # opspatch:t-patch
            x = min(max(x, 0), 9)
            return x
        """
    )
    assert_golden(
        LIMITS,
        make_patch(
            """
[[edits]]
kind = "replace"
scope = "clamp"
select = { matches = "x = max(x, 0)", which = "all" }
code = "x = min(max(x, 0), 9)"
"""
        ),
        expected,
    )


def test_replace_all_that_matches_nothing_is_not_applicable() -> None:
    patch = make_patch(
        """
[[edits]]
kind = "replace"
scope = "clamp"
select = { expression = "nothing_here", which = "all" }
code = "something_else"
"""
    )
    outcome = apply_patch(LIMITS, patch)
    assert isinstance(outcome, NotApplicable)
    assert outcome.field == "edits[0].select"
    assert "every expression `nothing_here`" in outcome.reason


# ---------------------------------------------------------------------------------------------
# delete (issue 19)


def test_delete_a_statement_leaves_the_marker_in_its_place() -> None:
    expected = src(
        """
        def run(batches):
            for batch in batches:
                # opspatch:t-patch: it moves after the forward pass
                out = batch.forward()
                batch.hidden = out.hidden
            return batches
        """
    )
    assert_golden(
        LOOP,
        make_patch(
            """
[[edits]]
kind = "delete"
scope = "run"
select = { calls = "batch.positions.add_" }
comment = "it moves after the forward pass"
"""
        ),
        expected,
    )


def test_delete_all_matching_statements() -> None:
    expected = src(
        """
        def clamp(x):
            # opspatch:t-patch
            y = 1
            # opspatch:t-patch
            return x
        """
    )
    assert_golden(
        LIMITS,
        make_patch(
            """
[[edits]]
kind = "delete"
scope = "clamp"
select = { assigns = "x", which = "all" }
"""
        ),
        expected,
    )


def test_a_move_is_a_delete_then_an_insert_at_the_anchor() -> None:
    delete = """
[[edits]]
kind = "delete"
scope = "run"
select = { matches = "batch.positions.add_(1)" }
"""
    expected = src(
        """
        def run(batches):
            for batch in batches:
                # opspatch:t-patch
                out = batch.forward()
                batch.hidden = out.hidden
                # opspatch:t-patch
                batch.positions.add_(1)
            return batches
        """
    )
    assert_golden(LOOP, make_patch(delete + MOVE_AFTER_HIDDEN), expected)


def test_a_delete_after_an_insert_of_the_same_code_is_refused() -> None:
    patch = make_patch(
        MOVE_AFTER_HIDDEN
        + """
[[edits]]
kind = "delete"
scope = "run"
select = { matches = "batch.positions.add_(1)", which = "all" }
"""
    )
    outcome = apply_patch(LOOP, patch)
    assert isinstance(outcome, NotApplicable)
    assert outcome.field == "edits[1].select"
    assert "put the delete before the insert" in outcome.reason


def test_delete_refuses_an_ambiguous_selector_with_every_place() -> None:
    patch = make_patch(
        """
[[edits]]
kind = "delete"
scope = "clamp"
select = { assigns = "x" }
"""
    )
    outcome = apply_patch(LIMITS, patch)
    assert isinstance(outcome, NotApplicable)
    assert outcome.field == "edits[0].select"
    assert outcome.candidates == ("line 2", "line 4")


@pytest.mark.parametrize("which", ["first", "last"])
def test_delete_with_first_or_last_is_refused_at_load_time(which: str) -> None:
    from opspatch.errors import SpecError

    with pytest.raises(SpecError, match="cannot be recognised as applied"):
        make_patch(
            f"""
[[edits]]
kind = "delete"
scope = "clamp"
select = {{ assigns = "x", which = "{which}" }}
"""
        )


@pytest.mark.parametrize("position", ["start", "end"])
def test_insert_at_start_or_end_counts_in_the_scopes_own_body_not_in_a_nested_block(
    position: str,
) -> None:
    """The same code in a nested block is not the insert; in the scope's own body it is, also
    when a patch stacked later put code before or after it (re-applying must not add a copy)."""
    before = src(
        """
        def f(x):
            if x:
                guard = 0
            return x
        """
    )
    patch = make_patch(
        f"""
[[edits]]
kind = "insert"
scope = "f"
position = "{position}"
code = "guard = 0"
"""
    )
    assert detect(before, patch).state == "not-applied"
    outcome = apply_patch(before, patch)
    assert isinstance(outcome, Applied), outcome
    assert isinstance(apply_patch(outcome.new_source, patch), AlreadyApplied)
    undone = unapply(outcome.new_source, patch)
    assert not isinstance(undone, NotApplicable), undone.reason
    assert undone.old_source == before
    stacked = make_patch(
        f"""
[[edits]]
kind = "insert"
scope = "f"
position = "{position}"
code = "later = 1"
"""
    )
    on_top = apply_patch(outcome.new_source, stacked)
    assert isinstance(on_top, Applied), on_top
    assert detect(on_top.new_source, patch).state == "applied"
    assert isinstance(apply_patch(on_top.new_source, patch), AlreadyApplied)
