"""Partial-initialisation hazards, and the guard patch that removes them (`opspatch lint-init`)."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opspatch.analysis.classgraph import (
    DEFAULT_IGNORED_CALLS,
    ClassGraph,
    ClassInfo,
    FunctionNode,
    Statement,
    assigned_attributes,
    attribute_reads,
    describe_statement,
    find_class,
    self_name,
    statement_assigned_attributes,
    statements_run,
)
from opspatch.analysis.guarddefault import GuardDefault, infer_default
from opspatch.core.anchors import first_line
from opspatch.errors import InputError

# Class decorators and bases under which a class-level assignment is not an inert default: it
# becomes a field (dataclasses, attrs, pydantic, NamedTuple, TypedDict) or a member (Enum).
_FIELD_DECORATORS = {"dataclass", "dataclasses.dataclass", "attr.s", "attrs", "attr.define",
                     "attrs.define", "define", "frozen", "attr.attrs"}  # fmt: skip
_FIELD_BASES = {"Enum", "IntEnum", "StrEnum", "Flag", "IntFlag", "NamedTuple", "TypedDict",
                "BaseModel", "Struct"}  # fmt: skip


@dataclass(frozen=True)
class AttributeRead:
    """Where an attribute is read: the method's qualname and file, and the line."""

    method: str
    path: str
    line: int

    def render(self) -> str:
        return f"{self.method} (line {self.line})"


@dataclass(frozen=True)
class SkippingSubclass:
    """A subclass whose construction never runs the class's `__init__`."""

    name: str
    path: str
    line: int
    runs_instead: tuple[str, ...]  # the __init__s it does run, e.g. ("StandaloneWorkerV2", ...)

    def render(self) -> str:
        instead = ", ".join(f"{n}.__init__" for n in self.runs_instead) or "no known __init__"
        return f"{self.name} ({self.path}:{self.line}; runs {instead})"


@dataclass(frozen=True)
class InitHazard:
    """One attribute that an instance of `class_name` (or of a subclass) can lack."""

    class_name: str
    attribute: str
    assignment: Statement  # its first assignment in __init__
    risky_before: tuple[Statement, ...]  # statements at or before it that can raise
    reads: tuple[AttributeRead, ...]
    skipping_subclasses: tuple[SkippingSubclass, ...]
    default: GuardDefault

    @property
    def kinds(self) -> tuple[str, ...]:
        return (("late",) if self.risky_before else ()) + (
            ("skipped",) if self.skipping_subclasses else ()
        )

    @property
    def first_risky(self) -> Statement | None:
        return self.risky_before[0] if self.risky_before else None

    def to_json(self) -> dict[str, Any]:
        return {
            "class": self.class_name,
            "attribute": self.attribute,
            "kinds": list(self.kinds),
            "assigned_line": self.assignment.line,
            "assignment": self.assignment.to_json(),
            "first_risky": self.first_risky.to_json() if self.first_risky else None,
            "risky_before": [s.to_json() for s in self.risky_before],
            "reads": [{"method": r.method, "path": r.path, "line": r.line} for r in self.reads],
            "skipping_subclasses": [
                {
                    "name": s.name,
                    "path": s.path,
                    "line": s.line,
                    "runs_instead": list(s.runs_instead),
                }
                for s in self.skipping_subclasses
            ],
            "default": {
                "value": self.default.value,
                "annotation": self.default.annotation,
                "reason": self.default.reason,
            },
        }

    def describe(self) -> str:
        """One paragraph: what was found (used in reports and in a guard patch's rationale)."""
        parts = [f"{self.class_name}.{self.attribute} is assigned at line {self.assignment.line}"]
        risky = self.risky_before
        if risky:
            at_itself = risky[-1].line == self.assignment.line
            first = f"line {risky[0].line} `{risky[0].text}`"
            if len(risky) == 1 and at_itself:
                parts.append(f"by a statement that itself calls `{risky[0].calls[0]}`")
            elif len(risky) == 1:
                parts.append(f"after {first}, which can raise")
            else:
                parts.append(
                    f"after {len(risky)} statements that can raise "
                    f"(first {first}; last line {risky[-1].line} `{risky[-1].text}`)"
                )
        text = " ".join(parts)
        if self.reads:
            shown = ", ".join(r.render() for r in self.reads[:3])
            more = f" and {len(self.reads) - 3} more" if len(self.reads) > 3 else ""
            text += f"; read in {shown}{more}"
        if self.skipping_subclasses:
            text += "; missing on " + ", ".join(s.render() for s in self.skipping_subclasses)
            text += f", which never run {self.class_name}.__init__"
        return text + "."


