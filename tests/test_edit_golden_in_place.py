"""Golden pairs for "applied" proven at the edit's own place (issue 31, item 7): the new code
already standing elsewhere in the scope never makes an edit read applied, so its fix is written
where its selector, anchor or position points; applying again is already-applied there, and the
record reverses to the exact pre-image.

The silent skip this guards against (pnpm#9160): a `replace` with `which = "first"` whose new
code already occurs earlier in the scope was read as applied and never written.
"""

from __future__ import annotations

import pytest

from opspatch.core.edit import AlreadyApplied, Applied, apply_patch, detect
from tests.editkit import assert_golden
from tests.patchkit import make_patch, src

pytestmark = pytest.mark.pure

M = b"        # opspatch:t-patch\n"

# ---------------------------------------------------------------------------------------------
# replace: an expression, for every `which`

STEP = src(
    """
    class S:
        def step(self):
            early = self.chunked is None
            if self.free <= 0 and self.chunked is not None:
                return None
            if self.chunked is not None and self.dynamic:
                return len(self.chunked.prefix)
            late = self.chunked is None
            return early, late
    """
)
ONE_MATCH = STEP.replace(
    b"        if self.chunked is not None and self.dynamic:\n",
    b"        if self.dynamic:\n",
)
FIRST_IF = b"        if self.free <= 0 and self.chunked is not None:\n"
SECOND_IF = b"        if self.chunked is not None and self.dynamic:\n"


def _expression(which: str) -> str:
    return f"""
[[edits]]
kind = "replace"
scope = "S.step"
select = {{ expression = "self.chunked is not None", which = "{which}" }}
code = "self.chunked is None"
"""


def _fixed(source: bytes, line: bytes) -> bytes:
    return source.replace(line, M + line.replace(b"is not None", b"is None"))


@pytest.mark.parametrize(
    ("which", "before", "expected"),
    [
        ("only", ONE_MATCH, _fixed(ONE_MATCH, FIRST_IF)),
        ("first", STEP, _fixed(STEP, FIRST_IF)),
        ("last", STEP, _fixed(STEP, SECOND_IF)),
        ("all", STEP, _fixed(_fixed(STEP, FIRST_IF), SECOND_IF)),
    ],
    ids=["only", "first", "last", "all"],
)
def test_a_replaced_expression_is_written_although_its_new_code_stands_elsewhere(
    which: str, before: bytes, expected: bytes
) -> None:
    """`self.chunked is None` stands before the first match and after the last: neither is the
    edit's place, so the plan is applicable and writes the fix where `which` points."""
    assert_golden(before, make_patch(_expression(which)), expected)


# ---------------------------------------------------------------------------------------------
# replace: a statement, for every `which` (the selector does not match the new code)

LIMITS = src(
    """
    def clamp(x):
        x = min(max(x, 0), 9)
        x = max(x, 0)
        y = 1
        x = max(x, 0)
        x = min(max(x, 0), 9)
        return x
    """
)
LIMIT_ONCE = LIMITS.replace(b"    y = 1\n    x = max(x, 0)\n", b"    y = 1\n")
NEW_LIMIT = b"    # opspatch:t-patch\n    x = min(max(x, 0), 9)\n"


def _statement(which: str) -> str:
    return f"""
[[edits]]
kind = "replace"
scope = "clamp"
select = {{ matches = "x = max(x, 0)", which = "{which}" }}
code = "x = min(max(x, 0), 9)"
"""


@pytest.mark.parametrize(
    ("which", "before", "expected"),
    [
        ("only", LIMIT_ONCE, LIMIT_ONCE.replace(b"    x = max(x, 0)\n", NEW_LIMIT)),
        ("first", LIMITS, LIMITS.replace(b"    x = max(x, 0)\n", NEW_LIMIT, 1)),
        (
            "last",
            LIMITS,
            LIMITS.replace(b"    y = 1\n    x = max(x, 0)\n", b"    y = 1\n" + NEW_LIMIT),
        ),
        ("all", LIMITS, LIMITS.replace(b"    x = max(x, 0)\n", NEW_LIMIT)),
    ],
    ids=["only", "first", "last", "all"],
)
def test_a_replaced_statement_is_written_although_its_new_code_stands_elsewhere(
    which: str, before: bytes, expected: bytes
) -> None:
    assert_golden(before, make_patch(_statement(which)), expected)


