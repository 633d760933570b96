"""How far an `__init__` got, read from the log: "stopped between line X and line Y"."""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from opspatch.analysis.classgraph import (
    DEFAULT_IGNORED_CALLS,
    ClassGraph,
    ClassInfo,
    FunctionNode,
    Statement,
    calls_when_run,
    describe_statement,
    self_name,
)
from opspatch.core.anchors import dotted_name, first_line, last_line

MIN_LITERAL_CHARS = 8
_MAX_DEPTH = 3
_LOG_METHODS = {"debug", "info", "warning", "warn", "error", "exception", "critical", "fatal"}
_PLACEHOLDER = None  # a template segment that stands for formatted text
_PERCENT = re.compile(
    r"%(?:\([^)]*\))?[-#0 +]*(?:\*|\d+)?(?:\.(?:\*|\d+))?[hlL]?[diouxXeEfFgGcrsa%]"
)
_BRACES = re.compile(r"\{\{|\}\}|\{[^{}]*\}")

Segments = list[str | None]


@dataclass(frozen=True)
class LogCheckpoint:
    """A log message that proves `__init__` reached a line.

    `passed`: the log call is in `__init__` itself (its line was passed); otherwise it is inside
    `via`, called from `line` (that line was entered).
    """

    line: int
    template: str
    pattern: str
    via: str | None
    passed: bool

    def render(self) -> str:
        where = f"line {self.line}" + (f" (in {self.via})" if self.via else "")
        return f'{where}: "{self.template}"'


@dataclass(frozen=True)
class CheckedCheckpoint:
    checkpoint: LogCheckpoint
    seen: bool
    evidence: str | None  # the last log line that matched

    def to_json(self) -> dict[str, Any]:
        c = self.checkpoint
        return {
            "line": c.line,
            "template": c.template,
            "pattern": c.pattern,
            "via": c.via,
            "passed_when_seen": c.passed,
            "seen": self.seen,
            "evidence": self.evidence,
        }


@dataclass(frozen=True)
class InitProgress:
    """Where an `__init__` stopped, as far as its log messages tell."""

    scope: str
    path: str
    init_line: int
    end_line: int
    checkpoints: tuple[CheckedCheckpoint, ...]
    last_seen: CheckedCheckpoint | None
    next_unseen: CheckedCheckpoint | None
    suspects: tuple[Statement, ...]  # statements between the two that can raise

    @property
    def stopped_after_line(self) -> int:
        return self.last_seen.checkpoint.line if self.last_seen else self.init_line

    @property
    def stopped_before_line(self) -> int | None:
        return self.next_unseen.checkpoint.line if self.next_unseen else None

    def summary(self) -> str:
        if not self.checkpoints:
            return (
                f"{self.scope} logs nothing opspatch can recognise: no evidence of how far it got"
            )
        if self.next_unseen is None:
            assert self.last_seen is not None
            if not self.last_seen.checkpoint.passed:
                return (
                    f"{self.scope} reached line {self.stopped_after_line} (a message from the "
                    "call there is in the log); it logs nothing later, so whether it finished is "
                    "not known"
                )
            return (
                f"{self.scope} got past its last logged point (line {self.stopped_after_line}): "
                "every message it logs up to there is present"
            )
        if self.last_seen is None:
            return (
                f"{self.scope} stopped before line {self.stopped_before_line} "
                "(none of its messages is in the log: it may not have run at all)"
            )
        return (
            f"{self.scope} stopped between line {self.stopped_after_line} "
            f"and line {self.stopped_before_line}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "scope": self.scope,
            "path": self.path,
            "summary": self.summary(),
            "stopped_after_line": self.stopped_after_line,
            "stopped_before_line": self.stopped_before_line,
            "last_seen": self.last_seen.to_json() if self.last_seen else None,
            "next_unseen": self.next_unseen.to_json() if self.next_unseen else None,
            "suspects": [s.to_json() for s in self.suspects],
            "checkpoints": [c.to_json() for c in self.checkpoints],
        }

    def render(self) -> str:
        lines = [self.summary()]
        if self.last_seen is not None:
            lines.append(f"  last message seen: {self.last_seen.checkpoint.render()}")
        if self.next_unseen is not None:
            lines.append(f"  first message missing: {self.next_unseen.checkpoint.render()}")
        lines += [f"  can raise in between: {s.render()}" for s in self.suspects]
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# message templates


