"""What the edit engine keeps to go fast (issue 20) gives the answers it gave without it: each
tree's definitions are walked once and belong to that tree alone, and lines split in C are the
lines Python's tokenizer counts."""

from __future__ import annotations

import ast
import gc
import random
import re
import weakref

import pytest

from opspatch.core import anchors
from opspatch.core.anchors import iter_definitions, resolve_scope
from opspatch.core.source import LineIndex, split_lines

pytestmark = pytest.mark.pure

CODE = """
class A:
    def f(self):
        pass

    class B:
        def g(self):
            if x:
                def h():
                    pass
"""


def test_a_tree_is_walked_once_however_many_scopes_are_resolved(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    walked: list[ast.stmt] = []
    real = anchors.child_blocks

    def counting(stmt: ast.stmt) -> list[list[ast.stmt]]:
        walked.append(stmt)
        return real(stmt)

    monkeypatch.setattr(anchors, "child_blocks", counting)
    tree = ast.parse(CODE)
    names = [name for name, _ in iter_definitions(tree)]
    once = len(walked)
    assert once > 0
    for name in names * 3:
        resolve_scope(tree, name)
    assert len(walked) == once


def test_each_tree_resolves_to_its_own_nodes() -> None:
    first, second = ast.parse(CODE), ast.parse(CODE)
    for name in ("A", "A.f", "A.B.g", "A.B.g.h"):
        assert resolve_scope(first, name).node is not resolve_scope(second, name).node
    assert resolve_scope(second, "A").node is second.body[0]
    assert [n for n, _ in iter_definitions(first)] == ["A", "A.f", "A.B", "A.B.g", "A.B.g.h"]


def test_the_index_keeps_no_tree_alive() -> None:
    tree = ast.parse(CODE)
    resolve_scope(tree, "A.B.g")
    gone = weakref.ref(tree)
    del tree
    gc.collect()
    assert gone() is None


def test_a_scope_defined_twice_or_missing_is_still_refused_with_every_place() -> None:
    tree = ast.parse("def f():\n    pass\n\n\ndef f():\n    pass\n\n\ndef fg():\n    pass\n")
    with pytest.raises(anchors.AnchorProblem) as twice:
        resolve_scope(tree, "f")
    assert twice.value.candidates == ("f at line 1", "f at line 5")
    with pytest.raises(anchors.AnchorProblem) as missing:
        resolve_scope(tree, "fgh")
    assert "fg (line 9)" in missing.value.candidates


_TOKENIZER_LINE_END = re.compile(r"\r\n|\r|\n")


def _lines_as_the_tokenizer_counts(text: str) -> list[str]:
    lines, start = [], 0
    for match in _TOKENIZER_LINE_END.finditer(text):
        lines.append(text[start : match.end()])
        start = match.end()
    return lines + ([text[start:]] if start < len(text) else [])


def test_lines_end_at_cr_lf_and_crlf_only_whatever_else_the_text_holds() -> None:
    pieces = ["a", " ", "\n", "\r", "\r\n", "\f", "\v", "\x1c", "\x85", "\u2028", "\u2029"]
    chooser = random.Random(20)
    for _ in range(5000):
        text = "".join(chooser.choice(pieces) for _ in range(chooser.randint(0, 14)))
        lines = split_lines(text)
        assert lines == _lines_as_the_tokenizer_counts(text), repr(text)
        index = LineIndex(text)
        assert index.starts == [sum(len(line) for line in lines[:k]) for k in range(len(lines) + 1)]
