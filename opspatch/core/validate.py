"""Validate a patched text before anyone writes it anywhere."""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Sequence

from opspatch.core.anchors import (
    AnchorProblem,
    call_matches,
    calls_in,
    first_line,
    iter_definitions,
    last_line,
    resolve_scope,
    same_code,
    statement_assigns,
)
from opspatch.core.source import LineIndex
from opspatch.core.spec import (
    MODULE_SCOPE,
    AssignedBeforeCalls,
    ClassAttribute,
    PatchSpec,
)
from opspatch.core.syntax import MAX_AST_DEPTH, compile_parsed, parse_python, warnings_ignored


def check_compiles(
    new_source: bytes,
    filename: str,
    feature_version: tuple[int, int] | None,
    tree: ast.Module | None = None,
    *,
    tree_for_version: bool = False,
) -> list[str]:
    """Problems compiling `new_source` (and parsing it for an older Python, if named).

    `tree`, when the caller has it, is `parse_python` of the same text: it is compiled instead of
    the text (the same errors, without parsing the text again; issue 44). `tree_for_version`:
    it was parsed with `feature_version`, so the text parses for that Python (not parsed again).
    Thread-safe: the warning filters are changed under `warnings_ignored`'s lock.
    """
    problems = []
    with warnings_ignored():  # SyntaxWarnings of upstream code are not ours to judge
        try:
            if tree is None:
                compile(new_source, filename, "exec", dont_inherit=True)
            else:
                compile_parsed(tree, filename)
        except SyntaxError as exc:
            problems.append(f"does not compile: {exc.msg} (line {exc.lineno})")
        except ValueError as exc:  # e.g. null bytes
            problems.append(f"does not compile: {exc}")
        except (RecursionError, MemoryError):
            problems.append("does not compile: nested too deeply for Python's compiler")
        if feature_version is not None and not problems and not tree_for_version:
            try:
                # a `tree` given was checked for depth when it was parsed
                depth = None if tree is not None else MAX_AST_DEPTH
                parse_python(new_source, filename, feature_version=feature_version, max_depth=depth)
            except SyntaxError as exc:
                problems.append(
                    f"does not parse as Python {feature_version[0]}.{feature_version[1]}: "
                    f"{exc.msg} (line {exc.lineno})"
                )
    return problems


def _ignored(name: str, ignored: str) -> bool:
    # `super().__init__()` is two calls: `super()` and `super().__init__`; ignoring the second
    # ignores the first, which only exists to make it.
    return call_matches(name, ignored) or ignored.startswith(name + "().")


def check_assigned_before_calls(tree: ast.Module, condition: AssignedBeforeCalls) -> list[str]:
    """`condition.attribute` is assigned in the scope's own body before any statement that calls
    out (calls listed in `ignore_calls` excepted), by a statement that makes no call itself."""
    try:
        scope = resolve_scope(tree, condition.scope)
    except AnchorProblem as problem:
        return [f"postcondition assigned-before-calls: {problem.message}"]
    for stmt in scope.node.body:
        calls = [
            name
            for name in calls_in(stmt)
            if not any(_ignored(name, ignored) for ignored in condition.ignore_calls)
        ]
        if condition.attribute in statement_assigns(stmt) and not calls:
            return []
        if calls:
            return [
                f"postcondition: `{condition.attribute}` is not assigned in `{condition.scope}` before "
                f"line {first_line(stmt)}, which calls `{calls[0]}` (a call that can fail part-way)"
            ]
    return [
        f"postcondition: `{condition.attribute}` is never assigned in `{condition.scope}`'s body"
    ]


def check_class_attribute(tree: ast.Module, condition: ClassAttribute) -> list[str]:
    """Class `condition.class_` assigns `condition.name` a value at class level."""
    try:
        scope = resolve_scope(tree, condition.class_)
    except AnchorProblem as problem:
        return [f"postcondition class-attribute: {problem.message}"]
    if not isinstance(scope.node, ast.ClassDef):
        return [f"postcondition class-attribute: `{condition.class_}` is not a class"]
    for stmt in scope.node.body:
        if isinstance(stmt, ast.AnnAssign) and stmt.value is None:
            continue
        if condition.name in statement_assigns(stmt) and not isinstance(stmt, ast.AugAssign):
            return []
    return [
        f"postcondition: class `{condition.class_}` has no class-level value for `{condition.name}`"
    ]


def check_postconditions(tree: ast.Module, patch: PatchSpec) -> list[str]:
    problems: list[str] = []
    for condition in patch.postconditions:
        if isinstance(condition, AssignedBeforeCalls):
            problems += check_assigned_before_calls(tree, condition)
        else:
            problems += check_class_attribute(tree, condition)
    return problems


def _definitions(tree: ast.Module) -> dict[str, list[ast.AST]]:
    found: dict[str, list[ast.AST]] = defaultdict(list)
    for qualname, node in iter_definitions(tree):
        found[qualname].append(node)
    return found


