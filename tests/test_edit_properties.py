"""Property tests of the patch engine over generated modules (hypothesis).

Generated modules vary line endings (LF, CRLF), indentation (spaces, tabs), comments, blank
lines, docstrings, decorators, async functions, nested blocks and a leading `super().__init__()`.
For insert patches at every position (and for replace, delete, move and the selectors below the
statement, the first two):
- apply then reverse is the identity on bytes (from the record, and without it via `unapply`);
- applying twice equals applying once (the second time is `AlreadyApplied`);
- every definition outside the edited scope keeps an identical syntax tree;
- the only change is added lines.
"""

from __future__ import annotations

import ast
import difflib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opspatch.core.anchors import iter_definitions, strip_positions
from opspatch.core.edit import AlreadyApplied, Applied, NotApplicable, apply_patch, reverse, unapply
from tests.editkit import module_source
from tests.patchkit import make_patch

pytestmark = pytest.mark.pure


POSITIONS = st.sampled_from(
    [
        ("Target.__init__", 'position = "start"'),
        ("Target.__init__", 'position = "end"'),
        ("Target", 'position = "start"'),
        ("Target", 'position = "end"'),
        ("<module>", 'position = "start"'),
        ("<module>", 'position = "end"'),
        ("Target.__init__", 'position = "before"\nanchor = { calls = "anchor_call" }'),
        ("Target.__init__", 'position = "after"\nanchor = { calls = "anchor_call" }'),
    ]
)


def _patch(scope: str, position: str, with_comment: bool) -> str:
    comment = 'comment = "why this is here"\n' if with_comment else ""
    return (
        f'[[edits]]\nkind = "insert"\nscope = "{scope}"\n{position}\n{comment}'
        'code = """\nself_guard = 0\nif self_guard:\n    pass\n"""\n'
    )


def _definitions(tree: ast.Module) -> dict[str, str]:
    return {name: strip_positions(node) for name, node in iter_definitions(tree)}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(module_source(), POSITIONS, st.booleans())
def test_insert_properties(
    generated: tuple[bytes, str], position: tuple[str, str], comment: bool
) -> None:
    source, newline = generated
    scope, where = position
    patch = make_patch(_patch(scope, where, comment))
    outcome = apply_patch(source, patch)
    assert isinstance(outcome, Applied), outcome

    # apply then reverse is the identity on bytes, with and without the record
    assert reverse(outcome) == source
    undone = unapply(outcome.new_source, patch)
    assert not isinstance(undone, NotApplicable), undone.reason
    assert undone.old_source == source

    # applying twice equals applying once
    assert isinstance(apply_patch(outcome.new_source, patch), AlreadyApplied)

    # definitions outside the edited scope keep identical syntax trees
    before = _definitions(ast.parse(source.decode()))
    after = _definitions(ast.parse(outcome.new_source.decode()))
    for name, dump in before.items():
        if name == scope or scope.startswith(name + "."):
            continue
        assert after[name] == dump, name

    # only lines were added, all with the file's own line ending
    old_lines = source.decode().splitlines(keepends=True)
    new_lines = outcome.new_source.decode().splitlines(keepends=True)
    ops = difflib.SequenceMatcher(a=old_lines, b=new_lines, autojunk=False).get_opcodes()
    changed = [op for op in ops if op[0] != "equal"]
    assert all(tag == "insert" for tag, *_ in changed) or not source.endswith(newline.encode())
    for tag, _, _, j1, j2 in changed:
        if tag == "insert":
            assert all(
                line.endswith(newline) or j == len(new_lines) - 1
                for j, line in enumerate(new_lines[j1:j2], j1)
            )


SELECTIONS = st.sampled_from(
    [
        'kind = "replace"\nselect = { assigns = "self.last", which = "first" }\ncode = "self.last = -1"',
        'kind = "replace"\nselect = { assigns = "self.last", which = "last" }\ncode = "self.last = -1"',
        'kind = "replace"\nselect = { assigns = "self.last", which = "all" }\ncode = "self.last = -1"',
        'kind = "delete"\nselect = { calls = "anchor_call" }',
    ]
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(module_source(), SELECTIONS)
def test_replace_and_delete_properties(generated: tuple[bytes, str], selection: str) -> None:
    """For replace (first, last, all) and delete: applying twice equals applying once, and the
    record reverses to the original bytes (issue 19: first/last rewrote one more match each
    time)."""
    source, _ = generated
    patch = make_patch(f'[[edits]]\nscope = "Target.__init__"\n{selection}\n')
    outcome = apply_patch(source, patch)
    assert isinstance(outcome, Applied), outcome
    assert reverse(outcome) == source
    again = apply_patch(outcome.new_source, patch)
    assert isinstance(again, AlreadyApplied), again


MOVES_AND_SELECTORS = st.sampled_from(
    [
        'kind = "move"\nselect = { calls = "anchor_call" }\nposition = "end"',
        'kind = "move"\nselect = { calls = "anchor_call" }\nposition = "start"',
        'kind = "move"\nselect = { calls = "anchor_call" }\nposition = "after"\n'
        'anchor = { assigns = "self.last", which = "last" }',
        'kind = "move"\nselect = { calls = "anchor_call" }\nposition = "before"\n'
        'anchor = { assigns = "self.last", which = "first" }',
        'kind = "replace"\nselect = { calls = "open_stream", keyword = "size" }\ncode = "size_for(self)"',
        'kind = "replace"\nselect = { calls = "open_stream", keyword = "size" }\n'
        'code = "self.stream_size_that_every_capture_of_this_runner_shares_with_its_draft_model_runner"',
        'kind = "replace"\nselect = { with_item = "self.lock" }\ncode = "self.rlock"',
        'kind = "replace"\nselect = { test_of = "if", which = "all" }\ncode = "flag and not done"',
        # alternatives: the edit as written fits no generated module, its alternative does
        'kind = "replace"\nselect = { assigns = "self.missing" }\ncode = "self.last = -1"\n'
        '[[edits.alternatives]]\nselect = { assigns = "self.last", which = "all" }',
        'kind = "move"\nselect = { calls = "missing_call" }\nposition = "end"\n'
        '[[edits.alternatives]]\nselect = { calls = "anchor_call" }',
    ]
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(module_source(), MOVES_AND_SELECTORS)
def test_move_and_selector_properties(generated: tuple[bytes, str], selection: str) -> None:
    """For move, the selectors below the statement and alternatives (issue 19): applying twice
    equals applying
    once, the record reverses to the original bytes, definitions outside the scope keep their
    syntax trees; where nothing fits (no `if` in the scope) it is refused at its select field."""
    source, _ = generated
    patch = make_patch(f'[[edits]]\nscope = "Target.__init__"\n{selection}\n')
    outcome = apply_patch(source, patch)
    if "test_of" in selection and isinstance(outcome, NotApplicable):
        init = source.decode().split("def __init__")[1].split("def other")[0]
        assert "if " not in init
        assert outcome.field == "edits[0].select"
        return
    assert isinstance(outcome, Applied), outcome
    assert reverse(outcome) == source
    again = apply_patch(outcome.new_source, patch)
    assert isinstance(again, AlreadyApplied), again
    assert again.reason.startswith("all 1 edit(s) already present")
    if "alternatives" in selection:
        assert outcome.matched == again.matched == ("edits[0]: alternatives[0]",)
    before = _definitions(ast.parse(source.decode()))
    after = _definitions(ast.parse(outcome.new_source.decode()))
    for name, dump in before.items():
        if name not in ("Target", "Target.__init__"):
            assert after[name] == dump, name