def _percent_segments(text: str) -> Segments:
    out: Segments = []
    cursor = 0
    for match in _PERCENT.finditer(text):
        out.append(text[cursor : match.start()])
        out.append("%" if match.group(0) == "%%" else _PLACEHOLDER)
        cursor = match.end()
    out.append(text[cursor:])
    return out


def _brace_segments(text: str) -> Segments:
    out: Segments = []
    cursor = 0
    for match in _BRACES.finditer(text):
        out.append(text[cursor : match.start()])
        token = match.group(0)
        out.append(token[0] if token in ("{{", "}}") else _PLACEHOLDER)
        cursor = match.end()
    out.append(text[cursor:])
    return out


def _segments(expr: ast.expr, lazy_args: bool) -> Segments:
    """The literal and formatted parts of a message expression."""
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return _percent_segments(expr.value) if lazy_args else [expr.value]
    if isinstance(expr, ast.JoinedStr):
        out: Segments = []
        for part in expr.values:
            if isinstance(part, ast.Constant) and isinstance(part.value, str):
                out.append(part.value)
            else:
                out.append(_PLACEHOLDER)
        return out
    if (
        isinstance(expr, ast.BinOp)
        and isinstance(expr.op, ast.Mod)
        and isinstance(expr.left, ast.Constant)
        and isinstance(expr.left.value, str)
    ):
        return _percent_segments(expr.left.value)
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
        return _segments(expr.left, lazy_args) + _segments(expr.right, lazy_args)
    if (
        isinstance(expr, ast.Call)
        and isinstance(expr.func, ast.Attribute)
        and expr.func.attr == "format"
        and isinstance(expr.func.value, ast.Constant)
        and isinstance(expr.func.value.value, str)
    ):
        return _brace_segments(expr.func.value.value)
    return [_PLACEHOLDER]


def message_pattern(expr: ast.expr, lazy_args: bool = False) -> tuple[str, str] | None:
    """(readable template, regular expression) for a log message expression, or None when it has
    too little literal text to recognise. Only the message's first line is used (a log line is
    matched one line at a time). `lazy_args`: the call passes arguments for `%` formatting."""
    segments = _segments(expr, lazy_args)
    first: Segments = []
    for segment in segments:
        if segment is not None and "\n" in segment:
            head = segment.split("\n", 1)[0]
            if head or first:
                first.append(head)
                break
            continue  # a message that starts with a newline: its first line is the next one
        first.append(segment)
    merged: Segments = []
    for segment in first:
        if segment is None and merged and merged[-1] is None:
            continue
        merged.append(segment)
    while merged and (merged[-1] is None or merged[-1] == ""):
        merged.pop()  # a trailing wildcard adds nothing to a search
    while merged and (merged[0] is None or merged[0] == ""):
        merged.pop(0)
    literal = sum(len(s.strip()) for s in merged if s is not None)
    if literal < MIN_LITERAL_CHARS:
        return None
    template = "".join("{…}" if s is None else s for s in merged)
    pattern = "".join(".*?" if s is None else re.escape(s) for s in merged)
    return template, pattern


