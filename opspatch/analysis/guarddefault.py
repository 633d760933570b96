"""The default a guard patch gives an attribute, and the evidence it follows."""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass

from opspatch.analysis.classgraph import ClassGraph, ClassInfo, FunctionNode, self_name
from opspatch.core.syntax import parse_python

ZERO_OF = {"int": "0", "float": "0.0", "bool": "False", "str": '""', "bytes": 'b""'}


@dataclass(frozen=True)
class GuardDefault:
    """The class-level default a guard gives an attribute, and the evidence it follows."""

    value: str  # Python expression
    annotation: str | None  # as it will be written (quoted where it would otherwise be evaluated)
    reason: str

    def code(self, attribute: str) -> str:
        return (
            f"{attribute}: {self.annotation} = {self.value}"
            if self.annotation
            else f"{attribute} = {self.value}"
        )


def _annotation_default(annotation: ast.expr) -> tuple[str, bool]:
    """(default value, whether the annotation already admits None) for an annotation."""
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:
            annotation = parse_python(annotation.value, mode="eval").body
        except SyntaxError:
            return "None", False
    text = ast.unparse(annotation)
    if text in ZERO_OF:
        return ZERO_OF[text], False
    if text == "None" or re.match(r"^(typing\.)?Optional\[", text):
        return "None", True
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        members = [ast.unparse(n) for n in ast.walk(annotation) if not isinstance(n, ast.BinOp)]
        return "None", "None" in members
    return "None", False


def _literal_type(value: ast.expr | None) -> str | None:
    if isinstance(value, ast.UnaryOp) and isinstance(value.op, (ast.USub, ast.UAdd)):
        value = value.operand
    if not isinstance(value, ast.Constant):
        return None
    if isinstance(value.value, bool):
        return "bool"
    for kind in (int, float, str, bytes):
        if isinstance(value.value, kind):
            return kind.__name__
    return "None" if value.value is None else None


def _usage_type(func: FunctionNode, self_var: str, attribute: str) -> tuple[str, int] | None:
    """An int/float type suggested by how a method uses the attribute: compared with or combined
    with a numeric literal, or passed to `range()`; directly or through a local bound to it."""
    aliases = {
        t.id
        for node in ast.walk(func)
        if isinstance(node, ast.Assign) and _is_self_attr(node.value, self_var, attribute)
        for t in node.targets
        if isinstance(t, ast.Name)
    }

    def refers(node: ast.expr) -> bool:
        return _is_self_attr(node, self_var, attribute) or (
            isinstance(node, ast.Name) and node.id in aliases
        )

    for node in ast.walk(func):
        pairs: list[tuple[ast.expr, ast.expr]] = []
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            pairs = list(zip(operands, operands[1:], strict=False))
        elif isinstance(node, ast.BinOp):
            pairs = [(node.left, node.right)]
        elif (
            isinstance(node, ast.Call)
            and ast.unparse(node.func) == "range"
            and any(refers(a) for a in node.args)
        ):
            return "int", node.lineno
        for left, right in pairs:
            for mine, other in ((left, right), (right, left)):
                kind = _literal_type(other)
                if refers(mine) and kind in ("int", "float"):
                    return kind, int(getattr(node, "lineno", 0))
    return None


def _is_self_attr(node: ast.expr | None, self_var: str, attribute: str) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == attribute
        and isinstance(node.value, ast.Name)
        and node.value.id == self_var
    )


def _future_annotations(graph: ClassGraph, cls: ClassInfo) -> bool:
    return any(
        isinstance(s, ast.ImportFrom)
        and s.module == "__future__"
        and any(a.name == "annotations" for a in s.names)
        for s in graph.trees[cls.path].body
    )


def infer_default(graph: ClassGraph, cls: ClassInfo, attribute: str) -> GuardDefault:
    """The default a guard gives `attribute`, from the strongest evidence found:

    1. an annotation (`self.x: T = ...` in a method of the class or a known base, or a bare
       class-level `x: T`): `0`, `0.0`, `False`, `""`, `b""` for int/float/bool/str/bytes, else
       `None` (the annotation is widened to `T | None` when it does not admit None);
    2. a literal assigned in `__init__`: the zero of its type (0 for an int-looking literal);
    3. usage in the class's methods: compared with, or combined with, an int or float literal,
       or passed to `range()`: 0 or 0.0;
    4. otherwise `None`.

    Annotations are written quoted unless the module has `from __future__ import annotations`
    (builtin scalar types excepted), so a class body never evaluates a name that exists only for
    type checkers.
    """
    future = _future_annotations(graph, cls)
    for owner in graph.mro(cls):
        for stmt in owner.node.body:
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and stmt.target.id == attribute
            ):
                return _from_annotation(stmt.annotation, f"{owner.name} line {stmt.lineno}", future)
        for name, method in graph.methods(owner).items():
            self_var = self_name(method)
            for node in ast.walk(method):
                if (
                    isinstance(node, ast.AnnAssign)
                    and self_var is not None
                    and _is_self_attr(node.target, self_var, attribute)
                ):
                    where = f"{owner.name}.{name} line {node.lineno}"
                    return _from_annotation(node.annotation, where, future)
    init = graph.methods(cls).get("__init__")
    self_var = self_name(init) if init is not None else None
    if init is not None and self_var is not None:
        for node in ast.walk(init):
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and any(
                _is_self_attr(t, self_var, attribute)
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
            ):
                kind = _literal_type(node.value)
                if kind is not None:
                    value = "None" if kind == "None" else ZERO_OF[kind]
                    annotation = None if kind == "None" else kind
                    literal = ast.unparse(node.value) if node.value is not None else "None"
                    reason = f"assigned the literal {literal} at line {node.lineno}"
                    return GuardDefault(value, annotation, reason + f": the zero of {kind}")
    for owner in [*graph.mro(cls), *graph.subclasses(cls)]:
        for name, method in graph.methods(owner).items():
            method_self = self_name(method)
            if method_self is None:
                continue
            found = _usage_type(method, method_self, attribute)
            if found is not None:
                kind, line = found
                return GuardDefault(
                    ZERO_OF[kind],
                    kind,
                    f"used as {'an' if kind == 'int' else 'a'} {kind} in {owner.name}.{name} "
                    f"(line {line}): 0 means off",
                )
    return GuardDefault("None", None, "no type evidence: None")


def _from_annotation(annotation: ast.expr, where: str, future: bool) -> GuardDefault:
    value, admits_none = _annotation_default(annotation)
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        text = annotation.value
    else:
        text = ast.unparse(annotation)
    if value == "None" and not admits_none:
        text = f"{text} | None"
    if not future and text not in ZERO_OF:
        text = json.dumps(text)
    return GuardDefault(value, text, f"annotated `{ast.unparse(annotation)}` at {where}")
