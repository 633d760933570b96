"""Which definitions a `diff` edit changes: a hunk's context may start in the method above its
change or run into the one below, and the change still belongs to the method it is in (issue
42, item 20: such diffs were refused at plan, "`W.b` changed, but the patch does not edit it")."""

from __future__ import annotations

import difflib

import pytest

from opspatch.core.edit import Applied
from tests.editkit import assert_golden
from tests.patchkit import make_patch, src

pytestmark = pytest.mark.pure

BEFORE = src(
    """
    class W:
        def a(self):
            x = 1
            return x

        def b(self):
            y = 2
            self.ready = True

        def c(self):
            if self:
                pass
            return 3
    """
)


def diff_patch(after: bytes, context: int = 3) -> str:
    """A patch of one `diff` edit, the unified diff `diff -u` writes from BEFORE to `after`."""
    diff = "".join(
        difflib.unified_diff(
            BEFORE.decode().splitlines(True),
            after.decode().splitlines(True),
            "a/pkg/mod.py",
            "b/pkg/mod.py",
            n=context,
        )
    )
    return f'[[edits]]\nkind = "diff"\ndiff = """\n{diff}"""\n'


def golden(after: bytes, context: int = 3) -> Applied:
    return assert_golden(BEFORE, make_patch(diff_patch(after, context)), after)


def test_a_line_added_at_the_end_of_a_method_belongs_to_it() -> None:
    # its context runs past the blank line into W.c: the added line lies between W.b's last
    # line and that blank line, which belongs to the class
    after = BEFORE.replace(
        b"        self.ready = True\n", b"        self.ready = True\n        self.n = 0\n"
    )
    assert golden(after).edited_scopes == ("W.b",)
    assert golden(after, context=1).edited_scopes == ("W.b",)


def test_a_change_whose_context_starts_in_the_method_above() -> None:
    after = BEFORE.replace(b"        y = 2\n", b"        y = 3\n")
    assert golden(after).edited_scopes == ("W.b",)


def test_a_line_added_first_in_a_method_after_its_signature() -> None:
    after = BEFORE.replace(b"    def b(self):\n", b"    def b(self):\n        self.n = 0\n")
    assert golden(after).edited_scopes == ("W.b",)


def test_one_hunk_that_changes_two_methods_edits_both() -> None:
    after = BEFORE.replace(b"        x = 1\n", b"        x = 2\n").replace(
        b"        y = 2\n", b"        y = 5\n"
    )
    assert golden(after).edited_scopes == ("W.a", "W.b")


def test_a_method_added_between_two_is_a_change_of_the_class() -> None:
    after = BEFORE.replace(
        b"        self.ready = True\n",
        b"        self.ready = True\n\n    def d(self):\n        return 4\n",
    )
    assert golden(after).edited_scopes == ("W",)