def log_message(call: ast.Call) -> tuple[str, str] | None:
    """The (template, pattern) of a logging call, or None when `call` does not log."""
    func = call.func
    name = dotted_name(func) or ""
    args = list(call.args)
    message: ast.expr | None = None
    lazy = False
    if isinstance(func, ast.Attribute) and func.attr in _LOG_METHODS | {"log"}:
        owner = (dotted_name(func.value) or "").lower()
        if "log" in owner:
            index = 1 if func.attr == "log" else 0
            message = args[index] if len(args) > index else None
            lazy = len(args) > index + 1
    elif name == "print":
        message = args[0] if args else None
    elif name.rsplit(".", 1)[-1].startswith("log_") or "_log" in name:
        # SGLang's helpers take the logger first: log_info_on_rank0(logger, "msg")
        if args and "log" in (dotted_name(args[0]) or "").lower():
            args = args[1:]
        message = args[0] if args else None
        lazy = len(args) > 1
    if message is None:
        return None
    return message_pattern(message, lazy)


# ---------------------------------------------------------------------------------------------
# checkpoints


class _Resolver:
    """Finds the function a call runs, among the given sources."""

    def __init__(self, graph: ClassGraph) -> None:
        self.graph = graph
        self.functions: dict[str, list[tuple[str, FunctionNode]]] = {}
        for path, tree in graph.trees.items():
            for stmt in tree.body:
                if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    self.functions.setdefault(stmt.name, []).append((path, stmt))

    def method(
        self, instance: ClassInfo, name: str, after: ClassInfo | None = None
    ) -> tuple[ClassInfo, FunctionNode] | None:
        order = self.graph.mro(instance)
        start = order.index(after) + 1 if after is not None and after in order else 0
        for owner in order[start:]:
            found = self.graph.methods(owner).get(name)
            if found is not None:
                return owner, found
        return None

    def resolve(
        self, call: ast.Call, path: str, self_var: str | None, instance: ClassInfo | None,
        owner: ClassInfo | None,
    ) -> tuple[str, str, FunctionNode, ClassInfo | None] | None:  # fmt: skip
        """(label, path, function, instance for `self` inside it) of what `call` runs."""
        name = dotted_name(call.func)
        if name is None:
            return None
        parts = name.split(".")
        if instance is not None and self_var is not None and len(parts) == 2:
            if parts[0] == self_var or parts[0] == "super()":
                found = self.method(instance, parts[1], owner if parts[0] == "super()" else None)
                if found is not None:
                    cls, func = found
                    return f"{cls.name}.{parts[1]}", cls.path, func, instance
            return None
        if len(parts) != 1:
            return None
        classes = self.graph.named(name, path) or self.graph.named(name)
        if len(classes) == 1:
            init = self.graph.init_owner(classes[0])
            if init is not None:
                _, cls = init
                return (
                    f"{cls.name}.__init__",
                    cls.path,
                    self.graph.methods(cls)["__init__"],
                    classes[0],
                )
            return None
        candidates = self.functions.get(name, [])
        same = [c for c in candidates if c[0] == path]
        pick = same or (candidates if len(candidates) == 1 else [])
        if pick:
            fpath, func = pick[0]
            return name, fpath, func, None
        return None


def _owner_of(graph: ClassGraph, func: FunctionNode) -> ClassInfo | None:
    for cls in graph.classes:
        if any(m is func for m in graph.methods(cls).values()):
            return cls
    return None


def _nested_messages(
    resolver: _Resolver, func: FunctionNode, path: str, instance: ClassInfo | None, depth: int,
    seen: set[int],
) -> list[tuple[str, str, str]]:  # fmt: skip
    """(template, pattern, where) of every log call a function makes, following its calls."""
    if depth > _MAX_DEPTH or id(func) in seen:
        return []
    seen = seen | {id(func)}
    owner = _owner_of(resolver.graph, func)
    label = f"{owner.name}.{func.name}" if owner else func.name
    out: list[tuple[str, str, str]] = []
    for call in calls_when_run(func):
        message = log_message(call)
        if message is not None:
            out.append((message[0], message[1], label))
            continue
        target = resolver.resolve(call, path, self_name(func), instance, owner)
        if target is not None:
            _, tpath, tfunc, tinstance = target
            out += _nested_messages(resolver, tfunc, tpath, tinstance, depth + 1, seen)
    return out


