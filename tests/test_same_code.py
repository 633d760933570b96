"""`same_code` decides what comparing `ast.dump`s decided before issue 20, without the dumps:
equal exactly when the dumps without positions are equal (and with `stub_nested`, exactly when
the skeletons, nested definitions reduced to their names, are)."""

from __future__ import annotations

import ast
import copy
import itertools

import pytest

from opspatch.core.anchors import DefNode, iter_definitions, same_code, strip_positions
from tests.patchkit import src
from tests.releasecases import EAGLE_RELPATH, release_source
from tests.sglang_wheels import WheelUnavailable

pytestmark = pytest.mark.pure


def reference_skeleton(node: ast.AST) -> str:
    """The skeleton as it was computed before issue 20 (a deep copy, rewritten)."""

    class Reduce(ast.NodeTransformer):
        def visit(self, child: ast.AST) -> ast.AST:
            if isinstance(child, DefNode) and child is not clone:
                return ast.Expr(ast.Constant(f"<{type(child).__name__} {child.name}>"))
            return self.generic_visit(child)

    clone = copy.deepcopy(node)
    return strip_positions(Reduce().visit(clone))


def _agrees(a: ast.AST, b: ast.AST) -> None:
    assert same_code(a, b) == (strip_positions(a) == strip_positions(b))
    assert same_code(a, b, stub_nested=True) == (reference_skeleton(a) == reference_skeleton(b))


PAIRS = [
    ("x = 1", "x = 1.0"),  # equal values, different dumps
    ("x = 1", "x = True"),
    ("x = 'a'", "x = b'a'"),
    ("x = u'a'", "x = 'a'"),  # Constant.kind
    ("x = 0.0", "x = 0.0"),
    ("def f(a, *, b): pass", "def f(a, *, b=None): pass"),  # kw_defaults holds None
    ("def f(): pass", "'<FunctionDef f>'"),  # a stub is what the skeleton says
    ("class A:\n    def f(self): return 1", "class A:\n    def f(self): return 2"),
    ("class A:\n    def f(self): return 1", "class A:\n    async def f(self): return 1"),
    ("class A:\n    def f(self): pass", "class A:\n    def g(self): pass"),
    ("class A:\n    x = 1\n    def f(self): pass", "class A:\n    x = 2\n    def f(self): pass"),
    ("import a", "import a as b"),
    ("from . import a", "from .. import a"),
    ("global a", "global b"),
    ("f(*a)", "f(a)"),
    ("x: int", "x: int = 0"),
    ("x[1:2]", "x[1:2:]"),
]


@pytest.mark.parametrize(("left", "right"), PAIRS)
def test_same_code_agrees_with_the_dumps_on_small_pairs(left: str, right: str) -> None:
    a, b = ast.parse(src(left)), ast.parse(src(right))
    _agrees(a, b)
    _agrees(b, a)
    _agrees(a, a)
    for (_, x), (_, y) in itertools.product(iter_definitions(a), iter_definitions(b)):
        _agrees(x, y)


def test_same_code_agrees_with_the_dumps_on_a_real_file() -> None:
    try:
        source = release_source("0.5.23", EAGLE_RELPATH)
    except WheelUnavailable as exc:
        pytest.skip(f"SGLang wheel not available (offline?): {exc}")
    tree, again = ast.parse(source), ast.parse(source)
    definitions = [node for _, node in iter_definitions(tree)]
    for a, b in zip(definitions, definitions[1:] + definitions[:1], strict=True):
        _agrees(a, b)
    for (_, a), (_, b) in zip(iter_definitions(tree), iter_definitions(again), strict=True):
        assert same_code(a, b) and same_code(a, b, stub_nested=True)
    _agrees(tree, again)
