"""Where a module's source reads a name while it is imported (pure): the values a live fix of that
name would not reach, because something built at import time holds the old one."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from typing import Any

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def import_time_uses(tree: ast.Module, names: set[str], retaken: set[str]) -> list[dict[str, Any]]:
    """Every import-time read of one of `names` in `tree`, outside the values of `retaken`
    (definitions the fix evaluates again), in source order: `{"name": dotted, "line": n,
    "where": "the defaults of f"}`."""
    return sorted(_body(tree.body, "", names, retaken), key=lambda use: use["line"])


def _body(
    body: list[ast.stmt], prefix: str, names: set[str], retaken: set[str]
) -> Iterator[dict[str, Any]]:
    where_body = f"class {prefix.rstrip('.')}'s body" if prefix else "the module's top level"
    for statement in body:
        if isinstance(statement, _FUNCTIONS):
            qualname = prefix + statement.name
            args = statement.args
            yield from _reads(
                statement.decorator_list, prefix, names, f"the decorators of {qualname}"
            )
            yield from _reads(
                [*args.defaults, *[d for d in args.kw_defaults if d is not None]],
                prefix,
                names,
                f"the defaults of {qualname}",
            )
        elif isinstance(statement, ast.ClassDef):
            qualname = prefix + statement.name
            outside = [*statement.decorator_list, *statement.bases]
            outside += [keyword.value for keyword in statement.keywords]
            yield from _reads(outside, prefix, names, f"the definition of class {qualname}")
            yield from _body(statement.body, qualname + ".", names, retaken)
        elif _assigned(statement, prefix) & retaken:
            continue  # its value is evaluated again by the fix
        elif isinstance(statement, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Expr)):
            value = statement.value
            yield from _reads([value] if value is not None else [], prefix, names, where_body)
        else:  # an if, a for, a with, a try: its expressions run here, its blocks are this body
            blocks = [getattr(statement, field, None) or [] for field in _BLOCKS]
            handlers = getattr(statement, "handlers", None) or []
            blocks += [handler.body for handler in handlers]
            nested = {id(node) for block in blocks for node in block}
            own = [
                node
                for node in ast.iter_child_nodes(statement)
                if id(node) not in nested and not isinstance(node, ast.ExceptHandler)
            ]
            yield from _reads(own, prefix, names, where_body)
            for block in blocks:
                yield from _body(block, prefix, names, retaken)


_BLOCKS = ("body", "orelse", "finalbody")


def _assigned(statement: ast.stmt, prefix: str) -> set[str]:
    """The dotted names a plain assignment binds in this body."""
    if isinstance(statement, ast.Assign):
        targets = statement.targets
    elif isinstance(statement, ast.AnnAssign):
        targets = [statement.target]
    else:
        return set()
    return {prefix + t.id for t in targets if isinstance(t, ast.Name)}


def _reads(nodes: list[Any], prefix: str, names: set[str], where: str) -> Iterator[dict[str, Any]]:
    """Reads of `names` in expressions evaluated here (lambda bodies left out: they run later)."""
    for node in nodes:
        for found in _walk(node):
            dotted = _dotted(found)
            if dotted is None:
                continue
            for candidate in (
                (dotted, prefix + dotted) if isinstance(found, ast.Name) else (dotted,)
            ):
                if candidate in names:
                    yield {"name": candidate, "line": getattr(found, "lineno", 0), "where": where}
                    break


def _walk(node: ast.AST) -> Iterator[ast.AST]:
    yield node
    if isinstance(node, ast.Lambda):
        args = node.args
        children: list[ast.AST] = [*args.defaults, *[d for d in args.kw_defaults if d]]
    else:
        children = list(ast.iter_child_nodes(node))
    for child in children:
        yield from _walk(child)


def _dotted(node: ast.AST) -> str | None:
    """`a.b.c` for a read of a name or an attribute chain on a name, else None."""
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
        inner = _dotted(node.value)
        return None if inner is None else f"{inner}.{node.attr}"
    return None
