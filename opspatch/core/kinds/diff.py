"""The `diff` edit kind: a unified diff applied by its context, as GNU patch applies it. Its
model and alternative model, its placement, how it is recognised in place (its reverse applies)
and how it is taken out of the patched text (the reversed diff is applied). Pure.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field, field_validator

from opspatch.core.anchors import first_line, iter_definitions, last_line
from opspatch.core.kinds.base import Alternative, EditKind, EditState, _alternatives_field
from opspatch.core.placement import EditProblem, Splice, apply_splices, edit_field
from opspatch.core.selectors import MODULE_SCOPE
from opspatch.core.source import LineIndex, split_lines, strip_newline
from opspatch.core.syntax import parse_python
from opspatch.core.vocabulary import EditStatus

# `core.unified` (the hunks parsed and placed) is imported where a diff edit runs: a patch of
# other kinds loads this model (the schema's union) but runs none of it (issue 44).
if TYPE_CHECKING:
    from opspatch.core.spec import PatchSpec
    from opspatch.core.unified import LineReplacement, ParsedDiff


class DiffAlternative(Alternative):
    diff: str | None = None
    max_offset: int | None = Field(None, ge=0, le=100_000)
    fuzz: int | None = Field(None, ge=0, le=3)


class DiffEdit(EditKind):
    """A unified diff, applied by context like GNU patch: the hunk may move by at most
    `max_offset` lines and drop up to `fuzz` context lines at its ends; a context that matches
    more than one place is refused rather than guessed."""

    kind: Literal["diff"]
    diff: str
    max_offset: int = Field(200, ge=0, le=100_000)
    fuzz: int = Field(2, ge=0, le=3)
    alternatives: list[DiffAlternative] = _alternatives_field()

    @field_validator("diff")
    @classmethod
    def _diff_parses(cls, value: str) -> str:
        from opspatch.core.unified import parse_unified_diff

        parse_unified_diff(value)  # raises ValueError with the reason
        return value

    recognised_by: ClassVar[str] = "reverse apply"
    undone_from_text: ClassVar[bool] = True

    def description(self) -> str:
        return "diff"

    def place(
        self, text: str, tree: ast.Module, patch: PatchSpec, newline: str, i: int
    ) -> tuple[list[Splice], list[str]]:
        return self.plan(text, tree, newline, i)

    def plan(
        self, text: str, tree: ast.Module, newline: str, i: int, diff: ParsedDiff | None = None
    ) -> tuple[list[Splice], list[str]]:
        """The splices of `diff` (default: the edit's own), and the scopes its hunks change."""
        from opspatch.core.unified import parse_unified_diff, plan_hunks

        index = LineIndex.of(text)
        parsed = diff if diff is not None else parse_unified_diff(self.diff)
        plain = [strip_newline(line) for line in index.lines]
        planned = plan_hunks(plain, parsed, max_offset=self.max_offset, fuzz=self.fuzz)
        if not isinstance(planned, list):
            raise EditProblem(planned.message, edit_field(i, "diff"))
        splices = [_replacement_splice(index, r, newline) for r in planned]
        return splices, _changed_scopes(planned, tree, apply_splices(text, splices))

    def state(self, index: LineIndex, tree: ast.Module, patch: PatchSpec, i: int) -> EditState:
        """Pending when the diff applies; applied when its reverse does."""
        from opspatch.core.unified import HunkFailure, parse_unified_diff, plan_hunks

        parsed = parse_unified_diff(self.diff)
        plain = [strip_newline(line) for line in split_lines(index.text)]
        # As GNU patch does, look for an already-applied diff before fuzzing: with fuzz, an
        # addition's context may still match after the addition is in place.
        forward: object = None
        for fuzz in sorted({0, self.fuzz}):
            forward = plan_hunks(plain, parsed, max_offset=self.max_offset, fuzz=fuzz)
            if isinstance(forward, list):
                return EditState(i, EditStatus.PENDING, "the diff applies")
            backward = plan_hunks(plain, parsed.reversed(), max_offset=self.max_offset, fuzz=fuzz)
            if isinstance(backward, list):
                return EditState(
                    i, EditStatus.APPLIED, "the diff is already in the file (its reverse applies)"
                )
        assert isinstance(forward, HunkFailure)
        raise EditProblem(forward.message, edit_field(i, "diff"))

    def undo(self, text: str, tree: ast.Module, patch: PatchSpec, newline: str, i: int) -> str:
        """The reversed diff, applied."""
        from opspatch.core.unified import parse_unified_diff

        parsed = parse_unified_diff(self.diff).reversed()
        splices, _ = self.plan(text, tree, newline, i, diff=parsed)
        return apply_splices(text, splices)


def _changed_scopes(
    planned: list[LineReplacement], old_tree: ast.Module, new_text: str
) -> list[str]:
    """The scope each change of the hunks makes (a run of removed and added lines): where its
    removed lines were in the old tree and where its added lines are in the new one, the scope
    holding both. Added lines sit between two old lines that may belong to different
    definitions (a line added at the end of a method lies before the blank line after it), so
    only the new tree says which one they went into; a definition a change adds counts as a
    change of the scope that holds it."""
    try:
        new_tree: ast.Module | None = parse_python(new_text)
    except SyntaxError:  # the validation that follows says so; scope by the old lines alone
        new_tree = None
    known = {qualname for qualname, _ in iter_definitions(old_tree)}

    def scope_of(removed: list[int], added: list[int], before: int) -> str:
        found = []
        if removed:
            found.append(_enclosing_scope(old_tree, removed[0], removed[-1]))
        if added and new_tree is not None:
            scope = _enclosing_scope(new_tree, added[0], added[-1])
            while scope != MODULE_SCOPE and scope not in known:  # a definition it adds
                scope = scope.rpartition(".")[0] or MODULE_SCOPE
            found.append(scope)
        elif added:  # no new tree: the scope of the old line the additions go before
            found.append(_enclosing_scope(old_tree, before, before))
        return _common_scope(found)

    scopes = []
    shift = 0  # a new line's number minus the old line's, past the changes before it
    for replacement in sorted(planned, key=lambda r: r.start):
        old_line = replacement.start + 1  # 1-based, the next old line
        removed: list[int] = []
        added: list[int] = []
        for tag, _ in (*replacement.ops, (" ", "")):  # a context line ends a change
            if tag == "+":
                added.append(old_line + shift)
                shift += 1
            elif tag == "-":
                removed.append(old_line)
                old_line += 1
                shift -= 1
            else:
                if removed or added:
                    scopes.append(scope_of(removed, added, old_line))
                    removed, added = [], []
                old_line += 1
    return scopes


def _common_scope(scopes: list[str]) -> str:
    """The innermost scope holding every one of `scopes` (`W.a`, `W.b` -> `W`)."""
    parts = [s.split(".") if s != MODULE_SCOPE else [] for s in scopes]
    common = []
    for names in zip(*parts, strict=False):
        if len(set(names)) != 1:
            break
        common.append(names[0])
    return ".".join(common) or MODULE_SCOPE


def _enclosing_scope(tree: ast.Module, first: int, last: int) -> str:
    """The innermost definition containing lines [first, last]; `<module>` when none does."""
    best = MODULE_SCOPE
    best_span = None
    for qualname, node in iter_definitions(tree):
        start, end = first_line(node), last_line(node)
        if start <= first and last <= end and (best_span is None or end - start < best_span):
            best, best_span = qualname, end - start
    return best


def _replacement_splice(index: LineIndex, replacement: LineReplacement, newline: str) -> Splice:
    out = []
    cursor = replacement.start
    for tag, value in replacement.ops:
        if tag == " ":
            out.append(index.lines[cursor])
            cursor += 1
        elif tag == "-":
            cursor += 1
        else:
            if out and not out[-1].endswith(("\n", "\r")):
                out[-1] += newline
            out.append(value + newline)
    start = index.line_start(replacement.start + 1)
    end = index.line_end(replacement.end)
    new = "".join(out)
    original_tail = index.text[start:end]
    if new and not original_tail.endswith(("\n", "\r")) and end == len(index.text):
        new = new[: -len(newline)] if new.endswith(newline) else new
    return Splice(start, end, new)
