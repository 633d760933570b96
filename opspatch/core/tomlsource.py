"""Load TOML files so that every later error can name the file, the line and the field."""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from opspatch.core.fileschema import MAX_NESTING, FieldPath, check_nesting, format_field_path
from opspatch.errors import Location, SpecError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = [
    "FieldPath",
    "TomlDocument",
    "format_field_path",
    "locate_lines",
    "parse_field_path",
    "parse_toml",
]

_BARE_KEY = r"[A-Za-z0-9_-]+"
_KEY = rf'(?:{_BARE_KEY}|"(?:[^"\\]|\\.)*"|\'[^\']*\')'
_DOTTED_KEY = rf"{_KEY}(?:\s*\.\s*{_KEY})*"
_HEADER_RE = re.compile(rf"^\s*(\[\[?)\s*({_DOTTED_KEY})\s*\]\]?\s*(?:#.*)?$")
_KEYVAL_RE = re.compile(rf"^\s*({_DOTTED_KEY})\s*=\s*(.*)$")
_INLINE_KEY_RE = re.compile(rf"(?:^|[{{,])\s*({_DOTTED_KEY})\s*=")


def _split_dotted(dotted: str) -> list[str]:
    parts = re.findall(_KEY, dotted)
    return [p[1:-1] if p[:1] in "\"'" else p for p in parts]


@dataclass
class _Locator:
    lines: dict[FieldPath, int] = field(default_factory=dict)
    array_counts: dict[tuple[str | int, ...], int] = field(default_factory=dict)

    def header_path(self, names: list[str], is_array: bool) -> FieldPath:
        path: list[str | int] = []
        for i, name in enumerate(names):
            path.append(name)
            last = i == len(names) - 1
            count = self.array_counts.get(tuple(path))
            if last and is_array:
                new = (count or 0) + 1
                self.array_counts[tuple(path)] = new
                path.append(new - 1)
            elif count is not None:
                path.append(count - 1)
        return tuple(path)


def locate_lines(text: str) -> dict[FieldPath, int]:
    """Map every written key path in a TOML document to its 1-based line number."""
    loc = _Locator()
    current: FieldPath = ()
    in_multiline: str | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw
        if in_multiline is not None:
            if line.count(in_multiline) % 2 == 1:
                in_multiline = None
            continue
        header = _HEADER_RE.match(line)
        if header:
            current = loc.header_path(_split_dotted(header.group(2)), header.group(1) == "[[")
            loc.lines.setdefault(current, number)
            continue
        keyval = _KEYVAL_RE.match(line)
        if not keyval:
            continue
        key_path = current + tuple(_split_dotted(keyval.group(1)))
        loc.lines.setdefault(key_path, number)
        value = keyval.group(2)
        for quote in ('"""', "'''"):
            if value.lstrip().startswith(quote) and value.count(quote) % 2 == 1:
                in_multiline = quote
                break
        if value.lstrip().startswith("{"):
            for inner in _INLINE_KEY_RE.finditer(value):
                loc.lines.setdefault(key_path + tuple(_split_dotted(inner.group(1))), number)
    return loc.lines


@dataclass(frozen=True)
class TomlDocument:
    """A parsed TOML file with its text, so problems can be reported at file:line."""

    path: str
    text: str
    data: dict[str, Any]
    _lines: dict[FieldPath, int] = field(default_factory=dict, repr=False, compare=False)

    def line_of(self, field_path: Sequence[str | int]) -> int:
        """The line where `field_path` (or its nearest written ancestor) is written.

        A top-level key that is not written at all (a missing field) is reported at line 1.
        """
        path = tuple(field_path)
        while path:
            if path in self._lines:
                return self._lines[path]
            path = path[:-1]
        return 1 if self.text else 0

    def location(self, field_path: Sequence[str | int]) -> Location:
        return Location(self.path, self.line_of(field_path), format_field_path(field_path))

    def error(
        self, field_path: Sequence[str | int], problem: str, *, hint: str | None = None
    ) -> SpecError:
        """A SpecError pointing at `field_path` in this document."""
        return SpecError(self.location(field_path), problem, hint=hint)


def first_line_nested_deeper_than(text: str, depth: int) -> int:
    """The first line where brackets and braces (counted naively) open more than `depth` deep,
    or 0: where to point when a parser gives up on nesting without saying where."""
    level = 0
    for number, line in enumerate(text.splitlines(), start=1):
        for char in line:
            if char in "[{":
                level += 1
                if level > depth:
                    return number
            elif char in "]}":
                level = max(0, level - 1)
    return 0


def parse_toml(text: str, path: str) -> TomlDocument:
    """Parse TOML text; a syntax error becomes a SpecError with the parser's line.

    Raises:
        SpecError: the text is not valid TOML, or is nested more than `MAX_NESTING` deep.
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        match = re.search(r"line (\d+)", str(exc))
        line = int(match.group(1)) if match else 0
        problem = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(exc))
        raise SpecError(
            Location(path, line), f"malformed TOML: {problem}", hint="fix the syntax at that line"
        ) from None
    except (RecursionError, MemoryError):
        # tomllib parses nested arrays and inline tables recursively
        raise SpecError(
            Location(path, first_line_nested_deeper_than(text, MAX_NESTING)),
            f"arrays or inline tables nested more than {MAX_NESTING} levels deep",
            hint="no opspatch file needs that; is the file generated or damaged?",
        ) from None
    document = TomlDocument(path=path, text=text, data=data, _lines=locate_lines(text))
    check_nesting(data, document)
    return document


def parse_field_path(text: str) -> FieldPath:
    """`edits[1].anchor` -> `("edits", 1, "anchor")` (the inverse of `format_field_path`)."""
    path: list[str | int] = []
    for part in re.finditer(r"([^.\[\]]+)|\[(\d+)\]", text):
        if part.group(1) is not None:
            path.append(part.group(1))
        else:
            path.append(int(part.group(2)))
    return tuple(path)
