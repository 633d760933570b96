"""Planning a patch of many edits (issue 44): the planner says what it said before, in a time
close to linear in the edits.

- Placing each edit parses again only the scope it changed (`core/regions.py`); the reference
  (`WholeReparse`, the whole file parsed after every edit, as before) says the same on generated
  modules (hypothesis) and real SGLang files, for every style of generated patch
  (`tests/manyedits.py`: inserts spread over a file, mixed kinds with diffs, the same snippets
  crowding three scopes, wrong edits found at detection or only when placed).
- The planner of commit 3e9e2ce (before this issue) recorded its answers to 96 generated
  patches on real files (`tests/data/plan-scale.json`): plan, detection, second plan and removal
  of the patched file are the same now.
- Counted, not timed: a plan of many edits in functions parses the whole file twice (the file,
  and the result), not once per edit, and parses in all a number of times linear in the edits.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opspatch.core import edit, regions, syntax
from tests.editkit import module_source
from tests.manyedits import (
    GOLDEN_CASES,
    STYLES,
    Style,
    digest,
    golden_case,
    many_edits_patch,
    plan_record,
    scale_sources,
)
from tests.patchkit import HEADER, make_patch
from tests.sglang_wheels import WheelUnavailable

pytestmark = pytest.mark.pure

GOLDEN = Path(__file__).resolve().parent / "data" / "plan-scale.json"


def _reference_record(
    monkeypatch: pytest.MonkeyPatch, source: bytes, patch: Any, **options: Any
) -> dict[str, Any]:
    """`plan_record` with every edit placed on the whole file's tree, parsed after each edit."""
    with monkeypatch.context() as patched:
        patched.setattr(edit, "PLACERS", (regions.WholeReparse,))
        return plan_record(source, patch, **options)


@pytest.fixture(scope="module")
def sources() -> dict[str, bytes]:
    try:
        return scale_sources()
    except WheelUnavailable as exc:
        pytest.skip(f"SGLang wheel not available (offline?): {exc}")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(module_source(), st.sampled_from(STYLES), st.integers(1, 25), st.integers(0, 2**16))
def test_scoped_placing_says_what_the_reference_says_on_generated_modules(
    generated: tuple[bytes, str], style: Style, count: int, seed: int
) -> None:
    source, _ = generated
    patch = many_edits_patch(source, count, seed=seed, style=style)
    with pytest.MonkeyPatch.context() as monkeypatch:
        reference = _reference_record(monkeypatch, source, patch, undo=False)
    assert plan_record(source, patch, undo=False) == reference


@pytest.mark.slow  # in this process; the reference parses the file after each of 190 edits
@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize(
    "name", ["eagle-0.5.23", "eagle-0.5.23-crlf", "eagle-0.5.4", "scheduler-0.5.23"]
)
def test_scoped_placing_says_what_the_reference_says_on_real_files(
    name: str, style: Style, sources: dict[str, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    source = sources[name]
    for count, seed in ((40, 0), (150, 1)):
        patch = many_edits_patch(source, count, seed=seed, style=style)
        expected = _reference_record(monkeypatch, source, patch, undo=False)
        assert plan_record(source, patch, undo=False) == expected, (count, seed)


@pytest.mark.slow  # in this process; removing a patch still parses once per edit (~1 min)
@pytest.mark.parametrize("key", GOLDEN_CASES)
def test_plans_as_the_planner_before_issue_44(key: str, sources: dict[str, bytes]) -> None:
    expected = json.loads(GOLDEN.read_text("utf-8"))[key]
    count = int(key.split("/")[2])
    record = digest(plan_record(*golden_case(key, sources), undo=count <= 12))
    assert record == {part: expected[part] for part in record}, key


def _module(functions: int) -> bytes:
    """A module of `functions` small functions."""
    body = "".join(
        f"def f{n}(a):\n    x = a + {n}\n    y = x * 2\n    return y\n\n\n"
        for n in range(functions)
    )
    return f'"""Many functions."""\n\nimport os\n\n\n{body}'.encode()


def _inserts(count: int, functions: int) -> str:
    positions = (
        'position = "start"',
        'position = "end"',
        'position = "after"\nanchor = { assigns = "x" }',
    )
    return "".join(
        f'[[edits]]\nkind = "insert"\nscope = "f{k % functions}"\n{positions[k % 3]}\n'
        f'code = "added_{k} = {k}"\n\n'
        for k in range(count)
    )


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The length of every source `ast.parse` is given (leading blank lines not counted: a
    scope parsed on its own keeps its line numbers with them)."""
    sizes: list[int] = []
    real = ast.parse

    def counting(source: Any, *args: Any, **kwargs: Any) -> Any:
        text = source.decode() if isinstance(source, bytes) else source
        sizes.append(len(text.lstrip("\n")))
        return real(source, *args, **kwargs)

    monkeypatch.setattr(ast, "parse", counting)
    yield sizes


def test_a_text_parsed_for_python_3_7_or_later_has_this_pythons_tree() -> None:
    # What lets a plan's one parse of the result, for the patch's `min_python`, be its tree too.
    package = Path(edit.__file__).resolve().parents[1]
    for path in sorted([*package.glob("core/*.py"), *package.glob("sandbox/engine_src/**/*.py")]):
        text = path.read_text(encoding="utf-8")
        tree = ast.dump(ast.parse(text), include_attributes=True)
        try:
            older = ast.parse(text, feature_version=syntax.SAME_TREE_FROM)
        except SyntaxError:
            continue  # newer syntax: refused, never a different tree
        assert ast.dump(older, include_attributes=True) == tree, path


@pytest.mark.parametrize(
    ("min_python", "whole_parses"),
    # the result's one parse is for the patch's `min_python` (its tree is this Python's); before
    # 3.7 (`async` and `await` were names) the result is parsed for it on its own, once more
    [(None, 2), ("3.8", 2), ("3.10", 2), ("3.6", 3)],
)
def test_a_plan_parses_the_whole_file_twice_not_once_per_edit(
    parses: list[int], min_python: str | None, whole_parses: int
) -> None:
    source = _module(40)
    older = f'min_python = "{min_python}"\n' if min_python else ""
    patch = make_patch(_inserts(90, 40), header=HEADER + older)
    parses.clear()
    outcome = edit.apply_patch(source, patch)
    assert outcome.outcome == "applicable", getattr(outcome, "reason", "")
    whole = [size for size in parses if size > len(source) // 2]
    # the file, the result
    assert len(whole) == whole_parses, f"{len(whole)} parses of the whole file for 90 edits"
    assert len(parses) <= 6 * 90, f"{len(parses)} parses for 90 edits"
