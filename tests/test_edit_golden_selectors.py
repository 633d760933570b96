"""Golden pairs for selectors below the statement (issue 19): a call's keyword argument value,
an item of a `with`, the test of an `if`/`while`; a replaced expression that would pass the
file's width is wrapped; two edits in one statement leave one marker. Each applies, re-applies
(already applied, bytes unchanged) and reverses to the exact pre-image."""

from __future__ import annotations

import pytest

from opspatch.core.edit import NotApplicable, apply_patch
from opspatch.core.placement import WIDTHS, file_width
from opspatch.core.source import LineIndex
from opspatch.errors import SpecError
from tests.editkit import assert_golden
from tests.patchkit import make_patch, src

pytestmark = pytest.mark.pure

CAPTURE = src(
    """
    class Runner:
        def capture(self, graph):
            with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
                out = self.forward()
            with self.lock, torch.cuda.stream(self.stream):
                self.graphs.append(graph)
            while self.pending and self.free:
                self.step()
            if self.free <= 0 and self.chunked is not None:
                return None
            return out
    """
)


def _replace(select: str, code: str, comment: str = "") -> str:
    return (
        f'[[edits]]\nkind = "replace"\nscope = "Runner.capture"\nselect = {select}\n'
        f"code = {code!r}\n" + (f"comment = {comment!r}\n" if comment else "")
    ).replace("'", '"')


def test_the_value_of_a_keyword_argument() -> None:
    expected = CAPTURE.replace(
        b"        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):\n",
        b"        # opspatch:t-patch: share the global pool\n"
        b"        with torch.cuda.graph(graph, pool=get_pool(), stream=self.stream):\n",
    )
    patch = make_patch(
        _replace(
            '{ calls = "torch.cuda.graph", keyword = "pool" }',
            "get_pool()",
            "share the global pool",
        )
    )
    assert_golden(CAPTURE, patch, expected)


def test_an_item_of_a_with_chosen_by_the_call_it_makes() -> None:
    expected = CAPTURE.replace(
        b"        with self.lock, torch.cuda.stream(self.stream):\n",
        b"        # opspatch:t-patch\n"
        b"        with self.lock, self.device_module.stream(self.stream):\n",
    )
    patch = make_patch(
        _replace('{ with_item = "torch.cuda.stream" }', "self.device_module.stream(self.stream)")
    )
    assert_golden(CAPTURE, patch, expected)


def test_an_item_of_a_with_chosen_by_its_expression() -> None:
    expected = CAPTURE.replace(
        b"        with self.lock, torch.cuda.stream(self.stream):\n",
        b"        # opspatch:t-patch\n        with self.rlock, torch.cuda.stream(self.stream):\n",
    )
    assert_golden(
        CAPTURE, make_patch(_replace('{ with_item = "self.lock" }', "self.rlock")), expected
    )


@pytest.mark.parametrize(
    ("select", "code", "old", "new"),
    [
        (
            '{ test_of = "if", containing = "self.chunked" }',
            "self.chunked is None",
            b"        if self.free <= 0 and self.chunked is not None:\n",
            b"        if self.chunked is None:\n",
        ),
        (
            '{ test_of = "while" }',
            "self.pending",
            b"        while self.pending and self.free:\n",
            b"        while self.pending:\n",
        ),
    ],
    ids=["if-containing", "while"],
)
def test_the_test_of_an_if_or_while(select: str, code: str, old: bytes, new: bytes) -> None:
    expected = CAPTURE.replace(old, b"        # opspatch:t-patch\n" + new)
    assert_golden(CAPTURE, make_patch(_replace(select, code)), expected)


def test_a_keyword_selector_that_finds_nothing_lists_the_places_it_considered() -> None:
    patch = make_patch(_replace('{ calls = "torch.cuda.graph", keyword = "pools" }', "p"))
    outcome = apply_patch(CAPTURE, patch)
    assert isinstance(outcome, NotApplicable)
    assert outcome.field == "edits[0].select"
    assert outcome.reason == (
        "the value of `pools=` in a call of `torch.cuda.graph` is not in `Runner.capture`"
    )


