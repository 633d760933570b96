"""The `insert` edit kind: code put into a scope at its start, its end, or beside an anchor."""

from __future__ import annotations

import ast
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field, field_validator

from opspatch.core.anchors import (
    BlockDumps,
    Scope,
    find_statement_runs,
    first_line,
    last_line,
    matching_statements,
    statement_dumps,
)
from opspatch.core.kinds.base import (
    Alternative,
    EditKind,
    EditState,
    _alternatives_field,
    _check_anchor,
)
from opspatch.core.placement import (
    EditProblem,
    Positioned,
    Splice,
    _code_lines,
    _insert_splice,
    _insertion_point,
    _refuse_reindenting,
    _render_block,
    _shifted,
    apply_splices,
    carries_marker,
    edit_field,
    marker_lines,
    needs_blank_line_after,
    scope_of,
    select_in,
    start_index,
)
from opspatch.core.selectors import StatementSelector, _check_qualname, _parse_statements
from opspatch.core.source import LineIndex
from opspatch.core.syntax import parse_python
from opspatch.core.vocabulary import EditStatus

if TYPE_CHECKING:
    from opspatch.core.spec import PatchSpec


class InsertAlternative(Alternative):
    scope: str | None = None
    position: Literal["start", "end", "before", "after"] | None = None
    anchor: StatementSelector | None = None
    code: str | None = None
    comment: str | None = None


class InsertEdit(EditKind):
    """Insert code into a scope.

    Positions: `start` (after the docstring, after `from __future__` imports in a module, and after
    a leading `super().__init__(...)` call), `end`, or `before` / `after` the statement chosen by
    `anchor`. A class scope inserts at class level. Inserted code takes the indentation of its
    block and is preceded by a marker comment naming the patch (`# opspatch:<id>: <comment>`).
    """

    kind: Literal["insert"]
    scope: str = Field(description="`Class`, `Class.method`, `function` or `<module>`")
    position: Literal["start", "end", "before", "after"] = "start"
    anchor: StatementSelector | None = None
    code: str = Field(description="Python statements to insert (dedented automatically)")
    comment: str | None = Field(None, description="Why: rendered after the marker comment")
    alternatives: list[InsertAlternative] = _alternatives_field()

    _scope = field_validator("scope")(_check_qualname)

    @field_validator("code")
    @classmethod
    def _code_parses(cls, value: str) -> str:
        if not _parse_statements(value, "code"):
            raise ValueError("code is empty")
        return value

    def _check_rules(self) -> None:
        """The anchor matches the position."""
        _check_anchor(self.position, self.anchor)

    undone_from_text: ClassVar[bool] = True

    def description(self) -> str:
        return f"insert at {self.position} of {self.scope}"

    def place(
        self, text: str, tree: ast.Module, patch: PatchSpec, newline: str, i: int
    ) -> tuple[list[Splice], list[str]]:
        index = LineIndex.of(text)
        scope = scope_of(tree, self.scope, i)
        line, indent = _insertion_point(index, scope, self, i)
        blank_after = needs_blank_line_after(index, scope, line)
        marker = marker_lines(patch, self.comment, indent, blank_after=blank_after)
        code = _code_lines(self.code, indent)
        _refuse_reindenting(code, indent, statement_dumps(self.code), edit_field(i, "code"))
        lines = [*marker, *code.lines, *([""] if blank_after else [])]
        block = _render_block(lines, indent, newline, _shifted(code.verbatim, len(marker)))
        return [_insert_splice(index, line, block, newline)], [self.scope]

    def state(self, index: LineIndex, tree: ast.Module, patch: PatchSpec, i: int) -> EditState:
        """Present when its code stands at its own place (`inserted_run`)."""
        scope = scope_of(tree, self.scope, i)
        if inserted_run(index, tree, patch, i) is not None:
            return EditState(i, EditStatus.APPLIED, f"its code is present {place_words(self)}")
        if self.anchor is not None:
            select_in(scope, self.anchor, i, "anchor")  # a missing anchor is a problem now
        return EditState(i, EditStatus.PENDING, f"its code is not {place_words(self)}")

    def undo(self, text: str, tree: ast.Module, patch: PatchSpec, newline: str, i: int) -> str:
        """The inserted block, marker included, is found by its syntax tree and removed line
        for line; re-inserting it into what is left must give back `text` byte for byte."""
        index = LineIndex.of(text)
        run = inserted_run(index, tree, patch, i)
        assert run is not None  # detection said applied
        indent = index.indentation(first_line(run[0]))
        end_line = last_line(run[-1])
        for blank_after in (False, True):
            marker = marker_lines(patch, self.comment, indent, blank_after=blank_after)
            start_line = first_line(run[0]) - len(marker)
            if start_line >= 1 and index.line_text(start_line).strip() == marker[0]:
                break
        else:
            raise EditProblem(
                "the inserted code's marker comment is missing or changed; restore from the recorded "
                "pre-image",
                edit_field(i),
            )
        if blank_after:  # the block brought the blank line after it: it goes too
            end_line += 1
            if end_line > len(index.lines) or index.line_text(end_line).strip():
                raise EditProblem(
                    "the blank line the inserted code brought is gone; restore from the recorded "
                    "pre-image",
                    edit_field(i),
                )
        candidates = _removal_candidates(index, start_line, end_line, newline)
        verified = _first_verified(candidates, patch, i, text, newline)
        if verified is None:
            raise EditProblem(
                "the inserted code was changed since it was applied; restore from the recorded "
                "pre-image",
                edit_field(i),
            )
        return verified