# ---------------------------------------------------------------------------------------------
# replace: selectors below the statement

TESTS = src(
    """
    def run(self):
        if self.enabled:
            a()
        if self.dynamic and self.ready:
            b()
        if self.dynamic:
            c()
        if self.enabled:
            d()
        with torch.cuda.device(0):
            e()
        with torch.cuda.stream(s):
            f()
        with torch.cuda.stream(t):
            g()
        with torch.cuda.device(0):
            h()
    """
)


@pytest.mark.parametrize(
    ("select", "code", "which", "old", "new"),
    [
        (
            'test_of = "if", containing = "self.dynamic"',
            "self.enabled",
            "first",
            b"    if self.dynamic and self.ready:\n",
            b"    if self.enabled:\n",
        ),
        (
            'test_of = "if", containing = "self.dynamic"',
            "self.enabled",
            "last",
            b"    if self.dynamic:\n",
            b"    if self.enabled:\n",
        ),
        (
            'with_item = "torch.cuda.stream"',
            "torch.cuda.device(0)",
            "first",
            b"    with torch.cuda.stream(s):\n",
            b"    with torch.cuda.device(0):\n",
        ),
        (
            'with_item = "torch.cuda.stream"',
            "torch.cuda.device(0)",
            "last",
            b"    with torch.cuda.stream(t):\n",
            b"    with torch.cuda.device(0):\n",
        ),
    ],
    ids=["test_of-first", "test_of-last", "with_item-first", "with_item-last"],
)
def test_a_selector_below_the_statement_is_written_although_its_new_code_stands_elsewhere(
    select: str, code: str, which: str, old: bytes, new: bytes
) -> None:
    patch = make_patch(
        f"""
[[edits]]
kind = "replace"
scope = "run"
select = {{ {select}, which = "{which}" }}
code = "{code}"
"""
    )
    assert_golden(TESTS, patch, TESTS.replace(old, b"    # opspatch:t-patch\n" + new))


# ---------------------------------------------------------------------------------------------
# what proves a `first` / `last` replace applied when its selector does not match its new code


def test_a_first_replace_without_its_marker_is_the_same_file_as_new_code_standing_first() -> None:
    """The tree of an applied `first` replace whose marker was removed is the tree of a file
    where the new code stood before the first match all along: the marker is the proof, so
    without it the plan writes the next match (never a silent skip)."""
    patch = make_patch(_expression("first"))
    outcome = apply_patch(STEP, patch)
    assert isinstance(outcome, Applied)
    unmarked = outcome.new_source.replace(M, b"")
    assert detect(unmarked, patch).state == "not-applied"
    again = apply_patch(unmarked, patch)
    assert isinstance(again, Applied), again
    assert again.new_source == _fixed(unmarked, SECOND_IF)


def test_an_only_replace_whose_old_code_is_gone_reads_applied_without_its_marker() -> None:
    """Upstream's own file carries no marker: with nothing left to replace and the new code in
    the scope, there is no place where the fix could still be written."""
    patch = make_patch(_expression("only"))
    outcome = apply_patch(ONE_MATCH, patch)
    assert isinstance(outcome, Applied)
    assert isinstance(apply_patch(outcome.new_source.replace(M, b""), patch), AlreadyApplied)


def test_a_marker_of_a_patch_whose_id_starts_the_same_proves_nothing() -> None:
    patch = make_patch(_expression("first"))
    outcome = apply_patch(STEP, patch)
    assert isinstance(outcome, Applied)
    other = outcome.new_source.replace(M, b"        # opspatch:t-patch-other\n")
    assert detect(other, patch).state == "not-applied"


# ---------------------------------------------------------------------------------------------
# insert: at the start or end, and beside an anchor chosen with `which`

INIT = src(
    """
    class W:
        def __init__(self):
            self.load()
            self.threshold = 0
    """
)


