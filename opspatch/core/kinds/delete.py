"""The `delete` edit kind: statements, selected as `replace` selects them, replaced by the
marker comment. Its model and alternative model, its placement, and how it is recognised in
place (nothing it selects is left but code the patch inserted); it is undone from the recorded
pre-image. Pure.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import field_validator

from opspatch.core.anchors import AnchorProblem, first_line, matching_statements, select_statements
from opspatch.core.kinds.base import (
    Alternative,
    EditKind,
    EditState,
    _alternatives_field,
)
from opspatch.core.kinds.insert import inserted_by
from opspatch.core.placement import (
    EditProblem,
    Splice,
    _replace_statements,
    edit_field,
    scope_of,
)
from opspatch.core.selectors import ReplaceSelector, _check_qualname
from opspatch.core.source import LineIndex
from opspatch.core.vocabulary import EditStatus

if TYPE_CHECKING:
    from opspatch.core.spec import PatchSpec


class DeleteAlternative(Alternative):
    scope: str | None = None
    select: ReplaceSelector | None = None
    comment: str | None = None


class DeleteEdit(EditKind):
    """Delete one statement (`which = "all"`: every match), selected as `replace` selects
    statements; the marker comment stands where it was.

    Recognised as applied when the selector matches nothing in the scope, so `first`/`last`
    (which would delete one more match each time) are refused.
    """

    kind: Literal["delete"]
    scope: str
    select: ReplaceSelector
    comment: str | None = None
    alternatives: list[DeleteAlternative] = _alternatives_field()

    _scope = field_validator("scope")(_check_qualname)

    leaves_code: ClassVar[bool] = False

    def _check_rules(self) -> None:
        """It selects statements, in a way that can be recognised as applied."""
        if self.select.selects_expressions:
            raise ValueError(
                "select: a delete removes statements; use calls, assigns, "
                "defines or matches (an expression is changed with replace)"
            )
        if self.select.which in ("first", "last"):
            raise ValueError(
                f"select.which: {self.select.which!r} cannot be recognised as applied once the "
                "statement is gone; use 'only' (select it uniquely, e.g. with matches) or 'all'"
            )

    def description(self) -> str:
        return f"delete {self.select.describe()} in {self.scope}"

    def place(
        self, text: str, tree: ast.Module, patch: PatchSpec, newline: str, i: int
    ) -> tuple[list[Splice], list[str]]:
        """Each selected statement becomes the marker comment (which says why it went)."""
        index = LineIndex.of(text)
        _refuse_deleting_inserted(self, index, tree, patch, i)
        scope = scope_of(tree, self.scope, i)
        try:
            statements = [located.stmt for located in select_statements(scope, self.select)]
        except AnchorProblem as problem:
            raise EditProblem(
                problem.message, edit_field(i, "select"), problem.candidates
            ) from None
        return _replace_statements(
            index, statements, self.scope, self.comment, patch, "", newline, i
        )

    def state(self, index: LineIndex, tree: ast.Module, patch: PatchSpec, i: int) -> EditState:
        """A delete is applied when the selector matches nothing left in the scope but the code
        this patch inserted."""
        inserted = inserted_by(index, tree, patch, range(len(patch.edits)), self.scope)
        scope = scope_of(tree, self.scope, i)
        left = [
            loc for loc in matching_statements(scope, self.select) if id(loc.stmt) not in inserted
        ]
        if not left:
            return EditState(
                i, EditStatus.APPLIED, "the statement to delete is not in the scope", placed=False
            )
        if self.select.which == "only" and len(left) > 1:
            raise EditProblem(
                f"{self.select.describe()} matches {len(left)} statements in `{scope.qualname}`",
                edit_field(i, "select"),
                [f"line {first_line(loc.stmt)}" for loc in left],
            )
        return EditState(i, EditStatus.PENDING, "the statement to delete is present")


def _refuse_deleting_inserted(
    edit: DeleteEdit, index: LineIndex, tree: ast.Module, patch: PatchSpec, i: int
) -> None:
    """A delete placed after an insert of the same code would take the inserted code too."""
    inserted = inserted_by(index, tree, patch, range(i), edit.scope)
    scope = scope_of(tree, edit.scope, i)
    if any(id(loc.stmt) in inserted for loc in matching_statements(scope, edit.select)):
        raise EditProblem(
            "it would delete code this patch inserts; put the delete before the insert",
            edit_field(i, "select"),
        )