def inserted_run(
    index: LineIndex, tree: ast.Module, patch: PatchSpec, i: int
) -> list[ast.stmt] | None:
    """The statements insert edit `i` put into `tree` (the tree of `index.text`), if they are
    there: at its own place, never merely somewhere in its scope.

    Beside its anchor: the statement the anchor selects (its `which` applied), counted without
    the inserted code itself and the code of the patch's later inserts, as it was chosen when
    the edit was placed. At the start (end): first (last) in the scope's own body, or anywhere
    in that body under this patch's marker (a patch stacked later may have inserted before or
    after it). The code of the patch's other inserts may stand in between, since two inserts at
    one place go side by side.
    """
    edit = patch.edits[i]
    assert isinstance(edit, InsertEdit)
    found = _scope_runs(index, tree, patch, edit.scope)[i]
    if isinstance(found, EditProblem):
        raise EditProblem(found.message, found.field, found.candidates)
    return found


_Found = list[ast.stmt] | EditProblem | None

_RUNS: weakref.WeakKeyDictionary[
    ast.Module, dict[tuple[int, str], tuple[PatchSpec, str, dict[int, _Found]]]
] = weakref.WeakKeyDictionary()
_RUNS_LOCK = threading.Lock()
"""Each tree's inserted runs, per patch and scope, found once: detecting a patch asks for every
insert's run, and each run depends on the runs of the later inserts in its scope. Trees are never
changed; the preflight plans hosts in parallel, hence the lock."""


def _scope_runs(
    index: LineIndex, tree: ast.Module, patch: PatchSpec, scope: str
) -> dict[int, _Found]:
    """`inserted_run` (or the problem finding it) of every insert of the patch into `scope`."""
    key = (id(patch), scope)
    with _RUNS_LOCK:
        known = _RUNS.get(tree, {}).get(key)
    if known is not None and known[0] is patch and known[1] is index.text:
        return known[2]
    found = _find_scope_runs(index, tree, patch, scope)
    with _RUNS_LOCK:
        _RUNS.setdefault(tree, {})[key] = (patch, index.text, found)
    return found


def _find_scope_runs(
    index: LineIndex, tree: ast.Module, patch: PatchSpec, scope: str
) -> dict[int, _Found]:
    """The last insert first: each excludes the statements the later ones put in from its
    anchor's matches. Only inserts into the same scope can stand among its statements."""
    code = InsertedCode.of(patch)
    seen = _Seen()
    runs: dict[int, _Found] = {}
    later: set[int] = set()
    for j in reversed(range(len(patch.edits))):
        edit = patch.edits[j]
        if not isinstance(edit, InsertEdit) or edit.scope != scope:
            continue
        try:
            run = _find_inserted(index, tree, patch, j, later, code, seen)
        except EditProblem as problem:
            runs[j] = problem.with_traceback(None)  # kept: its frames would hold this dict
            continue
        runs[j] = run
        later.update(id(stmt) for stmt in run or [])
    return runs


class _Seen:
    """What finding the runs of one scope looks up again and again: each anchor's matches."""

    def __init__(self) -> None:
        self.matches: dict[tuple[int, StatementSelector], list[ast.stmt]] = {}

    def matching(self, scope: Scope, anchor: StatementSelector) -> list[ast.stmt]:
        key = (id(scope.node), anchor)
        if key not in self.matches:
            self.matches[key] = [loc.stmt for loc in matching_statements(scope, anchor)]
        return self.matches[key]


def _find_inserted(
    index: LineIndex,
    tree: ast.Module,
    patch: PatchSpec,
    i: int,
    later: set[int],
    code: InsertedCode,
    seen: _Seen,
) -> list[ast.stmt] | None:
    edit = patch.edits[i]
    assert isinstance(edit, InsertEdit)
    scope = scope_of(tree, edit.scope, i)
    for run in find_statement_runs(scope, statement_dumps(edit.code)):
        dumps = BlockDumps(run.block)
        if edit.position in ("start", "end"):
            if run.block is not scope.node.body:  # a nested block is not the scope's start/end
                continue
            if edit.position == "start":
                placed = code.skip_back(dumps, run.start, i) == start_index(scope)
            else:
                placed = code.skip_forward(dumps, run.start + run.length, i) == len(run.block)
            if placed or carries_marker(index, run.statements[0], patch):
                return run.statements
            continue
        assert edit.anchor is not None
        own = {id(s) for s in run.statements}
        anchor = _chosen_anchor(seen.matching(scope, edit.anchor), edit.anchor, later, own)
        if anchor is None:
            continue
        if edit.position == "after":
            end = code.skip_back(dumps, run.start, i)  # what stands before it
            placed = end >= 1 and run.block[end - 1] is anchor
        else:
            begin = code.skip_forward(dumps, run.start + run.length, i)  # what stands after it
            placed = begin < len(run.block) and run.block[begin] is anchor
        if placed:
            return run.statements
    return None


