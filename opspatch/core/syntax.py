"""Parsing Python without letting a hostile or generated input crash opspatch.

`ast.parse` raises `RecursionError` or `MemoryError` (not `SyntaxError`) on very deep code,
such as `1+1+...` a hundred thousand terms long or `lambda: lambda: ...` nested thousands deep,
and a tree that does parse can still be too deep for the recursive walks that follow (`ast.dump`,
`compile`, the anchor code). `parse_python` turns all of these into `NestingTooDeep`, a
`SyntaxError`, so every caller's existing "does not parse" handling reports it as a problem at
the patch field or target file it came from.

Pure: text in, syntax tree out.
"""

from __future__ import annotations

import ast
import gc
import threading
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


class NestingTooDeep(SyntaxError):
    """Code nested too deeply for Python's parser, or for the analysis that follows it."""


@overload
def parse_python(
    source: str | bytes,
    filename: str = "<unknown>",
    *,
    mode: Literal["exec"] = "exec",
    feature_version: tuple[int, int] | None = None,
) -> ast.Module: ...


@overload
def parse_python(
    source: str | bytes,
    filename: str = "<unknown>",
    *,
    mode: Literal["eval"],
    feature_version: tuple[int, int] | None = None,
) -> ast.Expression: ...


def parse_python(
    source: str | bytes,
    filename: str = "<unknown>",
    *,
    mode: Literal["exec", "eval"] = "exec",
    feature_version: tuple[int, int] | None = None,
) -> ast.Module | ast.Expression:
    """`ast.parse`, refusing code nested deeper than `MAX_AST_DEPTH`.

    Raises:
        SyntaxError: the code does not parse; `NestingTooDeep` when it is nested too deeply.
    """
    with _PARSE:
        tree = _parse_without_collection(source, filename, mode, feature_version)
    assert isinstance(tree, ast.Module | ast.Expression)
    return tree


def _parse_without_collection(
    source: str | bytes,
    filename: str,
    mode: Literal["exec", "eval"],
    feature_version: tuple[int, int] | None,
) -> ast.AST:
    """`ast.parse` and the depth check with the cyclic garbage collector paused: a syntax tree
    has no cycles, but its tens of thousands of new nodes (and the check's level lists) trigger
    collections that traverse every tree still alive (about 40% of the parse of a 6,000-line
    file, and a fifth of the check). Called under `_PARSE`.

    Raises:
        NestingTooDeep: as `parse_python`.
    """
    collecting = gc.isenabled()
    gc.disable()
    try:
        try:
            tree = ast.parse(source, filename, mode, feature_version=feature_version)
        except (RecursionError, MemoryError):
            raise NestingTooDeep(
                "nested too deeply for Python's parser (a very long or very deep expression)"
            ) from None
        _check_depth(tree)
        return tree
    finally:
        if collecting:
            gc.enable()


def _check_depth(tree: ast.AST) -> None:
    # Level by level, `ast.iter_child_nodes` inlined: this walk visits every node of every parse.
    AST, listtype = ast.AST, list
    level: list[ast.AST] = [tree]
    depth = 1
    while level:
        if depth > MAX_AST_DEPTH:
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
