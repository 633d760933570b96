"""The golden-pair check every edit-engine test shares: apply gives the expected bytes, applying
again is already-applied with the bytes unchanged, the record reverses to the exact pre-image
(the unpatched file plans as not applied), and `unapply` (no record) gives the pre-image back
where the edit kinds allow it and refuses where they do not. Also the cases, and the generated
modules (a hypothesis strategy), that more than one edit test reads."""

from __future__ import annotations

from hypothesis import strategies as st

from opspatch.core.edit import (
    AlreadyApplied,
    Applied,
    NotApplicable,
    apply_patch,
    detect,
    reverse,
    unapply,
)
from opspatch.core.kinds import KINDS
from opspatch.core.spec import PatchSpec
from tests.patchkit import src

UNDONE_FROM_TEXT = frozenset(kind for kind, model in KINDS.items() if model.undone_from_text)
"""The edit kinds `unapply` removes from the patched text alone (each kind says so); the others
are undone from the recorded pre-image."""


def assert_golden(before: bytes, patch: PatchSpec, expected: bytes) -> Applied:
    """Apply `patch` to `before`, expecting `expected`; re-apply, reverse and unapply it (see
    module)."""
    assert detect(before, patch).state == "not-applied"
    outcome = apply_patch(before, patch)
    assert isinstance(outcome, Applied), getattr(outcome, "reason", outcome)
    assert outcome.new_source == expected, "\n" + outcome.new_source.decode("utf-8", "replace")
    again = apply_patch(outcome.new_source, patch)
    assert isinstance(again, AlreadyApplied), again
    assert detect(outcome.new_source, patch).state == "applied"
    assert reverse(outcome) == before
    undone = unapply(outcome.new_source, patch)
    if all(edit.kind in UNDONE_FROM_TEXT for edit in patch.edits):
        assert not isinstance(undone, NotApplicable), undone.reason
        assert undone.old_source == before
    else:
        assert isinstance(undone, NotApplicable), undone
    return outcome


DIFF_BEFORE = src(
    """
    import logging

    logger = logging.getLogger(__name__)


    def build(worker_cls, args):
        worker = worker_cls.__new__(worker_cls)
        try:
            worker.__init__(args)
        except Exception as exc:
            logger.warning("CUDA graph capture failed: %s; falling back", exc)
        return worker
    """
)


DIFF_PATCH = '''
[[edits]]
kind = "diff"
diff = """
--- a/pkg/mod.py
+++ b/pkg/mod.py
@@ -6,7 +6,8 @@
 def build(worker_cls, args):
     worker = worker_cls.__new__(worker_cls)
     try:
         worker.__init__(args)
     except Exception as exc:
         logger.warning("CUDA graph capture failed: %s; falling back", exc)
+        raise
     return worker
"""
'''


NAMES = st.sampled_from(["a", "b", "count", "value", "total", "flag"])


@st.composite
def simple_statement(draw: st.DrawFn, owner: str) -> list[str]:
    name = draw(NAMES)
    number = draw(st.integers(0, 99))
    choice = draw(st.integers(0, 5))
    if choice == 0:
        return [f"{owner}{name} = {number}"]
    if choice == 1:
        return [f"{owner}{name} = compute({number})  # trailing comment"]
    if choice == 2:
        return [f"log({name!r})"]
    if choice == 3:
        return ["# a comment line"]
    if choice == 4:
        return [""]
    return [f"{owner}{name} = (", f"    {number},", ")"]


@st.composite
def block(draw: st.DrawFn, owner: str, depth: int = 0) -> list[tuple[int, str]]:
    """(relative indent level, text) lines of a block body; never empty of statements."""
    lines: list[tuple[int, str]] = []
    for _ in range(draw(st.integers(1, 4))):
        if depth < 1 and draw(st.booleans()) and draw(st.booleans()):
            lines.append((0, f"if {draw(NAMES)}:"))
            lines += [(level + 1, text) for level, text in draw(block(owner, depth + 1))]
        else:
            lines += [(0, text) for text in draw(simple_statement(owner))]
    lines.append((0, f"{owner}last = {draw(st.integers(0, 9))}"))
    return lines


@st.composite
def module_source(draw: st.DrawFn) -> tuple[bytes, str]:
    newline = draw(st.sampled_from(["\n", "\r\n"]))
    unit = draw(st.sampled_from(["    ", "\t", "  "]))
    out: list[str] = []

    def emit(level: int, text: str) -> None:
        out.append((unit * level + text) if text else "")

    if draw(st.booleans()):
        emit(0, '"""A generated module."""')
    emit(0, "import os")
    emit(0, "")
    for i in range(draw(st.integers(0, 2))):
        if draw(st.booleans()):
            emit(0, "@decorate")
        prefix = "async def" if draw(st.booleans()) else "def"
        emit(0, f"{prefix} helper_{i}(x):")
        for level, text in draw(block("")):
            emit(1 + level, text)
        emit(0, "")
    emit(0, "class Target(Base):")
    if draw(st.booleans()):
        emit(1, '"""The class under patch."""')
    if draw(st.booleans()):
        emit(1, "kind = 'target'")
    emit(1, "def __init__(self, args):")
    if draw(st.booleans()):
        emit(2, '"""Initialise."""')
    if draw(st.booleans()):
        emit(2, "super().__init__()")
    if draw(st.booleans()):
        emit(2, "# Parse arguments")
    for level, text in draw(block("self.")):
        emit(2 + level, text)
    emit(2, "self.anchor_call()")
    emit(2, "with self.lock, open_stream(size=4):")
    emit(3, "self.ready = True")
    for level, text in draw(block("self.")):
        emit(2 + level, text)
    emit(0, "")
    emit(1, "def other(self):")
    for level, text in draw(block("self.")):
        emit(2 + level, text)
    source = newline.join(out) + (newline if draw(st.booleans()) else "")
    return source.encode("utf-8"), newline
