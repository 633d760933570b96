"""The `move` edit kind: one statement moved to a new place in its scope, its own text
re-indented under the marker. Its model and alternative model, its placement, and how it is
recognised in place (the statement stands where the position says); it is undone from the
recorded pre-image. Pure.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Literal

from pydantic import field_validator

from opspatch.core.anchors import BlockDumps, first_line, last_line, strip_positions
from opspatch.core.kinds.base import (
    Alternative,
    EditKind,
    EditState,
    _alternatives_field,
    _check_anchor,
)
from opspatch.core.kinds.insert import InsertedCode, place_words
from opspatch.core.placement import (
    EditProblem,
    Splice,
    _insert_splice,
    _insertion_point,
    _reads_the_same,
    _render_block,
    _shifted,
    _statement_alone,
    edit_field,
    marker_lines,
    needs_blank_line_after,
    scope_of,
    select_in,
    start_index,
)
from opspatch.core.selectors import ReplaceSelector, StatementSelector, _check_qualname
from opspatch.core.source import LineIndex
from opspatch.core.syntax import string_lines
from opspatch.core.vocabulary import EditStatus

if TYPE_CHECKING:
    from opspatch.core.spec import PatchSpec


class MoveAlternative(Alternative):
    scope: str | None = None
    select: ReplaceSelector | None = None
    position: Literal["start", "end", "before", "after"] | None = None
    anchor: StatementSelector | None = None
    comment: str | None = None


class MoveEdit(EditKind):
    """Move one statement (chosen as `replace` chooses statements) to a new place in its
    scope: `before` / `after` the statement chosen by `anchor`, or the `start` / `end` of the
    scope's body. The statement's own text moves (re-indented to its new block), preceded
    by the marker comment; nothing is left where it stood.

    Recognised as applied only where the anchor says: the statement stands there and nowhere else
    in the scope. A file where it stands elsewhere is pending, however near.
    """

    kind: Literal["move"]
    scope: str
    select: ReplaceSelector
    position: Literal["start", "end", "before", "after"]
    anchor: StatementSelector | None = None
    comment: str | None = None
    alternatives: list[MoveAlternative] = _alternatives_field()

    _scope = field_validator("scope")(_check_qualname)

    def _check_rules(self) -> None:
        """One statement, to one place."""
        if self.select.selects_expressions:
            raise ValueError(
                "select: a move takes one statement; use calls, assigns, defines or matches"
            )
        if self.select.which != "only":
            raise ValueError(
                f"select.which: a move takes one statement, so {self.select.which!r} cannot be "
                "recognised as applied; select it uniquely (e.g. with matches)"
            )
        _check_anchor(self.position, self.anchor)

    def description(self) -> str:
        return f"move {self.select.describe()} {place_words(self)} in {self.scope}"

    def place(
        self, text: str, tree: ast.Module, patch: PatchSpec, newline: str, i: int
    ) -> tuple[list[Splice], list[str]]:
        """The statement's lines go (whole lines: it must stand alone on them) and its text, re-
        indented for its new block and preceded by the marker, goes in at the insertion point."""
        index = LineIndex.of(text)
        scope = scope_of(tree, self.scope, i)
        moved = select_in(scope, self.select, i, "select")
        stmt = moved.stmt
        field_name = edit_field(i, "select")
        if not _statement_alone(index, stmt):
            raise EditProblem(
                f"the statement to move at line {first_line(stmt)} shares its line with other code",
                field_name,
            )
        if len(moved.block) == 1:
            raise EditProblem(
                f"the statement at line {first_line(stmt)} is alone in its block; moving it would "
                "leave the block empty",
                field_name,
            )
        line, indent = _insertion_point(index, scope, self, i)
        first, last = first_line(stmt), last_line(stmt)
        if first < line <= last:
            raise EditProblem(
                f"the place to move to (line {line}) is inside the statement to move "
                f"(lines {first}-{last})",
                edit_field(i, "anchor" if self.anchor is not None else "position"),
            )
        own = index.indentation(first)
        lines = [index.line_text(n) for n in range(first, last + 1)]
        # its own indentation off, whitespace-only lines empty (as _render_block writes them); the
        # lines inside a multi-line string stay as they are
        inside = string_lines(lines)
        body = [
            line_
            if n in inside
            else (line_[len(own) :] if line_.startswith(own) else line_)
            if line_.strip()
            else ""
            for n, line_ in enumerate(lines)
        ]
        if not _reads_the_same(body, indent, [strip_positions(stmt)], inside):
            raise EditProblem(
                f"the statement at line {first} does not read the same once indented for its new block",
                field_name,
            )
        blank_after = needs_blank_line_after(index, scope, line)
        block_lines = marker_lines(patch, self.comment, indent, blank_after=blank_after)
        block = _render_block(
            block_lines + body + ([""] if blank_after else []),
            indent,
            newline,
            _shifted(inside, len(block_lines)),
        )
        removal = Splice(index.line_start(first), index.line_end(last), "")
        insertion = _insert_splice(index, line, block, newline)
        return sorted([removal, insertion], key=lambda s_: (s_.start, s_.end)), [self.scope]

    def state(self, index: LineIndex, tree: ast.Module, patch: PatchSpec, i: int) -> EditState:
        """A move is applied when its one statement stands where the position says (past the code
        of the patch's inserts), not merely somewhere in the scope."""
        scope = scope_of(tree, self.scope, i)
        moved = select_in(scope, self.select, i, "select")
        anchor = select_in(scope, self.anchor, i, "anchor") if self.anchor is not None else None
        if anchor is not None and anchor.stmt is moved.stmt:
            raise EditProblem("the anchor is the statement to move", edit_field(i, "anchor"))
        block = moved.block
        at = next(k for k, stmt in enumerate(block) if stmt is moved.stmt)
        dumps = BlockDumps(block)
        code = InsertedCode.of(patch)
        if self.position == "after":
            before = code.skip_back(dumps, at, i)
            placed = anchor is not None and before >= 1 and block[before - 1] is anchor.stmt
        elif self.position == "before":
            after = code.skip_forward(dumps, at + 1, i)
            placed = anchor is not None and after < len(block) and block[after] is anchor.stmt
        elif self.position == "start":
            placed = block is scope.node.body and code.skip_back(dumps, at, i) == start_index(scope)
        else:
            placed = block is scope.node.body and code.skip_forward(dumps, at + 1, i) == len(block)
        where = place_words(self)
        if placed:
            return EditState(i, EditStatus.APPLIED, f"the statement stands {where}")
        return EditState(
            i,
            EditStatus.PENDING,
            f"the statement stands at line {first_line(moved.stmt)}, not {where}",
        )
