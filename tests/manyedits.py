"""Patches of many edits, generated from a real file: the planner's scale (issue 44).

`many_edits_patch(source, count, seed=...)` spreads `count` insert edits (and, with `mixed`,
replace, delete and move edits) over the file's scopes at every position, each anchored on a
statement the file has. Deterministic for a seed, so a benchmark row and a test case name the
same patch. Used by tests/test_edit_scale.py and bench/bench_planning.py.
"""

from __future__ import annotations

import ast
import hashlib
import json
import random
from collections import Counter
from dataclasses import astuple
from typing import Any, Literal

from opspatch.core.anchors import (
    Scope,
    dotted_name,
    iter_definitions,
    matching_statements,
    statement_assigns,
)
from opspatch.core.edit import Applied, NotApplicable, apply_patch, detect, unapply
from opspatch.core.selectors import MODULE_SCOPE, ReplaceSelector
from opspatch.core.spec import PatchSpec
from tests.releasecases import SCHEDULER_RELPATH
from tests.sglang_wheels import EAGLE_RELPATH, release_file

POSITIONS = ("start", "end", "before", "after")
POOL = {
    "function": ("pass", "log('x')\ncount = 1"),
    "class": ("pass", "count: int = 0"),
    "module": ("pass", "import os"),
}
"""With `clash`: the few snippets inserted again and again (often where they already stand)."""


def _name(selector: dict[str, str]) -> str:
    return selector.get("assigns") or selector["calls"]


def _anchors(body: list[ast.stmt]) -> list[dict[str, str]]:
    """Selectors of statements of a body the generator may anchor on (`first` of a name)."""
    found: list[dict[str, str]] = []
    for stmt in body:
        names = statement_assigns(stmt)
        if isinstance(stmt, ast.Assign | ast.AnnAssign) and names:
            found.append({"assigns": names[0], "which": "first"})
        elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            name = dotted_name(stmt.value.func)
            if name is not None and "()" not in name:
                found.append({"calls": name, "which": "first"})
    return found


def _scopes(tree: ast.Module) -> list[Scope]:
    """The file's scopes with a unique name and a body below their header."""
    definitions = list(iter_definitions(tree))
    counts = Counter(name for name, _ in definitions)
    scopes = [Scope(MODULE_SCOPE, tree)]
    for name, node in definitions:
        if counts[name] == 1 and node.body[0].lineno > node.lineno:
            scopes.append(Scope(name, node))
    return scopes


def _level(scope: Scope) -> str:
    if isinstance(scope.node, ast.Module):
        return "module"
    return "class" if isinstance(scope.node, ast.ClassDef) else "function"


class _Generator:
    """Edits one after another; a statement a replace, delete or move selects is never another
    edit's anchor (nor selected twice), so most generated patches apply."""

    def __init__(self, seed: int, clash: bool) -> None:
        self.rng = random.Random(seed)
        self.clash = clash
        self.selected: set[tuple[str, str]] = set()
        self.anchored: set[tuple[str, str]] = set()
        self.taken: list[tuple[Scope, dict[str, str]]] = []

    def code(self, scope: Scope, k: int) -> str:
        level = _level(scope)
        anchors = _anchors(scope.node.body)
        if self.clash and anchors and level != "module" and self.rng.random() < 0.3:
            name = self.rng.choice([a["assigns"] for a in anchors if "assigns" in a] or ["pass"])
            return name if name == "pass" else f"{name} = {name}"  # a later anchor may take it
        if self.clash:
            return self.rng.choice(POOL[level])
        return {
            "module": f"GENERATED_{k} = {k}",
            "class": f"generated_{k}: int = {k}",
            "function": f"generated_{k} = {k}",
        }[level]

    def insert(self, scope: Scope, k: int) -> dict[str, Any]:
        anchors = [
            a for a in _anchors(scope.node.body) if (scope.qualname, _name(a)) not in self.selected
        ]
        position = self.rng.choice(POSITIONS if anchors else POSITIONS[:2])
        edit: dict[str, Any] = {
            "kind": "insert",
            "scope": scope.qualname,
            "position": position,
            "code": self.code(scope, k),
        }
        if self.rng.random() < 0.5:
            edit["comment"] = f"generated edit {k}" + (
                " which says why\nover two lines" if self.clash else ""
            )
        if position in ("before", "after"):
            anchor = dict(self.rng.choice(anchors))
            if self.clash:
                anchor["which"] = self.rng.choice(("first", "last"))
            edit["anchor"] = anchor
            self.anchored.add((scope.qualname, _name(anchor)))
        return edit

    def wrong(self, scope: Scope, k: int) -> dict[str, Any]:
        """An edit that does not fit: mostly an anchor on a statement an earlier replace,
        delete or move took away (found wanting only when it is placed), else an anchor or a
        scope the file lacks."""
        if self.taken and self.rng.random() < 0.8:
            owner, selector = self.rng.choice(self.taken)
            edit = self.insert(owner, k)
            edit.update(position="after", anchor={**selector, "which": "first"})
            return edit
        edit = self.insert(scope, k)
        if scope.qualname != MODULE_SCOPE and self.rng.random() < 0.5:
            edit["scope"] = scope.qualname + "_gone"
        else:
            edit.update(position="before", anchor={"assigns": f"no_such_name_{k}"})
        return edit

    def other(self, scope: Scope, k: int) -> dict[str, Any]:
        """A replace, delete or move of a statement the selector picks alone (an insert when
        none is left in this scope)."""
        free = [
            a
            for a in _anchors(scope.node.body)
            if (scope.qualname, _name(a)) not in self.selected | self.anchored
            and len(matching_statements(scope, ReplaceSelector.model_validate(a))) == 1
        ]
        if not free:
            return self.insert(scope, k)
        select = {**self.rng.choice(free), "which": "only"}
        self.selected.add((scope.qualname, _name(select)))
        self.taken.append((scope, select))
        kind = self.rng.choice(("replace", "delete", "move"))
        edit: dict[str, Any] = {"kind": kind, "scope": scope.qualname, "select": select}
        if kind == "replace":
            edit["code"] = self.code(scope, k)
        elif kind == "move":
            body = scope.node.body
            at = next(n for n, loc in enumerate(body) if _name(select) in _names(loc))
            edit["position"] = "start" if at == len(body) - 1 else "end"
        return edit


