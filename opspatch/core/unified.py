"""Unified diffs applied by context, the way GNU patch does it, but refusing to guess."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Hunk:
    """One hunk: where it claims to start (1-based) and its lines tagged ' ', '-' or '+'."""

    source_start: int
    lines: tuple[tuple[str, str], ...]

    @property
    def old_lines(self) -> list[str]:
        return [text for tag, text in self.lines if tag in " -"]

    @property
    def new_lines(self) -> list[str]:
        return [text for tag, text in self.lines if tag in " +"]

    def leading_context(self) -> int:
        count = 0
        for tag, _ in self.lines:
            if tag != " ":
                break
            count += 1
        return count

    def trailing_context(self) -> int:
        count = 0
        for tag, _ in reversed(self.lines):
            if tag != " ":
                break
            count += 1
        return count

    def reversed(self) -> Hunk:
        swap = {" ": " ", "-": "+", "+": "-"}
        return Hunk(self.source_start, tuple((swap[tag], text) for tag, text in self.lines))


@dataclass(frozen=True)
class ParsedDiff:
    source_path: str
    target_path: str
    hunks: tuple[Hunk, ...]

    def reversed(self) -> ParsedDiff:
        return ParsedDiff(
            self.target_path, self.source_path, tuple(h.reversed() for h in self.hunks)
        )


def _strip_prefix(path: str) -> str:
    return path[2:] if path[:2] in ("a/", "b/") else path


_HUNK_HEADER_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def normalize_hunks(text: str) -> str:
    """Check hunk line counts against their headers and restore blank context lines.

    Editors strip the single space of an empty context line; GNU patch accepts that, so do we.
    A hunk with more body lines than its header counts is an error here: silently ignoring the
    extra lines (as a lenient parser may) would apply a different change than the one reviewed.

    Raises:
        ValueError: a hunk's body does not match its header's counts.
    """
    out: list[str] = []
    old_left = new_left = 0
    hunk_number = 0
    header = ""
    for line in text.splitlines():
        match = _HUNK_HEADER_RE.match(line)
        if match:
            if old_left or new_left:
                raise ValueError(
                    f"hunk {hunk_number} ({header}) has fewer lines than its header says"
                )
            hunk_number += 1
            header = match.group(0)
            old_left = int(match.group(2) or 1) if match.group(2) != "0" else 0
            new_left = int(match.group(4) or 1) if match.group(4) != "0" else 0
            out.append(line)
            continue
        if old_left or new_left:
            if line == "":
                line = " "
            tag = line[:1]
            if tag == " ":
                old_left -= 1
                new_left -= 1
            elif tag == "-":
                old_left -= 1
            elif tag == "+":
                new_left -= 1
            elif tag != "\\":
                raise ValueError(
                    f"hunk {hunk_number} ({header}): line {line!r} is not ' ', '-' or '+'"
                )
            if old_left < 0 or new_left < 0:
                raise ValueError(
                    f"hunk {hunk_number} ({header}) has more lines than its header says"
                )
            out.append(line)
            continue
        if hunk_number and line[:1] in (" ", "+", "-") and not line.startswith(("--- ", "+++ ")):
            raise ValueError(
                f"hunk {hunk_number} ({header}) has more lines than its header says: {line!r}"
            )
        out.append(line)
    if old_left or new_left:
        raise ValueError(f"hunk {hunk_number} ({header}) has fewer lines than its header says")
    return "\n".join(out) + "\n"


def parse_unified_diff(text: str) -> ParsedDiff:
    """Parse a unified diff for exactly one file.

    Raises:
        ValueError: not a unified diff, a hunk whose body does not match its header, no hunks,
            or more than one file.
    """
    text = normalize_hunks(text)
    # here, not with the module: only a patch with a diff needs it (its patterns compile at import)
    from unidiff import PatchSet  # type: ignore[attr-defined]
    from unidiff.errors import UnidiffParseError

    try:
        patch_set = PatchSet(text)
    except UnidiffParseError as exc:
        raise ValueError(f"not a valid unified diff: {exc}") from None
    if len(patch_set) != 1:
        raise ValueError(
            f"a diff edit must change exactly one file (this one changes {len(patch_set)})"
        )
    patched = patch_set[0]
    hunks = []
    for hunk in patched:
        lines = tuple(
            (line.line_type, line.value.rstrip("\r\n"))
            for line in hunk
            if line.line_type in (" ", "-", "+")
        )
        hunks.append(Hunk(hunk.source_start, lines))
    if not hunks:
        raise ValueError("the diff has no hunks")
    return ParsedDiff(
        _strip_prefix(patched.source_file), _strip_prefix(patched.target_file), tuple(hunks)
    )


@dataclass(frozen=True)
class LineReplacement:
    """Replace old lines [start, end) (0-based) following `ops`.

    `ops` are the hunk's tagged lines (context trimmed by fuzz): ' ' keeps the next old line as it
    is in the file (its own line ending included), '-' drops it, '+' adds a new line. Keeping
    context lines from the file, not from the diff, is what keeps unrelated bytes identical.
    """

    start: int
    end: int
    ops: tuple[tuple[str, str], ...]

    @property
    def new_lines(self) -> list[str]:
        return [text for tag, text in self.ops if tag in " +"]


@dataclass(frozen=True)
class HunkFailure:
    """Why a hunk could not be placed: `kind` is `not-found`, `ambiguous` or `too-far`."""

    hunk_index: int
    kind: str
    message: str
    places: tuple[int, ...] = ()


def _find_all(lines: Sequence[str], pattern: Sequence[str]) -> list[int]:
    n = len(pattern)
    if n == 0:
        return []
    first = pattern[0]
    return [
        i
        for i in range(len(lines) - n + 1)
        if lines[i] == first and list(lines[i : i + n]) == list(pattern)
    ]


def plan_hunks(
    lines: Sequence[str], diff: ParsedDiff, *, max_offset: int, fuzz: int
) -> list[LineReplacement] | HunkFailure:
    """Place every hunk of `diff` in `lines` (without line endings).

    Returns the replacements in order, or the first hunk that cannot be placed and why.
    """
    replacements: list[LineReplacement] = []
    delta = 0
    floor = 0  # hunks must not overlap or go backwards
    for index, hunk in enumerate(diff.hunks):
        placed: LineReplacement | None = None
        failure: HunkFailure | None = None
        for level in range(fuzz + 1):
            drop_head = min(level, hunk.leading_context())
            drop_tail = min(level, hunk.trailing_context())
            old = hunk.old_lines
            pattern = old[drop_head : len(old) - drop_tail]
            if not pattern:
                failure = HunkFailure(
                    index, "not-found", f"hunk {index + 1} has no lines to anchor on"
                )
                break
            expected = max(hunk.source_start - 1, 0) + delta + drop_head
            matches = [m for m in _find_all(lines, pattern) if m >= floor]
            if not matches:
                continue
            if len(matches) > 1:
                failure = HunkFailure(
                    index,
                    "ambiguous",
                    f"hunk {index + 1} matches {len(matches)} places (lines "
                    + ", ".join(str(m + 1) for m in matches)
                    + "); add context lines so it matches one",
                    tuple(m + 1 for m in matches),
                )
                break
            where = matches[0]
            if abs(where - expected) > max_offset:
                failure = HunkFailure(
                    index,
                    "too-far",
                    f"hunk {index + 1} matches at line {where + 1}, {abs(where - expected)} lines from "
                    f"where it claims to be (max_offset {max_offset})",
                    (where + 1,),
                )
                break
            ops = hunk.lines[drop_head : len(hunk.lines) - drop_tail]
            placed = LineReplacement(where, where + len(pattern), ops)
            delta = where - drop_head - max(hunk.source_start - 1, 0)
            floor = where + len(pattern)
            break
        if placed is None:
            return failure or HunkFailure(
                index,
                "not-found",
                f"hunk {index + 1} (at line {hunk.source_start}) does not match: its context is not in "
                f"the file even with fuzz {fuzz}",
            )
        replacements.append(placed)
    return replacements
