"""The size rule (docs/development.md): no module of `opspatch/` over 700 lines, and no function
over 80 lines (its `def` line to its last) without a one-line reason at the top of its body, a
comment `# Long because: ...` as its first line after the docstring.

Module docstrings stay short (issue 43): at most 60 words each, a drawing in a ``` fence aside
(the error tree of `errors.py`); the detail belongs in docs/.

Exempt only what is listed below, each with its reason; an exemption that no longer needs to be
listed fails as well, so the list only shrinks.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.pure

PACKAGE = Path(__file__).resolve().parent.parent / "opspatch"
MAX_MODULE_LINES = 700
MAX_FUNCTION_LINES = 80
REASON = "# Long because:"
MAX_DOCSTRING_WORDS = 60
NOT_OURS = ("sandbox/engine_src/", "sandbox/real/engine_files/")
"""The stand-in SGLang and the real sandbox's engine files: an engine's sources (their
docstrings and line numbers are the engine's), not opspatch's prose."""

EXEMPT_MODULES: dict[str, str] = {}
"""Modules allowed over the limit, by path from the repository root."""

EXEMPT_FUNCTIONS: dict[tuple[str, str], str] = {}
"""Functions allowed over the limit without a reason line, by (module path, function name)."""


def _has_reason(lines: list[str], function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A `# Long because: <reason>` comment between the signature (or the docstring) and the
    first statement of the body."""
    body = function.body
    first = body[0]
    starts_with_docstring = (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    )
    if starts_with_docstring:
        after = first.end_lineno or first.lineno
        until = body[1].lineno if len(body) > 1 else (function.end_lineno or after) + 1
    else:
        after, until = function.lineno, first.lineno
    comments = (line.strip() for line in lines[after : until - 1])
    return any(line.startswith(REASON) and line.removeprefix(REASON).strip() for line in comments)


def oversized(package: Path) -> tuple[list[str], list[str]]:
    """The modules over the limit and the long functions without a reason, under `package`
    (paths from the package's parent), exemptions aside; and the exemptions not needed."""
    root = package.parent
    found: list[str] = []
    needed: set[object] = set()
    for path in sorted(package.rglob("*.py")):
        name = path.relative_to(root).as_posix()
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        if len(lines) > MAX_MODULE_LINES:
            if name in EXEMPT_MODULES:
                needed.add(name)
            else:
                found.append(f"{name}: {len(lines)} lines (at most {MAX_MODULE_LINES})")
        for node in ast.walk(ast.parse(text, filename=name)):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length <= MAX_FUNCTION_LINES or _has_reason(lines, node):
                continue
            if (name, node.name) in EXEMPT_FUNCTIONS:
                needed.add((name, node.name))
            else:
                found.append(
                    f"{name}:{node.lineno}: {node.name} is {length} lines (at most "
                    f"{MAX_FUNCTION_LINES} without a '{REASON} ...' line at the top of its body)"
                )
    stale = [
        f"{exempt}: listed as exempt, but within the rule now; take it off the list"
        for exempt in [*EXEMPT_MODULES, *EXEMPT_FUNCTIONS]
        if exempt not in needed
    ]
    return found, stale


def test_no_module_or_function_of_opspatch_is_over_its_size_limit() -> None:
    found, stale = oversized(PACKAGE)
    assert not found + stale, "the size rule (split it, or give the reason):\n" + "\n".join(
        found + stale
    )


def _function(name: str, length: int, top: str = "") -> str:
    """A function of exactly `length` lines, `top` its body's first line after the docstring."""
    body = [f"    {top}"] if top else []
    body += ["    x = 1"] * (length - 2 - len(body))
    return "\n".join([f"def {name}() -> None:", '    """Doc."""', *body]) + "\n"


def test_the_rule_names_a_long_module_and_a_long_function_without_a_reason(
    tmp_path: Path,
) -> None:
    package = tmp_path / "opspatch"
    package.mkdir()
    (package / "big.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    (package / "fns.py").write_text(
        _function("at_limit", MAX_FUNCTION_LINES)
        + _function("too_long", MAX_FUNCTION_LINES + 1)
        + _function("explained", MAX_FUNCTION_LINES + 1, f"{REASON} one table, read in order")
        + _function("empty_reason", MAX_FUNCTION_LINES + 1, REASON)
    )
    found, _ = oversized(package)
    assert [line.split(" ")[0] for line in found] == [
        "opspatch/big.py:",
        "opspatch/fns.py:81:",
        "opspatch/fns.py:243:",
    ]
    assert "too_long is 81 lines" in found[1]
    assert "empty_reason" in found[2]


def test_a_reason_line_counts_without_a_docstring_and_not_further_down(tmp_path: Path) -> None:
    package = tmp_path / "opspatch"
    package.mkdir()
    filler = ["    x = 1"] * MAX_FUNCTION_LINES
    (package / "fns.py").write_text(
        "\n".join(["def plain() -> None:", f"    {REASON} mirrors upstream", *filler])
        + "\n"
        + "\n".join(["def buried() -> None:", "    x = 0", f"    {REASON} too late", *filler])
        + "\n"
    )
    found, _ = oversized(package)
    assert len(found) == 1 and "buried" in found[0]


def long_docstrings(package: Path) -> list[str]:
    """The modules under `package` whose docstring is over `MAX_DOCSTRING_WORDS` words, not
    counting what stands in a ``` fence (a drawing)."""
    found = []
    for path in sorted(package.rglob("*.py")):
        if any(part in path.as_posix() for part in NOT_OURS):
            continue
        docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        prose = docstring.split("```")[::2]
        words = sum(len(part.split()) for part in prose)
        if words > MAX_DOCSTRING_WORDS:
            name = path.relative_to(package.parent).as_posix()
            found.append(f"{name}: {words} words (at most {MAX_DOCSTRING_WORDS})")
    return found


def test_every_module_docstring_of_opspatch_is_short() -> None:
    found = long_docstrings(PACKAGE)
    assert not found, "say why in a few lines; the rest goes to docs/:\n" + "\n".join(found)


def test_the_docstring_rule_counts_prose_and_not_a_drawing(tmp_path: Path) -> None:
    package = tmp_path / "opspatch"
    package.mkdir()
    words = " ".join(["word"] * MAX_DOCSTRING_WORDS)
    (package / "short.py").write_text(f'"""{words}"""\n')
    (package / "essay.py").write_text(f'"""{words} more."""\n')
    (package / "drawn.py").write_text(f'"""{words}\n\n```\nA\n└── B  a drawing\n```\n"""\n')
    assert long_docstrings(package) == [
        f"opspatch/essay.py: {MAX_DOCSTRING_WORDS + 1} words (at most 60)"
    ]
