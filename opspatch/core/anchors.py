"""Find scopes and statements by structure, not by line number."""

from __future__ import annotations

import ast
import difflib
import functools
import threading
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import overload

from opspatch.core.selectors import MODULE_SCOPE, ReplaceSelector, StatementSelector
from opspatch.core.syntax import dedent_code, parse_python

DefNode = ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
ScopeNode = ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef


class AnchorProblem(Exception):
    """An anchor matched nothing or several places. Converted to `NotApplicable` by the engine."""

    def __init__(self, message: str, candidates: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.candidates = tuple(candidates)


@dataclass(frozen=True)
class Scope:
    qualname: str
    node: ScopeNode


@dataclass(frozen=True)
class Located:
    """A selected statement and the block (statement list) that holds it."""

    stmt: ast.stmt
    block: list[ast.stmt]


def first_line(node: ast.stmt) -> int:
    """The first line of a statement, decorators included."""
    decorators: list[ast.expr] = getattr(node, "decorator_list", None) or []
    return min([node.lineno, *(d.lineno for d in decorators)])


def last_line(node: ast.stmt) -> int:
    return node.end_lineno if node.end_lineno is not None else node.lineno


_BLOCKLESS = frozenset(
    {
        ast.Expr, ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Return, ast.Pass, ast.Import,
        ast.ImportFrom, ast.Raise, ast.Assert, ast.Delete, ast.Global, ast.Nonlocal, ast.Break,
        ast.Continue, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
    }
)  # fmt: skip
"""Statements with no statement list of their own to descend into (definitions are scopes of
their own): most statements of a file, answered by one type lookup."""


def child_blocks(stmt: ast.stmt) -> list[list[ast.stmt]]:
    """The statement lists directly inside a compound statement (not inside nested defs)."""
    if type(stmt) in _BLOCKLESS or isinstance(
        stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    ):
        return []
    blocks: list[list[ast.stmt]] = []
    for name in ("body", "orelse", "finalbody"):
        block = getattr(stmt, name, None)
        if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
            blocks.append(block)
    for handler in getattr(stmt, "handlers", []) or []:
        blocks.append(handler.body)
    for case in getattr(stmt, "cases", []) or []:
        blocks.append(case.body)
    return blocks


def scope_blocks(node: ScopeNode) -> Iterator[list[ast.stmt]]:
    """Every statement list of a scope, outermost first (nested defs are other scopes)."""
    stack = [node.body]
    while stack:
        block = stack.pop(0)
        yield block
        for stmt in block:
            stack.extend(child_blocks(stmt))


def iter_statements(node: ScopeNode) -> Iterator[Located]:
    """Every statement of a scope in source order, descending into if/for/with/try blocks."""
    return _walk_statements(node.body)


def _walk_statements(block: list[ast.stmt]) -> Iterator[Located]:
    for stmt in block:
        yield Located(stmt, block)
        for inner in child_blocks(stmt):
            yield from _walk_statements(inner)


@dataclass(frozen=True)
class _Definitions:
    ordered: tuple[tuple[str, DefNode], ...]
    by_name: dict[str, list[DefNode]]


_DEFINITIONS: weakref.WeakKeyDictionary[ast.Module, _Definitions] = weakref.WeakKeyDictionary()
_DEFINITIONS_LOCK = threading.Lock()
"""Each tree's definitions, walked once: a plan resolves scopes a dozen times on the same tree
(placing, detecting, validating), and walking a 6,000-line file each time was a fifth of it.
Trees are never changed after parsing (nothing in the engine edits a tree); kept while the tree
lives. The preflight plans hosts in parallel, hence the lock."""


def _definitions_of(tree: ast.Module) -> _Definitions:
    with _DEFINITIONS_LOCK:
        known = _DEFINITIONS.get(tree)
    if known is not None:
        return known
    return remember_definitions(tree, definitions_in(tree.body, ""))


def definitions_in(block: list[ast.stmt], prefix: str) -> list[tuple[str, DefNode]]:
    """Every class and function defined in `block` (nested ones too), qualnames under `prefix`,
    in source order."""
    ordered: list[tuple[str, DefNode]] = []
    _walk_definitions(block, prefix, ordered)
    return ordered


def _walk_definitions(
    block: list[ast.stmt], prefix: str, ordered: list[tuple[str, DefNode]]
) -> None:
    # a function of its own, not a closure: a closure that calls itself is a reference cycle,
    # which would keep every tree it saw alive until the cyclic collector ran
    for stmt in block:
        if isinstance(stmt, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            qualname = f"{prefix}{stmt.name}"
            ordered.append((qualname, stmt))
            _walk_definitions(stmt.body, qualname + ".", ordered)
        else:
            for inner in child_blocks(stmt):
                _walk_definitions(inner, prefix, ordered)


def remember_definitions(tree: ast.Module, ordered: Sequence[tuple[str, DefNode]]) -> _Definitions:
    """Keep `ordered` (what `definitions_in(tree.body, "")` gives) as the tree's definitions: a
    tree built from another's parts (`core/regions.py`) knows them without walking the file."""
    by_name: dict[str, list[DefNode]] = {}
    for qualname, node in ordered:
        by_name.setdefault(qualname, []).append(node)
    found = _Definitions(tuple(ordered), by_name)
    with _DEFINITIONS_LOCK:
        return _DEFINITIONS.setdefault(tree, found)


def iter_definitions(tree: ast.Module) -> Iterator[tuple[str, DefNode]]:
    """Every class and function with its qualname (`Outer.Inner.method`), in source order."""
    return iter(_definitions_of(tree).ordered)


def resolve_scope(tree: ast.Module, qualname: str) -> Scope:
    """Find the one scope called `qualname`.

    Raises:
        AnchorProblem: no such scope (nearest names offered) or several (all listed).
    """
    if qualname == MODULE_SCOPE:
        return Scope(qualname, tree)
    found = _definitions_of(tree).by_name.get(qualname, [])
    if len(found) == 1:
        return Scope(qualname, found[0])
    if found:
        raise AnchorProblem(
            f"scope `{qualname}` is defined {len(found)} times",
            [f"{qualname} at line {first_line(node)}" for node in found],
        )
    names = [name for name, _ in iter_definitions(tree)]
    near = difflib.get_close_matches(qualname, names, n=5, cutoff=0.5)
    tail = qualname.rsplit(".", 1)[-1]
    near += [n for n in names if n.rsplit(".", 1)[-1] == tail and n not in near][:5]
    raise AnchorProblem(
        f"scope `{qualname}` is not defined in this file",
        [
            f"{name} (line {first_line(node)})"
            for name, node in iter_definitions(tree)
            if name in near
        ],
    )


def dotted_name(node: ast.expr) -> str | None:
    """`self.a.b` -> "self.a.b"; `super().__init__` -> "super().__init__"; else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted_name(node.value)
        return f"{base}.{node.attr}" if base is not None else None
    if isinstance(node, ast.Call) and not node.args and not node.keywords:
        base = dotted_name(node.func)
        return f"{base}()" if base is not None else None
    return None


def _header_expressions(stmt: ast.stmt) -> list[ast.AST]:
    """The expressions a statement evaluates itself (a compound statement's header only)."""
    if not child_blocks(stmt) and not isinstance(
        stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    ):
        return [stmt]
    if isinstance(stmt, ast.If | ast.While):
        return [stmt.test]
    if isinstance(stmt, ast.For | ast.AsyncFor):
        return [stmt.target, stmt.iter]
    if isinstance(stmt, ast.With | ast.AsyncWith):
        return [item.context_expr for item in stmt.items]
    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
        # a keyword-only argument without a default has None in kw_defaults: not an expression
        defaults = [d for d in stmt.args.kw_defaults if d is not None]
        return [*stmt.decorator_list, *stmt.args.defaults, *defaults]
    if isinstance(stmt, ast.ClassDef):
        return [*stmt.decorator_list, *stmt.bases, *(k.value for k in stmt.keywords)]
    subject = getattr(stmt, "subject", None)
    return [subject] if subject is not None else []


def calls_in(node: ast.AST) -> list[str]:
    """Dotted names of every call inside `node` (`<call>` for calls of computed callables)."""
    return [
        dotted_name(sub.func) or "<call>" for sub in ast.walk(node) if isinstance(sub, ast.Call)
    ]


def statement_calls(stmt: ast.stmt) -> list[str]:
    """The calls a statement makes itself (for a compound statement: in its header)."""
    names: list[str] = []
    for expr in _header_expressions(stmt):
        names.extend(calls_in(expr))
    return names


def call_matches(name: str, wanted: str) -> bool:
    """`self.init_cuda_graphs` matches `init_cuda_graphs` and `self.init_cuda_graphs`."""
    return name == wanted or name.endswith("." + wanted)


def _target_names(target: ast.expr) -> list[str]:
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for elt in target.elts for n in _target_names(elt)]
    if isinstance(target, ast.Starred):
        return _target_names(target.value)
    name = dotted_name(target)
    return [name] if name else []


def statement_assigns(stmt: ast.stmt) -> list[str]:
    """What a statement assigns (`x`, `self.y`), for Assign, AnnAssign and AugAssign."""
    if isinstance(stmt, ast.Assign):
        return [n for t in stmt.targets for n in _target_names(t)]
    if isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
        return _target_names(stmt.target)
    return []


def strip_positions(node: ast.AST) -> str:
    """A dump of `node` without positions: equal dumps mean the same code. A statement's dump
    is kept while its tree lives (trees are never changed): recognising many edits compares the
    same statements again and again."""
    if not isinstance(node, ast.stmt):
        return ast.dump(node, annotate_fields=True, include_attributes=False)
    with _DUMPS_LOCK:
        known = _DUMPS.get(node)
    if known is None:
        known = ast.dump(node, annotate_fields=True, include_attributes=False)
        with _DUMPS_LOCK:
            _DUMPS[node] = known
    return known


_DUMPS: weakref.WeakKeyDictionary[ast.stmt, str] = weakref.WeakKeyDictionary()
_DUMPS_LOCK = threading.Lock()


class BlockDumps(Sequence[str]):
    """The dumps of a block's statements, each made when first read: what stands beside a place
    is a few statements of a block whose others (a class's methods) are long to dump."""

    def __init__(self, block: list[ast.stmt]) -> None:
        self.block = block

    def __len__(self) -> int:
        return len(self.block)

    @overload
    def __getitem__(self, at: int) -> str: ...

    @overload
    def __getitem__(self, at: slice) -> list[str]: ...

    def __getitem__(self, at: int | slice) -> str | list[str]:
        if isinstance(at, slice):
            return [strip_positions(stmt) for stmt in self.block[at]]
        return strip_positions(self.block[at])


def dump_matches(node: ast.AST, dump: str) -> bool:
    """`strip_positions(node) == dump`, without dumping nodes of another type (a dump starts with
    its node's type name): most candidates in a scope differ at the top."""
    name = type(node).__name__
    return (
        dump.startswith(name)
        and dump[len(name) : len(name) + 1] == "("
        and (strip_positions(node) == dump)
    )


_OMITTED = object()
_PLAIN = (str, int, bool, bytes)
"""Values whose `repr`s are equal exactly when they are (floats are not: `0.0 == -0.0`)."""


def _field_value(node: ast.AST, name: str) -> object:
    """A field as `ast.dump` sees it: missing, or None where the class default is None, is
    omitted from the dump."""
    value = getattr(node, name, _OMITTED)
    if value is None and getattr(type(node), name, ...) is None:
        return _OMITTED
    return value


def same_code(old: ast.AST, new: ast.AST, *, stub_nested: bool = False) -> bool:
    """`strip_positions(old) == strip_positions(new)`, decided by walking both trees side by side
    and stopping at the first difference. With `stub_nested`, definitions nested in the two roots
    count as their kind and name only (`<FunctionDef name>`): the roots' own code is compared,
    their nested definitions are compared on their own.

    Constants compare as `ast.dump` prints them (by type and `repr`), so `1` and `1.0` differ.
    """
    roots = (old, new)
    stack: list[tuple[object, object]] = [(old, new)]
    while stack:
        a, b = stack.pop()
        if stub_nested:
            if isinstance(a, DefNode) and a not in roots:
                a = _stub(a)
            if isinstance(b, DefNode) and b not in roots:
                b = _stub(b)
        if isinstance(a, ast.AST):
            if type(a) is not type(b):
                return False
            for name in a._fields:
                stack.append((_field_value(a, name), _field_value(b, name)))
        elif isinstance(a, list):
            if not isinstance(b, list) or len(a) != len(b):
                return False
            stack.extend(zip(a, b, strict=True))
        elif a is _OMITTED or b is _OMITTED or type(a) is not type(b):
            if a is not b:
                return False
        elif (a != b) if type(a) in _PLAIN else (repr(a) != repr(b)):
            return False
    return True


def _stub(node: DefNode) -> ast.stmt:
    return ast.Expr(ast.Constant(f"<{type(node).__name__} {node.name}>"))


def statement_dumps(code: str) -> list[str]:
    """Dumps of the statements of a snippet, dedented as it is placed (`dedent_code`: a
    multi-line string's lines kept as written)."""
    return list(_snippet_dumps(code))


@functools.lru_cache(maxsize=4096)
def _snippet_dumps(code: str) -> tuple[str, ...]:
    # every edit's code is dumped again for every other edit that may stand beside it
    tree = parse_python(dedent_code(code).text)
    return tuple(ast.dump(s, annotate_fields=True, include_attributes=False) for s in tree.body)


def _pick(
    found: list[Located], selector: StatementSelector | ReplaceSelector, where: str
) -> Located:
    if not found:
        raise AnchorProblem(f"{selector.describe()} is not in {where}")
    if selector.which == "first":
        return found[0]
    if selector.which == "last":
        return found[-1]
    if len(found) > 1:
        raise AnchorProblem(
            f"{selector.describe()} matches {len(found)} statements in {where}",
            [f"line {first_line(loc.stmt)}" for loc in found],
        )
    return found[0]


def _statement_candidates(scope: Scope, selector: StatementSelector | ReplaceSelector) -> list[str]:
    """Nearby alternatives to show when a statement anchor finds nothing."""
    seen: list[str] = []
    if selector.calls is not None:
        pool = [n for loc in iter_statements(scope.node) for n in statement_calls(loc.stmt)]
        target = selector.calls
    elif selector.assigns is not None:
        pool = [n for loc in iter_statements(scope.node) for n in statement_assigns(loc.stmt)]
        target = selector.assigns
    elif selector.defines is not None:
        pool = [
            loc.stmt.name
            for loc in iter_statements(scope.node)
            if isinstance(loc.stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        ]
        target = selector.defines
    else:
        return []
    tails = {p: p.rsplit(".", 1)[-1] for p in pool}
    for name in difflib.get_close_matches(
        target.rsplit(".", 1)[-1], list(tails.values()), n=5, cutoff=0.6
    ):
        for full, tail in tails.items():
            if tail == name and full not in seen:
                seen.append(full)
    return seen[:5]


def select_statement(scope: Scope, selector: StatementSelector | ReplaceSelector) -> Located:
    """The statement of `scope` that `selector` chooses.

    Raises:
        AnchorProblem: nothing matches (nearest names offered) or several do and `which` is
            `only` (all listed).
    """
    found = matching_statements(scope, selector)
    try:
        return _pick(found, selector, f"`{scope.qualname}`")
    except AnchorProblem as problem:
        if not found:
            near = _statement_candidates(scope, selector)
            raise AnchorProblem(problem.message, [f"nearest: {n}" for n in near]) from None
        raise


def matching_statements(
    scope: Scope, selector: StatementSelector | ReplaceSelector
) -> list[Located]:
    """Every statement of `scope` the selector's criterion matches (ignoring `which`)."""
    found: list[Located] = []
    wanted_dump = statement_dumps(selector.matches)[0] if selector.matches is not None else None
    for loc in iter_statements(scope.node):
        stmt = loc.stmt
        if selector.calls is not None:
            hit = any(call_matches(n, selector.calls) for n in statement_calls(stmt))
        elif selector.assigns is not None:
            hit = selector.assigns in statement_assigns(stmt)
        elif selector.defines is not None:
            hit = isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and (
                stmt.name == selector.defines
            )
        else:
            hit = wanted_dump is not None and dump_matches(stmt, wanted_dump)
        if hit:
            found.append(loc)
    return found


def select_statements(scope: Scope, selector: ReplaceSelector) -> list[Located]:
    """The statements a replace selector chooses: every match for `which = "all"`, else the
    one `select_statement` chooses.

    Raises:
        AnchorProblem: as `select_statement`; for `all`, when nothing matches.
    """
    if selector.which != "all":
        return [select_statement(scope, selector)]
    found = matching_statements(scope, selector)
    if not found:
        near = _statement_candidates(scope, selector)
        raise AnchorProblem(
            f"{selector.describe()}: none is in `{scope.qualname}`",
            [f"nearest: {n}" for n in near],
        )
    return found


@dataclass(frozen=True)
class LocatedExpression:
    expr: ast.expr
    stmt: ast.stmt


def select_expression(scope: Scope, selector: ReplaceSelector) -> LocatedExpression:
    """The expression of `scope` that `selector` chooses (`expression`, or a selector below the
    statement: `calls` + `keyword`, `with_item`, `test_of`).

    Raises:
        AnchorProblem: no such expression (the places considered listed), or several and
            `which` is `only` (all listed).
    """
    ordered = selected_expressions(scope, selector)
    where = f"`{scope.qualname}`"
    if not ordered:
        raise AnchorProblem(
            f"{selector.describe()} is not in {where}", _expression_candidates(scope, selector)
        )
    if selector.which == "first":
        return ordered[0]
    if selector.which == "last":
        return ordered[-1]
    if len(ordered) > 1:
        raise AnchorProblem(
            f"{selector.describe()} matches {len(ordered)} places in {where}",
            [_place(i) for i in ordered],
        )
    return ordered[0]


def select_expressions(scope: Scope, selector: ReplaceSelector) -> list[LocatedExpression]:
    """The expressions a replace selector chooses: every match for `which = "all"`, else the
    one `select_expression` chooses.

    Raises:
        AnchorProblem: as `select_expression`; for `all`, when nothing matches.
    """
    if selector.which != "all":
        return [select_expression(scope, selector)]
    ordered = selected_expressions(scope, selector)
    if not ordered:
        raise AnchorProblem(
            f"{selector.describe()}: none is in `{scope.qualname}`",
            _expression_candidates(scope, selector),
        )
    return ordered


def _place(found: LocatedExpression) -> str:
    return f"line {found.expr.lineno}, column {found.expr.col_offset + 1}"


def selected_expressions(scope: Scope, selector: ReplaceSelector) -> list[LocatedExpression]:
    """Every expression the selector's criterion matches (ignoring `which`), in source order."""
    if selector.expression is not None:
        return matching_expressions(scope, selector.expression)
    return [found for found in slot_expressions(scope, selector) if _slot_matches(selector, found)]


def replaced_expressions(
    scope: Scope, selector: ReplaceSelector, code: str
) -> list[LocatedExpression]:
    """Where an expression replace's new `code` stands: for `expression`, anywhere in the scope;
    for a selector below the statement, in the kind of place it selects (a `pool=` value of that
    call, a `with` item, an `if` test)."""
    if selector.expression is not None:
        return matching_expressions(scope, code)
    wanted = strip_positions(parse_python(code.strip(), mode="eval").body)
    return [
        found for found in slot_expressions(scope, selector) if dump_matches(found.expr, wanted)
    ]


def slot_expressions(scope: Scope, selector: ReplaceSelector) -> list[LocatedExpression]:
    """Every expression in the kind of place a selector below the statement chooses from,
    whatever it holds: the values of `keyword=` in calls of `calls`, the context expressions of
    `with` items, the tests of `if` (`elif`) or `while` statements."""
    found: list[LocatedExpression] = []
    for loc in iter_statements(scope.node):
        stmt = loc.stmt
        if selector.keyword is not None:
            assert selector.calls is not None
            for root in _header_expressions(stmt):
                for sub in ast.walk(root):
                    if isinstance(sub, ast.Call) and call_matches(
                        dotted_name(sub.func) or "<call>", selector.calls
                    ):
                        found += [
                            LocatedExpression(k.value, stmt)
                            for k in sub.keywords
                            if k.arg == selector.keyword
                        ]
        elif selector.with_item is not None:
            if isinstance(stmt, ast.With | ast.AsyncWith):
                found += [LocatedExpression(item.context_expr, stmt) for item in stmt.items]
        elif selector.test_of is not None:
            kind = ast.If if selector.test_of == "if" else ast.While
            if isinstance(stmt, kind):
                found.append(LocatedExpression(stmt.test, stmt))
    return sorted(found, key=lambda i: (i.expr.lineno, i.expr.col_offset))


def _slot_matches(selector: ReplaceSelector, found: LocatedExpression) -> bool:
    expr = found.expr
    if selector.with_item is not None:
        wanted = selector.with_item.strip()
        if isinstance(expr, ast.Call) and call_matches(dotted_name(expr.func) or "", wanted):
            return True
        return dump_matches(expr, strip_positions(parse_python(wanted, mode="eval").body))
    if selector.containing is not None:
        wanted = strip_positions(parse_python(selector.containing.strip(), mode="eval").body)
        return any(dump_matches(sub, wanted) for sub in ast.walk(expr))
    return True


def _expression_candidates(scope: Scope, selector: ReplaceSelector) -> list[str]:
    """The places a selector below the statement considered, when none fits (at most 8)."""
    if selector.expression is not None:
        return []
    places = [
        f"{_place(found)}: `{ast.unparse(found.expr)}`"
        for found in slot_expressions(scope, selector)
    ]
    if not places and selector.keyword is not None:
        assert selector.calls is not None
        near = _statement_candidates(scope, selector)
        places = [f"nearest call: {n}" for n in near]
    return places[:8]


def matching_expressions(scope: Scope, code: str) -> list[LocatedExpression]:
    """Every expression of `scope` whose syntax tree equals `code`, in source order."""
    wanted = strip_positions(parse_python(code.strip(), mode="eval").body)
    unique: dict[tuple[int, int], LocatedExpression] = {}
    for loc in iter_statements(scope.node):
        for expr_root in _header_expressions(loc.stmt):
            for sub in ast.walk(expr_root):
                if isinstance(sub, ast.expr) and dump_matches(sub, wanted):
                    unique.setdefault(
                        (sub.lineno, sub.col_offset), LocatedExpression(sub, loc.stmt)
                    )
    return sorted(unique.values(), key=lambda i: (i.expr.lineno, i.expr.col_offset))


def span(node: ast.AST) -> tuple[int, int, int, int]:
    """(line, col, end line, end col) of a node, for containment tests."""
    return (
        node.lineno,  # type: ignore[attr-defined]
        node.col_offset,  # type: ignore[attr-defined]
        node.end_lineno or node.lineno,  # type: ignore[attr-defined]
        node.end_col_offset or 0,  # type: ignore[attr-defined]
    )


def contains(outer: ast.AST, inner: ast.AST) -> bool:
    a = span(outer)
    b = span(inner)
    return (a[0], a[1]) <= (b[0], b[1]) and (b[2], b[3]) <= (a[2], a[3])


@dataclass(frozen=True)
class StatementRun:
    """Consecutive statements `block[start:start + length]` of one block."""

    block: list[ast.stmt]
    start: int
    length: int

    @property
    def statements(self) -> list[ast.stmt]:
        return self.block[self.start : self.start + self.length]


def find_statement_runs(scope: Scope, dumps: Sequence[str]) -> list[StatementRun]:
    """Every run of consecutive statements in a block of `scope` equal to `dumps`, outermost
    block first.

    This is how an edit is recognised as already applied: by its syntax tree, so removing the
    marker comment or reformatting does not hide it.
    """
    n = len(dumps)
    runs: list[StatementRun] = []
    for block in scope_blocks(scope.node):
        for i in range(len(block) - n + 1):
            if all(dump_matches(s, d) for s, d in zip(block[i : i + n], dumps, strict=True)):
                runs.append(StatementRun(block, i, n))
    return runs


def find_statement_run(scope: Scope, dumps: Sequence[str]) -> list[ast.stmt] | None:
    """The first run of consecutive statements of `scope` equal to `dumps`, if present."""
    runs = find_statement_runs(scope, dumps)
    return runs[0].statements if runs else None
