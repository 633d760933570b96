"""From an exception to the patches that declare they fix it (`fixes = [...]` in a patch file)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from opspatch.core.spec import PatchSpec

# The last line of a traceback: `Type: message` (a dotted type for exceptions outside builtins);
# the type's name must read like an exception's, so `Note: ...` is not taken for one.
_EXCEPTION_LINE = re.compile(
    r"^(?P<type>(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Warning|Timeout))"
    r"(?::\s?(?P<message>.*))?$"
)


@dataclass(frozen=True)
class RaisedException:
    """An exception as a log shows it: its type name and its message."""

    type_name: str
    message: str

    def render(self) -> str:
        return f"{self.type_name}: {self.message}"

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type_name, "message": self.message}


def parse_exception_line(line: str) -> RaisedException | None:
    """`AttributeError: 'X' object has no attribute 'y'` -> RaisedException; None for other text.

    Leading log decoration (`[2025-01-01 00:00:00 TP0] `) is not expected here: pass the
    traceback's last line.
    """
    match = _EXCEPTION_LINE.match(line.strip())
    if match is None:
        return None
    return RaisedException(match.group("type"), match.group("message") or "")


@dataclass(frozen=True)
class FixMatch:
    """A patch that declares it fixes an exception, and which of its `fixes` entries matched."""

    patch_id: str
    summary: str
    fix_index: int
    exception: str
    pattern: str

    def to_json(self) -> dict[str, Any]:
        return {
            "patch": self.patch_id,
            "summary": self.summary,
            "fix_index": self.fix_index,
            "exception": self.exception,
            "message_pattern": self.pattern,
        }

    def render(self) -> str:
        return f"{self.patch_id}: {self.summary} (fixes[{self.fix_index}] matches)"


def _type_matches(declared: str, raised: str) -> bool:
    return declared.rsplit(".", 1)[-1] == raised.rsplit(".", 1)[-1]


def patches_fixing(
    exception: RaisedException, patches: Iterable[PatchSpec]
) -> tuple[FixMatch, ...]:
    """The patches whose `fixes` declare this exception: the type by name (a dotted name matches
    by its last part) and the message by `re.search` of the declared pattern. One match per
    patch (its first matching entry), in the order the patches were given."""
    found = []
    for patch in patches:
        for index, fix in enumerate(patch.fixes):
            if _type_matches(fix.exception, exception.type_name) and re.search(
                fix.message, exception.message
            ):
                found.append(FixMatch(patch.id, patch.summary, index, fix.exception, fix.message))
                break
    return tuple(found)
