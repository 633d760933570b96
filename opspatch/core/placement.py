"""What the edit kinds share to place themselves: scopes, anchors, insertion points, the marker
comment, re-indenting, and the splices that carry an edit into the original text (pure)."""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from opspatch.core.anchors import (
    AnchorProblem,
    Located,
    Scope,
    first_line,
    last_line,
    resolve_scope,
    select_statement,
    statement_dumps,
    strip_positions,
)
from opspatch.core.selectors import MODULE_SCOPE, StatementSelector
from opspatch.core.source import LineIndex
from opspatch.core.syntax import CodeLines, dedent_code, parse_python
from opspatch.core.tomlsource import format_field_path

if TYPE_CHECKING:
    from opspatch.core.spec import PatchSpec


def edit_field(index: int, *rest: str | int) -> str:
    """The field path of an edit, as shown to operators: `edits[1].anchor`."""
    return format_field_path(("edits", index, *rest))


@dataclass(frozen=True)
class Splice:
    """Replace text[start:end] with `text` (offsets into the text the splice applies to)."""

    start: int
    end: int
    text: str


class EditProblem(Exception):
    """An edit cannot be placed; carries the field and candidates for `NotApplicable`."""

    def __init__(self, message: str, field: str = "", candidates: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.candidates = tuple(candidates)


# ---------------------------------------------------------------------------------------------
# text helpers


def apply_splices(text: str, splices: Sequence[Splice]) -> str:
    out = []
    cursor = 0
    for splice in sorted(splices, key=lambda s: s.start):
        if splice.start < cursor:
            raise EditProblem("two changes of this patch overlap")
        out.append(text[cursor : splice.start])
        out.append(splice.text)
        cursor = splice.end
    out.append(text[cursor:])
    return "".join(out)


def undo_splices(text: str, splices: Sequence[Splice]) -> tuple[Splice, ...]:
    """The splices that turn the result of `splices` back into `text`."""
    undo = []
    shift = 0
    for splice in sorted(splices, key=lambda s: s.start):
        new_start = splice.start + shift
        undo.append(
            Splice(new_start, new_start + len(splice.text), text[splice.start : splice.end])
        )
        shift += len(splice.text) - (splice.end - splice.start)
    return tuple(undo)


def _is_blank_or_comment(line: str) -> bool:
    stripped = line.strip()
    return not stripped or stripped.startswith("#")


COMMENT_WIDTH = 99


BLANK_LINE_MARK = "+blank"
"""Appended to the marker (`# opspatch:<id>+blank: ...`) when the inserted block brought the
blank line after it, so `unapply` can take exactly that line away again (see `kinds/insert.py`)."""


def marker_lines(
    patch: PatchSpec, comment: str | None, indent: str = "", *, blank_after: bool = False
) -> list[str]:
    """The marker comment naming the patch, with the edit's reason wrapped to fit the line.

    `blank_after`: the block is followed by a blank line it added; the marker says so.
    """
    head = patch.marker + (BLANK_LINE_MARK if blank_after else "")
    if not comment:
        return [head]
    width = max(40, COMMENT_WIDTH - len(indent.expandtabs(8)))
    lines: list[str] = []
    paragraphs = [p.strip() for p in textwrap.dedent(comment).strip().splitlines()]
    for number, paragraph in enumerate(paragraphs):
        first = f"{head}: {paragraph}" if number == 0 else f"# {paragraph}"
        lines += textwrap.wrap(
            first,
            width=width,
            subsequent_indent="# ",
            break_long_words=False,
            break_on_hyphens=False,
        ) or ["#"]
    return lines


def _render_block(
    lines: Sequence[str], indent: str, newline: str, verbatim: frozenset[int] = frozenset()
) -> str:
    """The lines at `indent` (whitespace-only lines empty), but those in `verbatim` (lines that
    begin inside a multi-line string) as they are: their whitespace is the string's."""
    return "".join(
        (line if n in verbatim else indent + line if line.strip() else "") + newline
        for n, line in enumerate(lines)
    )


def _reads_the_same(
    lines: Sequence[str], indent: str, dumps: Sequence[str], verbatim: frozenset[int]
) -> bool:
    """Whether `lines`, written at `indent` as `_render_block` writes them, are still the
    statements `dumps`."""
    source = _render_block(lines, indent, "\n", verbatim)
    try:
        tree = parse_python("if 1:\n" + source if indent else source)
    except SyntaxError:
        return False
    head = tree.body[0] if tree.body else None
    body = head.body if indent and isinstance(head, ast.If) else tree.body
    return [strip_positions(stmt) for stmt in body] == list(dumps)


def _refuse_reindenting(code: CodeLines, indent: str, dumps: Sequence[str], field: str) -> None:
    """A guard: the code as written into its block must be the code of the patch. Strings are
    never re-indented (`dedent_code`), so only code that parses differently once indented (none
    is known) is refused here."""
    if not _reads_the_same(code.lines, indent, dumps, code.verbatim):
        raise EditProblem(
            "the code does not read the same once indented for its block; write it as it "
            "stands in that block",
            field,
        )


def _code_lines(code: str, indent: str = "") -> CodeLines:
    """The snippet's lines, dedented (a multi-line string's lines kept as written); in a block
    indented with tabs, its own nested levels (written with spaces) become tabs too, unless that
    would change it."""
    dedented = dedent_code(code)
    lines = list(dedented.lines)
    if not indent.startswith("\t"):
        return dedented
    own = [n for n, line in enumerate(lines) if n not in dedented.verbatim and line.strip()]
    depths = [len(lines[n]) - len(lines[n].lstrip(" ")) for n in own]
    unit = min((d for d in depths if d), default=0)
    if not unit:
        return dedented
    tabbed = list(lines)
    for n in own:
        depth = len(lines[n]) - len(lines[n].lstrip(" "))
        tabbed[n] = "\t" * (depth // unit) + " " * (depth % unit) + lines[n][depth:]
    try:
        same = strip_positions(parse_python("\n".join(tabbed))) == strip_positions(
            parse_python("\n".join(lines))
        )
    except SyntaxError:
        same = False
    return CodeLines(tuple(tabbed), dedented.verbatim) if same else dedented


def _shifted(indices: frozenset[int], by: int) -> frozenset[int]:
    """`indices` of a block's lines, once `by` lines (the marker) go before them."""
    return frozenset(n + by for n in indices)


def _rest_of_line_is_empty(index: LineIndex, lineno: int, col: int) -> bool:
    line = index.line_text(lineno)
    rest = line.encode("utf-8")[col:].decode("utf-8")
    return _is_blank_or_comment(rest)


def _prefix_is_indent(index: LineIndex, lineno: int, col: int) -> bool:
    line = index.line_text(lineno).encode("utf-8")
    return not line[:col].strip()


def _statement_alone(index: LineIndex, stmt: ast.stmt) -> bool:
    """True when no other statement shares the statement's first or last line."""
    start_line = first_line(stmt)
    decorators = getattr(stmt, "decorator_list", None) or []
    start_col = decorators[0].col_offset - 1 if decorators else stmt.col_offset
    end_col = stmt.end_col_offset if stmt.end_col_offset is not None else 0
    return _prefix_is_indent(index, start_line, max(start_col, 0)) and _rest_of_line_is_empty(
        index, last_line(stmt), end_col
    )


# ---------------------------------------------------------------------------------------------
# placing edits


def _is_docstring(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    )


def _is_super_init(stmt: ast.stmt) -> bool:
    if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
        return False
    func = stmt.value.func
    return (
        isinstance(func, ast.Attribute)
        and func.attr == "__init__"
        and isinstance(func.value, ast.Call)
        and isinstance(func.value.func, ast.Name)
        and func.value.func.id == "super"
    )


def _is_future_import(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__"


def start_index(scope: Scope) -> int:
    """Where `position = "start"` inserts in a scope's body: past its docstring, and past a
    module's `from __future__` imports or a leading `super().__init__(...)`."""
    body = scope.node.body
    position = 0
    if position < len(body) and _is_docstring(body[position]):
        position += 1
    if isinstance(scope.node, ast.Module):
        while position < len(body) and _is_future_import(body[position]):
            position += 1
    elif position < len(body) and _is_super_init(body[position]):
        position += 1
    return position


def _start_point(index: LineIndex, scope: Scope) -> tuple[int, str]:
    """(line to insert before, indentation) for the start of a scope's body."""
    body = scope.node.body
    position = start_index(scope)
    skipped = body[position - 1] if position else None
    if skipped is not None:
        if not _statement_alone(index, skipped):
            raise EditProblem(f"line {last_line(skipped)} holds more than one statement")
        return last_line(skipped) + 1, index.indentation(first_line(skipped))
    if not body:  # only possible for an empty module
        return 1, ""
    first = body[0]
    indent = index.indentation(first_line(first))
    if isinstance(scope.node, ast.Module):
        return first_line(first), indent
    header_line = scope.node.lineno
    line = first_line(first) - 1
    while line > header_line and _is_blank_or_comment(index.line_text(line)):
        line -= 1
    if first_line(first) <= header_line:
        raise EditProblem(
            f"`{scope.qualname}` has its body on its header line (line {header_line}); "
            "inserting at its start would need reformatting"
        )
    return line + 1, indent


def _end_point(index: LineIndex, scope: Scope) -> tuple[int, str]:
    last = scope.node.body[-1] if scope.node.body else None
    if last is None:
        return len(index.lines) + 1, ""
    if not _statement_alone(index, last):
        raise EditProblem(f"line {last_line(last)} holds more than one statement")
    return last_line(last) + 1, index.indentation(first_line(last))


def _before_point(index: LineIndex, located: Located) -> tuple[int, str]:
    stmt = located.stmt
    if not _statement_alone(index, stmt):
        raise EditProblem(f"the anchor statement at line {first_line(stmt)} shares its line")
    line = first_line(stmt)
    indent = index.indentation(line)
    # Comments directly above a statement belong to it: insert above them.
    while line > 1:
        above = index.line_text(line - 1)
        if above.strip().startswith("#") and index.indentation(line - 1) == indent:
            line -= 1
        else:
            break
    return line, indent


def _after_point(index: LineIndex, located: Located) -> tuple[int, str]:
    stmt = located.stmt
    if not _statement_alone(index, stmt):
        raise EditProblem(f"the anchor statement at line {last_line(stmt)} shares its line")
    return last_line(stmt) + 1, index.indentation(first_line(stmt))


def _insert_splice(index: LineIndex, line: int, block: str, newline: str) -> Splice:
    offset = index.line_start(line)
    text = index.text
    if offset == len(text) and text and not text.endswith(("\n", "\r")):
        # the file ends without a newline: start the block on a new line, keep the ending as it was
        return Splice(offset, offset, newline + block[: -len(newline)])
    return Splice(offset, offset, block)


class Positioned(Protocol):
    """An edit that goes to a position in its scope (an insert, a move)."""

    @property
    def scope(self) -> str: ...

    @property
    def position(self) -> Literal["start", "end", "before", "after"]: ...

    @property
    def anchor(self) -> StatementSelector | None: ...


def _insertion_point(index: LineIndex, scope: Scope, edit: Positioned, i: int) -> tuple[int, str]:
    """(line to insert before, indentation) for an insert's or a move's position."""
    if edit.position == "start":
        return _start_point(index, scope)
    if edit.position == "end":
        return _end_point(index, scope)
    assert edit.anchor is not None
    located = select_in(scope, edit.anchor, i, "anchor")
    point = _before_point if edit.position == "before" else _after_point
    return point(index, located)


def needs_blank_line_after(index: LineIndex, scope: Scope, line: int) -> bool:
    """Whether a block inserted at class level before `line` must bring a blank line: the line
    starts a method, a nested class or a decorator, which a reviewer expects set apart (a block
    glued to the `def` under it reads as a mistake). Function bodies and modules are left as
    they are: there a blank line would be a matter of taste, not of reading."""
    if not isinstance(scope.node, ast.ClassDef) or line > len(index.lines):
        return False
    return index.line_text(line).lstrip().startswith(("def ", "async def ", "class ", "@"))


def carries_marker(index: LineIndex, stmt: ast.stmt, patch: PatchSpec) -> bool:
    """Whether the comment block directly above `stmt` holds this patch's marker (not that of
    a patch whose id merely starts with this one's): the trace an edit leaves at its own place."""
    line = first_line(stmt) - 1
    while line >= 1 and (text := index.line_text(line).strip()).startswith("#"):
        rest = text.removeprefix(patch.marker).removeprefix(BLANK_LINE_MARK)
        if text.startswith(patch.marker) and (not rest or rest.startswith(":")):
            return True
        line -= 1
    return False


WIDTHS = (79, 88, 100, 120)
"""The line lengths style guides use; a file's width is the first that holds its longest line."""


def file_width(index: LineIndex) -> int:
    """The width a file keeps to: the first of 79, 88, 100, 120 that its longest line fits in,
    or the longest line itself when it is longer (tabs count 8)."""
    longest = max(
        (len(index.line_text(n).expandtabs(8)) for n in range(1, len(index.lines) + 1)), default=0
    )
    return next((w for w in WIDTHS if longest <= w), longest)


def fit_expression(index: LineIndex, expr: ast.expr, code: str, width: int, newline: str) -> str:
    """The text that replaces `expr`: `code` on its line when the line keeps within `width`,
    else in parentheses on lines of its own, one level deeper than the line it starts on, split
    before each `and` / `or` of a boolean expression at its top. Parentheses do not change the
    syntax tree, so detection and undo read it as the one-line form."""
    code = code.strip()
    assert expr.end_lineno is not None and expr.end_col_offset is not None
    start_line = index.line_text(expr.lineno)
    before = start_line.encode("utf-8")[: expr.col_offset].decode("utf-8")
    after = index.line_text(expr.end_lineno).encode("utf-8")[expr.end_col_offset :].decode("utf-8")
    if "\n" in code or len((before + code + after).rstrip().expandtabs(8)) <= width:
        return code
    lead = index.indentation(expr.lineno)
    inner = lead + ("\t" if lead.startswith("\t") else "    ")
    tree = parse_python(code, mode="eval").body
    pieces = [code]
    if isinstance(tree, ast.BoolOp):
        word = "and" if isinstance(tree.op, ast.And) else "or"
        parts = [_operand_text(code, value) for value in tree.values]
        split = [parts[0], *(f"{word} {part}" for part in parts[1:])]
        if _same_expression(" ".join(split), tree):  # the split must read as the code did
            pieces = split
    return "(" + newline + "".join(inner + p + newline for p in pieces) + lead + ")"


def _operand_text(code: str, value: ast.expr) -> str:
    text = ast.get_source_segment(code, value) or ast.unparse(value)
    loose = isinstance(value, ast.BoolOp | ast.IfExp | ast.Lambda | ast.NamedExpr)
    return f"({text})" if loose else text


def _same_expression(text: str, tree: ast.expr) -> bool:
    try:
        return strip_positions(parse_python(f"({text})", mode="eval").body) == strip_positions(tree)
    except SyntaxError:
        return False


def _replace_statements(
    index: LineIndex,
    statements: Sequence[ast.stmt],
    scope: str,
    comment: str | None,
    patch: PatchSpec,
    code: str,
    newline: str,
    i: int,
) -> tuple[list[Splice], list[str]]:
    """Splices that put the marker and `code` ("" for a delete) where each statement stood (its trailing comment
    and line ending stay)."""
    splices: list[Splice] = []
    scopes = [scope]
    for stmt in statements:
        if not _statement_alone(index, stmt):
            raise EditProblem(
                f"the selected statement at line {first_line(stmt)} shares its line with other "
                "code",
                edit_field(i, "select"),
            )
        indent = index.indentation(first_line(stmt))
        # a replace under this patch's marker (an earlier edit's) adds none; a delete needs its
        # own, since the marker is what stands in its place
        already = bool(code) and carries_marker(index, stmt, patch)
        marker = [] if already else marker_lines(patch, comment, indent)
        assert stmt.end_col_offset is not None
        start = index.line_start(first_line(stmt))
        end = index.offset(last_line(stmt), stmt.end_col_offset)
        lines = _code_lines(code, indent) if code else CodeLines((), frozenset())
        if code:
            _refuse_reindenting(lines, indent, statement_dumps(code), edit_field(i, "code"))
        rendered = _render_block(
            [*marker, *lines.lines], indent, newline, _shifted(lines.verbatim, len(marker))
        )
        rendered = rendered[: -len(newline)]  # the statement's own line ending stays in the file
        splices.append(Splice(start, end, rendered))
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            prefix = "" if scope == MODULE_SCOPE else scope + "."
            scopes.append(prefix + stmt.name)
    return splices, scopes


def scope_of(tree: ast.Module, qualname: str, i: int) -> Scope:
    try:
        return resolve_scope(tree, qualname)
    except AnchorProblem as problem:
        raise EditProblem(problem.message, edit_field(i, "scope"), problem.candidates) from None


def select_in(scope: Scope, selector: object, i: int, name: str) -> Located:
    try:
        return select_statement(scope, selector)  # type: ignore[arg-type]
    except AnchorProblem as problem:
        raise EditProblem(problem.message, edit_field(i, name), problem.candidates) from None