@dataclass(frozen=True)
class ClassLint:
    """The hazards of one class, and why a guard patch could not be written for it (if so)."""

    name: str
    path: str
    line: int
    init_line: int | None
    hazards: tuple[InitHazard, ...]
    guard_refusal: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "class": self.name,
            "path": self.path,
            "line": self.line,
            "init_line": self.init_line,
            "hazards": [h.to_json() for h in self.hazards],
            "guard_refusal": self.guard_refusal,
        }


@dataclass(frozen=True)
class InitLintReport:
    """Every class examined in a file, with its hazards."""

    path: str
    classes: tuple[ClassLint, ...]
    skipped_files: tuple[str, ...] = ()

    @property
    def hazards(self) -> tuple[InitHazard, ...]:
        return tuple(h for c in self.classes for h in c.hazards)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "hazard_count": len(self.hazards),
            "classes": [c.to_json() for c in self.classes],
            "skipped_files": list(self.skipped_files),
        }

    def render(self) -> str:
        """The text `opspatch lint-init` prints."""
        lines = []
        for cls in self.classes:
            if not cls.hazards:
                continue
            lines.append(f"{self.path}:{cls.line}: class {cls.name}: {len(cls.hazards)} hazard(s)")
            for hazard in cls.hazards:
                lines.append(f"  {hazard.attribute} [{', '.join(hazard.kinds)}]")
                lines.append(
                    f"    assigned: line {hazard.assignment.line}: {hazard.assignment.text}"
                )
                if hazard.first_risky is not None:
                    more = len(hazard.risky_before) - 1
                    tail = f" (+{more} more)" if more else ""
                    lines.append(f"    first risky: {hazard.first_risky.render()}{tail}")
                reads = ", ".join(r.render() for r in hazard.reads[:4])
                lines.append(f"    read in: {reads}" + (" ..." if len(hazard.reads) > 4 else ""))
                for sub in hazard.skipping_subclasses:
                    lines.append(f"    skipped by: {sub.render()}")
                lines.append(
                    f"    guard: {hazard.default.code(hazard.attribute)}  # {hazard.default.reason}"
                )
            if cls.guard_refusal:
                lines.append(f"  no guard patch: {cls.guard_refusal}")
        if not lines:
            examined = ", ".join(c.name for c in self.classes) or "no class with __init__"
            lines.append(f"{self.path}: no partial-initialisation hazard ({examined})")
        else:
            lines.append(f"{len(self.hazards)} hazard(s)")
        for skipped in self.skipped_files:
            lines.append(f"note: {skipped} does not parse and was not examined")
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# analysis


def _first_assignments(init: FunctionNode, self_var: str) -> dict[str, tuple[int, ast.stmt]]:
    """attribute -> (index of the top-level statement of its first assignment, the statement that
    assigns it: the top-level statement or the nested one inside it)."""
    found: dict[str, tuple[int, ast.stmt]] = {}
    for index, stmt in enumerate(init.body):
        for node in statements_run(stmt):
            for name in statement_assigned_attributes(node, self_var):
                found.setdefault(name, (index, node))
    return found


def _hierarchy_reads(
    graph: ClassGraph, cls: ClassInfo, attribute: str
) -> tuple[AttributeRead, ...]:
    reads = []
    for owner in [*graph.mro(cls), *graph.subclasses(cls)]:
        for name, method in graph.methods(owner).items():
            if owner is cls and name == "__init__":
                continue
            for _, line in attribute_reads(method, attribute):
                reads.append(AttributeRead(f"{owner.name}.{name}", owner.path, line))
    return tuple(sorted(set(reads), key=lambda r: (r.path != cls.path, r.path, r.line)))


def _class_level_anywhere(graph: ClassGraph, cls: ClassInfo) -> set[str]:
    return {name for owner in graph.mro(cls) for name in graph.class_level_names(owner)}


def _init_assigned(graph: ClassGraph, owner: ClassInfo) -> set[str]:
    init = graph.methods(owner).get("__init__")
    if init is None or (self_var := self_name(init)) is None:
        return set()
    return set(assigned_attributes(init, self_var))


def _skipping(graph: ClassGraph, cls: ClassInfo) -> list[tuple[ClassInfo, list[ClassInfo]]]:
    """Known subclasses that never run `cls.__init__`, with the `__init__`s they run instead."""
    out = []
    for sub in graph.subclasses(cls):
        if graph.skips_init_of(sub, cls):
            out.append((sub, graph.init_chain(sub)))
    return out


