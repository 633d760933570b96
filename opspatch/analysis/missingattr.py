"""Why `'<Class>' object has no attribute '<attr>'`: the analysis behind `opspatch diagnose`."""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opspatch.analysis.classgraph import (
    DEFAULT_IGNORED_CALLS,
    ClassGraph,
    ClassInfo,
    Statement,
    describe_statement,
    self_name,
    statement_assigned_attributes,
    statements_run,
)
from opspatch.analysis.initprogress import InitProgress, init_progress
from opspatch.core.anchors import first_line

_MESSAGE = re.compile(
    r"(?:AttributeError:\s*)?'(?P<cls>[A-Za-z_][\w.]*)' object has no attribute '(?P<attr>\w+)'"
)
# Bases from the standard library whose attribute behaviour is known to be plain.
_PLAIN_STDLIB_BASES = {"object", "ABC", "abc.ABC", "Generic", "typing.Generic", "Protocol"}


@dataclass(frozen=True)
class MissingAttribute:
    """What an AttributeError names: the instance's class and the attribute."""

    class_name: str
    attribute: str

    def to_json(self) -> dict[str, Any]:
        return {"class": self.class_name, "attribute": self.attribute}


def parse_missing_attribute(text: str) -> MissingAttribute | None:
    """The class and attribute of `AttributeError: 'C' object has no attribute 'a'` (also found
    inside a longer line, and with Python 3.12's `. Did you mean: ...?` tail); None otherwise."""
    match = _MESSAGE.search(text)
    if match is None:
        return None
    return MissingAttribute(match.group("cls").rsplit(".", 1)[-1], match.group("attr"))


@dataclass(frozen=True)
class Assignment:
    """One place that assigns the attribute, and what stands before it."""

    class_name: str
    method: str
    path: str
    statement: Statement
    in_init: bool
    init_runs: bool  # building the instance's class runs this method's __init__ chain
    risky_before: tuple[Statement, ...]  # in an __init__: statements at/before it that can raise

    def to_json(self) -> dict[str, Any]:
        return {
            "class": self.class_name,
            "method": self.method,
            "path": self.path,
            "line": self.statement.line,
            "statement": self.statement.to_json(),
            "in_init": self.in_init,
            "init_runs": self.init_runs,
            "risky_before": [s.to_json() for s in self.risky_before],
        }


@dataclass(frozen=True)
class Check:
    """An alternative explanation, checked: `present` says whether the source shows it."""

    name: str
    present: bool
    detail: str

    def render(self) -> str:
        return f"[{'FOUND' if self.present else 'no'}] {self.name}: {self.detail}"


@dataclass(frozen=True)
class MissingAttributeReport:
    """Everything found about one missing attribute."""

    class_name: str
    attribute: str
    path: str
    class_where: str | None  # path:line, None when the class is not in the sources
    assignments: tuple[Assignment, ...]
    class_level: str | None  # where a class-level value is, if any
    skipping_subclasses: tuple[str, ...]  # "Sub (path:line)" that skip the assigning __init__
    checks: tuple[Check, ...]
    progress: InitProgress | None
    likely_cause: str
    not_examined: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "class": self.class_name,
            "attribute": self.attribute,
            "path": self.path,
            "class_where": self.class_where,
            "likely_cause": self.likely_cause,
            "assignments": [a.to_json() for a in self.assignments],
            "class_level": self.class_level,
            "skipping_subclasses": list(self.skipping_subclasses),
            "checks": [
                {"name": c.name, "present": c.present, "detail": c.detail} for c in self.checks
            ],
            "init_progress": self.progress.to_json() if self.progress else None,
            "not_examined": list(self.not_examined),
        }

    def render(self) -> str:
        """The section `opspatch diagnose` prints for this AttributeError on one host."""
        head = f"{self.class_name}.{self.attribute}"
        lines = [f"missing attribute {head}: {self.likely_cause}"]
        if self.class_where is None:
            return "\n".join(lines)
        lines.append(f"  class {self.class_name} at {self.class_where}")
        for a in self.assignments:
            runs = "" if a.init_runs or not a.in_init else f" (never runs for {self.class_name})"
            lines.append(f"  assigned in {a.class_name}.{a.method}{runs}: {a.statement.render()}")
            for risky in a.risky_before:
                lines.append(f"    can raise before it: {risky.render()}")
        if not self.assignments:
            lines.append(f"  never assigned in {self.class_name} or its known bases")
        if self.class_level:
            lines.append(f"  class-level value: {self.class_level}")
        for sub in self.skipping_subclasses:
            lines.append(f"  subclass skipping that __init__: {sub}")
        if self.progress is not None:
            lines += ["  " + line for line in self.progress.render().splitlines()]
        lines += [f"  {c.render()}" for c in self.checks]
        lines += [f"  not examined: {n}" for n in self.not_examined]
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------