def test_an_insert_at_the_start_is_written_although_its_code_stands_later_in_the_body() -> None:
    """`self.threshold = 0` at the end of `__init__` is not set before the calls that can fail:
    the insert at the start is pending and written there."""
    patch = make_patch(
        '[[edits]]\nkind = "insert"\nscope = "W.__init__"\nposition = "start"\n'
        'code = "self.threshold = 0"\n'
    )
    expected = INIT.replace(
        b"        self.load()\n", M + b"        self.threshold = 0\n        self.load()\n"
    )
    assert_golden(INIT, patch, expected)


def test_an_insert_at_the_end_is_written_although_its_code_stands_earlier_in_the_body() -> None:
    before = src(
        """
        class W:
            def __init__(self):
                self.done = False
                self.load()
        """
    )
    patch = make_patch(
        '[[edits]]\nkind = "insert"\nscope = "W.__init__"\nposition = "end"\n'
        'code = "self.done = False"\n'
    )
    assert_golden(before, patch, before + M + b"        self.done = False\n")


def test_an_insert_at_the_start_stays_applied_when_a_later_patch_inserts_before_it() -> None:
    """Stacked patches: the later one's code goes first; the marker keeps the earlier one's
    code recognised where it now stands."""
    first = make_patch(
        '[[edits]]\nkind = "insert"\nscope = "W.__init__"\nposition = "start"\ncode = "self.a = 1"\n'
    )
    second = make_patch(
        '[[edits]]\nkind = "insert"\nscope = "W.__init__"\nposition = "start"\ncode = "self.b = 2"\n',
        patch_id="t-later",
    )
    one = apply_patch(INIT, first)
    assert isinstance(one, Applied)
    two = apply_patch(one.new_source, second)
    assert isinstance(two, Applied)
    assert two.new_source.index(b"self.b = 2") < two.new_source.index(b"self.a = 1")
    assert isinstance(apply_patch(two.new_source, first), AlreadyApplied)
    assert isinstance(apply_patch(two.new_source, second), AlreadyApplied)


CALLS = src(
    """
    def run(batch):
        batch.step()
        batch.check()
        batch.step()
        batch.sync()
        batch.step()
        return batch
    """
)
SYNC = b"    # opspatch:t-patch\n    batch.sync()\n"


@pytest.mark.parametrize(
    ("which", "expected"),
    [
        ("first", CALLS.replace(b"    batch.step()\n", b"    batch.step()\n" + SYNC, 1)),
        (
            "last",
            CALLS.replace(
                b"    batch.step()\n    return", b"    batch.step()\n" + SYNC + b"    return"
            ),
        ),
    ],
    ids=["first", "last"],
)
def test_an_insert_after_an_anchor_counts_only_after_the_one_which_selects(
    which: str, expected: bytes
) -> None:
    """`batch.sync()` already follows the middle `batch.step()`, which is neither the first nor
    the last: only the statement the anchor selects is the insert's place."""
    patch = make_patch(
        f"""
[[edits]]
kind = "insert"
scope = "run"
position = "after"
anchor = {{ calls = "batch.step", which = "{which}" }}
code = "batch.sync()"
"""
    )
    assert_golden(CALLS, patch, expected)


# ---------------------------------------------------------------------------------------------
# alternatives: a variant whose old code is gone does not skip one with code left to change


def test_a_variant_with_code_to_change_wins_over_one_whose_new_code_merely_stands_there() -> None:
    """The edit as written finds no `self.dynamic` test (renamed in this release) while an `if`
    already tests its new code elsewhere; the alternative's old code is present: it is applied,
    not skipped as already applied."""
    before = src(
        """
        def step(self):
            if self.chunked is not None:
                pass
            if self.enable_dynamic:
                return 1
        """
    )
    patch = make_patch(
        """
[[edits]]
kind = "replace"
scope = "step"
select = { test_of = "if", containing = "self.dynamic" }
code = "self.chunked is not None"

[[edits.alternatives]]
select = { test_of = "if", containing = "self.enable_dynamic" }
"""
    )
    expected = before.replace(
        b"    if self.enable_dynamic:\n",
        b"    # opspatch:t-patch\n    if self.chunked is not None:\n",
    )
    outcome = assert_golden(before, patch, expected)
    assert outcome.matched == ("edits[0]: alternatives[0]",)
