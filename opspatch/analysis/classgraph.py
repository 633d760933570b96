"""The classes of a few source files, related: bases, subclasses, `__init__` chains, attributes."""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from opspatch.core.anchors import call_matches, dotted_name, first_line, iter_definitions
from opspatch.core.codec import Record
from opspatch.core.syntax import parse_python
from opspatch.errors import InputError

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef
# Calls that never count as "can raise part-way" unless the caller says otherwise: the base-class
# initializer runs before the object holds anything of its own (the patch postcondition
# `assigned-before-calls` ignores it for the same reason).
DEFAULT_IGNORED_CALLS: tuple[str, ...] = ("super().__init__",)
_MAX_TEXT = 120


@dataclass(frozen=True)
class ClassInfo:
    """One class definition: its name, where it is, and its syntax tree."""

    name: str
    qualname: str
    path: str
    node: ast.ClassDef

    @property
    def line(self) -> int:
        return first_line(self.node)

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass(frozen=True)
class Statement(Record):
    """A statement as reports show it: its lines, a one-line text, and the calls it makes."""

    line: int
    end_line: int
    text: str
    calls: tuple[str, ...]

    def render(self) -> str:
        return f"line {self.line}: {self.text}"


def statement_text(stmt: ast.stmt) -> str:
    """The statement on one line (unparsed, so a call split over lines reads whole), shortened."""
    if isinstance(stmt, (ast.If, ast.While, ast.For, ast.AsyncFor, ast.With, ast.AsyncWith)):
        header = ast.unparse(stmt).splitlines()[0]
        text = header + " ..."
    elif isinstance(stmt, ast.Try):
        text = "try: ..."
    else:
        text = " ".join(ast.unparse(stmt).split())
    return text if len(text) <= _MAX_TEXT else text[: _MAX_TEXT - 3] + "..."


def calls_when_run(node: ast.AST) -> list[ast.Call]:
    """Calls `node` makes when it runs, in source order. A nested function or lambda body runs
    later, not now (its decorators and defaults do run now); `node` itself is always entered."""
    found: list[ast.Call] = []
    stack: list[ast.AST] = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, ast.Call):
            found.append(current)
        for child in ast.iter_child_nodes(current):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                if not isinstance(child, ast.Lambda):
                    stack.extend(child.decorator_list)
                stack.extend(child.args.defaults)
                stack.extend(d for d in child.args.kw_defaults if d is not None)
            else:
                stack.append(child)
    return sorted(found, key=lambda call: (call.lineno, call.col_offset))


def _ignored(name: str, ignored: Sequence[str]) -> bool:
    # `super().__init__()` is two calls, `super()` and `super().__init__`: ignoring the second
    # ignores the first, which only exists to make it.
    return any(call_matches(name, wanted) or wanted.startswith(name + "().") for wanted in ignored)


def calls_made(node: ast.AST, ignored: Sequence[str] = ()) -> tuple[str, ...]:
    """Dotted names of the calls `node` makes when it runs (`<call>` for computed callables)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        # a `def` statement runs its decorators and defaults, not its body
        runs_now = [*node.decorator_list, *node.args.defaults]
        runs_now += [d for d in node.args.kw_defaults if d is not None]
        calls = [c for part in runs_now for c in calls_when_run(part)]
    else:
        calls = calls_when_run(node)
    names = (dotted_name(call.func) or "<call>" for call in calls)
    return tuple(name for name in names if not _ignored(name, ignored))


def describe_statement(stmt: ast.stmt, ignored: Sequence[str] = ()) -> Statement:
    return Statement(
        line=first_line(stmt),
        end_line=stmt.end_lineno or stmt.lineno,
        text=statement_text(stmt),
        calls=calls_made(stmt, ignored),
    )


def self_name(func: FunctionNode) -> str | None:
    """The name a method calls its instance (`self`), or None for a method without one."""
    positional = [*func.args.posonlyargs, *func.args.args]
    for decorator in func.decorator_list:
        if dotted_name(decorator) in ("staticmethod", "classmethod"):
            return None
    return positional[0].arg if positional else None


def assigned_attributes(stmt: ast.AST, self_var: str) -> list[str]:
    """Instance attributes a statement (and its nested blocks) assigns: `self.x = ...`,
    `self.x: T = ...`, `self.a, self.b = ...`, `self.x += ...`, `with ... as self.x`, `for self.x`."""
    names: list[str] = []
    for node in ast.walk(stmt):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id == self_var
        ):
            names.append(node.attr)
    return names


def statement_assigned_attributes(stmt: ast.stmt, self_var: str) -> list[str]:
    """Attributes one statement assigns itself (not the statements nested in it): assignment
    targets, a `for` target, `with ... as self.x`."""
    if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        return assigned_attributes(stmt, self_var)
    if isinstance(stmt, (ast.For, ast.AsyncFor)):
        return assigned_attributes(stmt.target, self_var)
    if isinstance(stmt, (ast.With, ast.AsyncWith)):
        return [
            n
            for item in stmt.items
            if item.optional_vars is not None
            for n in assigned_attributes(item.optional_vars, self_var)
        ]
    return []


def statements_run(stmt: ast.stmt) -> list[ast.stmt]:
    """`stmt` and the statements nested in its blocks, in source order; a nested function's or
    class's body is not entered (it does not run as part of `stmt`)."""
    out = [stmt]
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return out
    for child in ast.iter_child_nodes(stmt):
        if isinstance(child, ast.stmt):
            out += statements_run(child)
        elif isinstance(child, (ast.ExceptHandler, ast.match_case)):
            for inner in child.body:
                out += statements_run(inner)
    return out