def _assignments(
    graph: ClassGraph, cls: ClassInfo, attribute: str, ignore_calls: Sequence[str]
) -> list[Assignment]:
    chain = graph.init_chain(cls)
    found = []
    for owner in graph.mro(cls):
        for name, method in graph.methods(owner).items():
            self_var = self_name(method)
            if self_var is None:
                continue
            statements = [describe_statement(s, ignore_calls) for s in method.body]
            for index, stmt in enumerate(method.body):
                hit = next(
                    (
                        node
                        for node in statements_run(stmt)
                        if attribute in statement_assigned_attributes(node, self_var)
                    ),
                    None,
                )
                if hit is None:
                    continue
                in_init = name == "__init__"
                found.append(
                    Assignment(
                        class_name=owner.name,
                        method=name,
                        path=owner.path,
                        statement=describe_statement(hit, ignore_calls),
                        in_init=in_init,
                        init_runs=owner in chain if in_init else True,
                        risky_before=tuple(s for s in statements[: index + 1] if s.calls)
                        if in_init
                        else (),
                    )
                )
                if in_init:
                    break  # the first assignment in __init__ is the one that matters
    return found


def _dunder_check(graph: ClassGraph, order: list[ClassInfo], name: str, why: str) -> Check:
    owners = [c for c in order if name in graph.methods(c)]
    if owners:
        where = ", ".join(
            f"{c.name} ({c.path}:{first_line(graph.methods(c)[name])})" for c in owners
        )
        return Check(name, True, f"defined in {where}: {why}")
    return Check(name, False, "not defined in the class or its known bases")


def _checks(graph: ClassGraph, cls: ClassInfo, attribute: str) -> list[Check]:
    order = graph.mro(cls)
    checks = [
        _dunder_check(
            graph, order, "__getattr__",
            "a missing name is handed to it, and it may raise this AttributeError itself",
        ),
        _dunder_check(
            graph, order, "__getattribute__", "every attribute access goes through it"
        ),
        _dunder_check(graph, order, "__setattr__", "an assignment may not store the value"),
        _dunder_check(graph, order, "__delattr__", "it may remove attributes"),
        _dunder_check(
            graph, order, "__new__", "it may return an object whose __init__ never runs"
        ),
    ]  # fmt: skip
    metaclasses = [
        f"{c.name}: metaclass={ast.unparse(k.value)}"
        for c in order
        for k in c.node.keywords
        if k.arg == "metaclass"
    ]
    checks.append(Check("metaclass", bool(metaclasses), "; ".join(metaclasses) or "none declared"))
    hooks = [c for c in order[1:] if "__init_subclass__" in graph.methods(c)]
    checks.append(
        Check(
            "__init_subclass__",
            bool(hooks),
            ", ".join(f"in {c.name} ({c.path})" for c in hooks) or "not defined in a known base",
        )
    )
    slots = [c.name for c in order if "__slots__" in graph.class_level_names(c)]
    checks.append(
        Check("__slots__", bool(slots), ", ".join(slots) or "no class declares __slots__")
    )
    properties = [
        f"{c.name} ({c.path}:{first_line(m)})"
        for c in order
        for n, m in graph.methods(c).items()
        if n == attribute and any("property" in ast.unparse(d) for d in m.decorator_list)
    ]
    checks.append(
        Check(
            f"property {attribute}",
            bool(properties),
            ("a property raising AttributeError inside: " + ", ".join(properties))
            if properties
            else "no property of that name",
        )
    )
    deletions = [
        f"{c.name}.{n} line {node.lineno}"
        for c in [*order, *graph.subclasses(cls)]
        for n, m in graph.methods(c).items()
        for node in ast.walk(m)
        if isinstance(node, ast.Delete)
        and any(ast.unparse(t) == f"{self_name(m)}.{attribute}" for t in node.targets)
    ]
    checks.append(
        Check(f"del self.{attribute}", bool(deletions), ", ".join(deletions) or "never deleted")
    )
    same = graph.named(cls.name)
    checks.append(
        Check(
            "proxy or other class",
            len(same) > 1,
            (
                f"{len(same)} classes are named {cls.name}: "
                + ", ".join(c.where for c in same)
                + " (the instance may be of another one)"
            )
            if len(same) > 1
            else f"the message names type(obj).__name__ = {cls.name}: the object is an "
            f"instance of {cls.name}, not a proxy or wrapper (those would be named)",
        )
    )
    return checks


def _not_examined(graph: ClassGraph, cls: ClassInfo) -> list[str]:
    out = []
    for c in graph.mro(cls):
        for base in graph.unresolved_bases(c):
            if base not in _PLAIN_STDLIB_BASES:
                out.append(f"base {base} of {c.name} (its source was not given)")
    return out


