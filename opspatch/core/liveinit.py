"""Which changed methods run only while an object is built (pure): a live fix of one reaches only
the objects built after it, never the ones the running server already built (the Scheduler, the
model worker: built once, at start)."""

from __future__ import annotations

import ast

ROOTS = frozenset({"__init__", "__new__", "__post_init__"})
"""The methods that run while an object is built."""

_Function = ast.FunctionDef | ast.AsyncFunctionDef


def construction_only(pre: ast.Module, post: ast.Module, dotted: str) -> bool:
    """Whether method `dotted` (`Class.method`, nested classes dotted too) runs only while an
    object is built, by its class in `pre`, and its change from `pre` to `post` is not one that
    reaches objects already built (the module's docstring)."""
    owner, _, name = dotted.rpartition(".")
    before, after = _class(pre, owner), _class(post, owner)
    if before is None or after is None or name not in _construction(before):
        return False
    if name == "__init__":
        was, now = _methods(before).get(name), _methods(after).get(name)
        if was is not None and now is not None and _guard_defaults_only(was, now, after):
            return False
    return True


def _class(tree: ast.Module, dotted: str) -> ast.ClassDef | None:
    body: list[ast.stmt] = tree.body
    found: ast.ClassDef | None = None
    for part in dotted.split("."):
        found = next((s for s in body if isinstance(s, ast.ClassDef) and s.name == part), None)
        if found is None:
            return None
        body = found.body
    return found


def _methods(cls: ast.ClassDef) -> dict[str, _Function]:
    return {s.name: s for s in cls.body if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef)}


def _construction(cls: ast.ClassDef) -> set[str]:
    """The class's methods that run only while an object is built (the module's docstring)."""
    methods = _methods(cls)
    callers: dict[str, set[str]] = {name: set() for name in methods}
    for caller, function in methods.items():
        first = function.args.args[0].arg if function.args.args else None
        for node in ast.walk(function):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in (first, "cls", "self")
                and node.func.attr in callers
            ):
                callers[node.func.attr].add(caller)
    found = set(ROOTS & set(methods))
    grown = True
    while grown:
        grown = False
        for name, by in callers.items():
            if name not in found and by and by <= found:
                found.add(name)
                grown = True
    return found


def _guard_defaults_only(was: _Function, now: _Function, cls: ast.ClassDef) -> bool:
    """Whether `now` is `was` with only early `self.x = <literal>` assignments added, each
    before anything else sets `self.x` and equal to the class's own default of `x`."""
    old = [ast.dump(s) for s in was.body]
    kept, added = 0, []
    for index, statement in enumerate(now.body):
        if kept < len(old) and ast.dump(statement) == old[kept]:
            kept += 1
        else:
            added.append(index)
    if kept != len(old) or not added or not now.args.args:
        return False
    me = now.args.args[0].arg
    defaults = _class_defaults(cls)
    for index in added:
        statement = now.body[index]
        if not (
            isinstance(statement, ast.Assign)
            and len(statement.targets) == 1
            and isinstance(target := statement.targets[0], ast.Attribute)
            and isinstance(target.value, ast.Name)
            and target.value.id == me
            and _literal(statement.value)
            and defaults.get(target.attr) == ast.dump(statement.value)
        ):
            return False
        if any(_sets(earlier, me, target.attr) for earlier in now.body[:index]):
            return False
    return True


def _class_defaults(cls: ast.ClassDef) -> dict[str, str]:
    """The class body's plain assignments of a name to a literal, as dumps."""
    found: dict[str, str] = {}
    for statement in cls.body:
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target, value = statement.targets[0], statement.value
        elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
            target, value = statement.target, statement.value
        else:
            continue
        if isinstance(target, ast.Name) and _literal(value):
            found[target.id] = ast.dump(value)
    return found


def _literal(node: ast.expr) -> bool:
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def _sets(statement: ast.stmt, me: str, attribute: str) -> bool:
    """Whether `statement` assigns `<me>.<attribute>` anywhere in it."""
    return any(
        isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Store)
        and node.attr == attribute
        and isinstance(node.value, ast.Name)
        and node.value.id == me
        for node in ast.walk(statement)
    )
