"""Parsing Python without letting a hostile or generated input crash opspatch."""

from __future__ import annotations

import ast
import contextlib
import gc
import io
import threading
import tokenize
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, overload

MAX_AST_DEPTH = 150
"""Deepest syntax tree accepted. Real code stays below it (the deepest file of the standard
library and of torch is under 100 levels); the walks after parsing (`copy.deepcopy`, the node
transformers) take several of Python's 1000 frames per level and fail from about 250 levels."""


_PARSE = threading.Lock()
"""One `ast.parse` at a time in this process. CPython 3.11 (and 3.12 before its fix for
gh-106905) keeps the recursion depth of the C-to-Python tree conversion in per-interpreter
state, so two threads parsing at once (the preflight plans hosts in parallel) can fail with
`SystemError: AST constructor recursion depth mismatch`. Seen in a dry run over three hosts;
parsing is a few milliseconds, so serialising it costs nothing that matters."""


SAME_TREE_FROM = (3, 7)
"""A text parsed for Python 3.7 or later (`feature_version`) that parses gives this Python's own
tree: a feature version only refuses newer syntax (before 3.7, `async` and `await` were names).
So one parse for a patch's `min_python` can serve as the tree too (issue 44)."""


class NestingTooDeep(SyntaxError):
    """Code nested too deeply for Python's parser, or for the analysis that follows it."""


@overload
def parse_python(
    source: str | bytes,
    filename: str = "<unknown>",
    *,
    mode: Literal["exec"] = "exec",
    feature_version: tuple[int, int] | None = None,
    max_depth: int | None = MAX_AST_DEPTH,
) -> ast.Module: ...


@overload
def parse_python(
    source: str | bytes,
    filename: str = "<unknown>",
    *,
    mode: Literal["eval"],
    feature_version: tuple[int, int] | None = None,
    max_depth: int | None = MAX_AST_DEPTH,
) -> ast.Expression: ...


def parse_python(
    source: str | bytes,
    filename: str = "<unknown>",
    *,
    mode: Literal["exec", "eval"] = "exec",
    feature_version: tuple[int, int] | None = None,
    max_depth: int | None = MAX_AST_DEPTH,
) -> ast.Module | ast.Expression:
    """`ast.parse`, refusing code nested deeper than `max_depth` (`MAX_AST_DEPTH`; less for a
    part of a file parsed on its own, which sits deeper in the whole file's tree; None: code
    already checked, parsed again only for its positions).

    Raises:
        SyntaxError: the code does not parse; `NestingTooDeep` when it is nested too deeply.
    """
    with _PARSE:
        tree = _parse_without_collection(source, filename, mode, feature_version, max_depth)
    assert isinstance(tree, ast.Module | ast.Expression)
    return tree


def _parse_without_collection(
    source: str | bytes,
    filename: str,
    mode: Literal["exec", "eval"],
    feature_version: tuple[int, int] | None,
    max_depth: int | None,
) -> ast.AST:
    """`ast.parse` and the depth check with the cyclic garbage collector paused: a syntax tree
    has no cycles, but its tens of thousands of new nodes (and the check's level lists) trigger
    collections that traverse every tree still alive (about 40% of the parse of a 6,000-line
    file, and a fifth of the check). Called under `_PARSE`.

    Raises:
        NestingTooDeep: as `parse_python`.
    """
    with collection_paused():
        try:
            tree = ast.parse(source, filename, mode, feature_version=feature_version)
        except (RecursionError, MemoryError):
            raise NestingTooDeep(
                "nested too deeply for Python's parser (a very long or very deep expression)"
            ) from None
        if max_depth is not None:
            _check_depth(tree, max_depth)
        return tree


def compile_parsed(tree: ast.Module, filename: str) -> None:
    """Compile a tree `parse_python` made, for the compiler's errors only (`SyntaxError`), without
    parsing its text again. Under `_PARSE`: CPython 3.11 converts the tree back with the same
    per-interpreter depth count as the parse's."""
    with _PARSE:
        compile(tree, filename, "exec", dont_inherit=True)


_WARNING_FILTERS = threading.Lock()
"""`warnings.catch_warnings` saves and restores the process-wide filter list; two threads doing
it at once (the preflight plans hosts in parallel) can restore each other's state and leave
warnings ignored for good. Every use holds this lock (`warnings_ignored`)."""