def attribute_reads(func: FunctionNode, attribute: str | None = None) -> list[tuple[str, int]]:
    """`(attribute, line)` of every `self.<attribute>` load in a method (all of them if None)."""
    self_var = self_name(func)
    if self_var is None:
        return []
    reads = []
    for node in ast.walk(func):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Load)
            and isinstance(node.value, ast.Name)
            and node.value.id == self_var
            and (attribute is None or node.attr == attribute)
        ):
            reads.append((node.attr, node.lineno))
    return reads


def _imported_from(tree: ast.Module) -> dict[str, str]:
    """Module-level `from M import Name [as Alias]`: alias -> `M`."""
    found: dict[str, str] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.ImportFrom) and stmt.module:
            for alias in stmt.names:
                found[alias.asname or alias.name] = stmt.module
    return found


class ClassGraph:
    """The classes of a main file and related files, with their relations resolved by name.

    Raises (constructor):
        InputError: the main file is not Python (with the line of the syntax error). Related files
            that do not parse are skipped and listed in `skipped`.
    """

    def __init__(
        self, main_path: str, main_text: str, related: Mapping[str, str] | None = None
    ) -> None:
        self.main_path = main_path
        self.trees: dict[str, ast.Module] = {}
        self.texts: dict[str, str] = {}
        self.skipped: list[str] = []
        try:
            self.trees[main_path] = parse_python(main_text)
        except SyntaxError as exc:
            raise InputError(
                f"{main_path}:{exc.lineno or 0}: not Python: {exc.msg}",
                hint="give the module's .py source file",
            ) from None
        self.texts[main_path] = main_text
        for path, text in (related or {}).items():
            if path == main_path:
                continue
            try:
                self.trees[path] = parse_python(text)
                self.texts[path] = text
            except SyntaxError:
                self.skipped.append(path)
        self.classes: list[ClassInfo] = [
            ClassInfo(node.name, qualname, path, node)
            for path, tree in self.trees.items()
            for qualname, node in iter_definitions(tree)
            if isinstance(node, ast.ClassDef)
        ]
        self._imports = {path: _imported_from(tree) for path, tree in self.trees.items()}
        self._mro: dict[int, list[ClassInfo]] = {}

    # -- lookup -----------------------------------------------------------------------------

    def named(self, name: str, path: str | None = None) -> list[ClassInfo]:
        """Classes called `name` (by simple name or qualname), optionally in one file."""
        return [
            c
            for c in self.classes
            if (c.name == name or c.qualname == name) and (path is None or c.path == path)
        ]

    def main_classes(self) -> list[ClassInfo]:
        return [c for c in self.classes if c.path == self.main_path]

    def resolve_base(self, cls: ClassInfo, base: ast.expr) -> ClassInfo | None:
        """The class a base expression names, among the known classes (None: not known)."""
        name = dotted_name(base)
        if name is None:
            return None
        simple = name.rsplit(".", 1)[-1]
        same_file = [c for c in self.named(simple, cls.path) if c is not cls]
        if same_file:
            return same_file[0]
        candidates = [c for c in self.named(simple) if c is not cls]
        if len(candidates) <= 1:
            return candidates[0] if candidates else None
        module = self._imports.get(cls.path, {}).get(simple)
        if module is not None:
            suffix = module.replace(".", "/")
            for candidate in candidates:
                path = candidate.path.replace("\\", "/")
                if path.endswith(suffix + ".py") or path.endswith(suffix + "/__init__.py"):
                    return candidate
        return None

    def bases(self, cls: ClassInfo) -> list[ClassInfo]:
        return [b for b in (self.resolve_base(cls, e) for e in cls.node.bases) if b is not None]

    def unresolved_bases(self, cls: ClassInfo) -> list[str]:
        """Base names that are not among the known classes (`object` excluded)."""
        out = []
        for expr in cls.node.bases:
            if self.resolve_base(cls, expr) is None:
                text = ast.unparse(expr)
                if text != "object":
                    out.append(text)
        return out

    def mro(self, cls: ClassInfo) -> list[ClassInfo]:
        """The known part of the method resolution order (C3 over the resolved bases)."""
        key = id(cls.node)
        if key not in self._mro:
            self._mro[key] = _c3(cls, self.bases, set())
        return self._mro[key]

    def subclasses(self, cls: ClassInfo) -> list[ClassInfo]:
        """Every known class that has `cls` in its MRO (not `cls` itself), in file order."""
        return [c for c in self.classes if c is not cls and cls in self.mro(c)]

    # -- members ----------------------------------------------------------------------------

    @staticmethod
    def methods(cls: ClassInfo) -> dict[str, FunctionNode]:
        """Functions defined directly in the class body (the last definition of a name wins)."""
        return {
            s.name: s
            for s in cls.node.body
            if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))
        }

    @staticmethod
    def class_level_names(cls: ClassInfo) -> dict[str, int]:
        """Names the class body gives a value (assignments, defs, nested classes): name -> line.

        A bare annotation (`x: int`) gives no value and is not included.
        """
        names: dict[str, int] = {}
        for stmt in cls.node.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.setdefault(stmt.name, first_line(stmt))
            elif isinstance(stmt, ast.Assign):
                for target in stmt.targets:
                    for node in ast.walk(target):
                        if isinstance(node, ast.Name):
                            names.setdefault(node.id, stmt.lineno)
            elif (
                isinstance(stmt, ast.AnnAssign)
                and stmt.value is not None
                and isinstance(stmt.target, ast.Name)
            ):
                names.setdefault(stmt.target.id, stmt.lineno)
        return names

    def init_owner(self, instance: ClassInfo, start: int = 0) -> tuple[int, ClassInfo] | None:
        """The first class from position `start` of `instance`'s MRO that defines `__init__`."""
        order = self.mro(instance)
        for index in range(start, len(order)):
            if "__init__" in self.methods(order[index]):
                return index, order[index]
        return None

    def init_chain(self, instance: ClassInfo) -> list[ClassInfo]:
        """The known classes whose `__init__` runs when `instance` is constructed, in call order:
        the first `__init__` in the MRO, then whatever it calls through `super().__init__` or
        `Base.__init__(self)`, recursively (each class once)."""
        order = self.mro(instance)
        chain: list[ClassInfo] = []

        def visit(start: int) -> None:
            found = self.init_owner(instance, start)
            if found is None:
                return
            index, owner = found
            if owner in chain:
                return
            chain.append(owner)
            for call in calls_when_run(self.methods(owner)["__init__"]):
                target = _init_call_target(call)
                if target == "super":
                    visit(index + 1)
                elif target is not None:
                    named = self.resolve_base(owner, ast.Name(id=target))
                    if named is not None and named in order:
                        visit(order.index(named))

        visit(0)
        return chain

    def skips_init_of(self, sub: ClassInfo, base: ClassInfo) -> bool:
        """Whether constructing `sub` does not run `base.__init__` (it defines an `__init__` of
        its own, somewhere between, that does not chain to it)."""
        return base not in self.init_chain(sub)