def test_a_with_item_selector_that_finds_nothing_lists_every_with_item() -> None:
    outcome = apply_patch(CAPTURE, make_patch(_replace('{ with_item = "self.mutex" }', "m")))
    assert isinstance(outcome, NotApplicable)
    assert outcome.candidates == (
        "line 3, column 14: `torch.cuda.graph(graph, pool=self.pool, stream=self.stream)`",
        "line 5, column 14: `self.lock`",
        "line 5, column 25: `torch.cuda.stream(self.stream)`",
    )


def test_an_ambiguous_test_selector_lists_both_places() -> None:
    twice = CAPTURE.replace(
        b"        return out\n", b"        if self.chunked:\n            pass\n        return out\n"
    )
    outcome = apply_patch(
        twice, make_patch(_replace('{ test_of = "if", containing = "self.chunked" }', "x"))
    )
    assert isinstance(outcome, NotApplicable)
    assert outcome.candidates == ("line 9, column 12", "line 11, column 12")


@pytest.mark.parametrize(
    ("select", "problem"),
    [
        ('{ keyword = "pool" }', "give calls too"),
        ('{ containing = "x" }', "give test_of too"),
        ('{ test_of = "for" }', "test_of"),
        ('{ with_item = "a b" }', "does not parse"),
        ('{ calls = "f", keyword = "class" }', "not an argument name"),
        ('{ with_item = "a", test_of = "if" }', "give exactly one"),
    ],
)
def test_malformed_selectors_are_refused_at_load_time(select: str, problem: str) -> None:
    with pytest.raises(SpecError, match=problem):
        make_patch(_replace(select, "x"))


def test_a_selector_below_the_statement_needs_expression_code() -> None:
    with pytest.raises(SpecError, match="must be an expression"):
        make_patch(_replace('{ with_item = "self.lock" }', "x = 1"))


def test_a_delete_or_move_refuses_a_selector_below_the_statement() -> None:
    with pytest.raises(SpecError, match="a delete removes statements"):
        make_patch('[[edits]]\nkind = "delete"\nscope = "f"\nselect = { test_of = "if" }\n')


# ---------------------------------------------------------------------------------------------
# width and markers


@pytest.mark.parametrize(
    ("longest", "width"), [(10, 79), (79, 79), (80, 88), (99, 100), (120, 120), (131, 131)]
)
def test_a_files_width_is_the_first_usual_width_its_longest_line_fits(
    longest: int, width: int
) -> None:
    assert WIDTHS == (79, 88, 100, 120)
    assert file_width(LineIndex("x = 1\n" + "#" * longest + "\n")) == width


def test_a_long_replaced_test_is_wrapped_in_parentheses_before_each_and() -> None:
    code = (
        "self.free <= 0 and self.chunked is not None "
        "and self.enable_dynamic_chunking_for_the_current_batch"
    )
    expected = CAPTURE.replace(
        b"        if self.free <= 0 and self.chunked is not None:\n",
        b"        # opspatch:t-patch\n"
        b"        if (\n"
        b"            self.free <= 0\n"
        b"            and self.chunked is not None\n"
        b"            and self.enable_dynamic_chunking_for_the_current_batch\n"
        b"        ):\n",
    )
    outcome = assert_golden(
        CAPTURE,
        make_patch(_replace('{ test_of = "if", containing = "self.chunked" }', code)),
        expected,
    )
    assert max(len(line) for line in outcome.new_source.decode().splitlines()) <= 79