def init_checkpoints(
    graph: ClassGraph, instance: ClassInfo, owner: ClassInfo
) -> tuple[LogCheckpoint, ...]:
    """The log checkpoints of `owner.__init__` when constructing an `instance` (source order)."""
    init = graph.methods(owner)["__init__"]
    resolver = _Resolver(graph)
    self_var = self_name(init)
    checkpoints: list[LogCheckpoint] = []
    for stmt in init.body:
        for call in calls_when_run(stmt):
            message = log_message(call)
            if message is not None:
                checkpoints.append(LogCheckpoint(call.lineno, message[0], message[1], None, True))
                continue
            target = resolver.resolve(call, owner.path, self_var, instance, owner)
            if target is None:
                continue
            label, tpath, tfunc, tinstance = target
            for template, pattern, where in _nested_messages(
                resolver, tfunc, tpath, tinstance, 1, {id(init)}
            ):
                via = label if where == label else f"{label} -> {where}"
                checkpoints.append(LogCheckpoint(first_line(stmt), template, pattern, via, False))
    return tuple(checkpoints)


def _between(
    line: int, last_seen: CheckedCheckpoint | None, next_unseen: CheckedCheckpoint | None
) -> bool:
    """Whether the statement starting at `line` may be where `__init__` stopped: after the last
    proven point (at it, when that point only proves the line was entered) and before the next
    missing message (at it, when its message would come from inside a call on that line, which
    may have raised before logging)."""
    if last_seen is not None:
        low = last_seen.checkpoint.line
        if line < low or (line == low and last_seen.checkpoint.passed):
            return False
    if next_unseen is not None:
        high = next_unseen.checkpoint.line
        if line > high or (line == high and next_unseen.checkpoint.passed):
            return False
    return True


def init_progress(
    graph: ClassGraph,
    instance: ClassInfo,
    owner: ClassInfo,
    log_text: str,
    ignore_calls: Sequence[str] = DEFAULT_IGNORED_CALLS,
) -> InitProgress:
    """How far `owner.__init__` got when building an `instance`, judged by `log_text` (the log
    since the server started). See the module docstring."""
    init = graph.methods(owner)["__init__"]
    log_lines = log_text.splitlines()
    checked = []
    for checkpoint in init_checkpoints(graph, instance, owner):
        regex = re.compile(checkpoint.pattern)
        hits = [line for line in log_lines if regex.search(line)]
        checked.append(
            CheckedCheckpoint(checkpoint, bool(hits), hits[-1].strip()[:200] if hits else None)
        )
    ordered = sorted(
        enumerate(checked),
        key=lambda item: (item[1].checkpoint.line, item[1].checkpoint.passed, item[0]),
    )
    position = {id(c): rank for rank, (_, c) in enumerate(ordered)}
    seen = [c for c in checked if c.seen]
    last_seen = max(seen, key=lambda c: position[id(c)]) if seen else None
    after = position[id(last_seen)] if last_seen else -1
    next_unseen = next(
        (c for _, c in ordered if not c.seen and position[id(c)] > after
         and (last_seen is None or c.checkpoint.line > last_seen.checkpoint.line
              or (c.checkpoint.passed and not last_seen.checkpoint.passed))),
        None,
    )  # fmt: skip
    suspects = tuple(
        d
        for stmt in init.body
        if (d := describe_statement(stmt, ignore_calls)).calls
        and _between(d.line, last_seen, next_unseen)
    )
    return InitProgress(
        scope=f"{owner.name}.__init__",
        path=owner.path,
        init_line=first_line(init),
        end_line=last_line(init),
        checkpoints=tuple(checked),
        last_seen=last_seen,
        next_unseen=next_unseen,
        suspects=suspects,
    )
