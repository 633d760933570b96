"""No module imports a test module: helpers that more than one test needs live in `tests/*kit.py`
(or another helper module beside them), so a test module's tests are collected only as its own,
and a test module reads from its imports straight to its first test.

The check parses every module under `tests/` and `bench/`; a test module is one named `test_*`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.editkit import assert_golden
from tests.patchkit import make_patch, src

pytestmark = pytest.mark.pure

REPO = Path(__file__).resolve().parent.parent
FOLDERS = ("tests", "bench")


def _package(root: Path, path: Path, node: ast.ImportFrom) -> Path:
    """The folder `from` names where it is a package, whose imported names are then modules."""
    start = path.parents[node.level - 1] if node.level else root
    return start.joinpath(*(node.module or "").split("."))


def imports_of_test_modules(root: Path) -> list[str]:
    """Every import of a test module by a Python file under `root`'s FOLDERS, as
    `path:line: imports module`."""
    found: list[str] = []
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            name = path.relative_to(root).as_posix()
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=name)):
                if isinstance(node, ast.Import):
                    modules = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom):
                    base = "." * node.level + (node.module or "")
                    modules = [base]
                    if _package(root, path, node).is_dir():  # `from tests import test_x`
                        modules += [f"{base.rstrip('.')}.{alias.name}" for alias in node.names]
                else:
                    continue
                tests = [m for m in modules if any(p.startswith("test_") for p in m.split("."))]
                if tests:
                    found.append(f"{name}:{node.lineno}: imports {tests[0].lstrip('.')}")
    return found


def test_no_module_imports_a_test_module() -> None:
    found = imports_of_test_modules(REPO)
    assert not found, "move what is shared into a tests/*kit.py and import it from there:\n" + (
        "\n".join(found)
    )


@pytest.mark.parametrize(
    ("line", "module"),
    [
        ("from tests.test_other import helper", "tests.test_other"),
        ("from .test_other import helper", "test_other"),
        ("from . import test_other", "test_other"),
        ("from tests import kit, test_other", "tests.test_other"),
        ("import tests.test_other", "tests.test_other"),
        ("import os, tests.test_other as other", "tests.test_other"),
    ],
)
def test_every_form_of_importing_a_test_module_is_named(
    tmp_path: Path, line: str, module: str
) -> None:
    for folder in FOLDERS:
        (tmp_path / folder).mkdir()
    (tmp_path / "tests" / "test_one.py").write_text(f"def f() -> None:\n    {line}\n")
    (tmp_path / "tests" / "onekit.py").write_text("from tests.twokit import test_like_helper\n")
    (tmp_path / "bench" / "bench_one.py").write_text("from tests.onekit import helper\n")
    assert imports_of_test_modules(tmp_path) == [f"tests/test_one.py:2: imports {module}"]


def test_a_kits_failing_assert_shows_what_it_compared() -> None:
    """conftest.py has pytest rewrite the kits' asserts as it rewrites a test module's, so a
    helper moved into a kit explains its failure as it did before: the values, not only the
    message."""
    patch = make_patch('[[edits]]\nkind = "insert"\nscope = "f"\ncode = "x = 1"\n')
    with pytest.raises(AssertionError) as failed:
        assert_golden(src("def f():\n    pass\n"), patch, b"not what the edit gives\n")
    assert "assert b'def f():" in str(failed.value), str(failed.value)