def analyze_missing_attribute(
    text: str,
    path: str,
    missing: MissingAttribute,
    *,
    related: Mapping[str, str] | None = None,
    log_text: str | None = None,
    ignore_calls: Sequence[str] = DEFAULT_IGNORED_CALLS,
) -> MissingAttributeReport:
    """Explain `'<Class>' object has no attribute '<attr>'` from the class's source.

    `text`/`path`: the module that defines the class (as the host imports it); `related`: other
    files by path (bases' and subclasses' modules). `log_text`: the log since the server started;
    when given, how far the assigning `__init__` got is reported.

    Raises:
        InputError: `text` is not Python.
    """
    graph = ClassGraph(path, text, related)
    found = graph.named(missing.class_name, path) or graph.named(missing.class_name)
    if not found:
        cause = (
            f"class {missing.class_name} is not defined in {path}"
            + (" or the related files" if related else "")
            + ": the process runs another copy of the code, or the class lives elsewhere"
        )
        return MissingAttributeReport(
            missing.class_name, missing.attribute, path, None, (), None, (), (), None, cause
        )
    cls = found[0]
    assignments = _assignments(graph, cls, missing.attribute, ignore_calls)
    class_level = next(
        (
            f"{c.name} ({c.path}:{graph.class_level_names(c)[missing.attribute]})"
            for c in graph.mro(cls)
            if missing.attribute in graph.class_level_names(c)
        ),
        None,
    )
    init_assignments = [a for a in assignments if a.in_init]
    skipping: list[str] = []
    for a in init_assignments:
        owner = next(c for c in graph.mro(cls) if c.name == a.class_name and c.path == a.path)
        for sub in [cls, *graph.subclasses(owner)]:
            if sub is not owner and graph.skips_init_of(sub, owner):
                entry = f"{sub.name} ({sub.where}) skips {owner.name}.__init__"
                if entry not in skipping:
                    skipping.append(entry)
    progress = None
    if log_text is not None:
        target = next((a for a in init_assignments if a.init_runs), None)
        owner_name = target.class_name if target else None
        init_owner = next(
            (c for c in graph.init_chain(cls) if c.name == owner_name),
            graph.init_chain(cls)[0] if graph.init_chain(cls) else None,
        )
        if init_owner is not None:
            progress = init_progress(graph, cls, init_owner, log_text, ignore_calls)
    checks = _checks(graph, cls, missing.attribute)
    cause = _likely_cause(cls, missing.attribute, assignments, class_level, checks, progress)
    return MissingAttributeReport(
        class_name=cls.name,
        attribute=missing.attribute,
        path=path,
        class_where=cls.where,
        assignments=tuple(assignments),
        class_level=class_level,
        skipping_subclasses=tuple(skipping),
        checks=tuple(checks),
        progress=progress,
        likely_cause=cause,
        not_examined=tuple(_not_examined(graph, cls)),
    )


def _likely_cause(
    cls: ClassInfo,
    attribute: str,
    assignments: Sequence[Assignment],
    class_level: str | None,
    checks: Sequence[Check],
    progress: InitProgress | None,
) -> str:
    """One sentence, strongest explanation first."""
    hooks = [c for c in checks if c.present and c.name in ("__getattr__", "__getattribute__")]
    if hooks:
        return f"likelier cause: {hooks[0].name} is {hooks[0].detail}"
    if class_level is not None:
        return (
            f"{cls.name} has a class-level value ({class_level}), so a {cls.name} built from this "
            "source cannot lack it: the process runs other code (another copy of the file, stale "
            "bytecode) or the attribute was deleted"
        )
    if not assignments:
        return f"{attribute} is never assigned in {cls.name} or its known bases"
    in_init = [a for a in assignments if a.in_init]
    if in_init and not any(a.init_runs for a in in_init):
        a = in_init[0]
        return (
            f"{cls.name} never runs {a.class_name}.__init__ (its own __init__ does not chain to "
            f"it), the only __init__ that assigns {attribute} (line {a.statement.line})"
        )
    running = next((a for a in in_init if a.init_runs), None)
    if running is None:
        return f"{attribute} is assigned only outside __init__ ({assignments[0].method})"
    line = running.statement.line
    if (
        progress is not None
        and progress.next_unseen is not None
        and progress.stopped_after_line < line
        and progress.suspects
        # at the line itself: the assignment's own value is a call (`get_int_env_var(...)`)
        and all(s.line <= line for s in progress.suspects)
    ):
        suspects = ", ".join(
            f"line {s.line} `{s.text}`" + (" (its own value)" if s.line == line else "")
            for s in progress.suspects
        )
        return (
            f"{progress.summary()}, before assigning {attribute} at line {line}: an exception "
            f"raised by {suspects} was swallowed by a caller and the half-built object was used"
        )
    if running.risky_before:
        return (
            f"{attribute} is assigned at line {line} of {running.class_name}.__init__ after "
            f"{len(running.risky_before)} statement(s) that can raise: if one raised and a caller "
            "swallowed the exception, the half-built object lacks it"
        )
    return (
        f"{attribute} is assigned at line {line} before any call in {running.class_name}.__init__: "
        "look for an instance built without __init__ (copy, pickle, __new__) or other code"
    )
