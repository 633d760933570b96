"""Golden pairs for `move` (issue 19): one statement to a new anchor, recognised as applied only
where the anchor says. Each applies, re-applies (already applied, bytes unchanged) and reverses
to the exact pre-image."""

from __future__ import annotations

import pytest

from opspatch.core.edit import Applied, NotApplicable, apply_patch, detect, unapply
from opspatch.errors import SpecError
from tests.editkit import assert_golden
from tests.patchkit import make_patch, src

pytestmark = pytest.mark.pure

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
kind = "move"
scope = "run"
select = { matches = "batch.positions.add_(1)" }
position = "after"
anchor = { assigns = "batch.hidden" }
comment = "the positions advance after the forward pass"
"""


def test_move_after_an_anchor_inside_a_loop() -> None:
    expected = src(
        """
        def run(batches):
            for batch in batches:
                out = batch.forward()
                batch.hidden = out.hidden
                # opspatch:t-patch: the positions advance after the forward pass
                batch.positions.add_(1)
            return batches
        """
    )
    assert_golden(LOOP, make_patch(MOVE_AFTER_HIDDEN), expected)


def test_move_before_an_anchor_keeps_the_statements_own_text_and_comments() -> None:
    before = src(
        """
        def run(self):
            self.load()
            self.warm(
                graphs=True,  # the capture needs the weights
            )
            self.weights = read()
        """
    )
    expected = src(
        """
        def run(self):
            self.load()
            # opspatch:t-patch
            self.weights = read()
            self.warm(
                graphs=True,  # the capture needs the weights
            )
        """
    )
    patch = make_patch(
        """
[[edits]]
kind = "move"
scope = "run"
select = { assigns = "self.weights" }
position = "before"
anchor = { calls = "self.warm" }
"""
    )
    assert_golden(before, patch, expected)


def test_move_out_of_a_nested_block_to_the_end_of_the_scope_is_re_indented() -> None:
    before = src(
        """
        class W:
            def step(self, batch):
                if batch.ready:
                    out = self.forward(batch)
                    self.stats.update(
                        out,
                    )
                return out
        """
    )
    expected = src(
        """
        class W:
            def step(self, batch):
                if batch.ready:
                    out = self.forward(batch)
                return out
                # opspatch:t-patch
                self.stats.update(
                    out,
                )
        """
    )
    patch = make_patch(
        """
[[edits]]
kind = "move"
scope = "W.step"
select = { calls = "self.stats.update" }
position = "end"
"""
    )
    assert_golden(before, patch, expected)


def test_move_to_the_start_goes_past_the_docstring() -> None:
    before = src(
        '''
        def init(self):
            """Set up."""
            self.a = 1
            self.b = 2
        '''
    )
    expected = src(
        '''
        def init(self):
            """Set up."""
            # opspatch:t-patch
            self.b = 2
            self.a = 1
        '''
    )
    patch = make_patch(
        """
[[edits]]
kind = "move"
scope = "init"
select = { assigns = "self.b" }
position = "start"
"""
    )
    assert_golden(before, patch, expected)


def test_a_pristine_file_with_the_statement_elsewhere_is_not_applied() -> None:
    """The statement stands in the scope, one line from its anchor: that is not the move."""
    patch = make_patch(MOVE_AFTER_HIDDEN)
    detection = detect(LOOP, patch)
    assert detection.state == "not-applied"
    assert detection.edits[0].reason == "the statement stands at line 3, not after its anchor"


def test_a_file_already_in_the_moved_order_is_already_applied_without_a_marker() -> None:
    moved = LOOP.replace(b"        batch.positions.add_(1)\n", b"").replace(
        b"        batch.hidden = out.hidden\n",
        b"        batch.hidden = out.hidden\n        batch.positions.add_(1)\n",
    )
    assert detect(moved, make_patch(MOVE_AFTER_HIDDEN)).state == "applied"


def test_a_move_is_not_undone_from_the_patched_text_alone() -> None:
    patch = make_patch(MOVE_AFTER_HIDDEN)
    outcome = apply_patch(LOOP, patch)
    assert isinstance(outcome, Applied)
    undone = unapply(outcome.new_source, patch)
    assert isinstance(undone, NotApplicable)
    assert "recorded pre-image" in undone.reason


def test_a_move_whose_statement_is_twice_in_the_scope_is_refused_with_both_places() -> None:
    twice = LOOP.replace(b"    return", b"    batch.positions.add_(1)\n    return")
    outcome = apply_patch(twice, make_patch(MOVE_AFTER_HIDDEN))
    assert isinstance(outcome, NotApplicable)
    assert outcome.field == "edits[0].select"
    assert outcome.candidates == ("line 3", "line 6")


def test_a_move_whose_anchor_is_missing_is_refused_with_the_nearest_names() -> None:
    patch = make_patch(MOVE_AFTER_HIDDEN.replace("batch.hidden", "batch.hiddens"))
    outcome = apply_patch(LOOP, patch)
    assert isinstance(outcome, NotApplicable)
    assert outcome.field == "edits[0].anchor"
    assert "nearest: batch.hidden" in outcome.candidates


def test_a_move_that_would_empty_its_block_is_refused() -> None:
    before = src(
        """
        def f(xs):
            for x in xs:
                use(x)
            done()
        """
    )
    patch = make_patch(
        """
[[edits]]
kind = "move"
scope = "f"
select = { calls = "use" }
position = "after"
anchor = { calls = "done" }
"""
    )
    outcome = apply_patch(before, patch)
    assert isinstance(outcome, NotApplicable)
    assert "leave the block empty" in outcome.reason


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        ('which = "first"', "a move takes one statement"),
        ('which = "all"', "a move takes one statement"),
    ],
)
def test_a_move_takes_one_statement(extra: str, problem: str) -> None:
    body = MOVE_AFTER_HIDDEN.replace(
        'select = { matches = "batch.positions.add_(1)" }',
        f'select = {{ matches = "batch.positions.add_(1)", {extra} }}',
    )
    with pytest.raises(SpecError, match=problem):
        make_patch(body)


def test_a_move_before_or_after_needs_an_anchor() -> None:
    with pytest.raises(SpecError, match="needs an anchor"):
        make_patch(MOVE_AFTER_HIDDEN.replace('anchor = { assigns = "batch.hidden" }\n', ""))