def _diff(rng: random.Random, lines: list[str], k: int) -> dict[str, Any] | None:
    """A diff that puts a comment line after a line met once in the file, by three lines of
    context (which other edits may move, or change: one in five keeps GNU patch's offset of 200
    lines, which edits above it may exceed)."""
    counts = Counter(lines)
    fits = [n for n in range(1, len(lines) - 1) if counts[lines[n]] == 1 and lines[n].strip()]
    if not fits:
        return None
    at = rng.choice(fits)
    indent = lines[at + 1][: len(lines[at + 1]) - len(lines[at + 1].lstrip())]
    hunk = [
        f" {lines[at - 1]}",
        f" {lines[at]}",
        f"+{indent}# generated diff {k}",
        f" {lines[at + 1]}",
    ]
    header = ["--- a/pkg/mod.py", "+++ b/pkg/mod.py", f"@@ -{at},3 +{at},4 @@"]
    edit = {"kind": "diff", "diff": "\n".join([*header, *hunk]) + "\n"}
    return edit if rng.random() < 0.2 else {**edit, "max_offset": 100_000}


def _names(stmt: ast.stmt) -> list[str]:
    return [_name(a) for a in _anchors([stmt])]


Style = Literal["spread", "mixed", "clash", "broken"]


def many_edits_patch(
    source: bytes,
    count: int,
    *,
    seed: int = 0,
    style: Style = "spread",
    patch_id: str = "many-edits",
) -> PatchSpec:
    """A patch of `count` edits on `source` (module `pkg.mod`), deterministic for `seed`.

    `spread`: inserts at start, end, before and after anchors over the file's scopes; `mixed`:
    about one edit in six a replace, delete or move of a statement its selector picks alone and
    one in thirty a diff; `clash`: the edits crowd into three scopes and insert the same few
    snippets, some of them assignments a later anchor (`first`, `last`) may select; `broken`:
    `mixed` with one edit in twenty wrong (mostly an anchor on a statement an earlier edit took
    away, found wanting only when placed; else an anchor or a scope the file lacks). A generated edit may not fit: the plan says so, which
    a planner must say the same way however fast it is.
    """
    generator = _Generator(seed, style == "clash")
    scopes = _scopes(ast.parse(source))
    if style == "clash":
        scopes = generator.rng.sample(scopes, min(3, len(scopes)))
    lines = source.decode("utf-8").splitlines()
    edits = []
    for k in range(count):
        scope = generator.rng.choice(scopes)
        chance = generator.rng.random()
        if style == "broken" and chance < 0.05:
            edits.append(generator.wrong(scope, k))
        elif style in ("mixed", "broken") and chance < 0.13:
            edits.append(_diff(generator.rng, lines, k) or generator.insert(scope, k))
        elif style in ("mixed", "broken") and chance < 0.3:
            edits.append(generator.other(scope, k))
        else:
            edits.append(generator.insert(scope, k))
    return PatchSpec.model_validate(
        {
            "id": patch_id,
            "summary": f"{count} generated edits",
            "rationale": "the planner's scale",
            "target": {"module": "pkg.mod"},
            "edits": edits,
        }
    )