class _Unchanged:
    """Whether a definition is the same code in both trees.

    With both texts, a definition whose lines are the same text in both files is the same code
    (it starts a logical line in both, so the same tokens make the same tree): one string
    comparison instead of a walk of both trees, for the many definitions a patch does not touch.
    The others are compared node by node (`same_code`)."""

    def __init__(self, old_text: str | None, new_text: str | None) -> None:
        self.texts = (
            (LineIndex.of(old_text), LineIndex.of(new_text))
            if old_text is not None and new_text is not None
            else None
        )

    def __call__(self, old: ast.AST, new: ast.AST, *, stub_nested: bool = False) -> bool:
        if self.texts is not None and isinstance(old, ast.stmt) and isinstance(new, ast.stmt):
            old_index, new_index = self.texts
            old_span = old_index.text[
                old_index.line_start(first_line(old)) : old_index.line_end(last_line(old))
            ]
            new_span = new_index.text[
                new_index.line_start(first_line(new)) : new_index.line_end(last_line(new))
            ]
            if old_span == new_span:
                return True
        return same_code(old, new, stub_nested=stub_nested)


def check_untouched(
    old_tree: ast.Module,
    new_tree: ast.Module,
    edited_scopes: Sequence[str],
    *,
    old_text: str | None = None,
    new_text: str | None = None,
) -> list[str]:
    """Problems where the new tree differs from the old outside the edited scopes.

    `old_text` and `new_text`, the texts the trees were parsed from, let definitions whose text
    is unchanged be recognised without walking their trees.
    """
    unchanged = _Unchanged(old_text, new_text)
    edited = set(edited_scopes)
    enclosing = {MODULE_SCOPE}
    for scope in edited:
        parts = scope.split(".") if scope != MODULE_SCOPE else []
        enclosing.update(".".join(parts[:k]) for k in range(1, len(parts)))
    problems = []
    if MODULE_SCOPE not in edited and not same_code(old_tree, new_tree, stub_nested=True):
        problems.append("module-level code outside the edited scopes changed")
    old_defs = _definitions(old_tree)
    new_defs = _definitions(new_tree)
    for qualname, old_nodes in old_defs.items():
        if qualname in edited or any(
            qualname.startswith(e + ".") for e in edited if e != MODULE_SCOPE
        ):
            continue  # an edited scope, or inside one: checked through the scope's own rules
        new_nodes = new_defs.get(qualname, [])
        if len(new_nodes) != len(old_nodes):
            problems.append(
                f"`{qualname}` is defined {len(new_nodes)} time(s) instead of {len(old_nodes)}"
            )
            continue
        stub_nested = qualname in enclosing
        for old, new in zip(old_nodes, new_nodes, strict=False):
            if not unchanged(old, new, stub_nested=stub_nested):
                problems.append(f"`{qualname}` changed, but the patch does not edit it")
                break
    # definitions nested inside an edited scope must survive unchanged unless edited themselves
    for scope in edited:
        prefix = "" if scope == MODULE_SCOPE else scope + "."
        for qualname, old_nodes in old_defs.items():
            if not qualname.startswith(prefix) or qualname in edited or qualname in enclosing:
                continue
            if any(
                qualname.startswith(e + ".") for e in edited if e != scope and e != MODULE_SCOPE
            ):
                continue
            new_nodes = new_defs.get(qualname, [])
            if len(new_nodes) != len(old_nodes) or not all(
                unchanged(old, new) for old, new in zip(old_nodes, new_nodes, strict=True)
            ):
                problems.append(f"`{qualname}` changed, but the patch does not edit it")
    return sorted(set(problems))


def validate_result(
    *,
    old_text: str,
    new_text: str,
    new_source: bytes,
    patch: PatchSpec,
    edited_scopes: Sequence[str],
    filename: str,
    check_compile: bool = True,
    old_tree: ast.Module | None = None,
    new_tree: ast.Module | None = None,
    new_tree_for_min_python: bool = False,
) -> list[str]:
    """Every problem with a patched text; empty when it may be written.

    `old_tree` and `new_tree`, when the caller has them, are `parse_python(old_text)` and
    `parse_python(new_text)`: passing them saves parsing a text again; `new_tree_for_min_python`
    says `new_tree` was parsed for the patch's `min_python` (`check_compiles`).
    """
    problems = []
    if check_compile:
        problems += check_compiles(
            new_source,
            filename,
            patch.target.feature_version,
            new_tree,
            tree_for_version=new_tree is not None and new_tree_for_min_python,
        )
        if problems:
            return problems
    if new_tree is None:
        new_tree = parse_python(new_text)
    problems += check_postconditions(new_tree, patch)
    if old_text is not new_text:
        if old_tree is None:
            old_tree = parse_python(old_text)
        problems += check_untouched(
            old_tree, new_tree, edited_scopes, old_text=old_text, new_text=new_text
        )
    return problems
