"""The `replace` edit kind: one statement or expression (or every match), selected
structurally, replaced by new code under the marker. Its model and alternative model, its
placement, and how it is recognised in place; it is undone from the recorded pre-image. Pure.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Literal

from pydantic import field_validator

from opspatch.core.anchors import (
    AnchorProblem,
    StatementRun,
    find_statement_runs,
    first_line,
    matching_statements,
    replaced_expressions,
    select_expressions,
    select_statements,
    selected_expressions,
    span,
    statement_dumps,
)
from opspatch.core.kinds.base import (
    Alternative,
    EditKind,
    EditState,
    _alternatives_field,
)
from opspatch.core.placement import (
    EditProblem,
    Splice,
    _render_block,
    _replace_statements,
    carries_marker,
    edit_field,
    file_width,
    fit_expression,
    marker_lines,
    scope_of,
)
from opspatch.core.selectors import ReplaceSelector, _check_qualname, _parse_statements
from opspatch.core.source import LineIndex
from opspatch.core.syntax import parse_python
from opspatch.core.vocabulary import EditStatus

if TYPE_CHECKING:
    from opspatch.core.spec import PatchSpec


class ReplaceAlternative(Alternative):
    scope: str | None = None
    select: ReplaceSelector | None = None
    code: str | None = None
    comment: str | None = None


class ReplaceEdit(EditKind):
    """Replace one statement or expression, selected structurally, with new code."""

    kind: Literal["replace"]
    scope: str
    select: ReplaceSelector
    code: str
    comment: str | None = None
    alternatives: list[ReplaceAlternative] = _alternatives_field()

    _scope = field_validator("scope")(_check_qualname)

    def _check_rules(self) -> None:
        """The code fits what is selected: an expression for an expression, else statements."""
        if self.select.selects_expressions:
            try:
                parse_python(self.code.strip(), mode="eval")
            except SyntaxError as exc:
                raise ValueError(
                    f"code: must be an expression to replace an expression: {exc.msg}"
                ) from None
        elif not _parse_statements(self.code, "code"):
            raise ValueError("code: is empty")

    def description(self) -> str:
        return f"replace {self.select.describe()} in {self.scope}"

    def place(
        self, text: str, tree: ast.Module, patch: PatchSpec, newline: str, i: int
    ) -> tuple[list[Splice], list[str]]:
        index = LineIndex.of(text)
        scope = scope_of(tree, self.scope, i)
        try:
            if self.select.selects_expressions:
                expressions = select_expressions(scope, self.select)
                statements = []
            else:
                expressions = []
                statements = [located.stmt for located in select_statements(scope, self.select)]
        except AnchorProblem as problem:
            raise EditProblem(
                problem.message, edit_field(i, "select"), problem.candidates
            ) from None
        splices: list[Splice] = []
        # one marker per statement, however many of its expressions this and earlier edits change
        marked = {
            first_line(found.stmt)
            for found in expressions
            if carries_marker(index, found.stmt, patch)
        }
        width = file_width(index)
        for found in expressions:
            expr = found.expr
            assert expr.end_lineno is not None and expr.end_col_offset is not None
            stmt_line = first_line(found.stmt)
            if stmt_line not in marked:
                marked.add(stmt_line)
                indent = index.indentation(stmt_line)
                marker = marker_lines(patch, self.comment, indent)
                at = index.line_start(stmt_line)
                splices.append(Splice(at, at, _render_block(marker, indent, newline)))
            start = index.offset(expr.lineno, expr.col_offset)
            end = index.offset(expr.end_lineno, expr.end_col_offset)
            splices.append(
                Splice(start, end, fit_expression(index, expr, self.code, width, newline))
            )
        statement_splices, scopes = _replace_statements(
            index, statements, self.scope, self.comment, patch, self.code, newline, i
        )
        return splices + statement_splices, scopes

    def state(self, index: LineIndex, tree: ast.Module, patch: PatchSpec, i: int) -> EditState:
        """A replace is applied when its new code stands at the place the selector chooses:

        - the node the selector selects (its `which` applied: the first, the last, or every match)
          lies inside new code (which may contain the old, e.g. `max(x, 1)`, or match the selector
          itself, e.g. a new call of the same function);
        - else, for `first` (`last`), new code under this patch's marker comes before (after) every
          match left: the tree alone cannot tell the new code the edit wrote from the same code that
          stood there before, so new code merely standing earlier (later) in the scope is not it;
        - nothing the selector matches is left and new code stands in the scope (the old code is
          gone: there is no place left to apply it; not `placed`, `marked` under the marker).
        """
        scope = scope_of(tree, self.scope, i)
        field_name = edit_field(i, "select")
        if self.select.selects_expressions:
            new = [
                (span(m.expr), m.stmt) for m in replaced_expressions(scope, self.select, self.code)
            ]
            old_spans = sorted(span(m.expr) for m in selected_expressions(scope, self.select))
        else:
            runs = find_statement_runs(scope, statement_dumps(self.code))
            new = [(_run_span(r), r.statements[0]) for r in runs]
            old_spans = sorted(span(loc.stmt) for loc in matching_statements(scope, self.select))
        new_spans = [where for where, _ in new]
        replaced = [any(_inside(old, where) for where in new_spans) for old in old_spans]
        leftover = [old for old, done in zip(old_spans, replaced, strict=True) if not done]
        marked = [where for where, stmt in new if carries_marker(index, stmt, patch)]
        which = self.select.which
        if new_spans and not leftover:
            return EditState(
                i,
                EditStatus.APPLIED,
                "the replacement is present"
                + ("" if old_spans else " (the code to replace is gone)"),
                placed=bool(old_spans),
                marked=bool(marked),
            )
        # here some match is left, or no new code stands anywhere (nothing is replaced or marked)
        first_done = (
            which == "first"
            and bool(leftover)
            and (replaced[0] or any(where[:2] < leftover[0][:2] for where in marked))
        )
        last_done = (
            which == "last"
            and bool(leftover)
            and (replaced[-1] or any(where[2:] > leftover[-1][2:] for where in marked))
        )
        if first_done or last_done:
            return EditState(
                i, EditStatus.APPLIED, f"the replacement is present at the {which} match"
            )
        try:  # the selection must be unambiguous for the edit to be applicable
            if self.select.selects_expressions:
                select_expressions(scope, self.select)
            else:
                select_statements(scope, self.select)
        except AnchorProblem as problem:
            raise EditProblem(problem.message, field_name, problem.candidates) from None
        return EditState(i, EditStatus.PENDING, "the code to replace is present")


Span = tuple[int, int, int, int]


def _run_span(run: StatementRun) -> Span:
    statements = run.statements
    return span(statements[0])[:2] + span(statements[-1])[2:]


def _inside(inner: Span, outer: Span) -> bool:
    return outer[:2] <= inner[:2] and inner[2:] <= outer[2:]