def _sha(data: str | bytes) -> str:
    return hashlib.sha256(data.encode("utf-8") if isinstance(data, str) else data).hexdigest()


PARTS = ("plan", "detect", "again", "unapply")
"""What `plan_record` says, in parts: the plan, then `detect`, a second plan and `unapply` of
the file the plan gave."""


def plan_record(source: bytes, patch: PatchSpec, *, undo: bool = True) -> dict[str, Any]:
    """Everything the planner says about `patch` on `source`, each part (`PARTS`) as JSON: the
    plan's outcome (for `Applied` the sha256 of every field: new bytes, diff, each edit's
    splices and undo); for an applicable plan also `detect`, a second plan and (with `undo`)
    `unapply` of the patched file. Two planners agree when their records do."""
    outcome = apply_patch(source, patch)
    plan: dict[str, Any] = {"outcome": outcome.outcome, "matched": list(outcome.matched)}
    if isinstance(outcome, NotApplicable):
        plan.update(field=outcome.field, candidates=list(outcome.candidates))
    if not isinstance(outcome, Applied):
        plan["reason"] = getattr(outcome, "reason", "")
        return {"plan": plan}
    edits = [
        [e.index, e.kind, e.scope, e.description, e.variant, [astuple(s) for s in e.splices],
         [astuple(s) for s in e.undo]]
        for e in outcome.edits
    ]  # fmt: skip
    plan.update(
        new_source=_sha(outcome.new_source),
        diff=_sha(outcome.diff),
        edits=_sha(json.dumps(edits)),
        edited_scopes=list(outcome.edited_scopes),
        newline=outcome.newline,
    )
    detection = detect(outcome.new_source, patch)
    again = apply_patch(outcome.new_source, patch)
    record: dict[str, Any] = {
        "plan": plan,
        "detect": [detection.state, detection.reason]
        + [[s.index, s.state, s.reason, s.variant, s.placed, s.marked] for s in detection.edits],
        "again": [again.outcome, getattr(again, "reason", "")],
    }
    if undo:
        undone = unapply(outcome.new_source, patch)
        record["unapply"] = (
            [undone.reason, undone.field]
            if isinstance(undone, NotApplicable)
            else [_sha(undone.old_source), _sha(undone.diff)]
        )
    return record


def digest(record: dict[str, Any]) -> dict[str, str]:
    """A record as the golden file keeps it: its outcome (with the reason of a refusal, to read
    a failure by) and the sha256 of each part."""
    plan = record["plan"]
    said = {"outcome": plan["outcome"] + (f": {plan['reason']}" if "reason" in plan else "")}
    return {**said, **{part: _sha(json.dumps(record[part])) for part in PARTS if part in record}}


def scale_sources() -> dict[str, bytes]:
    """The real files the scale cases plan on (SGLang wheels, cached: `tests/sglang_wheels.py`).

    Raises:
        WheelUnavailable: offline and not cached.
    """
    eagle = release_file("0.5.23", EAGLE_RELPATH)
    return {
        "eagle-0.5.23": eagle,
        "eagle-0.5.23-crlf": eagle.replace(b"\n", b"\r\n"),
        "eagle-0.5.4": release_file("0.5.4", EAGLE_RELPATH),
        "scheduler-0.5.23": release_file("0.5.23", SCHEDULER_RELPATH),
    }


STYLES: tuple[Style, ...] = ("spread", "mixed", "clash", "broken")
GOLDEN_CASES = tuple(
    f"{source}/{style}/{count}/{seed}"
    for source in ("eagle-0.5.23", "eagle-0.5.23-crlf", "eagle-0.5.4", "scheduler-0.5.23")
    for style in STYLES
    for count in (3, 12, 40)
    for seed in (0, 1)
)
"""The cases `tests/data/plan-scale.json` holds the planner's answers to, as it gave them before
issue 44 (when planning re-parsed the file after every edit): `source/style/count/seed`."""


def golden_case(key: str, sources: dict[str, bytes]) -> tuple[bytes, PatchSpec]:
    """The file and the patch a golden case names."""
    source, style, count, seed = key.split("/")
    return sources[source], many_edits_patch(
        sources[source],
        int(count),
        seed=int(seed),
        style=style,  # type: ignore[arg-type]
    )