def _chosen_anchor(
    matches: list[ast.stmt], anchor: StatementSelector, later: set[int], own: set[int]
) -> ast.stmt | None:
    """The statement `anchor` selects (its `which` applied) among its `matches` but the code of
    later inserts and the run itself; None when it selects none (or several, for `only`)."""
    found = [stmt for stmt in matches if id(stmt) not in later and id(stmt) not in own]
    if not found or (anchor.which == "only" and len(found) > 1):
        return None
    return found[-1] if anchor.which == "last" else found[0]


_CODE: list[tuple[PatchSpec, InsertedCode]] = []
_CODE_LOCK = threading.Lock()


@dataclass(frozen=True)
class InsertedCode:
    """The statement dumps of a patch's inserts, by their first and by their last statement:
    which insert's code stands just before or after a place (two inserts at one place go side
    by side), found without trying every insert of a large patch."""

    by_first: dict[str, list[tuple[int, list[str]]]]
    by_last: dict[str, list[tuple[int, list[str]]]]

    @classmethod
    def of(cls, patch: PatchSpec) -> InsertedCode:
        """The patch's, made once for the patch last asked about (a plan asks per scope)."""
        with _CODE_LOCK:
            if _CODE and _CODE[0][0] is patch:
                return _CODE[0][1]
        code = cls._made(patch)
        with _CODE_LOCK:
            _CODE[:] = [(patch, code)]
        return code

    @classmethod
    def _made(cls, patch: PatchSpec) -> InsertedCode:
        by_first: dict[str, list[tuple[int, list[str]]]] = {}
        by_last: dict[str, list[tuple[int, list[str]]]] = {}
        for j, edit in enumerate(patch.edits):
            if isinstance(edit, InsertEdit) and (dumps := statement_dumps(edit.code)):
                by_first.setdefault(dumps[0], []).append((j, dumps))
                by_last.setdefault(dumps[-1], []).append((j, dumps))
        return cls(by_first, by_last)

    def skip_back(self, dumps: Sequence[str], end: int, besides: int) -> int:
        """`end`, moved back over the code of any insert but edit `besides` that stands just
        before it (the first such insert of the patch each time)."""
        while end >= 1:
            skipped = next(
                (
                    o
                    for j, o in self.by_last.get(dumps[end - 1], ())
                    if j != besides and end >= len(o) and dumps[end - len(o) : end] == o
                ),
                None,
            )
            if skipped is None:
                break
            end -= len(skipped)
        return end

    def skip_forward(self, dumps: Sequence[str], begin: int, besides: int) -> int:
        """`begin`, moved on over the code of any insert but edit `besides` that stands just
        from it."""
        while begin < len(dumps):
            skipped = next(
                (
                    o
                    for j, o in self.by_first.get(dumps[begin], ())
                    if j != besides and dumps[begin : begin + len(o)] == o
                ),
                None,
            )
            if skipped is None:
                break
            begin += len(skipped)
        return begin


def place_words(edit: Positioned) -> str:
    if edit.anchor is not None:
        return f"{edit.position} its anchor"
    return f"at the {edit.position} of `{edit.scope}`"


def inserted_by(
    index: LineIndex, tree: ast.Module, patch: PatchSpec, indices: Sequence[int], scope: str
) -> set[int]:
    """Ids of the statements the patch's inserts among `indices` put into `scope` of `tree`
    (where present), so a delete of the same code (a move: the delete, then the insert) does not
    count them. Only an insert into `scope` itself puts statements among its own."""
    found: set[int] = set()
    for j in indices:
        edit = patch.edits[j]
        if isinstance(edit, InsertEdit) and edit.scope == scope:
            try:
                run = inserted_run(index, tree, patch, j)
            except EditProblem:
                continue
            found.update(id(stmt) for stmt in run or [])
    return found


def _removal_candidates(index: LineIndex, first: int, last: int, newline: str) -> list[str]:
    """Texts with lines [first, last] removed, also for a block that ended a file without a
    final newline (its newline went before it)."""
    text = index.text
    start, end = index.line_start(first), index.line_end(last)
    out = [text[:start] + text[end:]]
    if end == len(text) and start >= len(newline) and text[start - len(newline) : start] == newline:
        out.append(text[: start - len(newline)])
    return out


def _first_verified(
    candidates: Sequence[str], patch: PatchSpec, i: int, current: str, newline: str
) -> str | None:
    """The candidate pre-image from which edit `i` re-creates exactly `current`.

    Re-applying is the proof: a candidate is accepted only if inserting the edit into it gives
    back the patched text byte for byte.
    """
    edit = patch.edits[i]
    assert isinstance(edit, InsertEdit)
    for candidate in candidates:
        try:
            tree = parse_python(candidate)
            splices, _ = edit.place(candidate, tree, patch, newline, i)
        except (SyntaxError, EditProblem):
            continue
        if apply_splices(candidate, splices) == current:
            return candidate
    return None