def _init_call_target(call: ast.Call) -> str | None:
    """`super().__init__(...)` / `super(C, self).__init__(...)` -> "super";
    `Base.__init__(self, ...)` -> "Base"; anything else None."""
    func = call.func
    if not (isinstance(func, ast.Attribute) and func.attr == "__init__"):
        return None
    owner = func.value
    if (
        isinstance(owner, ast.Call)
        and isinstance(owner.func, ast.Name)
        and owner.func.id == "super"
    ):
        return "super"
    name = dotted_name(owner)
    return name.rsplit(".", 1)[-1] if name and "(" not in name else None


def _c3(
    cls: ClassInfo, bases_of: Callable[[ClassInfo], list[ClassInfo]], seen: set[int]
) -> list[ClassInfo]:
    """C3 linearisation over the known bases; a cycle or an inconsistent order degrades to a
    depth-first order rather than failing (the graph only advises)."""
    if id(cls) in seen:
        return [cls]
    seen = seen | {id(cls)}
    bases = bases_of(cls)
    sequences = [_c3(b, bases_of, seen) for b in bases] + [list(bases)]
    result = [cls]
    sequences = [list(s) for s in sequences if s]
    while sequences:
        for sequence in sequences:
            head = sequence[0]
            if not any(head in other[1:] for other in sequences):
                break
        else:  # inconsistent: take the first remaining head
            head = sequences[0][0]
        result.append(head)
        sequences = [[c for c in s if c is not head] for s in sequences]
        sequences = [s for s in sequences if s]
    deduplicated: list[ClassInfo] = []
    for c in result:
        if c not in deduplicated:
            deduplicated.append(c)
    return deduplicated


def find_class(graph: ClassGraph, name: str) -> ClassInfo:
    """The one class called `name` in the main file (falling back to related files).

    Raises:
        InputError: no class of that name (the classes there are listed) or several.
    """
    found = graph.named(name, graph.main_path) or graph.named(name)
    if len(found) == 1:
        return found[0]
    if found:
        raise InputError(
            f"class {name} is defined {len(found)} times: " + ", ".join(c.where for c in found),
            hint="name it by its qualname (Outer.Inner)",
        )
    known = ", ".join(c.qualname for c in graph.main_classes()) or "none"
    raise InputError(
        f"{graph.main_path}: no class {name} (classes in this file: {known})",
        hint="check the class name, or give the file that defines it",
    )
