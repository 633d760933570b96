"""eagle-init-guard on the real `eagle_worker_v2.py` of SGLang releases, and what `sed 613a` does.

Downloads the wheels from PyPI (cached outside the repository); skipped with the reason when
offline. SGLang is test data here: its files are parsed, never imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from opspatch.config.patches import load_patch
from opspatch.core.anchors import (
    first_line,
    iter_definitions,
    last_line,
    resolve_scope,
    strip_positions,
)
from opspatch.core.edit import AlreadyApplied, Applied, NotApplicable, apply_patch, reverse, unapply
from opspatch.core.validate import check_compiles
from opspatch.runs.commands.local_files import distribution_version_for
from tests.sglang_wheels import EAGLE_RELPATH, WheelUnavailable, sglang_site

pytestmark = pytest.mark.pure

REPO = Path(__file__).resolve().parent.parent
VERSIONS = ["0.5.4", "0.5.10", "0.5.23"]
# What the incident's `sed -i "613a <line>"` does to each release (computed by the test below).
SED_LINE = "        self.spec_disable_batch_threshold = 0\n"


@pytest.fixture(scope="module", params=VERSIONS)
def release(request: pytest.FixtureRequest) -> tuple[str, Path]:
    try:
        site = sglang_site(request.param)
    except WheelUnavailable as exc:
        pytest.skip(f"SGLang {request.param} wheel not available (offline?): {exc}")
    return request.param, site / EAGLE_RELPATH


@pytest.fixture(scope="module")
def guard():  # type: ignore[no-untyped-def]
    return load_patch(REPO / "patches" / "eagle-init-guard.toml")


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    node = resolve_scope(tree, name).node
    assert isinstance(node, ast.ClassDef)
    return node


def test_eagle_init_guard_on_real_release(release: tuple[str, Path], guard) -> None:  # type: ignore[no-untyped-def]
    version, path = release
    before = path.read_bytes()
    assert distribution_version_for(path, guard.spec.target) == version
    assert guard.spec.target.mismatch(str(path), version) is None

    outcome = apply_patch(before, guard.spec)
    assert isinstance(outcome, Applied), getattr(outcome, "reason", outcome)
    after = outcome.new_source

    # it compiles (and parses for the oldest Python SGLang supports)
    assert check_compiles(after, str(path), (3, 10)) == []

    tree = ast.parse(after)
    worker = _class(tree, "EAGLEWorkerV2")
    # the guarantee, part 1: a class-level default of 0, so every instance has it, including one
    # of a subclass that never runs EAGLEWorkerV2.__init__
    class_level = [
        s
        for s in worker.body
        if isinstance(s, ast.AnnAssign)
        and isinstance(s.target, ast.Name)
        and s.target.id == "spec_disable_batch_threshold"
    ]
    assert len(class_level) == 1
    assert isinstance(class_level[0].value, ast.Constant) and class_level[0].value.value == 0
    # part 2: __init__ assigns it before its first call that can fail part-way
    init = resolve_scope(tree, "EAGLEWorkerV2.__init__").node
    statements = list(init.body)
    assign_at = next(
        i
        for i, s in enumerate(statements)
        if isinstance(s, ast.Assign)
        and ast.unparse(s.targets[0]) == "self.spec_disable_batch_threshold"
    )
    for earlier in statements[:assign_at]:
        assert ast.unparse(earlier) == "super().__init__()", ast.unparse(earlier)

    # nothing else changed: only added lines, every other definition identical
    assert all(
        not line.startswith("-") or line.startswith("---") for line in outcome.diff.splitlines()
    )
    old_defs = {q: strip_positions(n) for q, n in iter_definitions(ast.parse(before))}
    new_defs = {q: strip_positions(n) for q, n in iter_definitions(tree)}
    assert old_defs.keys() == new_defs.keys()
    changed = {q for q in old_defs if old_defs[q] != new_defs[q]}
    assert changed == {"EAGLEWorkerV2", "EAGLEWorkerV2.__init__"}
    # the inserted code says why
    assert b"# opspatch:eagle-init-guard: set before any call that can fail part-way" in after

    # re-applying is a no-op; rollback is byte-identical (from the record and from the text)
    assert isinstance(apply_patch(after, guard.spec), AlreadyApplied)
    assert reverse(outcome) == before
    undone = unapply(after, guard.spec)
    assert not isinstance(undone, NotApplicable)
    assert undone.old_source == before


def _sed_append(source: str, line_number: int, line: str) -> str:
    lines = source.splitlines(keepends=True)
    return "".join(lines[:line_number] + [line] + lines[line_number:])


def _where_sed_lands(version: str, path: Path) -> str:
    text = _sed_append(path.read_text(encoding="utf-8"), 613, SED_LINE)
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        return f"SyntaxError: {exc.msg}"
    owner = "<module>"
    for qualname, node in iter_definitions(tree):
        if first_line(node) <= 614 <= last_line(node):
            owner = qualname
    return owner


def test_sed_613a_breaks_or_misplaces_the_fix(release: tuple[str, Path]) -> None:
    """The incident's line-number edit: a SyntaxError, or code in an unrelated method."""
    version, path = release
    landed = _where_sed_lands(version, path)
    expected = {
        "0.5.4": "EAGLEWorkerV2.verify",  # lands silently inside another method
        "0.5.10": "SyntaxError",
        "0.5.23": "SyntaxError",
    }[version]
    assert landed.startswith(expected), landed
    assert landed != "EAGLEWorkerV2.__init__"