def lint_class(
    graph: ClassGraph, cls: ClassInfo, ignore_calls: Sequence[str] = DEFAULT_IGNORED_CALLS
) -> ClassLint:
    """The hazards of one class (see the module docstring for what counts)."""
    init = graph.methods(cls).get("__init__")
    refusal = guard_refusal(cls)
    if init is None or (self_var := self_name(init)) is None:
        return ClassLint(cls.qualname, cls.path, cls.line, None, (), refusal)
    statements = [describe_statement(s, ignore_calls) for s in init.body]
    safe = _class_level_anywhere(graph, cls)
    skipping = _skipping(graph, cls)
    hazards = []
    for attribute, (index, assigning) in _first_assignments(init, self_var).items():
        if attribute in safe:
            continue
        risky = [s for s in statements[: index + 1] if s.calls]
        missing_on = tuple(
            SkippingSubclass(sub.name, sub.path, sub.line, tuple(c.name for c in chain))
            for sub, chain in skipping
            if attribute not in set().union(*(_init_assigned(graph, c) for c in chain))
            and attribute not in _class_level_anywhere(graph, sub)
        )
        if not risky and not missing_on:
            continue
        reads = _hierarchy_reads(graph, cls, attribute)
        if not reads:
            continue  # nothing this hierarchy runs would trip over it
        hazards.append(
            InitHazard(
                class_name=cls.qualname,
                attribute=attribute,
                assignment=describe_statement(assigning, ignore_calls),
                risky_before=tuple(risky),
                reads=reads,
                skipping_subclasses=missing_on,
                default=infer_default(graph, cls, attribute),
            )
        )
    hazards.sort(key=lambda h: h.assignment.line)
    return ClassLint(cls.qualname, cls.path, cls.line, first_line(init), tuple(hazards), refusal)


def lint_init(
    text: str,
    path: str,
    *,
    class_name: str | None = None,
    related: Mapping[str, str] | None = None,
    ignore_calls: Sequence[str] = DEFAULT_IGNORED_CALLS,
) -> InitLintReport:
    """Partial-initialisation hazards of the classes of one file (or of `class_name` only).

    `related` maps other files' paths to their text (e.g. the sibling modules of the package):
    their classes are known bases and subclasses, so a subclass elsewhere that skips `__init__`
    is found. Hazards are reported for classes of the main file only.

    Raises:
        InputError: the file is not Python, or `class_name` is not defined (classes listed).
    """
    graph = ClassGraph(path, text, related)
    if class_name is not None:
        classes = [find_class(graph, class_name)]
    else:
        classes = [c for c in graph.main_classes() if "__init__" in graph.methods(c)]
    return InitLintReport(
        path=path,
        classes=tuple(lint_class(graph, c, ignore_calls) for c in classes),
        skipped_files=tuple(graph.skipped),
    )


def guard_refusal(cls: ClassInfo) -> str | None:
    """Why class-level defaults would not be inert in this class (None: they would be)."""
    for decorator in cls.node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = ast.unparse(target)
        if name in _FIELD_DECORATORS:
            return f"it is decorated with @{name}: a class-level value would become a field"
    for base in cls.node.bases:
        name = ast.unparse(base).rsplit(".", 1)[-1]
        if name in _FIELD_BASES:
            return f"it derives from {name}: a class-level value would become a field or member"
    for stmt in cls.node.body:
        if isinstance(stmt, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__slots__" for t in stmt.targets
        ):
            return "it declares __slots__: a class-level value of a slot name is an error"
    return None


# ---------------------------------------------------------------------------------------------
# the guard patch


@dataclass(frozen=True)
class GuardPatch:
    """A written guard patch: its id, the TOML text, what it defaults, and the classes left out
    (where class-level defaults would not be inert)."""

    patch_id: str
    text: str
    defaults: tuple[tuple[str, str, str], ...]  # (class, line of code, reason)
    skipped: tuple[str, ...] = ()  # "Class: why"

    def to_json(self) -> dict[str, Any]:
        return {
            "patch": self.patch_id,
            "defaults": [
                {"class": cls, "code": code, "reason": reason}
                for cls, code, reason in self.defaults
            ],
            "skipped": list(self.skipped),
            "toml": self.text,
        }

    def render(self) -> str:
        lines = [f"guard patch {self.patch_id}: {len(self.defaults)} class-level default(s)"]
        lines += [f"  {cls}: {code}  # {reason}" for cls, code, reason in self.defaults]
        lines += [f"  not guarded: {why}" for why in self.skipped]
        return "\n".join(lines)


def _toml_string(value: str) -> str:
    # A JSON string is a valid TOML basic string (same escapes, \\uXXXX included).
    return json.dumps(value, ensure_ascii=False)


def _toml_multiline(value: str) -> str:
    if "'''" not in value and all(c == "\n" or c == "\t" or ord(c) >= 32 for c in value):
        return "'''\n" + value + "'''"
    return _toml_string(value)