@contextlib.contextmanager
def warnings_ignored() -> Iterator[None]:
    """Warnings ignored for a stretch of work that compiles code not ours (its SyntaxWarnings are
    upstream's), the filters restored after it; one such stretch at a time in this process."""
    with _WARNING_FILTERS, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """The cyclic garbage collector paused (if it ran) for a stretch of work that makes many
    objects and no cycles: syntax trees, and a plan that parses and compares them."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def _check_depth(tree: ast.AST, max_depth: int) -> None:
    # Level by level, `ast.iter_child_nodes` inlined: this walk visits every node of every parse.
    AST, listtype = ast.AST, list
    level: list[ast.AST] = [tree]
    depth = 1
    while level:
        if depth > max_depth:
            error = NestingTooDeep(
                f"nested more than {MAX_AST_DEPTH} levels deep (a very long or very deep "
                "expression); opspatch does not analyse code this deep"
            )
            # the node a depth-first walk taking the last child first meets first
            error.lineno = getattr(level[-1], "lineno", None)
            raise error
        below: list[ast.AST] = []
        push = below.append
        for node in level:
            for name in node._fields:
                value = getattr(node, name, None)
                if isinstance(value, AST):
                    push(value)
                elif isinstance(value, listtype):
                    for item in value:
                        if isinstance(item, AST):
                            push(item)
        level = below
        depth += 1


def string_lines(lines: Sequence[str]) -> frozenset[int]:
    """The indices of `lines` (Python code, one line each without its newline) that begin inside
    a string: the second and later lines of a multi-line string. Their text, leading whitespace
    included, is the string's own, so whoever re-indents the code must keep them as they are.

    Found by `tokenize`, which reads strings exactly as the parser does (triple quotes, a
    backslash before the newline, f-strings). Code that does not tokenize has none.
    """
    inside: set[int] = set()
    readline = io.StringIO("".join(line + "\n" for line in lines)).readline
    try:
        for token in tokenize.generate_tokens(readline):
            first, last = token.start[0], token.end[0]
            if first < last:  # only a string (or an f-string's text) spans lines
                inside.update(range(first, last))  # rows first+1 .. last, 0-based: first .. last-1
    except (tokenize.TokenError, SyntaxError):
        return frozenset()
    return frozenset(n for n in inside if n < len(lines))


@dataclass(frozen=True)
class CodeLines:
    """A snippet's lines, its common margin off, and which of them begin inside a string."""

    lines: tuple[str, ...]
    verbatim: frozenset[int]
    """Indices of `lines` that begin inside a multi-line string: kept byte for byte (never
    re-indented, stripped or emptied), since their whitespace belongs to the string."""

    @property
    def text(self) -> str:
        return "".join(line + "\n" for line in self.lines)


def dedent_code(code: str) -> CodeLines:
    """`code` as `textwrap.dedent` would give it, but never touching a string's contents: the
    leading and trailing blank lines off, the margin common to the code's own lines (a
    multi-line string's later lines aside) taken off those lines, which are right-stripped
    (but where a string goes on past the line's end), and whitespace-only lines emptied; the
    lines that begin inside a string are kept as written. So a docstring
    pasted from upstream keeps its exact value however its code is indented here."""
    lines = code.splitlines()
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    verbatim = string_lines(lines)
    own = [line for n, line in enumerate(lines) if n not in verbatim and line.strip()]
    margin = _common_margin(own)
    out = [
        line
        if n in verbatim
        else (line[len(margin) :] if line.strip() else "")
        if n + 1 in verbatim  # the line ends inside a string: its trailing blanks are the string's
        else (line[len(margin) :] if line.strip() else "").rstrip()
        for n, line in enumerate(lines)
    ]
    return CodeLines(tuple(out), verbatim)


def _common_margin(lines: Sequence[str]) -> str:
    """The leading whitespace every one of `lines` starts with (as `textwrap.dedent` finds it)."""
    margin: str | None = None
    for line in lines:
        indent = line[: len(line) - len(line.lstrip(" \t"))]
        if margin is None:
            margin = indent
            continue
        common = 0
        while common < min(len(margin), len(indent)) and margin[common] == indent[common]:
            common += 1
        margin = margin[:common]
    return margin or ""