def test_a_wrapped_operand_that_is_itself_a_boolean_keeps_its_parentheses() -> None:
    code = (
        "self.free <= 0 and (self.chunked_prefill_is_enabled or self.dynamic_chunking_is_enabled)"
    )
    outcome = assert_golden(
        CAPTURE,
        make_patch(_replace('{ test_of = "if", containing = "self.chunked" }', code)),
        CAPTURE.replace(
            b"        if self.free <= 0 and self.chunked is not None:\n",
            b"        # opspatch:t-patch\n"
            b"        if (\n"
            b"            self.free <= 0\n"
            b"            and (self.chunked_prefill_is_enabled or self.dynamic_chunking_is_enabled)\n"
            b"        ):\n",
        ),
    )
    assert outcome.diff


def test_a_long_value_that_cannot_be_split_goes_on_its_own_line() -> None:
    code = "self.graph_memory_pool_shared_by_every_capture_of_this_runner_and_its_drafts"
    expected = CAPTURE.replace(
        b"        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):\n",
        b"        # opspatch:t-patch\n"
        b"        with torch.cuda.graph(graph, pool=(\n"
        b"            self.graph_memory_pool_shared_by_every_capture_of_this_runner_and_its_drafts\n"
        b"        ), stream=self.stream):\n",
    )
    assert_golden(
        CAPTURE,
        make_patch(_replace('{ calls = "torch.cuda.graph", keyword = "pool" }', code)),
        expected,
    )


def test_two_edits_in_one_statement_leave_one_marker() -> None:
    body = _replace('{ calls = "torch.cuda.graph", keyword = "pool" }', "get_pool()", "why") + (
        "\n"
        + _replace('{ calls = "torch.cuda.graph", keyword = "stream" }', "side_stream()", "why")
    )
    expected = CAPTURE.replace(
        b"        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):\n",
        b"        # opspatch:t-patch: why\n"
        b"        with torch.cuda.graph(graph, pool=get_pool(), stream=side_stream()):\n",
    )
    assert_golden(CAPTURE, make_patch(body), expected)


def test_two_expression_edits_in_one_while_leave_one_marker() -> None:
    body = (
        _replace('{ expression = "self.pending" }', "self.queue")
        + "\n"
        + _replace('{ expression = "self.free", which = "first" }', "self.room")
    )
    expected = CAPTURE.replace(
        b"        while self.pending and self.free:\n",
        b"        # opspatch:t-patch\n        while self.queue and self.room:\n",
    )
    assert_golden(CAPTURE, make_patch(body), expected)


def test_code_inserted_into_a_tab_indented_block_is_indented_with_tabs() -> None:
    before = b"class T:\n\tdef f(self):\n\t\tself.a = 1\n"
    patch = make_patch(
        '[[edits]]\nkind = "insert"\nscope = "T.f"\nposition = "end"\n'
        'code = """\nif self.a:\n    self.b = 2\n"""\n'
    )
    expected = before + b"\t\t# opspatch:t-patch\n\t\tif self.a:\n\t\t\tself.b = 2\n"
    assert_golden(before, patch, expected)


def test_containing_is_an_expression_matched_as_a_sub_tree_not_as_text() -> None:
    """docs/formats.md: `containing` selects a test that holds that expression as a node; the
    same letters in a longer name, in a string, or inside a longer `and` do not count."""
    before = src(
        """
        def f(self, s):
            if self.chunked is not None and x:
                a()
            if self.chunked_req:
                b()
            if "self.chunked" in s:
                c()
            if p and q and r:
                d()
        """
    )
    patch = make_patch(
        '[[edits]]\nkind = "replace"\nscope = "f"\n'
        'select = { test_of = "if", containing = "self.chunked", which = "all" }\ncode = "flag"\n'
    )
    expected = before.replace(
        b"    if self.chunked is not None and x:\n", b"    # opspatch:t-patch\n    if flag:\n"
    )
    assert_golden(before, patch, expected)
    longer_and = make_patch(
        '[[edits]]\nkind = "replace"\nscope = "f"\n'
        'select = { test_of = "if", containing = "p and q" }\ncode = "flag"\n'
    )
    outcome = apply_patch(before, longer_and)
    assert isinstance(outcome, NotApplicable)
    assert "is not in" in outcome.reason