def write_guard_patch(
    report: InitLintReport,
    *,
    module: str,
    patch_id: str,
    distribution: str = "sglang",
    versions: str = "",
    incident: str | None = None,
    class_name: str | None = None,
) -> GuardPatch:
    """A typed patch file (TOML) that gives every hazard of the report a class-level default.

    One `insert` edit per class (at the start of the class body), one `class-attribute`
    postcondition per attribute, a `rationale` that says what was found and why each default,
    and a `fixes` entry for the AttributeError it prevents. It loads with `load_patch` and, on the
    file the report was made from, applies and validates with `apply_patch`.

    Classes where class-level defaults would not be inert (dataclass, enum, `__slots__`, ...) are
    left out and listed in `skipped`.

    Raises:
        InputError: no hazard to guard (in `class_name`, if given), or `class_name` (or every class
            with hazards) is one where class-level defaults would not be inert.
    """
    classes, skipped = _classes_to_guard(report, class_name)
    hazards = [h for c in classes for h in c.hazards]
    names = sorted({h.attribute for h in hazards})
    owners = sorted({h.class_name for h in hazards} | {
        s.name for h in hazards for s in h.skipping_subclasses
    })  # fmt: skip
    summary = (
        f"Class-level defaults for {len(hazards)} attribute(s) that "
        f"{' and '.join(c.name for c in classes)} can lack after a partial __init__"
    )
    rationale = (
        f"opspatch lint-init found partial-initialisation hazards in {report.path}:\n"
        + "".join(
            f"- {h.describe()} Default {h.default.value}: {h.default.reason}.\n" for h in hazards
        )
        + "\nA class-level default gives every instance the attribute, also one whose __init__ "
        "stopped part-way (an exception a caller swallowed) and one of a subclass that never runs "
        "this __init__; the value __init__ assigns still overrides it.\n"
    )
    message = (
        f"'(?:{'|'.join(re.escape(o.rsplit('.', 1)[-1]) for o in owners)})' object has no "
        f"attribute '(?:{'|'.join(re.escape(n) for n in names)})'"
    )
    out = [
        f"# Written by `opspatch lint-init --write-patch` from {report.path}: review before use.",
        f"id = {_toml_string(patch_id)}",
        f"summary = {_toml_string(summary)}",
    ]
    if incident:
        out.append(f"incident = {_toml_string(incident)}")
    out += [
        f"rationale = {_toml_multiline(rationale)}",
        f'fixes = [{{ exception = "AttributeError", message = {_toml_string(message)} }}]',
        "",
        "[target]",
        f"module = {_toml_string(module)}",
        f"distribution = {_toml_string(distribution)}",
        f"versions = {_toml_string(versions)}",
    ]
    defaults = []
    for cls in classes:
        out += _insert_edit_lines(cls)
        defaults += [(cls.name, h.default.code(h.attribute), h.default.reason) for h in cls.hazards]
    for hazard in hazards:
        out += [
            "",
            "[[postconditions]]",
            'kind = "class-attribute"',
            f"class = {_toml_string(hazard.class_name)}",
            f"name = {_toml_string(hazard.attribute)}",
        ]
    return GuardPatch(patch_id, "\n".join(out) + "\n", tuple(defaults), skipped)


def _classes_to_guard(
    report: InitLintReport, class_name: str | None
) -> tuple[list[ClassLint], tuple[str, ...]]:
    """The classes with hazards (in `class_name`, if given) a guard patch gives defaults, and
    those left out (`name: why`) because class-level defaults would not be inert there.

    Raises:
        InputError: no hazard to guard, or `class_name` (or every class with hazards) is left
            out.
    """
    classes = [
        c for c in report.classes if c.hazards and (class_name is None or c.name == class_name)
    ]
    if not classes:
        where = f"class {class_name}" if class_name else report.path
        raise InputError(f"{where}: no partial-initialisation hazard to guard")
    refused = [c for c in classes if c.guard_refusal]
    if refused and (class_name is not None or len(refused) == len(classes)):
        cls = refused[0]
        raise InputError(
            f"{report.path}:{cls.line}: class {cls.name}: no guard patch: {cls.guard_refusal}",
            hint="guard the attribute by assigning it early in __init__ instead",
        )
    skipped = tuple(f"{c.name}: {c.guard_refusal}" for c in refused)
    return [c for c in classes if not c.guard_refusal], skipped


def _insert_edit_lines(cls: ClassLint) -> list[str]:
    """The guard patch's `insert` edit for one class: its defaults at the start of its body."""
    code = "".join(f"{h.default.code(h.attribute)}\n" for h in cls.hazards)
    return [
        "",
        "[[edits]]",
        'kind = "insert"',
        f"scope = {_toml_string(cls.name)}",
        'position = "start"',
        "comment = "
        + _toml_string(
            "defaults for attributes __init__ assigns after calls that can raise "
            "or that subclasses skip"
        ),
        f"code = {_toml_multiline(code)}",
    ]
